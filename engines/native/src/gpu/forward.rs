//! The forward pass of one step, enqueued kernel by kernel and gemm by gemm.
//!
//! Embedding gather; per layer RMSNorm, one QKV matmul, a kernel that adds the bias,
//! normalizes Q/K heads (Qwen3), applies RoPE and writes K and V into the cache through the
//! block table, paged attention over each token's own sequence (prefill chunks and decode
//! tokens alike), the output projection, RMSNorm, the fused gate/up matmul, SiLU·up, the down
//! projection; the output and down projections add into the residual stream themselves, so a
//! norm only reads the stream. In decode steps of one sequence of a small model
//! (`Forward::norms_fused`) the norms run inside the products after them instead: six kernels
//! a layer, not eight, summing the same values in the same order. The layers' matmuls
//! accumulate in f32 and write their outputs in the model's dtype (as the weights, the matmul
//! inputs, the residual stream and the cache are), which the kernels after them read back into
//! f32 (the QKV post-processing, SiLU·up): rounded once, as a model computed in its own dtype
//! rounds them, at half the bytes an f32 copy writes and reads. The residual stream is rounded
//! at each add, as PyTorch's models add in their dtype (cuBLAS adds the product before
//! rounding it, so rounds once where PyTorch rounds twice). The logits are f32. Kernels are
//! compiled at run time with NVRTC, for the weights' and the cache's dtypes.

// cudarc's kernel launches, cuBLAS calls and raw device pointers are `unsafe`. Every index a
// kernel computes comes from values checked on the host (the step plan, the layout's reach
// checked against each region at construction), which is what makes each call sound; the
// SAFETY comments say which check covers which call.
#![allow(unsafe_code)]

mod kernels;
mod products;

use kernels::{Kernels, sm_count};
use products::Rows;

use super::buffers::{Buf, GpuLayer, GpuWeights, StepBufs};
use super::error::{GpuError, driver};
use super::flash::Flash;
use super::pages::CacheView;
use super::plan::{
    ATTENTION_WARPS, DECODE_WARPS, StepPlan, StepShape, attention_group, attention_heads, attention_splits,
    deal_decode_blocks, decode_splits, decode_tile_keys, gemv_glu_fits, gemv_glu_groups, gemv_groups,
    norm_groups_fit, norms_fused_fit, rope_tables,
};
use crate::weights::Weights;
use cudarc::cublas::CudaBlas;
use cudarc::cublas::sys::cudaDataType_t;
use cudarc::driver::{CudaFunction, CudaSlice, CudaStream, LaunchConfig, PushKernelArg};
use std::sync::Arc;
use xinf_engine::KvDtype;
use xinf_models::ModelConfig;

/// A stream and the cuBLAS handle that enqueues on it: where a step's work goes.
#[derive(Clone, Copy)]
pub(super) struct Lane<'a> {
    pub(super) stream: &'a Arc<CudaStream>,
    pub(super) blas: &'a CudaBlas,
}

fn cuda_type(dt: KvDtype) -> cudaDataType_t {
    match dt {
        KvDtype::F32 => cudaDataType_t::CUDA_R_32F,
        KvDtype::F16 => cudaDataType_t::CUDA_R_16F,
        KvDtype::Bf16 => cudaDataType_t::CUDA_R_16BF,
    }
}

/// `qkv_post`'s launch for `t` tokens of `heads` heads (Q, K and V) of `hd`: for heads of a
/// multiple of 64 up to 512, a token's heads in blocks of whole warps, `hd / 16` threads a head;
/// else a warp a head, eight a block.
fn qkv_post_grid(t: usize, heads: usize, hd: usize) -> LaunchConfig {
    let (threads, y) = if hd.is_multiple_of(64) && hd <= 512 {
        let per = heads * (hd / 16);
        let threads = per.next_multiple_of(32).min(1024);
        (threads, per.div_ceil(threads))
    } else {
        (256, heads.div_ceil(8))
    };
    LaunchConfig { grid_dim: (t as u32, y as u32, 1), block_dim: (threads as u32, 1, 1), shared_mem_bytes: 0 }
}

fn cfg1(blocks: u32, threads: u32) -> LaunchConfig {
    LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (threads, 1, 1), shared_mem_bytes: 0 }
}

/// What the forward pass reads besides a step's buffers and the cache: the model, its kernels
/// and weights, and the RoPE tables.
pub(super) struct Forward {
    cfg: ModelConfig,
    /// The weights' (compute) dtype.
    wdt: KvDtype,
    k: Kernels,
    w: GpuWeights,
    cos: CudaSlice<f32>,
    sin: CudaSlice<f32>,
    /// A stand-in for absent optional weights (never read: the kernels check the flags).
    none: Buf,
    /// The GPU's SMs, which `attention` splits keys to fill.
    sms: usize,
    /// Query heads per `attention` block (`plan::attention_group`).
    group: usize,
}

impl Forward {
    /// Compiles the kernels (for a cache in `kdt`) and uploads the weights, converted to `wdt`,
    /// and RoPE tables for `max_positions`, on `s`.
    pub(super) fn new(
        s: &Arc<CudaStream>,
        cfg: ModelConfig,
        w: &Weights,
        wdt: KvDtype,
        kdt: KvDtype,
        max_positions: usize,
    ) -> Result<Self, GpuError> {
        let group = attention_group(cfg.num_heads, cfg.kv_heads);
        let gqa = cfg.num_heads / cfg.kv_heads.max(1);
        let k = Kernels::compile(s, (wdt, kdt), [cfg.head_dim, group, gqa, cfg.hidden_size])?;
        let w = GpuWeights::upload(s, w, wdt, cfg.tie_word_embeddings)?;
        let (cos, sin) = rope_tables(&cfg, max_positions);
        let cos = s.clone_htod(&cos).map_err(driver)?;
        let sin = s.clone_htod(&sin).map_err(driver)?;
        let none = s.alloc_zeros::<u8>(16).map_err(driver)?;
        let sms = sm_count(s)?;
        Ok(Self { cfg, wdt, k, w, cos, sin, none, sms, group })
    }

    pub(super) fn cfg(&self) -> &ModelConfig {
        &self.cfg
    }

    /// The forward pass's kernels, by the address of their `CUfunction`s (`Graphs` tells them
    /// from cuBLAS's by it).
    pub(super) fn kernel_ids(&self) -> Vec<usize> {
        self.k.ids()
    }

    /// Whether prompt chunks over `cache` run the tensor-core prefill attention: the kernel
    /// exists for this model and GPU, and it can read the cache's rows in whole words.
    pub(super) fn flash(&self, cache: &CacheView) -> bool {
        self.k.flash.is_some() && cache.aligned
    }

    /// Enqueues the forward pass of a step of `t` tokens whose plan is in `bufs`, writing K
    /// and V into `cache`, and the logits of its `n_rows` wanted rows, from the embedding to
    /// the lm_head gemm. Every launch argument depends on the model and the step's shape
    /// alone, and every buffer is at a fixed address, so what a capture of this records is
    /// valid for any step of the same shape.
    ///
    /// SAFETY (every launch of the step, here and in the helpers it calls): each kernel reads
    /// exactly the arguments pushed, in this order and with these types. Token-indexed buffers
    /// hold at least `t` rows of the widths `StepBufs::new` allocated them with (`upload`
    /// checked the step fits), and kernels only index rows below `t` (the grid) or below
    /// `n_rows` (≤ `t`); the prefixes uploaded this step hold the plan, whose `ids` were
    /// checked below the vocabulary (embedding rows), `pos` below `max_positions` (RoPE rows),
    /// and every block a position reaches through `tab_off`/`tables` below `num_blocks`, whose
    /// farthest element was checked against each plane's region at construction. Weight
    /// buffers hold the shapes the model config gives.
    pub(super) fn record(
        &self,
        lane: Lane<'_>,
        bufs: &mut StepBufs,
        cache: &CacheView,
        shape: StepShape,
    ) -> Result<(), GpuError> {
        let StepShape { tokens: t, rows: n_rows, .. } = shape;
        let s = lane.stream;
        let (hid, vocab) = (self.cfg.hidden_size, self.cfg.vocab_size);
        let (hid_i, t_i) = (hid as i32, t as u32);
        let mut b = s.launch_builder(&self.k.embed);
        b.arg(&bufs.ids).arg(&self.w.embed).arg(&mut bufs.x).arg(&hid_i);
        // SAFETY: see this function's doc.
        unsafe { b.launch(cfg1(t_i, 256)) }.map_err(driver)?;

        // Whether the norms run inside the products after them: the same for every layer.
        let fused = self.norms_fused(t);
        for (li, lw) in self.w.layers.iter().enumerate() {
            self.record_layer(lane, bufs, cache, (li, lw), (shape, fused))?;
        }
        if n_rows == 0 {
            return Ok(());
        }
        // The final norm, for the rows whose logits are wanted only (`rows` were built from
        // token indices below `t`).
        self.rmsnorm(s, bufs, true, &self.w.final_norm, n_rows as u32)?;
        self.matmul(lane, self.w.head(), &bufs.act, &mut bufs.logits, [vocab, hid, n_rows])?;
        // Every row's argmax, which the host copies instead of the logits for greedy rows.
        let vocab_i = vocab as i32;
        let mut b = s.launch_builder(&self.k.argmax_rows);
        b.arg(&bufs.logits).arg(&vocab_i).arg(&mut bufs.argmax);
        // SAFETY: see this function's doc; `logits` holds `n_rows` rows of `vocab` (the gemm's
        // checked output) and `argmax` at least `n_rows` entries (the rows' capacity).
        unsafe { b.launch(cfg1(n_rows as u32, 1024)) }.map_err(driver)?;
        Ok(())
    }

    /// Enqueues layer `li` (weights `lw`) of a step of `shape`, with its norms inside the
    /// products where `fused` ([`Self::norms_fused`]).
    fn record_layer(
        &self,
        lane: Lane<'_>,
        bufs: &mut StepBufs,
        cache: &CacheView,
        (li, lw): (usize, &GpuLayer),
        (shape, fused): (StepShape, bool),
    ) -> Result<(), GpuError> {
        let t = shape.tokens;
        let cfg = &self.cfg;
        let s = lane.stream;
        let (h, kvh, d) = (cfg.num_heads, cfg.kv_heads, cfg.head_dim);
        let (hid, inter) = (cfg.hidden_size, cfg.intermediate_size);
        let qkv_w = (h + 2 * kvh) * d;
        let t_i = t as u32;

        let attn_in = if fused {
            Rows::Normed { res: &bufs.x, w: &lw.attn_norm }
        } else {
            self.rmsnorm(s, bufs, false, &lw.attn_norm, t_i)?;
            Rows::Plain(&bufs.act)
        };
        self.matmul_narrow(lane, &lw.wqkv, attn_in, &mut bufs.qkv, [qkv_w, hid, t])?;
        // In steps of one token a sequence the decode attention does `qkv_post`'s work itself.
        let fused_qkv = self.fuses_qkv(shape, cache).then_some(lw);
        if fused_qkv.is_none() {
            self.qkv_post(s, bufs, cache, [li, t], lw)?;
        }
        self.attention(s, bufs, cache, [li, t, shape.tiles, shape.singles], fused_qkv)?;
        self.matmul_add(lane, &lw.wo, &bufs.act, &mut bufs.x, [hid, h * d, t])?;

        let mlp_in = if fused {
            Rows::Normed { res: &bufs.x, w: &lw.mlp_norm }
        } else {
            self.rmsnorm(s, bufs, false, &lw.mlp_norm, t_i)?;
            Rows::Plain(&bufs.act)
        };
        // SiLU(gate) · up: by one kernel into the gate/up buffer where `gemv_glu` fits, else
        // the product and then `silu_mul` into `act`.
        let glu = self.gate_up_silu(lane, &lw.w_gate_up, mlp_in, &mut bufs.gu, [inter, hid, t])?;
        if !glu {
            self.matmul_narrow(lane, &lw.w_gate_up, mlp_in, &mut bufs.gu, [2 * inter, hid, t])?;
            let inter_i = inter as i32;
            let mut b = s.launch_builder(&self.k.silu_mul);
            b.arg(&bufs.gu).arg(&mut bufs.act).arg(&inter_i);
            let grid = LaunchConfig {
                grid_dim: (t_i, inter.div_ceil(2048) as u32, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: see `record`'s doc.
            unsafe { b.launch(grid) }.map_err(driver)?;
        }
        let activated = if glu { &bufs.gu } else { &bufs.act };
        self.matmul_add(lane, &lw.w_down, activated, &mut bufs.x, [hid, inter, t])
    }

    /// Whether a step of `t` tokens runs its norms inside the products after them: where they
    /// fit the model (`plan::norms_fused_fit`) and the kernels exist, and the QKV and gate/up
    /// products' groups are few enough for the blocks the GPU holds (`plan::norm_groups_fit`).
    fn norms_fused(&self, t: usize) -> bool {
        let c = &self.cfg;
        let (hid, inter) = (c.hidden_size, c.intermediate_size);
        let dims = [hid, c.num_heads * c.head_dim, inter];
        let (Some(norm), Some(glu)) = (&self.k.gemv_norm, &self.k.gemv_glu_norm) else {
            return false;
        };
        if !norms_fused_fit(t, dims) {
            return false;
        }
        let (norm, glu) = (norm.blocks(), glu.blocks());
        let qkv = gemv_groups((c.num_heads + 2 * c.kv_heads) * c.head_dim, hid);
        let mlp = if gemv_glu_fits(t, hid) {
            norm_groups_fit(gemv_glu_groups(inter, hid), glu)
        } else {
            norm_groups_fit(gemv_groups(2 * inter, hid), norm)
        };
        norm_groups_fit(qkv, norm) && mlp
    }

    /// Whether the decode attention does `qkv_post`'s work in a step of `shape` over `c`
    /// (`flash_decode_qkv`): it exists, and every token of the step is its sequence's only one
    /// and goes to it (no `flash_prefill` tiles), so no token reads a key another block writes.
    fn fuses_qkv(&self, shape: StepShape, c: &CacheView) -> bool {
        shape.solo && shape.tiles == 0 && self.decode_flash(c).is_some() && self.k.flash_decode_qkv.is_some()
    }

    /// `qkv_post`'s layer arguments for layer `lw`: the QKV bias and whether there is one, the
    /// Q and K norms' weights and whether there are (stand-ins the kernels never read where not).
    fn qkv_extras<'a>(&'a self, lw: &'a GpuLayer) -> (&'a Buf, i32, &'a Buf, &'a Buf, i32) {
        let none = &self.none;
        let has_bias = i32::from(lw.bqkv.is_some());
        let has_norm = i32::from(lw.q_norm.is_some() && lw.k_norm.is_some());
        let (qn, kn) = match (&lw.q_norm, &lw.k_norm) {
            (Some(a), Some(b)) => (a, b),
            _ => (none, none),
        };
        (lw.bqkv.as_ref().unwrap_or(none), has_bias, qn, kn, has_norm)
    }

    /// Enqueues the kernel after the QKV matmul of layer `li`: the bias, the Q/K norms, RoPE,
    /// and K and V written into `cache` through the block tables, for `t` tokens.
    fn qkv_post(
        &self,
        s: &Arc<CudaStream>,
        bufs: &mut StepBufs,
        c: &CacheView,
        [li, t]: [usize; 2],
        lw: &GpuLayer,
    ) -> Result<(), GpuError> {
        let cfg = &self.cfg;
        let (h, kvh) = (cfg.num_heads, cfg.kv_heads);
        let (h_i, kvh_i) = (h as i32, kvh as i32);
        let eps = cfg.rms_norm_eps as f32;
        let (bias, has_bias, qn, kn, has_norm) = self.qkv_extras(lw);
        let [kp, vp] = c.planes[li];
        let mut b = s.launch_builder(&self.k.qkv_post);
        b.arg(&bufs.qkv)
            .arg(bias)
            .arg(&has_bias)
            .arg(qn)
            .arg(kn)
            .arg(&has_norm)
            .arg(&self.cos)
            .arg(&self.sin)
            .arg(&bufs.pos)
            .arg(&bufs.tab_off)
            .arg(&bufs.tables)
            .arg(&kp)
            .arg(&vp)
            .arg(&c.block_size)
            .arg(&c.s_blk)
            .arg(&c.s_tok)
            .arg(&c.s_head)
            .arg(&mut bufs.q)
            .arg(&h_i)
            .arg(&kvh_i)
            .arg(&eps);
        // SAFETY: see `record`'s doc.
        unsafe { b.launch(qkv_post_grid(t, h + 2 * kvh, cfg.head_dim)) }.map_err(driver)?;
        Ok(())
    }

    /// Enqueues attention of layer `li` for `t` query tokens, each over its own sequence's keys
    /// in `cache` up to its position, into `act`: the prompt chunks listed in the step's tiles
    /// on tensor cores (`flash_prefill`), the other tokens (all of them when there are no
    /// tiles) on tensor cores too where `flash_decode` exists (a block per token, KV head and
    /// split of its keys), else one block per token and group of heads sharing a KV head
    /// (`attention`). With `qkv` (the layer's weights, where [`Self::fuses_qkv`]) the decode
    /// attention is `flash_decode_qkv`, which does `qkv_post`'s work from the QKV product first.
    /// `tiles`/`singles` are the plan's counts.
    fn attention(
        &self,
        s: &Arc<CudaStream>,
        bufs: &mut StepBufs,
        c: &CacheView,
        [li, t, tiles, singles]: [usize; 4],
        qkv: Option<&GpuLayer>,
    ) -> Result<(), GpuError> {
        let cfg = &self.cfg;
        let (h, d) = (cfg.num_heads, cfg.head_dim);
        let (h_i, kvh_i) = (h as i32, cfg.kv_heads as i32);
        let scale = 1.0f32 / (d as f32).sqrt();
        let [kp, vp] = c.planes[li];
        let (use_toks, vec) = (i32::from(tiles > 0), i32::from(c.aligned));
        let flash = self.prefill_flash(tiles, c);
        if let Some(flash) = flash {
            let scale_log2 = scale * std::f32::consts::LOG2_E;
            let mut b = s.launch_builder(&flash.f);
            b.arg(&bufs.q)
                .arg(&kp)
                .arg(&vp)
                .arg(&bufs.pos)
                .arg(&bufs.tab_off)
                .arg(&bufs.tables)
                .arg(&bufs.tiles)
                .arg(&c.block_size)
                .arg(&c.s_blk)
                .arg(&c.s_tok)
                .arg(&c.s_head)
                .arg(&mut bufs.act)
                .arg(&h_i)
                .arg(&kvh_i)
                .arg(&scale_log2);
            let tiles_i = tiles as i32;
            let grid_dim = if flash.persistent {
                b.arg(&tiles_i);
                ((h * tiles).min(self.sms) as u32, 1, 1)
            } else {
                (h as u32, tiles as u32, 1)
            };
            let grid =
                LaunchConfig { grid_dim, block_dim: (flash.threads, 1, 1), shared_mem_bytes: flash.smem };
            // SAFETY: see `record`'s doc; besides, the plan's tiles are `(first, count)` pairs of
            // tokens of one chunk each (below `t`), `flash` exists only for the dtype and head
            // dimension `flash.cu` is compiled for, and `c.aligned` says every row it reads in
            // 16-byte words starts on a 16-byte boundary.
            unsafe { b.launch(grid) }.map_err(driver)?;
        }
        let blocks = if flash.is_some() { singles } else { t };
        if blocks == 0 {
            return Ok(());
        }
        let use_toks = if flash.is_some() { use_toks } else { 0 };
        // `flash_decode` where it exists (its arguments are `attention`'s, but for a base-2
        // scale, then the step's deal), else `attention` with blocks of one head or of a GQA
        // group's heads.
        let decode = match (self.decode_flash(c), qkv.and(self.k.flash_decode_qkv.as_ref())) {
            (Some(_), Some(fused)) => Some(fused),
            (plain, _) => plain,
        };
        let (kernel, heads_splits, threads, scale) = match decode {
            Some(decode) => {
                let kvh = cfg.kv_heads;
                let splits = decode_splits(blocks, kvh, self.sms, bufs.part_rows);
                (decode, (kvh, splits), 32 * DECODE_WARPS, scale * std::f32::consts::LOG2_E)
            }
            None => {
                let per_block = attention_heads(blocks, h, self.group, self.sms);
                let head_blocks = h / per_block;
                let splits = attention_splits(blocks, head_blocks, self.sms, bufs.part_rows);
                let kernel = if per_block == 1 { &self.k.attention_one } else { &self.k.attention };
                (kernel, (head_blocks, splits), 32 * ATTENTION_WARPS, scale)
            }
        };
        let mut b = s.launch_builder(kernel);
        b.arg(&bufs.q)
            .arg(&kp)
            .arg(&vp)
            .arg(&bufs.pos)
            .arg(&bufs.tab_off)
            .arg(&bufs.tables)
            .arg(&bufs.singles)
            .arg(&use_toks)
            .arg(&vec)
            .arg(&c.block_size)
            .arg(&c.s_blk)
            .arg(&c.s_tok)
            .arg(&c.s_head)
            .arg(&mut bufs.act)
            .arg(&mut bufs.part)
            .arg(&mut bufs.counters)
            .arg(&h_i)
            .arg(&kvh_i)
            .arg(&scale);
        if decode.is_some() {
            b.arg(&bufs.deal);
        }
        // `flash_decode_qkv`'s further arguments: `qkv_post`'s, less what it shares.
        let eps = self.cfg.rms_norm_eps as f32;
        let extras = qkv.filter(|_| decode.is_some()).map(|lw| self.qkv_extras(lw));
        if let Some((bias, has_bias, qn, kn, has_norm)) = &extras {
            b.arg(&bufs.qkv).arg(*bias).arg(has_bias).arg(*qn).arg(*kn).arg(has_norm);
            b.arg(&self.cos).arg(&self.sin).arg(&eps);
        }
        let grid = LaunchConfig {
            grid_dim: (blocks as u32, heads_splits.0 as u32, heads_splits.1 as u32),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: see `record`'s doc; `singles` lists tokens below `t` and is read only with
        // `use_toks`, `vec` only when `c.aligned` holds (`flash_decode` runs only then and loads
        // whole 16-byte words), the kernel's heads per block (1, the `group` compiled in, or a KV
        // head's `gqa` for `flash_decode`, which exists only for the dtypes, head dimensions and
        // groups it is compiled for) divide the heads of a KV head (`attention_group`), and with
        // more than one split `attention_splits`/`decode_splits` checked that `part` holds the
        // `blocks` rows of partials written and `counters` (as many rows of `h` entries, zeroed
        // at allocation and set back to zero by the kernel) their counts; `flash_decode` reads
        // `deal`'s first `blocks × splits` entries, which `decode_deal` wrote for this step
        // (slots below `blocks`, splits up to MAX_SPLITS, `part`'s stride per query and head).
        // `flash_decode_qkv` reads `qkv_post`'s arguments as `qkv_post` does (`qkv` holds the
        // step's `t` rows of QKV, `pos` is below the RoPE tables' rows), for steps whose tokens
        // are each their sequence's only one (`fuses_qkv`): a token's own K and V are written
        // by one block of its KV head, the one that reads the tile holding them.
        unsafe { b.launch(grid) }.map_err(driver)?;
        Ok(())
    }

    /// `flash_prefill`, where it runs a step's prompt chunks: it exists, the step has tiles
    /// (`tiles`, counted in any unit) and the cache's rows are whole aligned words.
    fn prefill_flash(&self, tiles: usize, c: &CacheView) -> Option<&Flash> {
        self.k.flash.as_ref().filter(|_| tiles > 0 && c.aligned)
    }

    /// `flash_decode`, where it runs a step's one-token queries instead of `attention`.
    fn decode_flash(&self, c: &CacheView) -> Option<&CudaFunction> {
        self.k.flash_decode.as_ref().filter(|_| c.aligned)
    }

    /// `flash_decode`'s deal of its blocks for the step of `plan` ([`deal_decode_blocks`]), for
    /// the step buffers' partial rows `part_rows`: the queries `attention` gives it (the
    /// one-token chunks when the step has `flash_prefill` tiles, else every token) and its
    /// grid's splits. Empty where the step runs no `flash_decode`.
    pub(super) fn decode_deal(&self, plan: &StepPlan, c: &CacheView, part_rows: usize) -> Vec<i32> {
        if self.decode_flash(c).is_none() {
            return Vec::new();
        }
        let len = |t: usize| plan.pos.get(t).map_or(1, |&p| p.max(0) as usize + 1);
        let lens: Vec<usize> = if self.prefill_flash(plan.tiles.len(), c).is_some() {
            plan.singles.iter().map(|&t| len(t as usize)).collect()
        } else {
            (0..plan.pos.len()).map(len).collect()
        };
        let splits = decode_splits(lens.len(), self.cfg.kv_heads, self.sms, part_rows);
        deal_decode_blocks(&lens, splits, decode_tile_keys(self.cfg.head_dim))
    }

    /// Enqueues the RMSNorm `act = RMSNorm(x) · weight`, one block per row — the first `blocks`
    /// rows, or the rows listed in `rows` when `use_rows` (the final norm, for the rows whose
    /// logits are wanted).
    fn rmsnorm(
        &self,
        s: &Arc<CudaStream>,
        bufs: &mut StepBufs,
        use_rows: bool,
        weight: &Buf,
        blocks: u32,
    ) -> Result<(), GpuError> {
        let (hid, eps, use_rows) =
            (self.cfg.hidden_size as i32, self.cfg.rms_norm_eps as f32, i32::from(use_rows));
        let mut b = s.launch_builder(&self.k.rmsnorm);
        b.arg(&bufs.x).arg(&bufs.rows).arg(&use_rows).arg(weight).arg(&mut bufs.act).arg(&hid).arg(&eps);
        // SAFETY: the kernel reads exactly these arguments, in this order and with these types;
        // `record` passes step buffers of at least `blocks` rows of `hidden_size` (and `rows`
        // holding indices below the step's token count), as its SAFETY comment says.
        unsafe { b.launch(cfg1(blocks, 256)) }.map_err(driver)?;
        Ok(())
    }
}
