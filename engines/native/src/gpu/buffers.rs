//! Device memory of the GPU backend besides the cache: the weights, uploaded once; the
//! buffers a step's plan and scratch live in, kept for the model's life; and cuBLAS's
//! workspace.

// cuBLAS's workspace is set through a raw device pointer; the SAFETY comment says why that is
// sound.
#![allow(unsafe_code)]

use super::error::{GpuError, driver};
use super::plan::{MAX_SPLITS, StepCapacity, StepPlan};
use crate::weights::{Weights, with_le_bytes};
use candle_core::{DType, Tensor};
use cudarc::cublas::CudaBlas;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use std::sync::Arc;
use xinf_engine::KvDtype;
use xinf_models::ModelConfig;

/// Bytes of the workspace given to cuBLAS (32 MiB, what cuBLAS itself uses on Hopper): a
/// workspace of our own means cuBLAS never allocates while a graph is captured, and eager and
/// captured gemms see the same workspace size, so they pick the same algorithms.
const BLAS_WORKSPACE: usize = 32 << 20;

/// A device buffer of elements of the weights' dtype, as bytes.
pub(super) type Buf = CudaSlice<u8>;

/// One layer's weights on the device.
pub(super) struct GpuLayer {
    pub(super) attn_norm: Buf,
    pub(super) wqkv: Buf,
    pub(super) bqkv: Option<Buf>,
    pub(super) q_norm: Option<Buf>,
    pub(super) k_norm: Option<Buf>,
    pub(super) wo: Buf,
    pub(super) mlp_norm: Buf,
    pub(super) w_gate_up: Buf,
    pub(super) w_down: Buf,
}

/// The model's weights on the device, in the weights' (compute) dtype.
pub(super) struct GpuWeights {
    pub(super) embed: Buf,
    pub(super) layers: Vec<GpuLayer>,
    pub(super) final_norm: Buf,
    /// `None` when tied to the embedding.
    pub(super) lm_head: Option<Buf>,
}

impl GpuWeights {
    /// Uploads `w` converted to `wdt`; the lm_head only when not tied to the embedding.
    pub(super) fn upload(
        s: &Arc<CudaStream>,
        w: &Weights,
        wdt: KvDtype,
        tied: bool,
    ) -> Result<Self, GpuError> {
        let mut layers = Vec::with_capacity(w.layers.len());
        for l in &w.layers {
            layers.push(GpuLayer {
                attn_norm: upload(s, &l.attn_norm, wdt)?,
                wqkv: upload_linear(s, &l.wqkv, wdt)?,
                bqkv: opt_upload(s, &l.bqkv, wdt)?,
                q_norm: opt_upload(s, &l.q_norm, wdt)?,
                k_norm: opt_upload(s, &l.k_norm, wdt)?,
                wo: upload_linear(s, &l.wo, wdt)?,
                mlp_norm: upload(s, &l.mlp_norm, wdt)?,
                w_gate_up: upload_linear(s, &l.w_gate_up, wdt)?,
                w_down: upload_linear(s, &l.w_down, wdt)?,
            });
        }
        let embed = upload(s, &w.embed, wdt)?;
        let lm_head = if tied { None } else { Some(upload_linear(s, &w.lm_head, wdt)?) };
        let final_norm = upload(s, &w.final_norm, wdt)?;
        Ok(Self { embed, layers, final_norm, lm_head })
    }

    /// The matrix the logits come from.
    pub(super) fn head(&self) -> &Buf {
        self.lm_head.as_ref().unwrap_or(&self.embed)
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

/// [`upload`] of a projection (loaded dense for a GPU).
fn upload_linear(stream: &Arc<CudaStream>, l: &crate::weights::Linear, dt: KvDtype) -> Result<Buf, GpuError> {
    upload(stream, l.dense().map_err(|e| GpuError::Weights(e.to_string()))?, dt)
}

fn upload(stream: &Arc<CudaStream>, t: &Tensor, dt: KvDtype) -> Result<Buf, GpuError> {
    let w = |e: candle_core::Error| GpuError::Weights(e.to_string());
    with_le_bytes(t, candle_dtype(dt), |bytes| stream.clone_htod(bytes)).map_err(w)?.map_err(driver)
}

fn opt_upload(stream: &Arc<CudaStream>, t: &Option<Tensor>, dt: KvDtype) -> Result<Option<Buf>, GpuError> {
    t.as_ref().map(|t| upload(stream, t, dt)).transpose()
}

/// The device side of one step: the plan's arrays and the scratch the forward pass writes.
///
/// The model keeps one set for its whole life, sized by [`super::StepLimits`], filled prefix
/// by prefix each step: no allocation per step, and fixed addresses, which a captured graph
/// needs. A step that does not fit (a long prompt given to `prompt_logits` alone) gets a set
/// of its own.
///
/// Nothing needs zeroing between steps, because the kernels only read, per buffer, what the
/// same step wrote before: `x` is written for every token by `embed` (and then added into);
/// `act` by `rmsnorm` (token rows × hidden), `attention` (× heads × head_dim) and `silu_mul`
/// (× intermediate) before each matmul reads that many; `qkv`, `gu` and `logits` are matmul
/// outputs written whole for the step's rows; `q` is written by `qkv_post` for every Q head and
/// every element (RoPE writes both halves of an even head dimension, which the config checks);
/// the plan's arrays are uploaded for the step's tokens, tables and rows.
pub(super) struct StepBufs {
    /// The room the buffers below were allocated with.
    capacity: StepCapacity,
    pub(super) ids: CudaSlice<u32>,
    pub(super) pos: CudaSlice<i32>,
    pub(super) tab_off: CudaSlice<i32>,
    pub(super) tables: CudaSlice<u32>,
    pub(super) rows: CudaSlice<i32>,
    /// `flash_prefill`'s tiles (pairs; at most one per token) and `attention`'s listed tokens.
    pub(super) tiles: CudaSlice<i32>,
    pub(super) singles: CudaSlice<i32>,
    /// The residual stream, `[tokens][hidden]` in the weights' dtype (as PyTorch keeps it): the
    /// output and down products add into it.
    pub(super) x: Buf,
    pub(super) act: Buf,
    /// The QKV projection, in the weights' dtype.
    pub(super) qkv: Buf,
    /// Q after its norm and RoPE, `[tokens][heads][head_dim]` in the cache's dtype: attention
    /// multiplies it with the cached keys in that type, and reads it in half the bytes of f32.
    pub(super) q: Buf,
    /// The gate/up projection, in the weights' dtype.
    pub(super) gu: Buf,
    pub(super) logits: CudaSlice<f32>,
    /// Each row's largest logit's index (`argmax_rows`).
    pub(super) argmax: CudaSlice<u32>,
    /// `attention`'s partial results when it splits a query's keys: `[part_rows][heads]
    /// [MAX_SPLITS][head_dim + 2]`.
    pub(super) part: CudaSlice<f32>,
    /// Queries `part` holds: as many as rows of logits (every decode token of a full batch).
    pub(super) part_rows: usize,
    /// How many splits of each `attention` block's query have written their partial, `[part_rows]
    /// [heads]` (the last one merges them and sets the count back to 0).
    pub(super) counters: CudaSlice<u32>,
    /// `flash_decode`'s blocks dealt to the step's queries (`plan::deal_decode_blocks`): as many
    /// as the most splits of the partial buffer's rows, or one a token past them.
    pub(super) deal: CudaSlice<i32>,
}

impl StepBufs {
    /// Buffers for steps within `capacity`, for weights in `wdt` and a cache in `kdt`.
    pub(super) fn new(
        s: &Arc<CudaStream>,
        cfg: &ModelConfig,
        [wdt, kdt]: [KvDtype; 2],
        capacity: StepCapacity,
    ) -> Result<Self, GpuError> {
        let StepCapacity { tokens: t, tables, rows } = capacity;
        let (es, kes) = (wdt.size(), kdt.size());
        let (h, kvh, d) = (cfg.num_heads, cfg.kv_heads, cfg.head_dim);
        let (hid, inter) = (cfg.hidden_size, cfg.intermediate_size);
        Ok(Self {
            capacity,
            ids: s.alloc_zeros(t).map_err(driver)?,
            pos: s.alloc_zeros(t).map_err(driver)?,
            tab_off: s.alloc_zeros(t).map_err(driver)?,
            tables: s.alloc_zeros(tables).map_err(driver)?,
            rows: s.alloc_zeros(rows).map_err(driver)?,
            tiles: s.alloc_zeros(2 * t).map_err(driver)?,
            singles: s.alloc_zeros(t).map_err(driver)?,
            x: s.alloc_zeros(t * hid * es).map_err(driver)?,
            act: s.alloc_zeros(t * hid.max(h * d).max(inter) * es).map_err(driver)?,
            qkv: s.alloc_zeros(t * (h + 2 * kvh) * d * es).map_err(driver)?,
            q: s.alloc_zeros(t * h * d * kes).map_err(driver)?,
            gu: s.alloc_zeros(t * 2 * inter * es).map_err(driver)?,
            logits: s.alloc_zeros(rows * cfg.vocab_size).map_err(driver)?,
            argmax: s.alloc_zeros(rows).map_err(driver)?,
            part: s.alloc_zeros(rows * h * MAX_SPLITS * (d + 2)).map_err(driver)?,
            part_rows: rows,
            counters: s.alloc_zeros(rows * h).map_err(driver)?,
            deal: s.alloc_zeros((rows * MAX_SPLITS).max(t)).map_err(driver)?,
        })
    }

    /// Whether `plan` fits these buffers.
    pub(super) fn fits(&self, plan: &StepPlan) -> bool {
        self.capacity.fits(plan)
    }

    /// Copies the plan and `flash_decode`'s deal into the buffers' prefixes, ordered on `s`
    /// before the step's kernels.
    pub(super) fn upload(
        &mut self,
        s: &Arc<CudaStream>,
        plan: &StepPlan,
        deal: &[i32],
    ) -> Result<(), GpuError> {
        if !self.fits(plan) || deal.len() > self.deal.len() {
            return Err(GpuError::Shape("a step larger than its buffers".into()));
        }
        if !deal.is_empty() {
            s.memcpy_htod(deal, &mut self.deal).map_err(driver)?;
        }
        s.memcpy_htod(&plan.ids[..], &mut self.ids).map_err(driver)?;
        s.memcpy_htod(&plan.pos[..], &mut self.pos).map_err(driver)?;
        s.memcpy_htod(&plan.tab_off[..], &mut self.tab_off).map_err(driver)?;
        s.memcpy_htod(&plan.tables[..], &mut self.tables).map_err(driver)?;
        if !plan.rows.is_empty() {
            s.memcpy_htod(&plan.rows[..], &mut self.rows).map_err(driver)?;
        }
        if !plan.tiles.is_empty() {
            s.memcpy_htod(&plan.tiles[..], &mut self.tiles).map_err(driver)?;
        }
        if !plan.singles.is_empty() {
            s.memcpy_htod(&plan.singles[..], &mut self.singles).map_err(driver)?;
        }
        Ok(())
    }
}

/// Gives `blas` a workspace of [`BLAS_WORKSPACE`] bytes of its own, allocated on `stream`; the
/// buffer must outlive the handle. Call it after any `cublasSetStream`, which would reset it.
pub(super) fn give_workspace(blas: &CudaBlas, stream: &Arc<CudaStream>) -> Result<Buf, GpuError> {
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
