//! The GPU side of the extension (feature `cuda`): xinf's conversion kernel and handoff
//! staging on the engine's GPU, in the CUDA primary context the engine's own runtime (torch)
//! uses, so the engine's device addresses are valid here.

// Raw device addresses of the engine's tensors go to the kernel and to copies.
#![allow(unsafe_code)]

use crate::layout::Layout;
use crate::load::{Counters, Load};
use cudarc::driver::sys::CUstream;
use cudarc::driver::{CudaEvent, CudaStream};
use pyo3::PyResult;
use pyo3::exceptions::PyRuntimeError;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock};
use xinf_transfer::device::{DeviceRoute, DeviceSink};
use xinf_transfer::gpu::GpuPages;
use xinf_transfer::gpu_handoff::{Exported, GpuHandoff, Received};
use xinf_transfer::gpu_ipc::DeviceBuffer;
use xinf_transfer::sync::lock;
use xinf_transfer::transport::{self, TransportPolicy};

/// The kernel and the staging pools of one GPU of this process.
pub(crate) struct Gpu {
    pub(crate) pages: GpuPages,
    pub(crate) handoff: Arc<GpuHandoff>,
    /// The stream gathers (but those queued on the engine's own stream) and scatters run on:
    /// one that does not synchronize with the legacy default stream, where the engines' own
    /// work runs (vLLM's forward, the tensors a scheduler builds), so a copy waits only for
    /// what it was ordered after.
    pub(crate) stream: Arc<CudaStream>,
    /// One conversion at a time on `stream`: a gather and its wait are one step.
    pub(crate) busy: Mutex<()>,
}

/// GPU `ordinal` of this process, set up on first use.
pub(crate) fn gpu(ordinal: usize) -> PyResult<Arc<Gpu>> {
    static GPUS: OnceLock<Mutex<HashMap<usize, Arc<Gpu>>>> = OnceLock::new();
    let mut gpus = lock(GPUS.get_or_init(Mutex::default));
    if let Some(g) = gpus.get(&ordinal) {
        return Ok(g.clone());
    }
    let failed = |e: String| PyRuntimeError::new_err(format!("GPU {ordinal}: {e}"));
    let pages = GpuPages::new(ordinal).map_err(|e| failed(e.to_string()))?;
    let handoff = Arc::new(GpuHandoff::new(pages.context()).map_err(|e| failed(e.to_string()))?);
    let stream = pages.context().new_stream().map_err(|e| failed(e.to_string()))?;
    let g = Arc::new(Gpu { pages, handoff, stream, busy: Mutex::new(()) });
    gpus.insert(ordinal, g.clone());
    Ok(g)
}

/// A load into engine memory on GPU `ordinal`: pages `first..first + count` GPU to GPU by CUDA
/// IPC when the prefill side's staging is on this host's GPUs, else over TCP and uploaded; then
/// one scatter of the tokens asked for.
pub(crate) async fn load(
    load: Load,
    ordinal: usize,
    first: u32,
    count: u32,
    same_host: bool,
    counters: &Counters,
) -> Result<(), String> {
    let gpu = gpu(ordinal).map_err(|e| e.to_string())?;
    if same_host {
        let sink: Arc<dyn DeviceSink> = gpu.handoff.clone();
        let (pages, _) = transport::fetch_device(
            &load.endpoint,
            load.room,
            first,
            count,
            DeviceRoute::CudaIpc,
            sink,
            load.timeout,
        )
        .await
        .map_err(|e| e.to_string())?;
        counters.device_bytes_in.fetch_add(pages.len() as u64, Ordering::Relaxed);
        return blocking(move || {
            let received = pages.get::<Received>().ok_or("GPU pages of another kind")?;
            let buffer = received.buffer().map_err(|e| e.to_string())?;
            scatter(&gpu, &load, first, count, buffer.device_addr(), pages.len())
        })
        .await;
    }
    let (bytes, _) =
        transport::fetch(&load.endpoint, load.room, first, count, TransportPolicy::Auto, load.timeout)
            .await
            .map_err(|e| e.to_string())?;
    counters.host_bytes_in.fetch_add(bytes.len() as u64, Ordering::Relaxed);
    if bytes.is_empty() {
        return Err("no pages came".into());
    }
    blocking(move || {
        let stream = &gpu.stream;
        let mut buffer = DeviceBuffer::zeroed(stream, bytes.len()).map_err(|e| e.to_string())?;
        stream.memcpy_htod(&bytes, buffer.slice_mut()).map_err(|e| e.to_string())?;
        scatter(&gpu, &load, first, count, buffer.device_addr(), bytes.len())
    })
    .await
}

async fn blocking(f: impl FnOnce() -> Result<(), String> + Send + 'static) -> Result<(), String> {
    tokio::task::spawn_blocking(f).await.map_err(|e| format!("scattering pages stopped: {e}"))?
}

/// Scatters `len` bytes of pages at device address `pages` into the load's engine memory, and
/// waits for it.
fn scatter(gpu: &Gpu, load: &Load, first: u32, count: u32, pages: u64, len: usize) -> Result<(), String> {
    let _busy = lock(&gpu.busy);
    let range = first as usize..(first + count) as usize;
    // SAFETY: `load.regions` are the engine's live KV tensors on this GPU, reserved for this
    // request until the connector reports the load finished (after this returns); `pages` is a
    // buffer of `len` bytes the caller holds until then; the scatter is waited for below.
    unsafe {
        gpu.pages.scatter_raw(
            &gpu.stream,
            &load.layout.desc,
            load.layout.elem_bytes,
            &load.regions,
            &load.block_table,
            load.tokens.clone(),
            range,
            pages,
            len,
        )
    }
    .map_err(|e| e.to_string())?;
    gpu.stream.synchronize().map_err(|e| e.to_string())
}

/// Where a prompt's KV is when [`gather`] is called, and how the gather is ordered with the
/// engine's work.
#[derive(Clone, Copy, Debug)]
pub(crate) enum KvOrder {
    /// On some stream of the engine's: the gather waits for everything queued on the device,
    /// and for itself before returning.
    Device,
    /// Computed and waited for by the engine already: the gather waits only for itself.
    Ready,
    /// On this engine stream (a raw `CUstream`), which will also reuse the memory: the gather
    /// is queued on it and nothing waits; the pages are ready once the returned event is.
    Stream(u64),
}

/// A prompt's pages gathered into staging, and the event after which they are there.
pub(crate) struct Gathered {
    pub(crate) staged: Exported,
    pub(crate) gpu: Arc<Gpu>,
    pub(crate) done: CudaEvent,
}

/// Gathers a `prompt_len`-token prompt's pages on GPU `ordinal` into pooled staging memory of
/// `len` bytes, ordered with the engine's work as `order` says.
pub(crate) fn gather(
    ordinal: usize,
    layout: &Layout,
    regions: &[u64],
    block_table: &[u32],
    prompt_len: usize,
    len: usize,
    order: KvOrder,
) -> Result<Gathered, String> {
    let gpu = gpu(ordinal).map_err(|e| e.to_string())?;
    let staged = gpu.handoff.export_staging(DeviceRoute::CudaIpc, len).map_err(|e| e.to_string())?;
    let addr = staged.buffer().map_err(|e| e.to_string())?.device_addr();
    let pages = xinf_transfer::pages_for(prompt_len);
    let busy = lock(&gpu.busy);
    let stream = match order {
        // SAFETY: the engine passes its live stream of this GPU's primary context (torch's
        // `current_stream().cuda_stream`), which outlives this call; work on it is ordered by
        // the stream itself, and the staging memory is held until the event below is done.
        KvOrder::Stream(s) => unsafe { gpu.pages.context().wrap_borrowed_stream(s as CUstream) },
        KvOrder::Device => {
            gpu.pages.context().synchronize().map_err(|e| e.to_string())?;
            gpu.stream.clone()
        }
        KvOrder::Ready => gpu.stream.clone(),
    };
    // SAFETY: `regions` are the engine's live KV tensors on this GPU (the connector passes
    // their `data_ptr()`s, each `region_bytes` long as the layout was built from), `addr` the
    // staging buffer of at least `len` bytes, held with the event that says the gather is done
    // (a room waits for it before serving or freeing them); the engine reuses its blocks only
    // after this returns (`Device`, `Ready`: waited for below) or on `stream` after the gather.
    unsafe {
        gpu.pages.gather_raw(
            &stream,
            &layout.desc,
            layout.elem_bytes,
            regions,
            block_table,
            prompt_len,
            0..pages,
            addr,
            len,
        )
    }
    .map_err(|e| e.to_string())?;
    let done = stream.record_event(None).map_err(|e| e.to_string())?;
    if !matches!(order, KvOrder::Stream(_)) {
        done.synchronize().map_err(|e| e.to_string())?;
    }
    drop(busy);
    Ok(Gathered { staged, gpu, done })
}
