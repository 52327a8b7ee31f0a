//! The prefill side: rooms of staged pages, served by a page server in the engine's process.
//!
//! A connector publishes a finished prompt as a room: its KV is gathered at once into staging
//! memory (GPU memory from xinf's pools where the cache is on a GPU, else host memory), so the
//! engine may free its blocks right away. The room is then served to decode sides by this
//! process's page server (`xinf_transfer::transport`: host pages over TCP, GPU pages by CUDA
//! IPC) until xinf releases it (the wire's `XKR1`) or its lease runs out; every fetch renews
//! the lease. Staged bytes are bounded: a publish past the budget is refused, and the decode
//! side then computes the prompt itself.

use crate::layout::Layout;
use crate::runtime::runtime;
use futures::future::BoxFuture;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};
use xinf_transfer::device::{DeviceLease, DeviceRoute, KvDevice};
use xinf_transfer::sync::lock;
use xinf_transfer::transport::{PageProvider, PageServer, Registration, TransferError};

/// Staged bytes allowed by default, over all rooms of one host.
const DEFAULT_BUDGET: u64 = 8 << 30;
/// How often expired rooms are swept.
const SWEEP: Duration = Duration::from_millis(250);

/// What a room's pages are in.
enum Memory {
    Host(Vec<u8>),
    /// GPU staging, which holds the pages once its gather's event is done: a fetch waits for
    /// that, and so does freeing the memory (the pool would hand it to another gather).
    #[cfg(feature = "cuda")]
    Device(crate::gpu::Gathered),
}

impl Memory {
    /// Waits until the pages are in this memory.
    fn ready(&self) -> Result<(), TransferError> {
        #[cfg(feature = "cuda")]
        if let Memory::Device(g) = self {
            return g
                .done
                .synchronize()
                .map_err(|e| TransferError::Source(format!("GPU: gathering the pages: {e}")));
        }
        Ok(())
    }
}

/// A room's staged pages; their bytes leave the budget when the last holder (the room, or a
/// fetch still copying) drops them.
struct Staged {
    memory: Memory,
    len: usize,
    accounted: Arc<Counters>,
}

impl Drop for Staged {
    fn drop(&mut self) {
        if let Err(e) = self.memory.ready() {
            tracing::error!(error = %e, "freeing KV staging memory whose gather failed");
        }
        self.accounted.staged_bytes.fetch_sub(self.len as u64, Ordering::Relaxed);
    }
}

struct Room {
    staged: Arc<Staged>,
    pages: u32,
    lease: Duration,
    deadline: Instant,
}

#[derive(Default)]
struct Counters {
    staged_bytes: AtomicU64,
    published: AtomicU64,
    released: AtomicU64,
    expired: AtomicU64,
    refused: AtomicU64,
    host_bytes_out: AtomicU64,
    device_bytes_out: AtomicU64,
}

/// The rooms of one host, and the provider the page server asks for their pages.
struct Rooms {
    table: Mutex<HashMap<u64, Room>>,
    page_bytes: Mutex<usize>,
    budget: u64,
    counters: Arc<Counters>,
}

impl Rooms {
    /// The staged pages `first..first + count` of `room` (renewing its lease), as a byte range.
    fn claim(
        &self,
        room: u64,
        first: u32,
        count: u32,
    ) -> Result<(Arc<Staged>, std::ops::Range<usize>), TransferError> {
        let page_bytes = *lock(&self.page_bytes);
        let mut table = lock(&self.table);
        let r = table.get_mut(&room).ok_or(TransferError::UnknownRoom(room))?;
        let end = u64::from(first) + u64::from(count);
        if end > u64::from(r.pages) {
            return Err(TransferError::Source(format!(
                "pages {first}..{end} of room {room}, which holds {}",
                r.pages
            )));
        }
        r.deadline = Instant::now() + r.lease;
        let range = first as usize * page_bytes..end as usize * page_bytes;
        Ok((r.staged.clone(), range))
    }

    fn sweep(&self, now: Instant) {
        let mut table = lock(&self.table);
        let before = table.len();
        table.retain(|_, r| r.deadline > now);
        let gone = before - table.len();
        if gone > 0 {
            self.counters.expired.fetch_add(gone as u64, Ordering::Relaxed);
            tracing::warn!(rooms = gone, "KV room leases expired; their pages are freed");
        }
    }
}

impl PageProvider for Rooms {
    fn pages(&self, room: u64, first: u32, count: u32) -> BoxFuture<'static, Result<Vec<u8>, TransferError>> {
        let claimed = self.claim(room, first, count);
        let counters = self.counters.clone();
        Box::pin(async move {
            let (staged, range) = claimed?;
            let bytes = tokio::task::spawn_blocking(move || read_host(&staged, range))
                .await
                .map_err(|e| TransferError::Source(format!("reading staged pages stopped: {e}")))??;
            counters.host_bytes_out.fetch_add(bytes.len() as u64, Ordering::Relaxed);
            Ok(bytes)
        })
    }

    fn device_pages(
        &self,
        room: u64,
        first: u32,
        count: u32,
        route: DeviceRoute,
    ) -> BoxFuture<'static, Result<DeviceLease, TransferError>> {
        let claimed = self.claim(room, first, count);
        let counters = self.counters.clone();
        Box::pin(async move {
            let (staged, range) = claimed?;
            let staged =
                tokio::task::spawn_blocking(move || staged.memory.ready().map(|()| staged))
                    .await
                    .map_err(|e| TransferError::Source(format!("waiting for staged pages stopped: {e}")))??;
            let lease = device_lease(staged, range, route)?;
            counters.device_bytes_out.fetch_add(lease.len() as u64, Ordering::Relaxed);
            Ok(lease)
        })
    }

    fn release(&self, room: u64) -> bool {
        let released = lock(&self.table).remove(&room).is_some();
        if released {
            self.counters.released.fetch_add(1, Ordering::Relaxed);
        }
        released
    }
}

/// Bytes `range` of staged pages, in host memory.
fn read_host(staged: &Staged, range: std::ops::Range<usize>) -> Result<Vec<u8>, TransferError> {
    staged.memory.ready()?;
    match &staged.memory {
        Memory::Host(bytes) => Ok(bytes[range].to_vec()),
        #[cfg(feature = "cuda")]
        Memory::Device(crate::gpu::Gathered { staged: exported, gpu, .. }) => {
            let gpu_err = |e: String| TransferError::Source(format!("GPU: {e}"));
            let buffer = exported.buffer().map_err(|e| gpu_err(e.to_string()))?;
            let view = buffer.slice().slice(range);
            let _busy = lock(&gpu.busy);
            gpu.stream.clone_dtoh(&view).map_err(|e| gpu_err(e.to_string()))
        }
    }
}

/// A lease of bytes `range` of staged pages for a GPU route: a CUDA IPC handle of the range,
/// holding the staging memory until the peer's copy is over.
fn device_lease(
    staged: Arc<Staged>,
    range: std::ops::Range<usize>,
    route: DeviceRoute,
) -> Result<DeviceLease, TransferError> {
    match (&staged.memory, route) {
        #[cfg(feature = "cuda")]
        (Memory::Device(crate::gpu::Gathered { staged: exported, .. }), DeviceRoute::CudaIpc) => {
            let gpu_err = |e: String| TransferError::Source(format!("GPU: {e}"));
            let buffer = exported.buffer().map_err(|e| gpu_err(e.to_string()))?;
            let handle = buffer.export_ipc(range.clone()).map_err(|e| gpu_err(e.to_string()))?;
            let stage = xinf_transfer::device::DeviceStage::CudaIpc { handle: handle.to_hex() };
            Ok(DeviceLease::new(stage, range.len(), Box::new(staged)))
        }
        (Memory::Host(_), _) => {
            let _ = range;
            Err(TransferError::Source("these pages are staged in host memory".into()))
        }
        #[allow(unreachable_patterns)]
        _ => Err(TransferError::Source(format!("the engine server's pages do not travel by {route:?}"))),
    }
}

/// Rooms of prompt KV published by a prefill engine, served by a page server of this process.
#[pyclass(module = "xinf_kv._native")]
pub(crate) struct PageHost {
    rooms: Arc<Rooms>,
    _provider: Arc<dyn PageProvider>,
    registration: Registration,
    _server: PageServer,
    device: Option<usize>,
}

#[pymethods]
impl PageHost {
    /// A page server on `ip` (a free port) for rooms staged on GPU `device` of this process
    /// (`None`: in host memory), with at most `budget_bytes` staged at once.
    #[new]
    #[pyo3(signature = (ip = "127.0.0.1", device = None, budget_bytes = None))]
    fn new(ip: &str, device: Option<usize>, budget_bytes: Option<u64>) -> PyResult<Self> {
        let ip: std::net::IpAddr =
            ip.parse().map_err(|e| PyValueError::new_err(format!("ip `{ip}`: {e}")))?;
        #[cfg(not(feature = "cuda"))]
        if let Some(d) = device {
            return Err(PyRuntimeError::new_err(format!(
                "GPU {d}: this build of xinf_kv has no GPU support (build it with the `cuda` feature)"
            )));
        }
        #[cfg(feature = "cuda")]
        if let Some(d) = device {
            crate::gpu::gpu(d)?;
        }
        let rt = runtime()?;
        let server = rt
            .block_on(PageServer::start(ip))
            .map_err(|e| PyRuntimeError::new_err(format!("starting the page server on {ip}: {e}")))?;
        let rooms = Arc::new(Rooms {
            table: Mutex::default(),
            page_bytes: Mutex::new(0),
            budget: budget_bytes.unwrap_or(DEFAULT_BUDGET),
            counters: Arc::default(),
        });
        let provider: Arc<dyn PageProvider> = rooms.clone();
        let registration = server.register(&provider);
        let weak: Weak<Rooms> = Arc::downgrade(&rooms);
        rt.spawn(async move {
            loop {
                tokio::time::sleep(SWEEP).await;
                let Some(rooms) = weak.upgrade() else { return };
                rooms.sweep(Instant::now());
            }
        });
        Ok(Self { rooms, _provider: provider, registration, _server: server, device })
    }

    /// Where decode sides reach these rooms: xinf's `Endpoint`, as JSON.
    #[getter]
    fn endpoint(&self) -> PyResult<String> {
        serde_json::to_string(self.registration.endpoint())
            .map_err(|e| PyRuntimeError::new_err(e.to_string()))
    }

    /// Where the staged pages are when on a GPU (xinf's `KvDevice`, as JSON), else `None`: a
    /// decode side on the same host then copies them GPU to GPU.
    #[getter]
    fn kv_device(&self) -> PyResult<Option<String>> {
        let Some(ordinal) = self.device else { return Ok(None) };
        let d = KvDevice { host: xinf_transfer::device::host_id().to_owned(), ordinal: ordinal as u32 };
        serde_json::to_string(&d).map(Some).map_err(|e| PyRuntimeError::new_err(e.to_string()))
    }

    /// Gathers the KV of a `prompt_len`-token prompt (engine memory `regions`, laid out as
    /// `layout`, blocks `block_table`) into staging and publishes it as `room` for `lease_ms`.
    /// Returns the room's page count. The engine's memory may be reused once this returns.
    ///
    /// On a GPU the gather is ordered with the engine's work in one of three ways:
    /// - `stream` (a raw `CUstream`, e.g. torch's `current_stream().cuda_stream`): the stream
    ///   the engine computed the KV on and will reuse its blocks on. The gather is queued there
    ///   and nothing waits: fetches of the room wait for it instead (vLLM, which publishes from
    ///   its forward pass).
    /// - `kv_ready`: the engine has waited for the KV itself (SGLang, whose scheduler
    ///   synchronizes a batch's results before handing its requests over), so the gather does
    ///   not wait for the batch the engine queued after it; it waits for itself.
    /// - neither: it waits for all work queued on the device first, then for itself.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (room, layout, regions, block_table, prompt_len, lease_ms, kv_ready = false, stream = None))]
    fn publish(
        &self,
        py: Python<'_>,
        room: u64,
        layout: &Layout,
        regions: Vec<u64>,
        block_table: Vec<u32>,
        prompt_len: usize,
        lease_ms: u64,
        kv_ready: bool,
        stream: Option<u64>,
    ) -> PyResult<u32> {
        let pages = xinf_transfer::pages_for(prompt_len);
        layout.check(&regions, &block_table, &(0..prompt_len), &(0..pages))?;
        let len = pages * layout.page_bytes_usize();
        self.admit(room, layout, len)?;
        let memory = match self.stage(py, layout, &regions, &block_table, prompt_len, len, (kv_ready, stream))
        {
            Ok(memory) => memory,
            Err(e) => {
                // The bytes reserved above were never staged.
                self.rooms.counters.staged_bytes.fetch_sub(len as u64, Ordering::Relaxed);
                return Err(e);
            }
        };
        self.insert(room, memory, len, pages as u32, lease_ms);
        Ok(pages as u32)
    }

    /// Publishes ready canonical pages (host memory) as `room` for `lease_ms`.
    fn publish_pages(&self, room: u64, page_bytes: usize, pages: &[u8], lease_ms: u64) -> PyResult<u32> {
        if page_bytes == 0 || !pages.len().is_multiple_of(page_bytes) {
            return Err(PyValueError::new_err(format!("{} bytes of pages of {page_bytes}", pages.len())));
        }
        self.set_page_bytes(page_bytes)?;
        let count = (pages.len() / page_bytes) as u32;
        self.reserve(room, pages.len())?;
        self.insert(room, Memory::Host(pages.to_vec()), pages.len(), count, lease_ms);
        Ok(count)
    }

    /// Frees `room`; `False` when it was gone already.
    fn release(&self, room: u64) -> bool {
        self.rooms.release(room)
    }

    /// Rooms held now.
    fn __len__(&self) -> usize {
        lock(&self.rooms.table).len()
    }

    /// What this host has done: rooms published, released, expired and refused, bytes staged
    /// now, bytes served to host fetches and GPU fetches.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let c = &self.rooms.counters;
        let d = PyDict::new(py);
        for (k, v) in [
            ("published", &c.published),
            ("released", &c.released),
            ("expired", &c.expired),
            ("refused", &c.refused),
            ("staged_bytes", &c.staged_bytes),
            ("host_bytes_out", &c.host_bytes_out),
            ("device_bytes_out", &c.device_bytes_out),
        ] {
            d.set_item(k, v.load(Ordering::Relaxed))?;
        }
        d.set_item("rooms", lock(&self.rooms.table).len())?;
        Ok(d)
    }
}

impl PageHost {
    /// Gathers a prompt's pages into this host's staging memory: host memory, or pooled GPU
    /// memory on the host's GPU (without the GIL: the gather may wait for the engine's work),
    /// ordered with the engine's work as `publish`'s `(kv_ready, stream)` say.
    #[allow(clippy::too_many_arguments)]
    fn stage(
        &self,
        py: Python<'_>,
        layout: &Layout,
        regions: &[u64],
        block_table: &[u32],
        prompt_len: usize,
        len: usize,
        (kv_ready, stream): (bool, Option<u64>),
    ) -> PyResult<Memory> {
        let pages = xinf_transfer::pages_for(prompt_len);
        let Some(ordinal) = self.device else {
            let bytes = crate::layout::gather_bytes(layout, regions, block_table, 0..prompt_len, 0..pages)?;
            return Ok(Memory::Host(bytes));
        };
        #[cfg(feature = "cuda")]
        {
            use crate::gpu::KvOrder;
            let order = match (stream, kv_ready) {
                (Some(s), _) => KvOrder::Stream(s),
                (None, true) => KvOrder::Ready,
                (None, false) => KvOrder::Device,
            };
            let gathered = py
                .detach(|| crate::gpu::gather(ordinal, layout, regions, block_table, prompt_len, len, order))
                .map_err(|e| PyRuntimeError::new_err(format!("gathering KV pages on GPU {ordinal}: {e}")))?;
            Ok(Memory::Device(gathered))
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = (py, ordinal, len, kv_ready, stream);
            Err(PyRuntimeError::new_err("this build of xinf_kv has no GPU support"))
        }
    }

    /// Checks `room` and the page size, and reserves `len` staged bytes for it.
    fn admit(&self, room: u64, layout: &Layout, len: usize) -> PyResult<()> {
        self.set_page_bytes(layout.page_bytes_usize())?;
        self.reserve(room, len)
    }

    fn set_page_bytes(&self, page_bytes: usize) -> PyResult<()> {
        let mut pb = lock(&self.rooms.page_bytes);
        if *pb != 0 && *pb != page_bytes {
            return Err(PyValueError::new_err(format!(
                "pages of {page_bytes} bytes on a host serving pages of {}",
                *pb
            )));
        }
        *pb = page_bytes;
        Ok(())
    }

    fn reserve(&self, room: u64, len: usize) -> PyResult<()> {
        if room == 0 {
            return Err(PyValueError::new_err("room 0 (rooms are nonzero)"));
        }
        if lock(&self.rooms.table).contains_key(&room) {
            return Err(PyValueError::new_err(format!("room {room} is published already")));
        }
        let c = &self.rooms.counters;
        let now = c.staged_bytes.fetch_add(len as u64, Ordering::Relaxed) + len as u64;
        if now > self.rooms.budget {
            c.staged_bytes.fetch_sub(len as u64, Ordering::Relaxed);
            c.refused.fetch_add(1, Ordering::Relaxed);
            return Err(PyRuntimeError::new_err(format!(
                "staging {len} bytes for room {room} would pass the budget of {} bytes",
                self.rooms.budget
            )));
        }
        Ok(())
    }

    fn insert(&self, room: u64, memory: Memory, len: usize, pages: u32, lease_ms: u64) {
        let staged = Arc::new(Staged { memory, len, accounted: self.rooms.counters.clone() });
        let lease = Duration::from_millis(lease_ms.max(1));
        let r = Room { staged, pages, lease, deadline: Instant::now() + lease };
        lock(&self.rooms.table).insert(room, r);
        self.rooms.counters.published.fetch_add(1, Ordering::Relaxed);
    }
}
