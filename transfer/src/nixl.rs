//! NIXL (NVIDIA Inference Xfer Library) for the bulk bytes of a page fetch: the page server
//! stages the pages in memory registered with its NIXL agent, and the fetching process reads
//! them with one NIXL READ (UCX: RDMA, shared memory or TCP, whichever UCX finds fastest).
//!
//! **Loading.** nixl-sys is built with its `stub-api`: the binary has no link-time dependency
//! on NIXL, and the stubs `dlopen("libnixl_capi.so")` on the first call, aborting the process
//! if that fails. So nothing here calls nixl-sys before [`available`] has loaded the library
//! itself, by full path; the stubs' later dlopen by soname is then answered by the object
//! already loaded (the dynamic linker matches loaded objects by their `DT_SONAME`). It is
//! loaded `RTLD_LOCAL`: the soname match does not need global symbols, and the wheel bundles
//! its own gRPC, protobuf and abseil, which should not satisfy other libraries' lookups. The
//! folder is, in order:
//!
//! 1. `$XINF_NIXL_LIB_DIR`;
//! 2. the dynamic linker's own search (`LD_LIBRARY_PATH`, the system library paths);
//! 3. the `nixl-cu12` (or `nixl-cu13`) Python wheel, found by asking `$XINF_PYTHON` (default
//!    `python3`) where the package is: its libraries are in `.nixl_cu12.mesonpy.libs` next to it.
//!
//! When none has it, [`available`] says how to install it; nothing aborts. NIXL finds its
//! backend plugins (UCX) in `plugins/` beside `libnixl.so`, the wheel's layout, unless
//! `NIXL_PLUGIN_DIR` says otherwise; xinf leaves that variable to the user (setting it from a
//! running, multi-threaded process would race with C code reading the environment).
//!
//! **Agents.** One agent per process (named after [`process_nonce`]), with the UCX backend and
//! DRAM memory. NIXL calls block and the library does not promise thread safety, so every call
//! into an agent holds that agent's lock (taken with [`crate::sync::lock`]), and callers run
//! them on tokio's blocking threads.
//!
//! **Staging.** A served range is copied into a staging slab registered with the agent. Slabs
//! are pooled and stay registered for the life of the agent: NIXL (1.x) cannot update or drop
//! one descriptor of a remote agent that a peer has loaded (only the whole agent, which also
//! drops the UCX connection), and loading a registration again at an address a freed one had
//! used is refused, so a region once published must stay valid. Peers therefore load an agent's
//! metadata once per change (the agent's `generation` counts its registrations) and keep its
//! connection. The pool is bounded (16 GiB per agent); a fetch that finds it full fails with
//! [`TransferError::Nixl`] rather than wait.
//!
//! **GPU memory** (feature `cuda`): a `VramAgent` registers device buffers and reads a peer's
//! device memory into its own, device to device (see `VramAgent`'s module, `nixl/vram.rs`).

// Two kinds of unsafe code, both confined to this module: loading the NIXL library (running
// its initialisers, see `open_library`) and implementing nixl-sys's `MemoryRegion`, whose
// `as_ptr` promises that the pointer stays valid while registered (see `Slab`).
#![allow(unsafe_code)]

use crate::error::TransferError;
use crate::process::process_nonce;
use crate::sync::lock;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

mod library;
#[cfg(feature = "cuda")]
mod vram;

pub use library::available;
#[cfg(feature = "cuda")]
pub use vram::{RemoteVram, VramAgent, VramRegion};

/// The most staging memory one agent registers (the pool never shrinks, see the module doc).
const MAX_STAGING: usize = 16 << 30;
/// The smallest staging slab: small ranges share a size instead of each adding a registration.
const MIN_SLAB: usize = 1 << 20;

/// What failed in a NIXL call, as a typed error.
fn nixl_err(what: &str) -> impl FnOnce(nixl_sys::NixlError) -> TransferError + '_ {
    move |e| TransferError::Nixl(format!("{what}: {e}"))
}

/// DRAM registered with an agent. The registration is dropped (deregistered)
/// before the memory it names.
struct Slab {
    registration: Option<nixl_sys::RegistrationHandle>,
    memory: Region,
}

impl Slab {
    fn addr(&self) -> usize {
        self.memory.0.as_ptr() as usize
    }

    fn capacity(&self) -> usize {
        self.memory.0.len()
    }
}

/// The memory of a slab or of a destination buffer, as nixl-sys registers it.
#[derive(Debug)]
struct Region(Vec<u8>);

impl nixl_sys::MemoryRegion for Region {
    // SAFETY (for callers): the Vec's heap buffer neither moves nor is freed while the Region
    // lives, and every registration of a Region is dropped before the Region (`Slab`, `read`).
    unsafe fn as_ptr(&self) -> *const u8 {
        self.0.as_ptr()
    }

    fn size(&self) -> usize {
        self.0.len()
    }
}

impl nixl_sys::NixlDescriptor for Region {
    fn mem_type(&self) -> nixl_sys::MemType {
        nixl_sys::MemType::Dram
    }

    fn device_id(&self) -> u64 {
        0
    }
}

/// A NIXL agent with its UCX backend, a pool of registered staging slabs and the generations of
/// the remote agents' metadata it has loaded.
pub(crate) struct Node {
    name: String,
    /// Every call into the agent holds this lock (see the module doc).
    agent: Mutex<nixl_sys::Agent>,
    pool: Mutex<Pool>,
    /// Remote agent name → the newest generation of its metadata loaded.
    remotes: Mutex<HashMap<String, u64>>,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node").field("name", &self.name).finish_non_exhaustive()
    }
}

/// UCX settings of the NIXL backend (`KEY=VALUE,…` without the `UCX_` prefix; NIXL applies each
/// unless the environment sets `UCX_KEY` itself, which stays the way to override them).
///
/// The decode side *reads* the prefill side's staging (a NIXL READ, UCP get). UCX's CUDA IPC
/// transport offers get only where NVML reports NVLinks, so on a host without them — a
/// one-GPU machine, PCIe GPUs, a VM that hides the links — UCX emulated the read over TCP
/// through host memory: 27–376 ms for a 12.6 MB handoff that CUDA IPC moves in about 1 ms.
/// CUDA IPC get is slower than put only on some PCIe platforms, and still far faster than TCP.
const UCX_SETTINGS: &str = "CUDA_IPC_ENABLE_GET_ZCOPY=y";

#[derive(Default)]
struct Pool {
    free: Vec<Slab>,
    /// Bytes registered or being registered.
    bytes: usize,
    /// Registrations so far: a peer holding older metadata must load it again.
    generation: u64,
}

impl Node {
    /// Creates an agent named `name` with a UCX backend. Blocking.
    pub(crate) fn new(name: &str) -> Result<Arc<Self>, TransferError> {
        available()?;
        let config = nixl_sys::AgentConfig::default();
        let agent =
            nixl_sys::Agent::new_configured(name, &config).map_err(nixl_err("creating the NIXL agent"))?;
        let (_mems, mut params) =
            agent.get_plugin_params("UCX").map_err(nixl_err("reading the UCX plugin's parameters"))?;
        params
            .set("engine_config", UCX_SETTINGS)
            .map_err(nixl_err("setting the UCX backend's parameters"))?;
        agent.create_backend("UCX", &params).map_err(nixl_err("creating the UCX backend"))?;
        tracing::debug!(agent = name, "NIXL agent ready");
        Ok(Arc::new(Self {
            name: name.to_owned(),
            agent: Mutex::new(agent),
            pool: Mutex::default(),
            remotes: Mutex::default(),
        }))
    }

    /// This process's agent, created on first use. Blocking the first time.
    pub(crate) fn process() -> Result<Arc<Self>, TransferError> {
        static NODE: OnceLock<Result<Arc<Node>, TransferError>> = OnceLock::new();
        NODE.get_or_init(|| Node::new(&format!("xinf-{:016x}", process_nonce()))).clone()
    }

    /// Copies `pages` into a registered slab and returns it with what a peer needs to read it.
    /// Blocking (a new slab is registered when none is free).
    pub(crate) fn stage(self: &Arc<Self>, pages: &[u8]) -> Result<Staged, TransferError> {
        let len = pages.len();
        let mut slab = self.take_slab(len)?;
        slab.memory.0[..len].copy_from_slice(pages);
        let (metadata, generation) = {
            let agent = lock(&self.agent);
            // The generation is read first: every registration it counts has completed, so
            // the metadata taken after holds at least those (a peer may load it once more).
            let generation = lock(&self.pool).generation;
            let metadata = agent.get_local_md().map_err(nixl_err("reading the agent's metadata"))?;
            (metadata, generation)
        };
        let remote = RemoteStage {
            agent: self.name.clone(),
            generation,
            metadata,
            addr: slab.addr() as u64,
            len: len as u64,
            dev: 0,
        };
        Ok(Staged { node: Arc::clone(self), slab: Some(slab), remote })
    }

    /// A free slab of at least `len` bytes (the smallest), or a new one.
    fn take_slab(&self, len: usize) -> Result<Slab, TransferError> {
        let size = len.max(MIN_SLAB).next_power_of_two();
        {
            let mut pool = lock(&self.pool);
            let best = (pool.free.iter().enumerate())
                .filter(|(_, s)| s.capacity() >= len)
                .min_by_key(|(_, s)| s.capacity())
                .map(|(i, _)| i);
            if let Some(i) = best {
                return Ok(pool.free.swap_remove(i));
            }
            if pool.bytes + size > MAX_STAGING {
                return Err(TransferError::Nixl(format!(
                    "no staging memory for {len} bytes: {} MiB of {} MiB are in use",
                    pool.bytes >> 20,
                    MAX_STAGING >> 20
                )));
            }
            pool.bytes += size;
        }
        let memory = Region(vec![0u8; size]);
        let registered = lock(&self.agent).register_memory(&memory, None);
        match registered {
            Ok(registration) => {
                lock(&self.pool).generation += 1;
                Ok(Slab { registration: Some(registration), memory })
            }
            Err(e) => {
                lock(&self.pool).bytes -= size;
                Err(nixl_err("registering staging memory")(e))
            }
        }
    }

    /// Reads `stage` from its agent into a new buffer, by `deadline`. Blocking.
    pub(crate) fn read(&self, stage: &RemoteStage, deadline: Instant) -> Result<Vec<u8>, TransferError> {
        let len = usize::try_from(stage.len)
            .map_err(|_| TransferError::Protocol(format!("a range of {} bytes", stage.len)))?;
        if len == 0 {
            return Ok(Vec::new());
        }
        if stage.agent == self.name {
            return Err(TransferError::Nixl("the pages are staged by this agent itself".into()));
        }
        self.load_remote(stage)?;
        let memory = Region(vec![0u8; len]);
        let agent = lock(&self.agent);
        let registration =
            agent.register_memory(&memory, None).map_err(nixl_err("registering the destination"))?;
        let mut local =
            nixl_sys::XferDescList::new(nixl_sys::MemType::Dram).map_err(nixl_err("a descriptor list"))?;
        local.add_desc(memory.0.as_ptr() as usize, len, 0);
        let mut remote =
            nixl_sys::XferDescList::new(nixl_sys::MemType::Dram).map_err(nixl_err("a descriptor list"))?;
        remote.add_desc(stage.addr as usize, len, stage.dev);
        let request = agent
            .create_xfer_req(nixl_sys::XferOp::Read, &local, &remote, &stage.agent, None)
            .map_err(nixl_err("preparing the read (the staged range is not registered memory)"))?;
        let pending = agent.post_xfer_req(&request, None).map_err(nixl_err("posting the read"))?;
        drop(agent);
        match self.wait(&request, pending, deadline, Duration::ZERO) {
            Wait::Done => {}
            Wait::TimedOut => {
                // The read may still land: leak its buffer, registration and request rather
                // than free memory UCX may write into (a timeout is rare and already an error).
                std::mem::forget(request);
                std::mem::forget(registration);
                std::mem::forget(memory);
                return Err(TransferError::Nixl(format!(
                    "the read of {len} bytes from {} did not finish in time",
                    stage.agent
                )));
            }
            Wait::Failed(e) => {
                // A failed request is no longer in flight: release it under the lock.
                let _agent = lock(&self.agent);
                drop(request);
                drop(registration);
                return Err(nixl_err("reading the staged pages")(e));
            }
        }
        {
            let _agent = lock(&self.agent);
            drop(request);
            drop(registration);
        }
        Ok(memory.0)
    }

    /// Polls a posted transfer (`pending`: not done when posted) until it is done, fails or
    /// `deadline` passes: yielding for the first `spin` (a transfer between GPUs is over in
    /// microseconds, less than one sleep), then sleeping longer and longer, up to 1 ms.
    fn wait(
        &self,
        request: &nixl_sys::XferRequest,
        mut pending: bool,
        deadline: Instant,
        spin: Duration,
    ) -> Wait {
        let started = Instant::now();
        let mut pause = Duration::from_micros(5);
        while pending {
            if Instant::now() >= deadline {
                return Wait::TimedOut;
            }
            if started.elapsed() < spin {
                std::thread::yield_now();
            } else {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(1));
            }
            match lock(&self.agent).get_xfer_status(request) {
                Ok(status) => pending = !status.is_success(),
                Err(e) => return Wait::Failed(e),
            }
        }
        Wait::Done
    }

    /// Whether the agent's UCX backend says it handles GPU memory (NIXL built with CUDA).
    /// Whether UCX's cuda transports load shows only when GPU memory is registered and read.
    #[cfg(feature = "cuda")]
    fn handles_vram(&self) -> Result<bool, TransferError> {
        let agent = lock(&self.agent);
        let backend = agent
            .get_backend("UCX")
            .ok_or_else(|| TransferError::Nixl("the agent has no UCX backend".into()))?;
        let (mems, _params) =
            agent.get_backend_params(&backend).map_err(nixl_err("reading the UCX backend's parameters"))?;
        let count = mems.len().map_err(nixl_err("reading the UCX backend's memory types"))?;
        for i in 0..count {
            if mems.get(i).map_err(nixl_err("reading the UCX backend's memory types"))?
                == nixl_sys::MemType::Vram
            {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Loads `stage.agent`'s metadata unless a generation at least as new is loaded.
    fn load_remote(&self, stage: &RemoteStage) -> Result<(), TransferError> {
        if lock(&self.remotes).get(&stage.agent).is_some_and(|g| *g >= stage.generation) {
            return Ok(());
        }
        let name = lock(&self.agent)
            .load_remote_md(&stage.metadata)
            .map_err(nixl_err("loading the remote agent's metadata"))?;
        if name != stage.agent {
            return Err(TransferError::Protocol(format!(
                "metadata of agent {name} offered as {}",
                stage.agent
            )));
        }
        let mut remotes = lock(&self.remotes);
        let known = remotes.entry(name).or_default();
        *known = (*known).max(stage.generation);
        Ok(())
    }

    fn give_back(&self, slab: Slab) {
        lock(&self.pool).free.push(slab);
    }
}

/// How a posted transfer ended.
enum Wait {
    Done,
    /// Still in flight at the deadline: its memory may yet be written.
    TimedOut,
    /// Failed; no longer in flight.
    Failed(nixl_sys::NixlError),
}

impl Drop for Node {
    fn drop(&mut self) {
        // Slabs are deregistered under the agent's lock, before the agent itself goes.
        let slabs = std::mem::take(&mut lock(&self.pool).free);
        let _agent = lock(&self.agent);
        drop(slabs);
    }
}

impl Drop for Slab {
    fn drop(&mut self) {
        // Deregister before the memory is freed (field order would too; this says it).
        drop(self.registration.take());
    }
}

/// Where a peer reads a staged range: the staging agent, its metadata and the range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RemoteStage {
    /// The agent holding the staged pages.
    pub(crate) agent: String,
    /// Its registration count when the metadata was taken.
    pub(crate) generation: u64,
    /// Its `get_local_md()`.
    pub(crate) metadata: Vec<u8>,
    /// The staged range: address, length, device (0 for DRAM).
    pub(crate) addr: u64,
    pub(crate) len: u64,
    pub(crate) dev: u64,
}

impl RemoteStage {
    /// `agent_len:u32 agent generation:u64 md_len:u32 md addr:u64 len:u64 dev:u64`, little endian.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(40 + self.agent.len() + self.metadata.len());
        out.extend_from_slice(&(self.agent.len() as u32).to_le_bytes());
        out.extend_from_slice(self.agent.as_bytes());
        out.extend_from_slice(&self.generation.to_le_bytes());
        out.extend_from_slice(&(self.metadata.len() as u32).to_le_bytes());
        out.extend_from_slice(&self.metadata);
        for v in [self.addr, self.len, self.dev] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out
    }

    pub(crate) fn decode(mut b: &[u8]) -> Result<Self, TransferError> {
        fn take<'a>(b: &mut &'a [u8], n: usize) -> Result<&'a [u8], TransferError> {
            if b.len() < n {
                return Err(TransferError::Protocol("a truncated NIXL stage answer".into()));
            }
            let (head, rest) = b.split_at(n);
            *b = rest;
            Ok(head)
        }
        let u32_at = |b: &mut &[u8]| -> Result<usize, TransferError> {
            Ok(u32::from_le_bytes(take(b, 4)?.try_into().unwrap_or_default()) as usize)
        };
        let u64_at = |b: &mut &[u8]| -> Result<u64, TransferError> {
            Ok(u64::from_le_bytes(take(b, 8)?.try_into().unwrap_or_default()))
        };
        let n = u32_at(&mut b)?;
        let agent = String::from_utf8(take(&mut b, n)?.to_vec())
            .map_err(|_| TransferError::Protocol("an agent name that is not UTF-8".into()))?;
        let generation = u64_at(&mut b)?;
        let n = u32_at(&mut b)?;
        let metadata = take(&mut b, n)?.to_vec();
        let (addr, len, dev) = (u64_at(&mut b)?, u64_at(&mut b)?, u64_at(&mut b)?);
        Ok(Self { agent, generation, metadata, addr, len, dev })
    }
}

/// Pages staged for a peer; the slab goes back to the pool when this is dropped, which must
/// wait until the peer has finished (or given up) reading.
pub(crate) struct Staged {
    node: Arc<Node>,
    slab: Option<Slab>,
    remote: RemoteStage,
}

impl std::fmt::Debug for Staged {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Staged").field("remote", &self.remote).finish_non_exhaustive()
    }
}

impl Staged {
    /// What the peer needs to read the pages.
    pub(crate) fn remote(&self) -> &RemoteStage {
        &self.remote
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if let Some(slab) = self.slab.take() {
            self.node.give_back(slab);
        }
    }
}
