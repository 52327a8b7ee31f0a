//! NIXL reads of GPU memory (VRAM), device to device (feature `cuda`).
//!
//! The prefill side registers the [`DeviceBuffer`] it gathers a handoff into with its
//! [`VramAgent`] and publishes where it lies ([`VramAgent::remote`]: the agent's metadata, the
//! address, length and GPU); the decode side, with an agent of its own and a registered buffer
//! of its own, reads it in one NIXL READ ([`VramAgent::read`]) and scatters it into its engine's
//! layout. UCX picks the path: CUDA IPC (NVLink or PCIe peer to peer) between processes of one
//! host, RDMA with GPUDirect between hosts.
//!
//! **CUDA context.** UCX's cuda transports use the calling thread's current context and leave
//! GPU memory to slower paths without one, so every call here that touches device memory makes
//! the buffer's context current first.
//!
//! **Memory.** Registered memory comes from `cuMemAlloc` ([`DeviceBuffer`]): UCX exports it
//! with CUDA IPC, which stream-ordered pool memory does not support. A registration keeps its
//! buffer until it is dropped, and stays for the life of the registration: as for the DRAM
//! slabs, a peer that loaded the metadata may read it.

// Unsafe code (the `MemoryRegion` impl) is allowed by the parent module, for its reasons.

use super::{Node, RemoteStage, Wait, available, nixl_err};
use crate::error::TransferError;
use crate::gpu_ipc::DeviceBuffer;
use crate::sync::lock;
use cudarc::driver::CudaContext;
use std::mem::ManuallyDrop;
use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a read polls by yielding before it sleeps between polls.
const SPIN: Duration = Duration::from_millis(2);

/// A NIXL agent (UCX backend) that moves GPU memory. Blocking calls; one lock per agent, as for
/// [`crate::nixl`]'s DRAM agents.
pub struct VramAgent {
    node: Arc<Node>,
    ctx: Arc<CudaContext>,
}

impl std::fmt::Debug for VramAgent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VramAgent")
            .field("name", &self.node.name)
            .field("ordinal", &self.ctx.ordinal())
            .finish_non_exhaustive()
    }
}

/// Makes `ctx` current on the calling thread (see the module doc).
fn bind(ctx: &CudaContext) -> Result<(), TransferError> {
    ctx.bind_to_thread().map_err(|e| TransferError::Nixl(format!("making the CUDA context current: {e}")))
}

impl VramAgent {
    /// Creates an agent named `name` (unique among the agents that will talk to each other)
    /// for GPU memory of `ctx`'s device. Blocking.
    ///
    /// [`TransferError::NixlUnavailable`] when the library cannot be loaded or its UCX backend
    /// does not handle GPU memory (a NIXL or UCX built without CUDA, or UCX's cuda module
    /// missing), with what is missing.
    pub fn new(name: &str, ctx: &Arc<CudaContext>) -> Result<Self, TransferError> {
        available()?;
        bind(ctx)?;
        let node = Node::new(name)?;
        if !node.handles_vram()? {
            return Err(TransferError::NixlUnavailable(
                "NIXL's UCX backend does not handle GPU memory (VRAM): NIXL and UCX must be built \
                 with the driver's CUDA major version (the nixl-cu13 wheel for a CUDA 13 driver, \
                 nixl-cu12 for CUDA 12) and UCX must find its cuda modules (libuct_cuda, \
                 libucm_cuda in the ucx/ folder beside libucs)"
                    .into(),
            ));
        }
        Ok(Self { node, ctx: Arc::clone(ctx) })
    }

    /// The agent's name, as peers address it.
    pub fn name(&self) -> &str {
        &self.node.name
    }

    /// Registers `buffer` so that peers can read it and reads can land in it. Blocking.
    pub fn register(&self, buffer: DeviceBuffer) -> Result<VramRegion, TransferError> {
        bind(buffer.context())?;
        let memory = Vram { addr: buffer.device_addr(), len: buffer.len(), device: buffer.ordinal() as u64 };
        let registration = lock(&self.node.agent).register_memory(&memory, None).map_err(nixl_err(
            "registering GPU memory (UCX without its CUDA module sees it as host memory: \
                 take the NIXL wheel of the driver's CUDA major version, nixl-cu13 for CUDA 13)",
        ))?;
        lock(&self.node.pool).generation += 1;
        Ok(VramRegion {
            node: Arc::clone(&self.node),
            registration: Some(registration),
            buffer: ManuallyDrop::new(buffer),
            memory,
            lost: false,
        })
    }

    /// What a peer needs to read bytes `range` of `region` (registered with this agent).
    pub fn remote(&self, region: &VramRegion, range: Range<usize>) -> Result<RemoteVram, TransferError> {
        if !Arc::ptr_eq(&region.node, &self.node) {
            return Err(TransferError::Nixl(format!(
                "a region registered with another agent than {}",
                self.name()
            )));
        }
        if range.start > range.end || range.end > region.memory.len {
            return Err(TransferError::Nixl(format!(
                "bytes {range:?} of a region of {} bytes",
                region.memory.len
            )));
        }
        let (metadata, generation) = {
            let agent = lock(&self.node.agent);
            // As in `Node::stage`: the generation first, so the metadata holds at least it.
            let generation = lock(&self.node.pool).generation;
            let metadata = agent.get_local_md().map_err(nixl_err("reading the agent's metadata"))?;
            (metadata, generation)
        };
        Ok(RemoteVram(RemoteStage {
            agent: self.node.name.clone(),
            generation,
            metadata,
            addr: region.memory.addr + range.start as u64,
            len: range.len() as u64,
            dev: region.memory.device,
        }))
    }

    /// Reads `from` (a peer agent's GPU memory) into the start of `into` (registered with this
    /// agent), by `deadline`. Blocking; when it returns `Ok` the bytes are in `into`, visible
    /// to any kernel queued after.
    ///
    /// A read still in flight at the deadline may yet write into `into`: its memory is then
    /// never freed (nor reused by NIXL), and the error says so.
    pub fn read(
        &self,
        from: &RemoteVram,
        into: &mut VramRegion,
        deadline: Instant,
    ) -> Result<(), TransferError> {
        let stage = &from.0;
        let len = usize::try_from(stage.len)
            .map_err(|_| TransferError::Protocol(format!("a range of {} bytes", stage.len)))?;
        if !Arc::ptr_eq(&into.node, &self.node) {
            return Err(TransferError::Nixl(format!(
                "a region registered with another agent than {}",
                self.name()
            )));
        }
        if into.lost {
            return Err(TransferError::Nixl(
                "the region is still the target of a read that timed out".into(),
            ));
        }
        if len > into.memory.len {
            return Err(TransferError::Nixl(format!("{len} bytes into a region of {}", into.memory.len)));
        }
        if len == 0 {
            return Ok(());
        }
        if stage.agent == self.node.name {
            return Err(TransferError::Nixl("NIXL cannot read from the reading agent itself".into()));
        }
        bind(into.buffer.context())?;
        if !into.buffer.keeps_its_memory() {
            return Err(TransferError::Nixl(
                "the region's buffer no longer holds its registered memory".into(),
            ));
        }
        self.node.load_remote(stage)?;
        let agent = lock(&self.node.agent);
        let mut local =
            nixl_sys::XferDescList::new(nixl_sys::MemType::Vram).map_err(nixl_err("a descriptor list"))?;
        local.add_desc(into.memory.addr as usize, len, into.memory.device);
        let mut remote =
            nixl_sys::XferDescList::new(nixl_sys::MemType::Vram).map_err(nixl_err("a descriptor list"))?;
        remote.add_desc(stage.addr as usize, len, stage.dev);
        let request = agent
            .create_xfer_req(nixl_sys::XferOp::Read, &local, &remote, &stage.agent, None)
            .map_err(nixl_err("preparing the GPU read (the range is not registered GPU memory)"))?;
        let pending = agent.post_xfer_req(&request, None).map_err(nixl_err("posting the GPU read"))?;
        drop(agent);
        match self.node.wait(&request, pending, deadline, SPIN) {
            Wait::Done => {
                let _agent = lock(&self.node.agent);
                drop(request);
                Ok(())
            }
            Wait::TimedOut => {
                // The read may still land: keep its request and the region's memory for good.
                std::mem::forget(request);
                into.lost = true;
                Err(TransferError::Nixl(format!(
                    "the GPU read of {len} bytes from {} did not finish in time (its target memory is kept)",
                    stage.agent
                )))
            }
            Wait::Failed(e) => {
                let _agent = lock(&self.node.agent);
                drop(request);
                Err(nixl_err("reading GPU memory")(e))
            }
        }
    }
}

/// A [`DeviceBuffer`] registered with a [`VramAgent`]; deregistered, then freed, on drop.
pub struct VramRegion {
    node: Arc<Node>,
    registration: Option<nixl_sys::RegistrationHandle>,
    /// Dropped after the registration (see `Drop`), or never if a read into it timed out.
    buffer: ManuallyDrop<DeviceBuffer>,
    memory: Vram,
    /// A read into it timed out and may still land.
    lost: bool,
}

impl std::fmt::Debug for VramRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VramRegion")
            .field("agent", &self.node.name)
            .field("memory", &self.memory)
            .finish_non_exhaustive()
    }
}

impl VramRegion {
    /// The registered buffer, for kernels and copies.
    pub fn buffer(&self) -> &DeviceBuffer {
        &self.buffer
    }

    /// The registered buffer's memory, writable (e.g. the target of a gather). Its address
    /// must stay the registered one: a read refuses a buffer whose slice was swapped out.
    pub fn slice_mut(&mut self) -> &mut cudarc::driver::CudaSlice<u8> {
        self.buffer.slice_mut()
    }
}

impl Drop for VramRegion {
    fn drop(&mut self) {
        let _ = self.buffer.context().bind_to_thread();
        {
            // Deregistered under the agent's lock, before the memory goes.
            let _agent = lock(&self.node.agent);
            drop(self.registration.take());
        }
        if !self.lost {
            // SAFETY: the buffer is dropped once, here, after its registration; a region whose
            // read timed out keeps its memory for good instead.
            unsafe { ManuallyDrop::drop(&mut self.buffer) };
        }
    }
}

/// Where a peer reads a range of GPU memory: the agent holding it, the agent's metadata and
/// the range. Sent to the reading side over any control channel ([`encode`](Self::encode)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteVram(RemoteStage);

impl RemoteVram {
    /// The bytes on the wire (the format of the NIXL page-fetch answer).
    pub fn encode(&self) -> Vec<u8> {
        self.0.encode()
    }

    /// Parses [`encode`](Self::encode)'s bytes.
    pub fn decode(bytes: &[u8]) -> Result<Self, TransferError> {
        RemoteStage::decode(bytes).map(Self)
    }

    /// The agent holding the memory.
    pub fn agent(&self) -> &str {
        &self.0.agent
    }

    /// Bytes in the range.
    pub fn len(&self) -> u64 {
        self.0.len
    }

    /// Whether the range is empty.
    pub fn is_empty(&self) -> bool {
        self.0.len == 0
    }
}

/// A range of GPU memory as nixl-sys registers it.
#[derive(Debug, Clone, Copy)]
struct Vram {
    addr: u64,
    len: usize,
    device: u64,
}

impl nixl_sys::MemoryRegion for Vram {
    // SAFETY (for callers): the address names device memory of a `DeviceBuffer` that a
    // `VramRegion` keeps until after the registration made from this descriptor is dropped;
    // nixl-sys only passes it on to NIXL, never dereferences it on the host.
    unsafe fn as_ptr(&self) -> *const u8 {
        self.addr as usize as *const u8
    }

    fn size(&self) -> usize {
        self.len
    }
}

impl nixl_sys::NixlDescriptor for Vram {
    fn mem_type(&self) -> nixl_sys::MemType {
        nixl_sys::MemType::Vram
    }

    fn device_id(&self) -> u64 {
        self.device
    }
}
