//! An engine's side of GPU-to-GPU handoffs (feature `cuda`): staging memory for exported pages,
//! and the [`DeviceSink`] that receives a peer's pages into this GPU's memory. The native GPU
//! engine and the engine servers' connectors (through the Python extension) share it.
//!
//! Staging memory comes from `cuMemAlloc` ([`DeviceBuffer`]), the only kind CUDA IPC exports
//! and UCX registers; it is pooled, since an allocation (and for NIXL a registration) costs far
//! more than a handoff's copy. Buffers registered with NIXL are never freed: a peer may hold
//! the agent's metadata naming them, and NIXL refuses an address registered again under a new
//! key. Plain buffers beyond a few free ones are freed.
//!
//! Every export is complete on the GPU (a CUDA event recorded after the gather, waited for)
//! before its lease exists, so no peer can see half-written pages; every receive has copied the
//! pages into this GPU's memory before it returns, so the peer's staging can go back to its pool.

use crate::device::{DeviceLease, DevicePages, DeviceRoute, DeviceSink, DeviceStage, KvDevice};
use crate::gpu::GpuError;
use crate::gpu_ipc::{DeviceBuffer, IpcHandle, IpcMapping};
use crate::nixl::{RemoteVram, VramAgent, VramRegion};
use crate::sync::lock;
use crate::transport::TransferError;
use cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Instant;

/// Free plain buffers kept for reuse; more are freed.
const KEEP_FREE: usize = 4;
/// Smallest staging allocation: small handoffs share one size class.
const MIN_STAGING: usize = 1 << 20;

/// Memory that can back a pool entry.
pub trait Staging: Send + Sync + 'static {
    /// Bytes of the memory.
    fn len(&self) -> usize;

    /// Whether it holds no bytes (never: staging is at least one byte).
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Staging for DeviceBuffer {
    fn len(&self) -> usize {
        DeviceBuffer::len(self)
    }
}

impl Staging for VramRegion {
    fn len(&self) -> usize {
        self.buffer().len()
    }
}

/// A pool of staging memory of one kind.
struct Pool<T> {
    free: Arc<Mutex<Vec<T>>>,
    /// Free entries kept at most (`usize::MAX`: never free any).
    keep: usize,
}

impl<T: Staging> Pool<T> {
    fn new(keep: usize) -> Self {
        Self { free: Arc::default(), keep }
    }

    /// The smallest free entry of at least `len` bytes, else a new one from `make` (given the
    /// size to allocate: `len` rounded up to a power of two, so sizes recur).
    fn take(
        &self,
        len: usize,
        make: impl FnOnce(usize) -> Result<T, GpuError>,
    ) -> Result<Pooled<T>, GpuError> {
        let found = {
            let mut free = lock(&self.free);
            let best = free
                .iter()
                .enumerate()
                .filter(|(_, b)| b.len() >= len)
                .min_by_key(|(_, b)| b.len())
                .map(|(i, _)| i);
            best.map(|i| free.swap_remove(i))
        };
        let item = match found {
            Some(item) => item,
            None => make(len.max(MIN_STAGING).next_power_of_two())?,
        };
        Ok(Pooled { item: Some(item), home: Arc::downgrade(&self.free), keep: self.keep })
    }
}

/// An entry taken from a [`Pool`]; back in the pool when dropped (or freed, past the pool's
/// keep count or once the pool is gone).
pub struct Pooled<T: Staging> {
    item: Option<T>,
    home: Weak<Mutex<Vec<T>>>,
    keep: usize,
}

impl<T: Staging> Pooled<T> {
    fn get(&self) -> Result<&T, GpuError> {
        self.item.as_ref().ok_or_else(|| GpuError::Shape("a staging buffer given back".into()))
    }

    fn get_mut(&mut self) -> Result<&mut T, GpuError> {
        self.item.as_mut().ok_or_else(|| GpuError::Shape("a staging buffer given back".into()))
    }

    /// Frees the entry instead of giving it back (memory a failed transfer may still touch).
    fn discard(mut self) {
        drop(self.item.take());
    }
}

impl<T: Staging> Drop for Pooled<T> {
    fn drop(&mut self) {
        let (Some(item), Some(home)) = (self.item.take(), self.home.upgrade()) else { return };
        let mut free = lock(&home);
        if free.len() < self.keep {
            free.push(item);
        } else {
            // Freed outside the lock.
            drop(free);
            drop(item);
        }
    }
}

/// Pages received into this GPU's memory (what [`DevicePages`] holds for this engine).
pub enum Received {
    /// Plain device memory (CUDA IPC, in process).
    Plain(Pooled<DeviceBuffer>),
    /// Memory registered with NIXL (a VRAM read).
    Vram(Pooled<VramRegion>),
}

impl Received {
    /// The memory the scatter kernel reads.
    pub fn slice(&self) -> Result<&CudaSlice<u8>, GpuError> {
        Ok(self.buffer()?.slice())
    }

    /// The device buffer the pages are in.
    pub fn buffer(&self) -> Result<&DeviceBuffer, GpuError> {
        match self {
            Self::Plain(b) => b.get(),
            Self::Vram(r) => Ok(r.get()?.buffer()),
        }
    }
}

/// This process's NIXL agent for GPU memory, created on first use (with the first GPU's
/// context current, as UCX's cuda transports need).
fn vram_agent(ctx: &Arc<CudaContext>) -> Result<Arc<VramAgent>, TransferError> {
    static AGENT: OnceLock<Result<Arc<VramAgent>, TransferError>> = OnceLock::new();
    AGENT
        .get_or_init(|| {
            let name = format!("xinf-{:016x}-vram", crate::transport::process_nonce());
            VramAgent::new(&name, ctx).map(Arc::new)
        })
        .clone()
}

fn driver(e: impl std::fmt::Display) -> GpuError {
    GpuError::Driver(e.to_string())
}

fn transfer_err(e: GpuError) -> TransferError {
    TransferError::Source(format!("GPU: {e}"))
}

/// The GPU handoff machinery of one engine (shared by its compute thread, which exports, and
/// its decode-side fetches, which receive).
pub struct GpuHandoff {
    ctx: Arc<CudaContext>,
    /// Receives copy on a stream of their own, off the compute stream.
    stream: Arc<CudaStream>,
    /// Staging for exports by CUDA IPC and in process.
    exports: Pool<DeviceBuffer>,
    /// Memory received pages land in (CUDA IPC and in process).
    receives: Pool<DeviceBuffer>,
    /// Registered staging for NIXL, both directions.
    vram_exports: Pool<VramRegion>,
    vram_receives: Pool<VramRegion>,
}

impl std::fmt::Debug for GpuHandoff {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuHandoff").field("ordinal", &self.ctx.ordinal()).finish_non_exhaustive()
    }
}

/// The staging memory an export lease holds.
pub enum Exported {
    /// Plain device memory (CUDA IPC, in process).
    Plain(Pooled<DeviceBuffer>),
    /// Memory registered with NIXL (a VRAM read).
    Vram(Pooled<VramRegion>),
}

impl Exported {
    /// The device buffer gathered into.
    pub fn buffer(&self) -> Result<&DeviceBuffer, GpuError> {
        match self {
            Self::Plain(b) => b.get(),
            Self::Vram(r) => Ok(r.get()?.buffer()),
        }
    }

    /// The memory to gather into.
    pub fn slice_mut(&mut self) -> Result<&mut CudaSlice<u8>, GpuError> {
        match self {
            Self::Plain(b) => Ok(b.get_mut()?.slice_mut()),
            Self::Vram(r) => Ok(r.get_mut()?.slice_mut()),
        }
    }
}

impl GpuHandoff {
    /// The handoff machinery of an engine whose KV is on `ctx`'s GPU, with a copy stream of its
    /// own.
    pub fn new(ctx: &Arc<CudaContext>) -> Result<Self, GpuError> {
        let stream = ctx.new_stream().map_err(driver)?;
        Ok(Self {
            ctx: Arc::clone(ctx),
            stream,
            exports: Pool::new(KEEP_FREE),
            receives: Pool::new(KEEP_FREE),
            vram_exports: Pool::new(usize::MAX),
            vram_receives: Pool::new(usize::MAX),
        })
    }

    /// Where this engine's KV lives.
    pub fn kv_device(&self) -> KvDevice {
        KvDevice { host: crate::device::host_id().to_owned(), ordinal: self.ctx.ordinal() as u32 }
    }

    fn plain(&self, pool: &Pool<DeviceBuffer>, len: usize) -> Result<Pooled<DeviceBuffer>, GpuError> {
        pool.take(len, |size| DeviceBuffer::zeroed(&self.stream, size))
    }

    fn vram(&self, pool: &Pool<VramRegion>, len: usize) -> Result<Pooled<VramRegion>, GpuError> {
        let agent = vram_agent(&self.ctx).map_err(|e| GpuError::Driver(e.to_string()))?;
        pool.take(len, |size| {
            let buffer = DeviceBuffer::zeroed(&self.stream, size)?;
            agent.register(buffer).map_err(|e| GpuError::Driver(e.to_string()))
        })
    }

    /// Staging memory for an export of `len` bytes by `route`, and the slice to gather into.
    pub fn export_staging(&self, route: DeviceRoute, len: usize) -> Result<Exported, GpuError> {
        Ok(match route {
            DeviceRoute::InProcess | DeviceRoute::CudaIpc => Exported::Plain(self.plain(&self.exports, len)?),
            DeviceRoute::NixlVram => Exported::Vram(self.vram(&self.vram_exports, len)?),
        })
    }

    /// The lease of `len` gathered bytes in `staged` (the gather already waited for).
    pub fn lease(&self, route: DeviceRoute, staged: Exported, len: usize) -> Result<DeviceLease, GpuError> {
        let stage = match (&staged, route) {
            (Exported::Plain(_), DeviceRoute::InProcess) => DeviceStage::InProcess,
            (Exported::Plain(b), DeviceRoute::CudaIpc) => {
                DeviceStage::CudaIpc { handle: b.get()?.export_ipc(0..len)?.to_hex() }
            }
            (Exported::Vram(r), DeviceRoute::NixlVram) => {
                let agent = vram_agent(&self.ctx).map_err(|e| GpuError::Driver(e.to_string()))?;
                let remote = agent.remote(r.get()?, 0..len).map_err(|e| GpuError::Driver(e.to_string()))?;
                DeviceStage::NixlVram { remote: remote.encode() }
            }
            _ => return Err(GpuError::Shape(format!("staging of another route than {route:?}"))),
        };
        Ok(DeviceLease::new(stage, len, Box::new(staged)))
    }

    fn receive_into(&self, lease: &DeviceLease, deadline: Instant) -> Result<Received, TransferError> {
        let len = lease.len();
        match lease.stage() {
            DeviceStage::InProcess => {
                let src = match lease.held::<Exported>() {
                    Some(Exported::Plain(b)) => b.get().map_err(transfer_err)?,
                    _ => {
                        return Err(TransferError::Protocol(
                            "an in-process GPU lease without its memory".into(),
                        ));
                    }
                };
                let mut dst = self.plain(&self.receives, len).map_err(transfer_err)?;
                let to = dst.get_mut().map_err(transfer_err)?.slice_mut();
                let (Some(from), Some(mut to)) = (src.slice().try_slice(0..len), to.try_slice_mut(0..len))
                else {
                    return Err(TransferError::Protocol(format!("{len} bytes past a staging buffer")));
                };
                self.ctx.bind_to_thread().map_err(|e| transfer_err(driver(e)))?;
                self.stream.memcpy_dtod(&from, &mut to).map_err(|e| transfer_err(driver(e)))?;
                self.stream.synchronize().map_err(|e| transfer_err(driver(e)))?;
                Ok(Received::Plain(dst))
            }
            DeviceStage::CudaIpc { handle } => {
                let handle = IpcHandle::from_hex(handle).map_err(transfer_err)?;
                if handle.size < len as u64 {
                    return Err(TransferError::Protocol(format!(
                        "{len} bytes from an IPC range of {}",
                        handle.size
                    )));
                }
                let mapping = IpcMapping::open(&self.ctx, &handle).map_err(transfer_err)?;
                let mut dst = self.plain(&self.receives, len).map_err(transfer_err)?;
                let to = dst.get_mut().map_err(transfer_err)?.slice_mut();
                mapping.copy_into(&self.stream, 0..len, to).map_err(transfer_err)?;
                Ok(Received::Plain(dst))
            }
            DeviceStage::NixlVram { remote } => {
                let remote = RemoteVram::decode(remote)?;
                let agent = vram_agent(&self.ctx)?;
                let mut region = self.vram(&self.vram_receives, len).map_err(transfer_err)?;
                let read = agent.read(&remote, region.get_mut().map_err(transfer_err)?, deadline);
                if let Err(e) = read {
                    // A read that timed out may still land: that region never serves again.
                    region.discard();
                    return Err(e);
                }
                Ok(Received::Vram(region))
            }
        }
    }
}

impl DeviceSink for GpuHandoff {
    fn receive(&self, lease: &DeviceLease, deadline: Instant) -> Result<DevicePages, TransferError> {
        let received = self.receive_into(lease, deadline)?;
        Ok(DevicePages::new(lease.len(), Box::new(received)))
    }
}
