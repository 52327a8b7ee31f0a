//! The forward pass on an NVIDIA GPU (feature `cuda`): weights uploaded once, the paged KV cache
//! in device memory in the engine's layout, kernels compiled at run time with NVRTC, projections
//! with cuBLAS.
//!
//! The device cache is allocated region by region from the same [`LayoutDescriptor`] as the
//! host cache, so it is byte for byte what vLLM or SGLang would hold on the GPU, and the page
//! conversion kernel of [`xinf_transfer::gpu::GpuPages`] exports and imports pages straight
//! from it. [`KvCache`] only keeps the block accounting then.
//!
//! One step: embedding gather; per layer RMSNorm, one QKV matmul, a kernel that adds the bias,
//! normalizes Q/K heads (Qwen3), applies RoPE and writes K and V into the cache through the
//! block table, paged attention over each token's own sequence (prefill chunks and decode
//! tokens alike), the output projection, RMSNorm, the fused gate/up matmul, SiLU·up, the down
//! projection; the residual adds are fused into the norms. The residual stream and every
//! matmul output are f32 (cuBLAS accumulates and writes f32 from f16/bf16 inputs), so only the
//! weights, the matmul inputs and the cache carry the model's dtype. Logits come back as f32
//! for the CPU sampler. Everything runs on one stream, synchronized at the end of each step.
//!
//! A step's device buffers (its plan and its scratch) are allocated once, for the largest step
//! the engine forms, and filled prefix by prefix. Decode-only steps (one token per sequence) of
//! up to [`MAX_GRAPH_BATCH`] sequences read everything that changes from step to step (ids,
//! positions, block tables) from those buffers, so their launches depend on the batch size
//! alone: each batch size is captured once as a CUDA graph and replayed, one launch instead of
//! a few hundred, which is what bounds small-batch decoding. These steps run on a stream of
//! their own (the default stream cannot be captured) with a cuBLAS handle of their own, set up
//! like the main one. Prefill and mixed steps, and every step when graphs are off or a capture
//! failed, launch kernel by kernel: the same kernels and gemms with the same arguments, so the
//! results are bit for bit the same.
//!
//! The driver, NVRTC and cuBLAS are loaded at run time; without them loading the model fails
//! with an error that names the missing library, never a panic.

// cudarc's kernel launches, cuBLAS calls and raw device pointers are `unsafe`. Every index a
// kernel computes comes from values checked on the host (the step plan, the layout's reach
// checked against each region at construction), which is what makes each call sound; the
// SAFETY comments say which check covers which call.
#![allow(unsafe_code)]

use crate::config::ModelConfig;
use crate::kv_cache::KvCache;
use crate::model::{Chunk, ComputeBackend, inv_freq};
use crate::weights::Weights;
use candle_core::{DType, Tensor};
use cudarc::cublas::CudaBlas;
use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType_t};
use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaGraph, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, LaunchConfig,
    PushKernelArg,
};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use xinf_engine::{KvDtype, PAGE_TOKENS};
use xinf_transfer::LayoutDescriptor;
use xinf_transfer::device::{DeviceLease, DevicePages, DeviceRoute};
use xinf_transfer::gpu::{GpuPages, nvrtc_arch};

mod handoff;
pub(crate) use handoff::GpuHandoff;

const KERNELS: &str = include_str!("gpu/kernels.cu");

/// Warps of one attention block (one query token and head). Each warp walks every
/// `ATTENTION_WARPS`-th key with an online softmax, so the chain of dependent key loads a block
/// waits for is `len / ATTENTION_WARPS` long: at batch 1 a decode step has only `heads` blocks
/// per layer, and with 4 warps the walk over a few hundred keys dominated the step.
const ATTENTION_WARPS: u32 = 16;

/// Largest head dimension the attention kernel holds in registers (32 lanes × 8).
const MAX_HEAD_DIM: usize = 256;

/// Decode steps of at most this many sequences are replayed as CUDA graphs, one graph per batch
/// size: launch overhead dominates small batches, and this bounds the graphs kept to 64.
const MAX_GRAPH_BATCH: usize = 64;

/// Bytes of the workspace given to cuBLAS (32 MiB, what cuBLAS itself uses on Hopper): a
/// workspace of our own means cuBLAS never allocates while a graph is captured, and eager and
/// captured gemms see the same workspace size, so they pick the same algorithms.
const BLAS_WORKSPACE: usize = 32 << 20;

/// Why the GPU backend could not load or run.
#[derive(Debug, thiserror::Error)]
pub(crate) enum GpuError {
    /// The driver or NVRTC is missing, or the GPU could not be opened.
    #[error(transparent)]
    Setup(#[from] xinf_transfer::gpu::GpuError),
    /// cuBLAS could not be loaded.
    #[error("cuBLAS could not be loaded (libcublas.so.13; add the CUDA toolkit's lib64 to LD_LIBRARY_PATH)")]
    NoCublas,
    /// A CUDA call failed.
    #[error("CUDA: {0}")]
    Driver(String),
    /// A cuBLAS call failed.
    #[error("cuBLAS: {0}")]
    Blas(String),
    /// The kernels did not compile.
    #[error("NVRTC: {0}")]
    Compile(String),
    /// The model has a shape the kernels do not handle.
    #[error("unsupported on the GPU: {0}")]
    Unsupported(String),
    /// The weights could not be converted for upload.
    #[error("weights: {0}")]
    Weights(String),
    /// A step or page range does not fit the cache or the model.
    #[error("{0}")]
    Shape(String),
}

fn driver(e: impl std::fmt::Display) -> GpuError {
    GpuError::Driver(e.to_string())
}

/// Bytes of one element.
fn elem_bytes(dt: KvDtype) -> usize {
    match dt {
        KvDtype::F32 => 4,
        KvDtype::F16 | KvDtype::Bf16 => 2,
    }
}

/// The kernels' type code (`WT`/`KT`).
fn type_code(dt: KvDtype) -> u32 {
    match dt {
        KvDtype::F32 => 0,
        KvDtype::F16 => 1,
        KvDtype::Bf16 => 2,
    }
}

fn cuda_type(dt: KvDtype) -> cudaDataType_t {
    match dt {
        KvDtype::F32 => cudaDataType_t::CUDA_R_32F,
        KvDtype::F16 => cudaDataType_t::CUDA_R_16F,
        KvDtype::Bf16 => cudaDataType_t::CUDA_R_16BF,
    }
}

/// The candle dtype weights are loaded in to compute in `dt` on the GPU.
fn candle_dtype(dt: KvDtype) -> DType {
    match dt {
        KvDtype::F32 => DType::F32,
        KvDtype::F16 => DType::F16,
        KvDtype::Bf16 => DType::BF16,
    }
}

/// A device buffer of elements of the weights' dtype, as bytes.
type Buf = CudaSlice<u8>;

struct GpuLayer {
    attn_norm: Buf,
    wqkv: Buf,
    bqkv: Option<Buf>,
    q_norm: Option<Buf>,
    k_norm: Option<Buf>,
    wo: Buf,
    mlp_norm: Buf,
    w_gate_up: Buf,
    w_down: Buf,
}

struct Kernels {
    embed: CudaFunction,
    add_rmsnorm: CudaFunction,
    qkv_post: CudaFunction,
    attention: CudaFunction,
    silu_mul: CudaFunction,
}

/// What one step computes, flattened for the kernels; built and checked on the host.
#[derive(Debug, PartialEq)]
pub(crate) struct StepPlan {
    /// Token ids, all chunks back to back.
    pub(crate) ids: Vec<u32>,
    /// Position of each token.
    pub(crate) pos: Vec<i32>,
    /// Where each token's block table starts in `tables`.
    pub(crate) tab_off: Vec<i32>,
    /// The chunks' block tables (the blocks they reach), back to back.
    pub(crate) tables: Vec<u32>,
    /// Token rows whose logits are wanted, in chunk order.
    pub(crate) rows: Vec<i32>,
}

/// Flattens a step and checks everything a kernel will index with: token ids below `vocab`,
/// positions below `max_positions` (the RoPE table), block tables that cover every position
/// with blocks below `num_blocks`.
pub(crate) fn plan_step(
    chunks: &[Chunk<'_>],
    block_size: usize,
    num_blocks: usize,
    vocab: usize,
    max_positions: usize,
) -> Result<StepPlan, String> {
    let mut p = StepPlan {
        ids: Vec::new(),
        pos: Vec::new(),
        tab_off: Vec::new(),
        tables: Vec::new(),
        rows: Vec::new(),
    };
    for c in chunks {
        let end = c.start + c.tokens.len();
        if end > max_positions {
            return Err(format!("position {} is past the model's {max_positions}", end - 1));
        }
        let blocks = end.div_ceil(block_size);
        let table = c
            .block_table
            .get(..blocks)
            .ok_or_else(|| format!("a block table of {} blocks for {end} tokens", c.block_table.len()))?;
        if let Some(b) = table.iter().find(|&&b| b as usize >= num_blocks) {
            return Err(format!("block {b} is outside the cache's {num_blocks}"));
        }
        if let Some(t) = c.tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(format!("token {t} is outside the vocabulary of {vocab}"));
        }
        let off = p.tables.len() as i32;
        p.tables.extend_from_slice(table);
        for (i, &t) in c.tokens.iter().enumerate() {
            p.ids.push(t);
            p.pos.push((c.start + i) as i32);
            p.tab_off.push(off);
        }
        if c.want_logits && !c.tokens.is_empty() {
            p.rows.push(p.ids.len() as i32 - 1);
        }
    }
    if p.tables.is_empty() {
        p.tables.push(0);
    }
    Ok(p)
}

/// What the persistent step buffers are sized for, and whether decode steps replay CUDA graphs.
#[derive(Debug, Clone)]
pub(crate) struct StepLimits {
    /// Tokens of the largest step the engine forms (`max_batch_tokens`, at least
    /// `max_num_seqs`, since every running sequence gets its decode token).
    pub(crate) max_tokens: usize,
    /// Sequences of one step at most (`max_num_seqs`): the rows of logits a step returns.
    pub(crate) max_seqs: usize,
    /// Replay decode-only steps as CUDA graphs (engine option `cuda_graphs`).
    pub(crate) cuda_graphs: bool,
    /// Counts the steps computed by replaying a graph; the engine reads it for tests and
    /// benchmarks.
    pub(crate) graph_steps: Arc<AtomicU64>,
}

/// The device side of one step: the plan's arrays and the scratch the forward pass writes.
///
/// The model keeps one set for its whole life, sized by [`StepLimits`], filled prefix by prefix
/// each step: no allocation per step, and fixed addresses, which a captured graph needs. A step
/// that does not fit (a long prompt given to `prompt_logits` alone) gets a set of its own.
///
/// Nothing needs zeroing between steps, except `delta`, because the kernels only read, per
/// buffer, what the same step wrote before: `x` is written for every token by `embed`; `act`
/// by `add_rmsnorm` (token rows × hidden), `attention` (× heads × head_dim) and `silu_mul`
/// (× intermediate) before each matmul reads that many; `qkv`, `gu` and `logits` are matmul
/// outputs written whole for the step's rows; `q` is written by `qkv_post` for every Q head and
/// every element (RoPE writes both halves of an even head dimension, which the config checks);
/// the plan's arrays are uploaded for the step's tokens, tables and rows. `delta` is read by the
/// first layer's residual add before anything wrote it, so its prefix is cleared at the start
/// of each step (in the graph too).
struct StepBufs {
    ids: CudaSlice<u32>,
    pos: CudaSlice<i32>,
    tab_off: CudaSlice<i32>,
    tables: CudaSlice<u32>,
    rows: CudaSlice<i32>,
    x: CudaSlice<f32>,
    delta: CudaSlice<f32>,
    act: Buf,
    qkv: CudaSlice<f32>,
    q: CudaSlice<f32>,
    gu: CudaSlice<f32>,
    logits: CudaSlice<f32>,
}

impl StepBufs {
    /// Buffers for steps of up to `tokens` tokens, `tables` block-table entries and `rows` rows
    /// of logits (each at least 1).
    fn new(
        s: &Arc<CudaStream>,
        cfg: &ModelConfig,
        es: usize,
        tokens: usize,
        tables: usize,
        rows: usize,
    ) -> Result<Self, GpuError> {
        let (t, tables, rows) = (tokens.max(1), tables.max(1), rows.max(1));
        let (h, kvh, d) = (cfg.num_heads, cfg.kv_heads, cfg.head_dim);
        let (hid, inter) = (cfg.hidden_size, cfg.intermediate_size);
        Ok(Self {
            ids: s.alloc_zeros(t).map_err(driver)?,
            pos: s.alloc_zeros(t).map_err(driver)?,
            tab_off: s.alloc_zeros(t).map_err(driver)?,
            tables: s.alloc_zeros(tables).map_err(driver)?,
            rows: s.alloc_zeros(rows).map_err(driver)?,
            x: s.alloc_zeros(t * hid).map_err(driver)?,
            delta: s.alloc_zeros(t * hid).map_err(driver)?,
            act: s.alloc_zeros(t * hid.max(h * d).max(inter) * es).map_err(driver)?,
            qkv: s.alloc_zeros(t * (h + 2 * kvh) * d).map_err(driver)?,
            q: s.alloc_zeros(t * h * d).map_err(driver)?,
            gu: s.alloc_zeros(t * 2 * inter).map_err(driver)?,
            logits: s.alloc_zeros(rows * cfg.vocab_size).map_err(driver)?,
        })
    }

    /// Whether `plan` fits these buffers.
    fn fits(&self, plan: &StepPlan) -> bool {
        plan.ids.len() <= self.ids.len()
            && plan.tables.len() <= self.tables.len()
            && plan.rows.len() <= self.rows.len()
    }

    /// Copies the plan into the buffers' prefixes, ordered on `s` before the step's kernels.
    fn upload(&mut self, s: &Arc<CudaStream>, plan: &StepPlan) -> Result<(), GpuError> {
        if !self.fits(plan) {
            return Err(GpuError::Shape("a step larger than its buffers".into()));
        }
        s.memcpy_htod(&plan.ids[..], &mut self.ids).map_err(driver)?;
        s.memcpy_htod(&plan.pos[..], &mut self.pos).map_err(driver)?;
        s.memcpy_htod(&plan.tab_off[..], &mut self.tab_off).map_err(driver)?;
        s.memcpy_htod(&plan.tables[..], &mut self.tables).map_err(driver)?;
        if !plan.rows.is_empty() {
            s.memcpy_htod(&plan.rows[..], &mut self.rows).map_err(driver)?;
        }
        Ok(())
    }
}

/// Gives `blas` a workspace of [`BLAS_WORKSPACE`] bytes of its own, allocated on `stream`; the
/// buffer must outlive the handle. Call it after any `cublasSetStream`, which would reset it.
fn give_workspace(blas: &CudaBlas, stream: &Arc<CudaStream>) -> Result<Buf, GpuError> {
    // cuBLAS wants a workspace aligned to 256 bytes: over-allocate and round the address up.
    let workspace = stream.alloc_zeros::<u8>(BLAS_WORKSPACE + 256).map_err(driver)?;
    let aligned = {
        let (base, _sync) = workspace.device_ptr(stream);
        base.div_ceil(256) * 256
    };
    // SAFETY: `aligned..aligned + BLAS_WORKSPACE` lies inside the allocation above (rounding up
    // moves at most 255 of its 256 spare bytes); the callers keep the buffer in a field declared
    // after the handle's, so it is freed after the handle is destroyed. Neither handle's stream
    // is changed afterwards.
    unsafe {
        cudarc::cublas::sys::cublasSetWorkspace_v2(
            *blas.handle(),
            aligned as *mut std::ffi::c_void,
            BLAS_WORKSPACE,
        )
    }
    .result()
    .map_err(|e| GpuError::Blas(format!("setting the workspace: {e}")))?;
    Ok(workspace)
}

/// A stream and the cuBLAS handle that enqueues on it: where a step's work goes.
#[derive(Clone, Copy)]
struct Lane<'a> {
    stream: &'a Arc<CudaStream>,
    blas: &'a CudaBlas,
}

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
    after_main: cudarc::driver::CudaEvent,
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

/// A captured decode step, replayed on the graph lane's stream.
struct Graph(CudaGraph);

// SAFETY: a CUDA graph may be used from any thread as long as calls on it are serialized (it
// is not internally synchronized). This one is owned by `GpuModel`, which is used through
// `&mut self` by the one engine thread at a time that owns it, so every call is serialized.
unsafe impl Send for Graph {}

/// Where decode steps of one batch size stand.
enum Slot {
    /// Not seen yet: the first such step runs eagerly, which warms cuBLAS up (its algorithm
    /// choice and kernel loading for these shapes) outside any capture.
    Cold,
    /// Seen once: the next such step is captured.
    Warm,
    /// Captured: replayed from now on.
    Ready(Graph),
}

/// The GPU backend: one model on one GPU, with its KV cache.
pub(crate) struct GpuModel {
    cfg: ModelConfig,
    /// The weights' (compute) dtype.
    wdt: KvDtype,
    /// The cache's dtype.
    kdt: KvDtype,
    desc: LayoutDescriptor,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    blas: CudaBlas,
    pages: GpuPages,
    k: Kernels,
    embed: Buf,
    layers: Vec<GpuLayer>,
    final_norm: Buf,
    /// `None` when tied to the embedding.
    lm_head: Option<Buf>,
    cos: CudaSlice<f32>,
    sin: CudaSlice<f32>,
    max_positions: usize,
    /// The cache: one buffer per region of `desc`, in `kdt`.
    regions: Vec<Buf>,
    /// Device address of each `(layer, K/V)` plane.
    planes: Vec<[u64; 2]>,
    /// Staging and receiving for GPU-to-GPU handoffs.
    handoff: Arc<GpuHandoff>,
    /// Captured decode steps, indexed by batch size (dropped before the buffers they use).
    graphs: Vec<Slot>,
    /// Where decode steps run when graphs are on (`None` when off).
    graph_lane: Option<GraphLane>,
    /// Off by the `cuda_graphs` option, or after a capture failed.
    graphs_on: bool,
    /// Steps computed by replaying a graph.
    graph_steps: Arc<AtomicU64>,
    /// The step's device buffers; `None` only while a step holds them.
    bufs: Option<StepBufs>,
    /// A stand-in for absent optional weights (never read: the kernels check the flags).
    none: Buf,
    /// The memory cuBLAS works in (set on `blas`, so declared after it: freed after the handle).
    _blas_workspace: Buf,
}

impl std::fmt::Debug for GpuModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuModel").field("ordinal", &self.ctx.ordinal()).finish_non_exhaustive()
    }
}

fn upload(stream: &Arc<CudaStream>, t: &Tensor, dt: KvDtype) -> Result<Buf, GpuError> {
    let w = |e: candle_core::Error| GpuError::Weights(e.to_string());
    let flat = t.flatten_all().and_then(|t| t.to_dtype(candle_dtype(dt))).map_err(w)?;
    let bytes: Vec<u8> = match dt {
        KvDtype::F32 => flat.to_vec1::<f32>().map_err(w)?.iter().flat_map(|v| v.to_le_bytes()).collect(),
        KvDtype::F16 => {
            flat.to_vec1::<half::f16>().map_err(w)?.iter().flat_map(|v| v.to_bits().to_le_bytes()).collect()
        }
        KvDtype::Bf16 => {
            flat.to_vec1::<half::bf16>().map_err(w)?.iter().flat_map(|v| v.to_bits().to_le_bytes()).collect()
        }
    };
    stream.clone_htod(&bytes).map_err(driver)
}

fn opt_upload(stream: &Arc<CudaStream>, t: &Option<Tensor>, dt: KvDtype) -> Result<Option<Buf>, GpuError> {
    t.as_ref().map(|t| upload(stream, t, dt)).transpose()
}

fn cfg1(blocks: u32, threads: u32) -> LaunchConfig {
    LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (threads, 1, 1), shared_mem_bytes: 0 }
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
        if cfg.head_dim > MAX_HEAD_DIM {
            return Err(GpuError::Unsupported(format!("head_dim {} (at most {MAX_HEAD_DIM})", cfg.head_dim)));
        }
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
        let (major, minor) = ctx.compute_capability().map_err(driver)?;
        let src = format!(
            "#define WT {}\n#define KT {}\n#define WARPS {ATTENTION_WARPS}\n{KERNELS}",
            type_code(wdt),
            type_code(kdt)
        );
        let opts =
            cudarc::nvrtc::CompileOptions { arch: Some(nvrtc_arch(major, minor)), ..Default::default() };
        let ptx =
            cudarc::nvrtc::compile_ptx_with_opts(src, opts).map_err(|e| GpuError::Compile(e.to_string()))?;
        let module = ctx.load_module(ptx).map_err(driver)?;
        let f = |name: &str| module.load_function(name).map_err(driver);
        let k = Kernels {
            embed: f("embed")?,
            add_rmsnorm: f("add_rmsnorm")?,
            qkv_post: f("qkv_post")?,
            attention: f("attention")?,
            silu_mul: f("silu_mul")?,
        };
        let s = &stream;
        let mut layers = Vec::with_capacity(w.layers.len());
        for l in &w.layers {
            layers.push(GpuLayer {
                attn_norm: upload(s, &l.attn_norm, wdt)?,
                wqkv: upload(s, &l.wqkv, wdt)?,
                bqkv: opt_upload(s, &l.bqkv, wdt)?,
                q_norm: opt_upload(s, &l.q_norm, wdt)?,
                k_norm: opt_upload(s, &l.k_norm, wdt)?,
                wo: upload(s, &l.wo, wdt)?,
                mlp_norm: upload(s, &l.mlp_norm, wdt)?,
                w_gate_up: upload(s, &l.w_gate_up, wdt)?,
                w_down: upload(s, &l.w_down, wdt)?,
            });
        }
        let embed = upload(s, &w.embed, wdt)?;
        let lm_head = if cfg.tie_word_embeddings { None } else { Some(upload(s, &w.lm_head, wdt)?) };
        let final_norm = upload(s, &w.final_norm, wdt)?;
        // The same tables as the CPU backend: f32 angles from Hugging Face's inverse frequencies.
        let inv = inv_freq(&cfg);
        let mut cos = Vec::with_capacity(max_positions * inv.len());
        let mut sin = Vec::with_capacity(max_positions * inv.len());
        for p in 0..max_positions {
            for f in &inv {
                let a = p as f32 * f;
                cos.push(a.cos());
                sin.push(a.sin());
            }
        }
        let cos = s.clone_htod(&cos).map_err(driver)?;
        let sin = s.clone_htod(&sin).map_err(driver)?;
        // The cache, region by region, and the farthest element any row can reach in each plane.
        let es = elem_bytes(kdt);
        let mut regions = Vec::with_capacity(desc.num_regions);
        for _ in 0..desc.num_regions {
            regions.push(s.alloc_zeros::<u8>(desc.region_len * es).map_err(driver)?);
        }
        let reach = (desc.num_blocks - 1) * desc.s_blk
            + (desc.block_size() - 1) * desc.s_tok
            + (desc.kv_heads - 1) * desc.s_head
            + desc.head_dim;
        let mut planes = Vec::with_capacity(desc.num_layers);
        for (layer, pl) in desc.planes.iter().enumerate() {
            let mut pair = [0u64; 2];
            for kv in 0..2 {
                let plane = pl[kv];
                if plane.region >= regions.len() || plane.offset + reach > desc.region_len {
                    return Err(GpuError::Shape(format!("layer {layer} reaches past its region")));
                }
                let (base, _sync) = regions[plane.region].device_ptr(s);
                pair[kv] = base + (plane.offset * es) as u64;
            }
            planes.push(pair);
        }
        if desc.num_layers != cfg.num_layers || desc.kv_heads != cfg.kv_heads || desc.head_dim != cfg.head_dim
        {
            return Err(GpuError::Shape("the KV layout does not match the model".into()));
        }
        // Every sequence's blocks are its own, so the tables of one step hold at most the
        // cache's blocks (one stand-in entry when there are none).
        let bufs = StepBufs::new(
            s,
            &cfg,
            elem_bytes(wdt),
            limits.max_tokens.max(limits.max_seqs),
            desc.num_blocks,
            limits.max_seqs,
        )?;
        let none = s.alloc_zeros::<u8>(16).map_err(driver)?;
        let graph_sizes = if limits.cuda_graphs { limits.max_seqs.min(MAX_GRAPH_BATCH) + 1 } else { 0 };
        let graph_lane = if limits.cuda_graphs { Some(GraphLane::new(&ctx)?) } else { None };
        stream.synchronize().map_err(driver)?;
        let handoff = Arc::new(GpuHandoff::new(&ctx)?);
        Ok(Self {
            graphs: (0..graph_sizes).map(|_| Slot::Cold).collect(),
            graph_lane,
            graphs_on: limits.cuda_graphs,
            graph_steps: limits.graph_steps,
            bufs: Some(bufs),
            none,
            _blas_workspace: blas_workspace,
            handoff,
            cfg,
            wdt,
            kdt,
            desc,
            ctx,
            stream,
            blas,
            pages,
            k,
            embed,
            layers,
            final_norm,
            lm_head,
            cos,
            sin,
            max_positions,
            regions,
            planes,
        })
    }

    /// `y[t][o] = Σ_i x[t][i] · w[o][i]` for `t < rows`: `w` is `[out, inp]` in the weights'
    /// dtype, `x` `[rows, inp]` in the weights' dtype, `y` `[rows, out]` f32, enqueued on `lane`.
    fn matmul(
        &self,
        lane: Lane<'_>,
        w: &Buf,
        x: &Buf,
        y: &mut CudaSlice<f32>,
        [out, inp, rows]: [usize; 3],
    ) -> Result<(), GpuError> {
        let es = elem_bytes(self.wdt);
        if w.len() < out * inp * es || x.len() < rows * inp * es || y.len() < rows * out {
            return Err(GpuError::Shape(format!(
                "matmul [{rows}, {inp}] × [{out}, {inp}]ᵀ over short buffers"
            )));
        }
        let ty = cuda_type(self.wdt);
        let (alpha, beta) = (1.0f32, 0.0f32);
        let (wp, _w) = w.device_ptr(lane.stream);
        let (xp, _x) = x.device_ptr(lane.stream);
        let (yp, _y) = y.device_ptr_mut(lane.stream);
        // Column-major view: Yᵀ[out, rows] = W[out, inp] (row-major Wᵀ, transposed) · Xᵀ[inp, rows].
        // SAFETY: the three buffers were checked above to hold the matrices the sizes and
        // leading dimensions describe; alpha and beta are f32 as CUBLAS_COMPUTE_32F requires,
        // and live until the call returns (cuBLAS reads host scalars before returning).
        unsafe {
            cudarc::cublas::result::gemm_ex(
                *lane.blas.handle(),
                cublasOperation_t::CUBLAS_OP_T,
                cublasOperation_t::CUBLAS_OP_N,
                out as i32,
                rows as i32,
                inp as i32,
                (&alpha) as *const f32 as *const _,
                wp as *const _,
                ty,
                inp as i32,
                xp as *const _,
                ty,
                inp as i32,
                (&beta) as *const f32 as *const _,
                yp as *mut _,
                cudaDataType_t::CUDA_R_32F,
                out as i32,
                cublasComputeType_t::CUBLAS_COMPUTE_32F,
                cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|e| GpuError::Blas(e.to_string()))
    }

    fn step(&mut self, chunks: &[Chunk<'_>]) -> Result<Vec<Vec<f32>>, GpuError> {
        let cfg = &self.cfg;
        let plan = plan_step(
            chunks,
            self.desc.block_size(),
            self.desc.num_blocks,
            cfg.vocab_size,
            self.max_positions,
        )
        .map_err(GpuError::Shape)?;
        if plan.ids.is_empty() {
            return Ok(Vec::new());
        }
        self.ctx.bind_to_thread().map_err(driver)?;
        // Decode-only steps (one token per sequence, each wanting its logits) are the ones whose
        // launches depend on the batch size alone: everything else about them (ids, positions,
        // block tables, rows) is read from device memory.
        let decode = chunks.iter().all(|c| c.tokens.len() == 1 && c.want_logits);
        match self.bufs.take() {
            Some(mut bufs) if bufs.fits(&plan) => {
                let out = self.run(&mut bufs, &plan, decode);
                self.bufs = Some(bufs);
                out
            }
            kept => {
                self.bufs = kept;
                let es = elem_bytes(self.wdt);
                let (t, tables, rows) = (plan.ids.len(), plan.tables.len(), plan.rows.len());
                let mut own = StepBufs::new(&self.stream, &self.cfg, es, t, tables, rows)?;
                self.run(&mut own, &plan, false)
            }
        }
    }

    /// Uploads the plan into `bufs`, computes the step (replaying its graph when `decode` allows
    /// one) and returns the wanted logits.
    fn run(&mut self, bufs: &mut StepBufs, plan: &StepPlan, decode: bool) -> Result<Vec<Vec<f32>>, GpuError> {
        let (t, n_rows, vocab) = (plan.ids.len(), plan.rows.len(), self.cfg.vocab_size);
        // A decode step wants every token's logits, so its rows are `0..t` (what a capture
        // records for batch size `t`).
        let graphed = decode && n_rows == t && self.graphs_on && t < self.graphs.len();
        if let (Some(g), true) = (&self.graph_lane, graphed) {
            // Whatever the default stream still has queued comes first.
            g.after_main.record(&self.stream).map_err(driver)?;
            g.stream.wait(&g.after_main).map_err(driver)?;
        }
        let stream = self.lane(graphed).stream.clone();
        bufs.upload(&stream, plan)?;
        if !(graphed && self.replay(bufs, t)?) {
            self.record(self.lane(graphed), bufs, t, n_rows)?;
        }
        if n_rows == 0 {
            stream.synchronize().map_err(driver)?;
            return Ok(Vec::new());
        }
        let mut host = vec![0f32; n_rows * vocab];
        let wanted = bufs
            .logits
            .try_slice(..n_rows * vocab)
            .ok_or_else(|| GpuError::Shape(format!("{n_rows} rows of logits past the buffer")))?;
        stream.memcpy_dtoh(&wanted, &mut host).map_err(driver)?;
        stream.synchronize().map_err(driver)?;
        Ok(host.chunks_exact(vocab).map(<[f32]>::to_vec).collect())
    }

    /// The graph lane for a step that may use graphs (`graphed`), else the default stream.
    fn lane(&self, graphed: bool) -> Lane<'_> {
        match (&self.graph_lane, graphed) {
            (Some(g), true) => g.lane(),
            _ => Lane { stream: &self.stream, blas: &self.blas },
        }
    }

    /// Launches the graph of a decode step of `t` sequences, capturing it first if this batch
    /// size was seen before; `false` when the step is to run eagerly instead. A failed capture
    /// turns graphs off for good (logged once) rather than failing the step.
    fn replay(&mut self, bufs: &mut StepBufs, t: usize) -> Result<bool, GpuError> {
        if !self.graphs_on || t >= self.graphs.len() || self.graph_lane.is_none() {
            return Ok(false);
        }
        match self.graphs[t] {
            Slot::Cold => {
                self.graphs[t] = Slot::Warm;
                return Ok(false);
            }
            Slot::Warm => match self.capture(bufs, t) {
                Ok(g) => self.graphs[t] = Slot::Ready(g),
                Err(e) => {
                    tracing::warn!(
                        batch = t,
                        "CUDA graph capture failed, decode steps run without graphs from now on: {e}"
                    );
                    // The lane stays: this step still runs on it, eagerly.
                    self.graphs_on = false;
                    self.graphs.clear();
                    return Ok(false);
                }
            },
            Slot::Ready(_) => {}
        }
        let Slot::Ready(g) = &self.graphs[t] else { return Ok(false) };
        g.0.launch().map_err(driver)?;
        self.graph_steps.fetch_add(1, Ordering::Relaxed);
        Ok(true)
    }

    /// Captures the kernels and gemms of a decode step of `t` sequences (nothing runs).
    fn capture(&self, bufs: &mut StepBufs, t: usize) -> Result<Graph, GpuError> {
        let g = self.graph_lane.as_ref().ok_or_else(|| GpuError::Driver("no stream to capture on".into()))?;
        // Thread-local: only this thread's calls that are illegal during a capture break it, not
        // those of other threads using the GPU (GPU-to-GPU handoffs).
        let mode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
        g.stream.begin_capture(mode).map_err(driver)?;
        let recorded = self.record(g.lane(), bufs, t, t);
        // Always end the capture, so the stream leaves capture mode whatever happened.
        let ended = g.stream.end_capture(CUgraphInstantiate_flags(0));
        recorded?;
        let graph = ended.map_err(driver)?.ok_or_else(|| GpuError::Driver("an empty graph".into()))?;
        graph.upload().map_err(driver)?;
        Ok(Graph(graph))
    }

    /// Enqueues the fused residual add and RMSNorm: `x += delta`, then `act = RMSNorm(x) ·
    /// weight`, one block per row — the first `blocks` rows, or the rows listed in `rows` when
    /// `use_rows` (the final norm, for the rows whose logits are wanted).
    #[allow(clippy::too_many_arguments)]
    fn add_rmsnorm(
        &self,
        s: &Arc<CudaStream>,
        x: &mut CudaSlice<f32>,
        delta: &CudaSlice<f32>,
        rows: &CudaSlice<i32>,
        use_rows: bool,
        weight: &Buf,
        act: &mut Buf,
        blocks: u32,
    ) -> Result<(), GpuError> {
        let (hid, eps, use_rows) =
            (self.cfg.hidden_size as i32, self.cfg.rms_norm_eps as f32, i32::from(use_rows));
        let mut b = s.launch_builder(&self.k.add_rmsnorm);
        b.arg(x).arg(delta).arg(rows).arg(&use_rows).arg(weight).arg(act).arg(&hid).arg(&eps);
        // SAFETY: the kernel reads exactly these arguments, in this order and with these types;
        // `record` passes step buffers of at least `blocks` rows of `hidden_size` (and `rows`
        // holding indices below the step's token count), as its SAFETY comment says.
        unsafe { b.launch(cfg1(blocks, 256)) }.map_err(driver)?;
        Ok(())
    }

    /// Enqueues the forward pass of a step of `t` tokens whose plan is in `bufs`, and the
    /// logits of its `n_rows` wanted rows, from the embedding to the lm_head gemm. Every launch
    /// argument depends on the model, `t` and `n_rows` alone, and every buffer is at a fixed
    /// address, so what a capture of this records is valid for any step of the same shape.
    fn record(&self, lane: Lane<'_>, bufs: &mut StepBufs, t: usize, n_rows: usize) -> Result<(), GpuError> {
        let cfg = &self.cfg;
        let s = lane.stream;
        let (h, kvh, d) = (cfg.num_heads, cfg.kv_heads, cfg.head_dim);
        let (hid, inter, vocab) = (cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size);
        let qkv_w = (h + 2 * kvh) * d;
        let eps = cfg.rms_norm_eps as f32;
        let StepBufs { ids, pos, tab_off, tables, rows, x, delta, act, qkv, q, gu, logits } = bufs;
        let (hid_i, t_i) = (hid as i32, t as u32);
        let (bs, s_blk, s_tok, s_head) = (
            self.desc.block_size() as i32,
            self.desc.s_blk as i64,
            self.desc.s_tok as i64,
            self.desc.s_head as i64,
        );
        let (h_i, kvh_i, d_i) = (h as i32, kvh as i32, d as i32);
        let scale = 1.0f32 / (d as f32).sqrt();
        let none = &self.none;
        // The first residual add reads `delta` before any layer wrote it.
        {
            let mut first = delta
                .try_slice_mut(..t * hid)
                .ok_or_else(|| GpuError::Shape(format!("{t} tokens past the step buffers")))?;
            s.memset_zeros(&mut first).map_err(driver)?;
        }

        // SAFETY (every launch below): each kernel reads exactly the arguments pushed, in this
        // order and with these types. Token-indexed buffers hold at least `t` rows of the widths
        // `StepBufs::new` allocated them with (`upload` checked the step fits), and kernels only
        // index rows below `t` (the grid) or below `n_rows` (≤ `t`); the prefixes uploaded this
        // step hold the plan, whose `ids` were checked below the vocabulary (embedding rows),
        // `pos` below `max_positions` (RoPE rows), and every block a position reaches through
        // `tab_off`/`tables` below `num_blocks`, whose farthest element was checked against each
        // plane's region at construction. Weight buffers hold the shapes the model config gives.
        let mut b = s.launch_builder(&self.k.embed);
        b.arg(&*ids).arg(&self.embed).arg(&mut *x).arg(&hid_i);
        unsafe { b.launch(cfg1(t_i, 256)) }.map_err(driver)?;

        for (li, lw) in self.layers.iter().enumerate() {
            self.add_rmsnorm(s, x, delta, rows, false, &lw.attn_norm, act, t_i)?;
            self.matmul(lane, &lw.wqkv, act, qkv, [qkv_w, hid, t])?;

            let has_bias = i32::from(lw.bqkv.is_some());
            let has_norm = i32::from(lw.q_norm.is_some() && lw.k_norm.is_some());
            let bias = lw.bqkv.as_ref().unwrap_or(none);
            let (qn, kn) = match (&lw.q_norm, &lw.k_norm) {
                (Some(a), Some(b)) => (a, b),
                _ => (none, none),
            };
            let [kp, vp] = self.planes[li];
            let mut b = s.launch_builder(&self.k.qkv_post);
            b.arg(&*qkv)
                .arg(bias)
                .arg(&has_bias)
                .arg(qn)
                .arg(kn)
                .arg(&has_norm)
                .arg(&self.cos)
                .arg(&self.sin)
                .arg(&*pos)
                .arg(&*tab_off)
                .arg(&*tables)
                .arg(&kp)
                .arg(&vp)
                .arg(&bs)
                .arg(&s_blk)
                .arg(&s_tok)
                .arg(&s_head)
                .arg(&mut *q)
                .arg(&h_i)
                .arg(&kvh_i)
                .arg(&d_i)
                .arg(&eps);
            let grid = LaunchConfig {
                grid_dim: (t_i, (h + 2 * kvh) as u32, 1),
                block_dim: (128, 1, 1),
                shared_mem_bytes: 0,
            };
            unsafe { b.launch(grid) }.map_err(driver)?;

            let mut b = s.launch_builder(&self.k.attention);
            b.arg(&*q)
                .arg(&kp)
                .arg(&vp)
                .arg(&*pos)
                .arg(&*tab_off)
                .arg(&*tables)
                .arg(&bs)
                .arg(&s_blk)
                .arg(&s_tok)
                .arg(&s_head)
                .arg(&mut *act)
                .arg(&h_i)
                .arg(&kvh_i)
                .arg(&d_i)
                .arg(&scale);
            let grid = LaunchConfig {
                grid_dim: (t_i, h as u32, 1),
                block_dim: (32 * ATTENTION_WARPS, 1, 1),
                shared_mem_bytes: 0,
            };
            unsafe { b.launch(grid) }.map_err(driver)?;
            self.matmul(lane, &lw.wo, act, delta, [hid, h * d, t])?;

            self.add_rmsnorm(s, x, delta, rows, false, &lw.mlp_norm, act, t_i)?;
            self.matmul(lane, &lw.w_gate_up, act, gu, [2 * inter, hid, t])?;

            let (inter_i, n) = (inter as i32, (t * inter) as i64);
            let blocks = (t * inter).div_ceil(256).min(65_535) as u32;
            let mut b = s.launch_builder(&self.k.silu_mul);
            b.arg(&*gu).arg(&mut *act).arg(&inter_i).arg(&n);
            unsafe { b.launch(cfg1(blocks, 256)) }.map_err(driver)?;
            self.matmul(lane, &lw.w_down, act, delta, [hid, inter, t])?;
        }
        if n_rows == 0 {
            return Ok(());
        }
        // The last residual add and the final norm, for the rows whose logits are wanted only
        // (`rows` were built from token indices below `t`).
        self.add_rmsnorm(s, x, delta, rows, true, &self.final_norm, act, n_rows as u32)?;
        let head = self.lm_head.as_ref().unwrap_or(&self.embed);
        self.matmul(lane, head, act, logits, [vocab, hid, n_rows])
    }

    /// The engine's GPU handoff side (its decode-side sink, and where it says its KV lives).
    pub(crate) fn handoff(&self) -> Arc<GpuHandoff> {
        Arc::clone(&self.handoff)
    }

    /// Bytes of one canonical page in the cache's dtype.
    fn page_bytes(&self) -> usize {
        2 * self.desc.num_layers
            * PAGE_TOKENS
            * self.desc.kv_heads
            * self.desc.head_dim
            * elem_bytes(self.kdt)
    }
}

impl ComputeBackend for GpuModel {
    fn forward(&mut self, chunks: &[Chunk<'_>], _cache: &mut KvCache) -> candle_core::Result<Vec<Vec<f32>>> {
        self.step(chunks).map_err(|e| candle_core::Error::Msg(format!("GPU: {e}")))
    }

    fn export_pages(
        &mut self,
        _cache: &mut KvCache,
        table: &[u32],
        len: usize,
        first: usize,
        count: usize,
    ) -> Result<Vec<u8>, String> {
        if count == 0 {
            return Ok(Vec::new());
        }
        let run = || -> Result<Vec<u8>, GpuError> {
            self.ctx.bind_to_thread().map_err(driver)?;
            let mut staging = self.stream.alloc_zeros::<u8>(count * self.page_bytes()).map_err(driver)?;
            let es = elem_bytes(self.kdt);
            self.pages.gather(
                &self.desc,
                es,
                &self.regions,
                table,
                len,
                first..first + count,
                &mut staging,
            )?;
            let host = self.stream.clone_dtoh(&staging).map_err(driver)?;
            self.stream.synchronize().map_err(driver)?;
            Ok(host)
        };
        run().map_err(|e| e.to_string())
    }

    fn export_device(
        &mut self,
        table: &[u32],
        len: usize,
        first: usize,
        count: usize,
        route: DeviceRoute,
    ) -> Result<DeviceLease, String> {
        let run = || -> Result<DeviceLease, GpuError> {
            let bytes = count * self.page_bytes();
            if count == 0 {
                return Err(GpuError::Shape("an export of no pages".into()));
            }
            self.ctx.bind_to_thread().map_err(driver)?;
            let mut staged = self.handoff.export_staging(route, bytes)?;
            let es = elem_bytes(self.kdt);
            let dst = staged.slice_mut()?;
            self.pages.gather(&self.desc, es, &self.regions, table, len, first..first + count, dst)?;
            // The pages are complete before anyone may read them: an event after the gather,
            // waited for before the lease (and so the handle or address) exists.
            let done = self.stream.record_event(None).map_err(driver)?;
            done.synchronize().map_err(driver)?;
            self.handoff.lease(route, staged, bytes)
        };
        run().map_err(|e| e.to_string())
    }

    fn import_device(&mut self, table: &[u32], len: usize, pages: &DevicePages) -> Result<(), String> {
        let count = len.div_ceil(PAGE_TOKENS);
        let need = count * self.page_bytes();
        if pages.len() < need {
            return Err(format!("{} bytes of pages for {len} tokens, {need} expected", pages.len()));
        }
        if count == 0 {
            return Ok(());
        }
        let mut run = || -> Result<(), GpuError> {
            let received = pages
                .get::<handoff::Received>()
                .ok_or_else(|| GpuError::Shape("pages received by another kind of engine".into()))?;
            let src = received.slice()?;
            self.ctx.bind_to_thread().map_err(driver)?;
            let es = elem_bytes(self.kdt);
            self.pages.scatter(&self.desc, es, &mut self.regions, table, len, 0..count, src)?;
            self.stream.synchronize().map_err(driver)
        };
        run().map_err(|e| e.to_string())
    }

    fn import_pages(
        &mut self,
        _cache: &mut KvCache,
        table: &[u32],
        len: usize,
        pages: &[u8],
    ) -> Result<(), String> {
        let count = len.div_ceil(PAGE_TOKENS);
        let need = count * self.page_bytes();
        if pages.len() < need {
            return Err(format!("{} bytes of pages for {len} tokens, {need} expected", pages.len()));
        }
        if count == 0 {
            return Ok(());
        }
        let mut run = || -> Result<(), GpuError> {
            self.ctx.bind_to_thread().map_err(driver)?;
            let staging = self.stream.clone_htod(&pages[..need]).map_err(driver)?;
            let es = elem_bytes(self.kdt);
            self.pages.scatter(&self.desc, es, &mut self.regions, table, len, 0..count, &staging)?;
            self.stream.synchronize().map_err(driver)
        };
        run().map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests;
