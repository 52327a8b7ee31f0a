//! The GPU backend: one model on one GPU, with its KV cache. It opens the GPU, builds the
//! parts (weights and kernels, cache, step buffers, graphs), runs the step shapes a replica
//! meets once before any request (`warm_up`), and runs each step: the plan
//! checked and uploaded, then either a graph replayed or the forward pass launched eagerly,
//! then the wanted logits copied back for the CPU sampler. Everything runs on one stream at a
//! time, synchronized at the end of each step.
//!
//! The driver, NVRTC and cuBLAS are loaded at run time; without them loading the model fails
//! with an error that names the missing library, never a panic.

// Loading cuBLAS and turning cudarc's event tracking off are `unsafe`; the SAFETY comments say
// why each call is sound.
#![allow(unsafe_code)]

mod warm_up;

use super::buffers::{Buf, StepBufs, give_workspace};
use super::error::{GpuError, driver};
use super::forward::{Forward, Lane};
use super::graphs::Graphs;
use super::pages::KvMemory;
use super::plan::{
    StepCapacity, StepLimits, StepPlan, StepShape, check_model, is_decode, logit_runs, plan_step,
};
use crate::kv_cache::KvCache;
use crate::model::{Chunk, ComputeBackend, Row};
use crate::weights::Weights;
use cudarc::cublas::CudaBlas;
use cudarc::driver::{CudaContext, CudaStream};
use std::sync::Arc;
use xinf_engine::KvDtype;
use xinf_models::ModelConfig;
use xinf_transfer::LayoutDescriptor;
use xinf_transfer::device::{DeviceLease, DevicePages, DeviceRoute};
use xinf_transfer::gpu::GpuPages;
use xinf_transfer::gpu_handoff::GpuHandoff;

/// The GPU backend: one model on one GPU, with its KV cache.
pub(crate) struct GpuModel {
    /// Captured decode steps and their lane; declared first, so dropped before the memory
    /// they use.
    graphs: Graphs,
    fwd: Forward,
    /// The cache: its device memory, and its pages in and out.
    kv: KvMemory,
    /// The step's device buffers; `None` only while a step holds them.
    bufs: Option<StepBufs>,
    /// The weights' (compute) dtype.
    wdt: KvDtype,
    /// The cache's dtype.
    kdt: KvDtype,
    desc: LayoutDescriptor,
    max_positions: usize,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    blas: CudaBlas,
    /// The memory cuBLAS works in (set on `blas`, so declared after it: freed after the handle).
    _blas_workspace: Buf,
}

impl std::fmt::Debug for GpuModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuModel").field("ordinal", &self.ctx.ordinal()).finish_non_exhaustive()
    }
}

impl GpuModel {
    /// Opens GPU `ordinal`, compiles the kernels, uploads the weights (converted to `wdt`) and
    /// allocates the KV cache of `desc` in `kdt`, with RoPE tables for `max_positions`, and the
    /// step buffers for steps within `limits`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        ordinal: usize,
        cfg: ModelConfig,
        w: &Weights,
        wdt: KvDtype,
        kdt: KvDtype,
        desc: LayoutDescriptor,
        max_positions: usize,
        limits: StepLimits,
    ) -> Result<Self, GpuError> {
        let planes = check_model(&cfg, &desc, kdt)?;
        // Loads the driver and NVRTC (typed errors when missing) and opens the GPU.
        let pages = GpuPages::new(ordinal)?;
        // SAFETY: only tries to dlopen cuBLAS and reports whether that worked.
        if !unsafe { cudarc::cublas::sys::is_culib_present() } {
            return Err(GpuError::NoCublas);
        }
        let ctx = pages.context().clone();
        // SAFETY: this engine orders its streams itself: the handoff stream's copies and
        // allocations are waited for before the compute stream touches their memory, and an
        // export's gather is waited for (an event) before another stream or process may read
        // it (gpu/handoff.rs). cudarc's automatic tracking would otherwise create two events per
        // allocation and, once a second stream exists, add a wait and a record per kernel
        // argument to every launch of the forward pass.
        unsafe { ctx.disable_event_tracking() };
        let stream = pages.stream().clone();
        ctx.bind_to_thread().map_err(driver)?;
        let blas = CudaBlas::new(stream.clone()).map_err(|e| GpuError::Blas(e.to_string()))?;
        let blas_workspace = give_workspace(&blas, &stream)?;
        let fwd = Forward::new(&stream, cfg, w, wdt, kdt, max_positions)?;
        let kv = KvMemory::new(pages, desc.clone(), kdt, &planes)?;
        let bufs = StepBufs::new(&stream, fwd.cfg(), [wdt, kdt], limits.capacity(desc.num_blocks))?;
        let graphs = Graphs::new(&ctx, &limits, fwd.kernel_ids())?;
        stream.synchronize().map_err(driver)?;
        let mut model = Self {
            graphs,
            fwd,
            kv,
            bufs: Some(bufs),
            wdt,
            kdt,
            desc,
            max_positions,
            ctx,
            stream,
            blas,
            _blas_workspace: blas_workspace,
        };
        model.warm_up(&limits)?;
        Ok(model)
    }

    /// The engine's GPU handoff side (its decode-side sink, and where it says its KV lives).
    pub(crate) fn handoff(&self) -> Arc<GpuHandoff> {
        self.kv.handoff()
    }

    /// Computes a step; with `argmax`, the rows of chunks that asked for it come back as
    /// [`Row::Argmax`], all others (every row without `argmax`) as their logits.
    fn step(&mut self, chunks: &[Chunk<'_>], argmax: bool) -> Result<Vec<Row>, GpuError> {
        let started = std::time::Instant::now();
        let vocab = self.fwd.cfg().vocab_size;
        let flash = self.fwd.flash(self.kv.view());
        let mut plan =
            plan_step(chunks, self.desc.block_size(), self.desc.num_blocks, vocab, self.max_positions, flash)
                .map_err(GpuError::Shape)?;
        if !argmax {
            plan.row_argmax.fill(false);
        }
        if plan.ids.is_empty() {
            return Ok(Vec::new());
        }
        self.ctx.bind_to_thread().map_err(driver)?;
        let decode = is_decode(chunks);
        match self.bufs.take() {
            Some(mut bufs) if bufs.fits(&plan) => {
                let out = self.run(&mut bufs, &plan, decode, started);
                self.bufs = Some(bufs);
                out
            }
            kept => {
                self.bufs = kept;
                let dtypes = [self.wdt, self.kdt];
                let mut own = StepBufs::new(&self.stream, self.fwd.cfg(), dtypes, StepCapacity::of(&plan))?;
                self.run(&mut own, &plan, false, started)
            }
        }
    }

    /// The default stream and its cuBLAS handle.
    fn main_lane(&self) -> Lane<'_> {
        Lane { stream: &self.stream, blas: &self.blas }
    }

    /// Uploads the plan into `bufs`, computes the step (replaying its graph when `decode` allows
    /// one) and returns the wanted rows: the argmax where the plan asks for it, else the logits.
    /// At trace level (`xinf::step::gpu`) it logs the host's time from the step's start
    /// (`started`) until its work is enqueued, and the wait for the GPU after that.
    fn run(
        &mut self,
        bufs: &mut StepBufs,
        plan: &StepPlan,
        decode: bool,
        started: std::time::Instant,
    ) -> Result<Vec<Row>, GpuError> {
        let (t, n_rows, vocab) = (plan.ids.len(), plan.rows.len(), self.fwd.cfg().vocab_size);
        let graphed = self.graphs.takes(decode, t, n_rows);
        if graphed {
            // Whatever the default stream still has queued comes first.
            self.graphs.follow(&self.stream)?;
        }
        let stream = self.graphs.lane(self.main_lane(), graphed).stream.clone();
        let deal = self.fwd.decode_deal(plan, self.kv.view(), bufs.part_rows);
        bufs.upload(&stream, plan, &deal)?;
        let (fwd, cache) = (&self.fwd, self.kv.view());
        if !(graphed && self.graphs.replay(t, |lane| fwd.record(lane, bufs, cache, StepShape::decode(t)))?) {
            self.fwd.record(self.graphs.lane(self.main_lane(), graphed), bufs, cache, plan.shape())?;
        }
        let enqueued = std::time::Instant::now();
        if n_rows == 0 {
            stream.synchronize().map_err(driver)?;
            trace_gpu_step(plan, graphed, enqueued - started, enqueued.elapsed());
            return Ok(Vec::new());
        }
        let short = || GpuError::Shape(format!("{n_rows} rows of logits past the buffer"));
        let mut ids = vec![0u32; n_rows];
        stream.memcpy_dtoh(&bufs.argmax.try_slice(..n_rows).ok_or_else(short)?, &mut ids).map_err(driver)?;
        let mut out: Vec<Row> = ids.into_iter().map(Row::Argmax).collect();
        for run in logit_runs(&plan.row_argmax) {
            let mut host = vec![0f32; run.len() * vocab];
            let src = bufs.logits.try_slice(run.start * vocab..run.end * vocab).ok_or_else(short)?;
            stream.memcpy_dtoh(&src, &mut host).map_err(driver)?;
            for (slot, row) in out[run].iter_mut().zip(host.chunks_exact(vocab)) {
                *slot = Row::Logits(row.to_vec());
            }
        }
        stream.synchronize().map_err(driver)?;
        trace_gpu_step(plan, graphed, enqueued - started, enqueued.elapsed());
        Ok(out)
    }
}

/// A step's host time until its work was enqueued (`host_us`: planning, uploads, launches or a
/// graph's replay) and the wait for its results after that (`wait_us`), at trace level under
/// `xinf::step::gpu`, for `doc/bench/gpu/steps.py`: what of a step the GPU waits on the host.
fn trace_gpu_step(plan: &StepPlan, graphed: bool, host: std::time::Duration, wait: std::time::Duration) {
    if tracing::enabled!(target: "xinf::step::gpu", tracing::Level::TRACE) {
        let micros = |d: std::time::Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        let (tokens, rows) = (plan.ids.len(), plan.rows.len());
        let (host_us, wait_us) = (micros(host), micros(wait));
        tracing::trace!(target: "xinf::step::gpu", tokens, rows, graphed, host_us, wait_us, "gpu step");
    }
}

impl ComputeBackend for GpuModel {
    fn forward(&mut self, chunks: &[Chunk<'_>], _cache: &mut KvCache) -> candle_core::Result<Vec<Vec<f32>>> {
        let rows = self.step(chunks, false).map_err(|e| candle_core::Error::Msg(format!("GPU: {e}")))?;
        Ok(rows
            .into_iter()
            .map(|r| match r {
                Row::Logits(l) => l,
                Row::Argmax(_) => Vec::new(), // not asked for: `step` was told no argmax
            })
            .collect())
    }

    fn forward_step(&mut self, chunks: &[Chunk<'_>], _cache: &mut KvCache) -> candle_core::Result<Vec<Row>> {
        self.step(chunks, true).map_err(|e| candle_core::Error::Msg(format!("GPU: {e}")))
    }

    fn export_pages(
        &mut self,
        _cache: &mut KvCache,
        table: &[u32],
        len: usize,
        first: usize,
        count: usize,
    ) -> Result<Vec<u8>, String> {
        self.kv.export_host(table, len, first, count).map_err(|e| e.to_string())
    }

    fn export_device(
        &mut self,
        table: &[u32],
        len: usize,
        first: usize,
        count: usize,
        route: DeviceRoute,
    ) -> Result<DeviceLease, String> {
        self.kv.export_device(table, len, first, count, route).map_err(|e| e.to_string())
    }

    fn import_device(&mut self, table: &[u32], len: usize, pages: &DevicePages) -> Result<(), String> {
        self.kv.import_device(table, len, pages).map_err(|e| e.to_string())
    }

    fn import_pages(
        &mut self,
        _cache: &mut KvCache,
        table: &[u32],
        len: usize,
        pages: &[u8],
    ) -> Result<(), String> {
        self.kv.import_host(table, len, pages).map_err(|e| e.to_string())
    }
}
