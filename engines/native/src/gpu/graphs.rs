//! CUDA graphs of decode steps. A decode-only step of `t` sequences reads everything that
//! changes from step to step (ids, positions, block tables) from the step buffers, so its
//! launches depend on `t` alone: each batch size is captured once and replayed, one launch
//! instead of a few hundred, which is what bounds small-batch decoding.
//!
//! Graphs run on a stream of their own (the default stream cannot be captured) with a cuBLAS
//! handle of their own, set up like the main one. A failed capture turns graphs off for good
//! rather than failing the step, which then runs eagerly: the same kernels and gemms with the
//! same arguments, so the results are bit for bit the same. On Hopper and later, consecutive
//! kernels of a graph are joined by programmatic edges (`captured`), which take the launch
//! gap between them away without changing what they compute.

mod captured;

use super::buffers::{Buf, give_workspace};
use super::error::{GpuError, driver};
use super::forward::Lane;
use super::plan::StepLimits;
use captured::Captured;
use cudarc::cublas::CudaBlas;
use cudarc::driver::sys::CUstreamCaptureMode;
use cudarc::driver::{CudaContext, CudaEvent, CudaStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// The stream decode steps run on when graphs are on, with its own cuBLAS handle.
///
/// The model's stream is the context's legacy default stream, which cannot be captured; this
/// one is an ordinary stream. It is ordered after the default stream by `after_main`, recorded
/// there and waited for here at the start of each step on this lane, and every step ends with
/// a synchronize, so the two never overlap.
struct GraphLane {
    stream: Arc<CudaStream>,
    blas: CudaBlas,
    /// Declared after `blas`: freed after the handle.
    _workspace: Buf,
    after_main: CudaEvent,
}

impl GraphLane {
    fn new(ctx: &Arc<CudaContext>) -> Result<Self, GpuError> {
        let stream = ctx.new_stream().map_err(driver)?;
        let blas = CudaBlas::new(stream.clone()).map_err(|e| GpuError::Blas(e.to_string()))?;
        let workspace = give_workspace(&blas, &stream)?;
        let after_main = ctx.new_event(None).map_err(driver)?;
        Ok(Self { stream, blas, _workspace: workspace, after_main })
    }

    fn lane(&self) -> Lane<'_> {
        Lane { stream: &self.stream, blas: &self.blas }
    }
}

/// Where decode steps of one batch size stand.
enum Slot {
    /// Not seen yet: the first such step runs eagerly, which warms cuBLAS up (its algorithm
    /// choice and kernel loading for these shapes) outside any capture.
    Cold,
    /// Seen once: the next such step is captured.
    Warm,
    /// Captured: replayed from now on.
    Ready(Captured),
}

/// The graphs of one model, indexed by batch size, and the lane they run on.
pub(super) struct Graphs {
    /// Captured decode steps, indexed by batch size (dropped before the buffers they use).
    slots: Vec<Slot>,
    /// Where decode steps run when graphs are on (`None` when off).
    lane: Option<GraphLane>,
    /// Off by the `cuda_graphs` option, or after a capture failed.
    on: bool,
    /// Steps computed by replaying a graph.
    steps: Arc<AtomicU64>,
    /// Programmatic edges put into captured graphs.
    links: Arc<AtomicU64>,
    /// Our kernels (addresses of their `CUfunction`s), told apart from cuBLAS's in a graph.
    ours: Vec<usize>,
    /// Whether this GPU and driver take programmatic edges (`captured::available`).
    linked: bool,
}

impl Graphs {
    /// Graphs for `ctx`'s GPU within `limits`, whose kernels are `ours` (the addresses of their
    /// `CUfunction`s).
    pub(super) fn new(
        ctx: &Arc<CudaContext>,
        limits: &StepLimits,
        ours: Vec<usize>,
    ) -> Result<Self, GpuError> {
        let slots = (0..limits.graph_slots()).map(|_| Slot::Cold).collect();
        let lane = if limits.cuda_graphs { Some(GraphLane::new(ctx)?) } else { None };
        Ok(Self {
            slots,
            lane,
            on: limits.cuda_graphs,
            steps: limits.graph_steps.clone(),
            links: limits.graph_links.clone(),
            ours,
            linked: captured::available(ctx),
        })
    }

    /// Whether a step of `t` tokens and `n_rows` rows of logits runs on the graph lane: a
    /// decode step (`decode`) wants every token's logits, so its rows are `0..t`, what a
    /// capture records for batch size `t`.
    pub(super) fn takes(&self, decode: bool, t: usize, n_rows: usize) -> bool {
        decode && n_rows == t && self.on && t < self.slots.len()
    }

    /// How many decode steps of `t` sequences bring its slot to a captured graph (the first
    /// runs eagerly, the second is captured): 2 where `t` is graphed, else 1 (a run eagerly).
    pub(super) fn warm_up_steps(&self, t: usize) -> usize {
        if self.takes(true, t, t) { 2 } else { 1 }
    }

    /// Sets the count of steps replayed back to 0 (after the warm-up's).
    pub(super) fn forget_steps(&self) {
        self.steps.store(0, Ordering::Relaxed);
    }

    /// Orders the graph lane after whatever `main` still has queued, for a step that `takes`.
    pub(super) fn follow(&self, main: &Arc<CudaStream>) -> Result<(), GpuError> {
        if let Some(g) = &self.lane {
            g.after_main.record(main).map_err(driver)?;
            g.stream.wait(&g.after_main).map_err(driver)?;
        }
        Ok(())
    }

    /// The graph lane for a step that may use graphs (`graphed`), else `main`.
    pub(super) fn lane<'a>(&'a self, main: Lane<'a>, graphed: bool) -> Lane<'a> {
        match (&self.lane, graphed) {
            (Some(g), true) => g.lane(),
            _ => main,
        }
    }

    /// Launches the graph of a decode step of `t` sequences, capturing it first (what
    /// `record` enqueues on the lane it is given) if this batch size was seen before; `false`
    /// when the step is to run eagerly instead. A failed capture turns graphs off for good
    /// (logged once) rather than failing the step.
    pub(super) fn replay(
        &mut self,
        t: usize,
        record: impl FnOnce(Lane<'_>) -> Result<(), GpuError>,
    ) -> Result<bool, GpuError> {
        if !self.on || t >= self.slots.len() || self.lane.is_none() {
            return Ok(false);
        }
        match self.slots[t] {
            Slot::Cold => {
                self.slots[t] = Slot::Warm;
                return Ok(false);
            }
            Slot::Warm => match self.capture(record) {
                Ok(g) => self.slots[t] = Slot::Ready(g),
                Err(e) => {
                    tracing::warn!(
                        batch = t,
                        "CUDA graph capture failed, decode steps run without graphs from now on: {e}"
                    );
                    // The lane stays: this step still runs on it, eagerly.
                    self.on = false;
                    self.slots.clear();
                    return Ok(false);
                }
            },
            Slot::Ready(_) => {}
        }
        let Slot::Ready(g) = &self.slots[t] else { return Ok(false) };
        g.launch()?;
        self.steps.fetch_add(1, Ordering::Relaxed);
        Ok(true)
    }

    /// Captures what `record` enqueues on the graph lane (nothing runs).
    fn capture(&self, record: impl FnOnce(Lane<'_>) -> Result<(), GpuError>) -> Result<Captured, GpuError> {
        let g = self.lane.as_ref().ok_or_else(|| GpuError::Driver("no stream to capture on".into()))?;
        // Thread-local: only this thread's calls that are illegal during a capture break it, not
        // those of other threads using the GPU (GPU-to-GPU handoffs).
        let mode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
        g.stream.begin_capture(mode).map_err(driver)?;
        let recorded = record(g.lane());
        // Always end the capture, so the stream leaves capture mode whatever happened.
        let ended = Captured::end(&g.stream, &self.ours, self.linked);
        recorded?;
        let (graph, edges) = ended?;
        tracing::debug!(edges, "decode step captured; programmatic edges between its kernels");
        self.links.fetch_add(edges as u64, Ordering::Relaxed);
        Ok(graph)
    }
}
