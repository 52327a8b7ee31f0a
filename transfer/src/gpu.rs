//! Page conversion on NVIDIA GPUs: the gather/scatter of [`copy_pages`](crate::copy_pages) as
//! one CUDA kernel, compiled at run time with NVRTC (feature `cuda`).
//!
//! One launch converts a whole handoff: the grid's y axis is the `(layer, K/V)` plane, and a
//! block of 256 threads copies as many whole token rows (every head) of that plane as it has
//! threads for, 16 bytes per thread when every address and stride allows it. The kernel
//! computes each row's offsets from the layout's strides and the block table
//! (`table[t/B]·s_blk + (t%B)·s_tok` in the engine, `page·PAGE + off·H·D` in the canonical
//! pages), so only the plane pointers and the block table are uploaded; gather and scatter are
//! the same kernel with the direction flag. Rows past the prompt are zero-filled in the pages
//! (gather) and skipped in the engine (scatter), as on the CPU; a scatter may also start past
//! the sequence's first token, leaving a prefix the engine already holds untouched.
//!
//! The engine memory is a set of `CudaSlice`s (the native engine's own cache), or raw device
//! addresses of another runtime's tensors in this process (`gather_raw`, `scatter_raw`: an
//! engine server's KV cache, reached through the Python extension).
//!
//! The driver and NVRTC are loaded when a [`GpuPages`] is created; without them the error says
//! so instead of panicking.

// cudarc's kernel launches are `unsafe`: the kernel's arguments are checked on the host below
// (lengths, bounds of every offset against the buffers), which is what makes each launch sound.
#![allow(unsafe_code)]

use crate::{Direction, LayoutDescriptor, PAGE_TOKENS};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, LaunchConfig, PushKernelArg,
};
use std::ops::Range;
use std::sync::Arc;

const KERNEL: &str = r#"
extern "C" __global__ void kv_pages_copy(
    const unsigned long long* eng_plane, const unsigned int* table, int block_size,
    long long s_blk, long long s_tok, long long eng_head,
    const unsigned long long* can_plane, long long page_bytes, long long can_tok, long long can_head,
    int gather, long long start, long long len, int first_page,
    int heads, int row_bytes, int n_rows, int vec16, int rows_per_block)
{
    int lk = blockIdx.y;
    int per_head = vec16 ? (row_bytes >> 4) : row_bytes;   // copy units per head
    int units = heads * per_head;                          // copy units per token row
    unsigned char* ep = (unsigned char*)eng_plane[lk];
    unsigned char* cp = (unsigned char*)can_plane[lk];
    for (int u = threadIdx.x; u < rows_per_block * units; u += blockDim.x) {
        int r = u / units, rem = u - r * units;
        int i = blockIdx.x * rows_per_block + r;
        if (i >= n_rows) break;
        int p = i >> 6, o = i & 63;
        long long t = (long long)(first_page + p) * 64 + o;
        int h = rem / per_head, j = rem - h * per_head;
        unsigned char* c = cp + p * page_bytes + o * can_tok + h * can_head;
        if (t >= len || t < start) {                       // outside the tokens copied
            if (gather) {
                if (vec16) ((uint4*)c)[j] = make_uint4(0, 0, 0, 0); else c[j] = 0;
            }
            continue;
        }
        unsigned char* e = ep + (long long)table[t / block_size] * s_blk + (t % block_size) * s_tok + h * eng_head;
        if (vec16) {
            if (gather) ((uint4*)c)[j] = ((const uint4*)e)[j]; else ((uint4*)e)[j] = ((const uint4*)c)[j];
        } else {
            if (gather) c[j] = e[j]; else e[j] = c[j];
        }
    }
}
"#;

/// Threads per block.
const THREADS: usize = 256;

/// Why a GPU page conversion could not run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GpuError {
    /// No NVIDIA driver (`libcuda.so`) could be loaded.
    #[error("no NVIDIA driver: libcuda.so could not be loaded")]
    NoDriver,
    /// NVRTC (`libnvrtc.so.13`) could not be loaded; it ships with the CUDA toolkit.
    #[error("NVRTC could not be loaded (libnvrtc.so.13; add the CUDA toolkit's lib64 to LD_LIBRARY_PATH)")]
    NoNvrtc,
    /// A CUDA call failed.
    #[error("CUDA: {0}")]
    Driver(String),
    /// The kernel did not compile.
    #[error("NVRTC: {0}")]
    Compile(String),
    /// The buffers do not fit the descriptor, table or range.
    #[error("page conversion: {0}")]
    Shape(String),
    /// A CUDA IPC handle that is not one (see [`crate::gpu_ipc`]).
    #[error("CUDA IPC: {0}")]
    Ipc(String),
}

fn driver(e: impl std::fmt::Display) -> GpuError {
    GpuError::Driver(e.to_string())
}

/// The page-conversion kernel, loaded on one GPU.
pub struct GpuPages {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    func: CudaFunction,
}

impl std::fmt::Debug for GpuPages {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuPages").field("ordinal", &self.ctx.ordinal()).finish_non_exhaustive()
    }
}

/// The virtual architecture NVRTC compiles for: the device's, capped to what CUDA 13 knows.
/// Shared by every NVRTC-compiled kernel of xinf (page conversion, the engine's forward pass).
pub fn nvrtc_arch(major: i32, minor: i32) -> &'static str {
    match (major, minor) {
        (7, 5) => "compute_75",
        (8, 0) => "compute_80",
        (8, 6) => "compute_86",
        (8, 7) => "compute_87",
        (8, 9) => "compute_89",
        // Hopper's own: `wgmma` (the native engine's prefill attention), which only sm_90 runs.
        (9, 0) => "compute_90a",
        (9, _) => "compute_90",
        (10, _) => "compute_100",
        (12, _) => "compute_120",
        (m, _) if m > 12 => "compute_120",
        _ => "compute_75",
    }
}

/// Whether the NVIDIA driver (`libcuda.so`) can be loaded. cudarc panics on its first call
/// into a library it cannot load, so every entry point of xinf into the driver asks this first.
pub fn driver_present() -> bool {
    // SAFETY: this only tries to dlopen the library and reports whether that worked.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// One GPU as the driver describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuDevice {
    /// The CUDA ordinal (as renumbered by `CUDA_VISIBLE_DEVICES`).
    pub ordinal: u32,
    /// The product name (`NVIDIA H200`).
    pub name: String,
    /// Total device memory, in bytes.
    pub total_memory: u64,
}

/// The driver's description of GPU `ordinal` (the driver initialised).
fn describe(ordinal: u32) -> Result<GpuDevice, GpuError> {
    use cudarc::driver::result::device;
    let dev = device::get(ordinal as i32).map_err(driver)?;
    let name = device::get_name(dev).map_err(driver)?;
    // SAFETY: `dev` is a device handle the driver just returned.
    let total = unsafe { device::total_mem(dev) }.map_err(driver)?;
    Ok(GpuDevice { ordinal, name, total_memory: total as u64 })
}

/// The GPUs the driver sees, with their names and memory; [`GpuError::NoDriver`] without a
/// driver (never a panic).
pub fn devices() -> Result<Vec<GpuDevice>, GpuError> {
    if !driver_present() {
        return Err(GpuError::NoDriver);
    }
    cudarc::driver::result::init().map_err(driver)?;
    let count = cudarc::driver::result::device::get_count().map_err(driver)?;
    (0..count.max(0) as u32).map(describe).collect()
}

/// GPU `ordinal` as the driver describes it (its total memory sizes the KV cache under a
/// memory fraction).
pub fn device(ordinal: usize) -> Result<GpuDevice, GpuError> {
    if !driver_present() {
        return Err(GpuError::NoDriver);
    }
    cudarc::driver::result::init().map_err(driver)?;
    let ordinal = u32::try_from(ordinal).map_err(|_| GpuError::Driver(format!("no GPU {ordinal}")))?;
    describe(ordinal)
}

/// GPU `ordinal`'s free and total memory now, in bytes, as a server started on it next would
/// find it. Holds the device's primary context for the call (already held where this process
/// computes on the GPU).
pub fn memory(ordinal: usize) -> Result<(u64, u64), GpuError> {
    if !driver_present() {
        return Err(GpuError::NoDriver);
    }
    let ctx = CudaContext::new(ordinal).map_err(driver)?;
    let (free, total) = ctx.mem_get_info().map_err(driver)?;
    Ok((free as u64, total as u64))
}

impl GpuPages {
    /// Loads the driver and NVRTC, and compiles the kernel for GPU `ordinal`.
    pub fn new(ordinal: usize) -> Result<Self, GpuError> {
        if !driver_present() {
            return Err(GpuError::NoDriver);
        }
        // SAFETY: this only tries to dlopen the library and reports whether that worked.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            return Err(GpuError::NoNvrtc);
        }
        let ctx = CudaContext::new(ordinal).map_err(driver)?;
        let (major, minor) = ctx.compute_capability().map_err(driver)?;
        let opts =
            cudarc::nvrtc::CompileOptions { arch: Some(nvrtc_arch(major, minor)), ..Default::default() };
        let ptx = cudarc::nvrtc::compile_ptx_with_opts(KERNEL, opts)
            .map_err(|e| GpuError::Compile(e.to_string()))?;
        let func = ctx.load_module(ptx).map_err(driver)?.load_function("kv_pages_copy").map_err(driver)?;
        let stream = ctx.default_stream();
        Ok(Self { ctx, stream, func })
    }

    /// The context the kernel runs in.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The stream conversions are queued on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Queues the gather of pages `range` of a `len`-token sequence out of the engine's
    /// `regions` (bytes of `elem_bytes`-byte elements, laid out as `desc` says) into `pages`.
    /// The arguments are those of [`copy_pages`](crate::copy_pages), plus the element size.
    #[allow(clippy::too_many_arguments)]
    pub fn gather(
        &self,
        desc: &LayoutDescriptor,
        elem_bytes: usize,
        regions: &[CudaSlice<u8>],
        block_table: &[u32],
        len: usize,
        range: Range<usize>,
        pages: &mut CudaSlice<u8>,
    ) -> Result<(), GpuError> {
        self.launch(Direction::Gather, desc, elem_bytes, regions, block_table, len, range, pages)
    }

    /// Queues the scatter of `pages` (pages `range` of a `len`-token sequence) into the
    /// engine's `regions`; only tokens `< len` are written.
    #[allow(clippy::too_many_arguments)]
    pub fn scatter(
        &self,
        desc: &LayoutDescriptor,
        elem_bytes: usize,
        regions: &mut [CudaSlice<u8>],
        block_table: &[u32],
        len: usize,
        range: Range<usize>,
        pages: &CudaSlice<u8>,
    ) -> Result<(), GpuError> {
        self.launch(Direction::Scatter, desc, elem_bytes, regions, block_table, len, range, pages)
    }

    /// Waits until every queued conversion is done.
    pub fn synchronize(&self) -> Result<(), GpuError> {
        self.stream.synchronize().map_err(driver)
    }

    /// Queues on `stream` the gather of pages `range` of a `len`-token sequence out of engine
    /// memory that this crate does not own (another runtime's tensors: an engine server's KV
    /// cache) into `pages`. Regions and pages are device addresses of this GPU. `stream` is
    /// this crate's own ([`stream`](Self::stream)) or the one the other runtime computed the KV
    /// on and will reuse its memory on, so the gather is ordered after the one and before the
    /// other without any host wait.
    ///
    /// # Safety
    /// Each of `regions` must be the start of live device memory of this context holding at
    /// least `desc.region_len * elem_bytes` bytes, `pages` of at least `pages_len` bytes, and
    /// both must stay allocated until work queued on `stream` after this call is done; `stream`
    /// must be a live stream of this context for the whole call. Everything else (shapes, the
    /// block table, every offset against those lengths) is checked.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn gather_raw(
        &self,
        stream: &Arc<CudaStream>,
        desc: &LayoutDescriptor,
        elem_bytes: usize,
        regions: &[u64],
        block_table: &[u32],
        len: usize,
        range: Range<usize>,
        pages: u64,
        pages_len: usize,
    ) -> Result<(), GpuError> {
        let copy =
            Copy { direction: Direction::Gather, desc, es: elem_bytes, block_table, start: 0, len, range };
        // SAFETY: the caller's contract is this function's.
        unsafe { self.launch_raw(stream, &copy, regions, pages, pages_len) }
    }

    /// Queues on `stream` the scatter of `pages` (pages `range` of a `len`-token sequence) into
    /// engine memory this crate does not own; only tokens `start..len` are written, so a prefix
    /// the engine already holds stays untouched.
    ///
    /// # Safety
    /// As for [`gather_raw`](Self::gather_raw).
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn scatter_raw(
        &self,
        stream: &Arc<CudaStream>,
        desc: &LayoutDescriptor,
        elem_bytes: usize,
        regions: &[u64],
        block_table: &[u32],
        tokens: Range<usize>,
        range: Range<usize>,
        pages: u64,
        pages_len: usize,
    ) -> Result<(), GpuError> {
        let copy = Copy {
            direction: Direction::Scatter,
            desc,
            es: elem_bytes,
            block_table,
            start: tokens.start,
            len: tokens.end,
            range,
        };
        // SAFETY: the caller's contract is this function's.
        unsafe { self.launch_raw(stream, &copy, regions, pages, pages_len) }
    }

    #[allow(clippy::too_many_arguments)]
    fn launch(
        &self,
        direction: Direction,
        desc: &LayoutDescriptor,
        es: usize,
        regions: &[CudaSlice<u8>],
        block_table: &[u32],
        len: usize,
        range: Range<usize>,
        pages: &CudaSlice<u8>,
    ) -> Result<(), GpuError> {
        if regions.len() != desc.num_regions || regions.iter().any(|r| r.len() != desc.region_len * es) {
            return Err(GpuError::Shape(format!(
                "{} regions of {} bytes expected",
                desc.num_regions,
                desc.region_len * es
            )));
        }
        let stream = &self.stream;
        let (pages_ptr, _sync) = pages.device_ptr(stream);
        let mut guards = Vec::with_capacity(regions.len());
        let mut bases = Vec::with_capacity(regions.len());
        for r in regions {
            let (ptr, sync) = r.device_ptr(stream);
            bases.push(ptr);
            guards.push(sync);
        }
        let copy = Copy { direction, desc, es, block_table, start: 0, len, range };
        // SAFETY: the regions and pages are live buffers of this context, borrowed (with their
        // stream guards) for the whole call, of the lengths checked above and passed.
        unsafe { self.launch_raw(stream, &copy, &bases, pages_ptr, pages.len()) }
    }

    /// # Safety
    /// As for [`gather_raw`](Self::gather_raw).
    unsafe fn launch_raw(
        &self,
        stream: &Arc<CudaStream>,
        copy: &Copy<'_>,
        bases: &[u64],
        pages_ptr: u64,
        pages_len: usize,
    ) -> Result<(), GpuError> {
        let Copy { direction, desc, es, block_table, start, len, ref range } = *copy;
        let range = range.clone();
        let shape = |m: String| Err(GpuError::Shape(m));
        if bases.len() != desc.num_regions {
            return shape(format!("{} regions expected, {} given", desc.num_regions, bases.len()));
        }
        let (l, h, d) = (desc.num_layers, desc.kv_heads, desc.head_dim);
        let count = range.len();
        if count == 0 {
            return Ok(());
        }
        let page_bytes = 2 * l * PAGE_TOKENS * h * d * es;
        if pages_len < count * page_bytes {
            return shape(format!("{pages_len} bytes of pages for {count} pages of {page_bytes}"));
        }
        let b = desc.block_size();
        let needed = len.min(range.end * PAGE_TOKENS).div_ceil(b);
        if block_table.len() < needed
            || block_table.iter().take(needed).any(|&blk| blk as usize >= desc.num_blocks)
        {
            return shape(format!("the block table must name {needed} blocks below {}", desc.num_blocks));
        }
        // The farthest engine byte a row can reach, checked against every plane's region.
        let max_blk = block_table.iter().take(needed).copied().max().unwrap_or(0) as usize;
        let row_span = ((h - 1) * desc.s_head + d) * es;
        let max_row = (max_blk * desc.s_blk + (b - 1) * desc.s_tok) * es;
        let mut engine_plane = Vec::with_capacity(2 * l);
        let mut canon_plane = Vec::with_capacity(2 * l);
        for layer in 0..l {
            for kv in 0..2 {
                let plane = desc.planes[layer][kv];
                if needed > 0 && plane.offset * es + max_row + row_span > desc.region_len * es {
                    return shape(format!("layer {layer} reaches past its region"));
                }
                engine_plane.push(bases[plane.region] + (plane.offset * es) as u64);
                canon_plane.push(pages_ptr + (((layer * 2 + kv) * PAGE_TOKENS * h * d) * es) as u64);
            }
        }
        let (s_blk, s_tok, eng_head) =
            ((desc.s_blk * es) as i64, (desc.s_tok * es) as i64, (desc.s_head * es) as i64);
        let (can_tok, can_head, page_stride) = ((h * d * es) as i64, (d * es) as i64, page_bytes as i64);
        let row_bytes = d * es;
        let aligned = |x: u64| x.is_multiple_of(16);
        let vec16 = row_bytes % 16 == 0
            && engine_plane.iter().chain(&canon_plane).all(|&p| aligned(p))
            && [s_blk, s_tok, eng_head, can_tok, can_head, page_stride].iter().all(|&x| aligned(x as u64));
        // Small uploads only: the kernel computes every row's offsets itself.
        let mut table: Vec<u32> = block_table.iter().take(needed).copied().collect();
        if table.is_empty() {
            table.push(0);
        }
        let engine_plane = stream.clone_htod(&engine_plane).map_err(driver)?;
        let canon_plane = stream.clone_htod(&canon_plane).map_err(driver)?;
        let table = stream.clone_htod(&table).map_err(driver)?;
        let rows = count * PAGE_TOKENS;
        // A block of 256 threads copies as many whole rows as it has threads for.
        let units = if vec16 { h * row_bytes / 16 } else { h * row_bytes };
        let rows_per_block = (THREADS / units.max(1)).max(1);
        let grid_x = rows.div_ceil(rows_per_block) as u32;
        let gather = i32::from(direction == Direction::Gather);
        let (block_size, start, len, first_page) = (b as i32, start as i64, len as i64, range.start as i32);
        let (heads, row_bytes, n_rows, vec16) = (h as i32, row_bytes as i32, rows as i32, i32::from(vec16));
        let rows_per_block = rows_per_block as i32;
        let cfg = LaunchConfig {
            grid_dim: (grid_x, (2 * l) as u32, 1),
            block_dim: (THREADS as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut launch = stream.launch_builder(&self.func);
        launch
            .arg(&engine_plane)
            .arg(&table)
            .arg(&block_size)
            .arg(&s_blk)
            .arg(&s_tok)
            .arg(&eng_head)
            .arg(&canon_plane)
            .arg(&page_stride)
            .arg(&can_tok)
            .arg(&can_head)
            .arg(&gather)
            .arg(&start)
            .arg(&len)
            .arg(&first_page)
            .arg(&heads)
            .arg(&row_bytes)
            .arg(&n_rows)
            .arg(&vec16)
            .arg(&rows_per_block);
        // SAFETY: every plane pointer lies in a live buffer (this function's contract); the
        // farthest engine byte any row can reach (largest block of the table, last token of a
        // block, last head) was checked against each plane's region above, the canonical side
        // against `pages_len` through `count * page_bytes`; the table holds every block the
        // rows below `len` index; and the kernel reads exactly the arguments pushed, in this
        // order and with these types.
        unsafe { launch.launch(cfg) }.map_err(driver)?;
        Ok(())
    }
}

/// One conversion's arguments, those of [`copy_pages`](crate::copy_pages) plus the element size
/// and the first token copied.
struct Copy<'a> {
    direction: Direction,
    desc: &'a LayoutDescriptor,
    es: usize,
    block_table: &'a [u32],
    start: usize,
    len: usize,
    range: Range<usize>,
}
