//! The transformer forward pass on CPU (candle), over a batch of sequence chunks that read and
//! write the paged KV cache.
//!
//! One step carries any mix of prompt chunks and single decode tokens. The projections and the
//! MLP run once over all the step's tokens; attention runs per chunk, on K and V gathered from
//! the cache through the layout descriptor, so every layout is exercised by every forward.

mod decode;
#[cfg(test)]
mod tests;

use crate::kv_cache::{DecodeQuery, KvCache};
use crate::weights::{RowKinds, Weights};
use candle_core::{DType, Device, Tensor};
use xinf_models::{ModelConfig, RopeScaling};
use xinf_transfer::device::{DeviceLease, DevicePages, DeviceRoute};

/// One sequence's part of a step.
pub(crate) struct Chunk<'a> {
    /// Tokens to compute, at positions `start..start + tokens.len()`.
    pub(crate) tokens: &'a [u32],
    /// Position of the first token.
    pub(crate) start: usize,
    /// The sequence's blocks, covering at least `start + tokens.len()` tokens.
    pub(crate) block_table: &'a [u32],
    /// Whether the logits of the last token are wanted.
    pub(crate) want_logits: bool,
    /// Whether the logits of every token are wanted, one row each in order (a prompt's
    /// log-probabilities): the last row is then also the one `want_logits` asks for.
    pub(crate) all_logits: bool,
    /// The length of the sequence's prompt: positions from here on are generated tokens, which
    /// quantized weights multiply block by block ([`RowKinds`]).
    pub(crate) prompt_len: usize,
    /// Whether the next token is simply the largest logit (greedy, no penalties), so
    /// [`ComputeBackend::forward_step`] may return that index instead of the logits.
    pub(crate) argmax: bool,
}

/// What a step gives for a chunk whose logits were wanted.
#[derive(Debug, PartialEq)]
pub(crate) enum Row {
    /// The logits, one per vocabulary entry.
    Logits(Vec<f32>),
    /// The index of the largest logit (the first of equals; NaN counts as `-inf`, and a row with
    /// no finite maximum gives 0), for a chunk that asked for `argmax`. Only the GPU backend
    /// gives it.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    Argmax(u32),
}

/// Something that computes a step: the seam where a GPU backend slots in.
pub(crate) trait ComputeBackend: Send {
    /// Runs one step, writing K and V of every token into the cache, and returns the logits of
    /// the chunks that asked for them, in order.
    fn forward(&mut self, chunks: &[Chunk<'_>], cache: &mut KvCache) -> candle_core::Result<Vec<Vec<f32>>>;

    /// [`forward`](Self::forward) for the engine's step loop: the row of a chunk that asked for
    /// `argmax` may come back as the index of its largest logit. A GPU backend finds it where
    /// the logits are and copies 4 bytes instead of a vocabulary of logits per sequence, which
    /// at a batch of 64 and a 150k vocabulary is 38 MB a step. By default, the logits.
    fn forward_step(&mut self, chunks: &[Chunk<'_>], cache: &mut KvCache) -> candle_core::Result<Vec<Row>> {
        Ok(self.forward(chunks, cache)?.into_iter().map(Row::Logits).collect())
    }

    /// Copies canonical pages `first..first + count` of a `len`-token sequence out of the cache.
    /// Goes through the backend because the backend knows where the cache's memory is: host
    /// memory (the default) or the GPU.
    fn export_pages(
        &mut self,
        cache: &mut KvCache,
        table: &[u32],
        len: usize,
        first: usize,
        count: usize,
    ) -> Result<Vec<u8>, String> {
        Ok(cache.export_pages(table, len, first, count))
    }

    /// Gathers canonical pages `first..first + count` of a `len`-token sequence into GPU
    /// staging memory for a GPU-to-GPU handoff by `route`, complete when this returns.
    fn export_device(
        &mut self,
        table: &[u32],
        len: usize,
        first: usize,
        count: usize,
        route: DeviceRoute,
    ) -> Result<DeviceLease, String> {
        let _ = (table, len, first, count, route);
        Err("the KV cache is in host memory".into())
    }

    /// Scatters canonical pages received into this GPU's memory, covering positions `0..len`.
    fn import_device(&mut self, table: &[u32], len: usize, pages: &DevicePages) -> Result<(), String> {
        let _ = (table, len, pages);
        Err("GPU pages given to an engine whose KV cache is in host memory".into())
    }

    /// Scatters canonical pages covering positions `0..len` into a sequence's blocks.
    fn import_pages(
        &mut self,
        cache: &mut KvCache,
        table: &[u32],
        len: usize,
        pages: &[u8],
    ) -> Result<(), String> {
        cache.import_pages(table, len, pages);
        Ok(())
    }
}

/// The CPU backend: weights in F32 and candle's CPU kernels.
pub(crate) struct CpuModel {
    cfg: ModelConfig,
    w: Weights,
    /// `cos` and `sin` of each position's angles, `[max_positions][head_dim / 2]`.
    cos: Vec<f32>,
    sin: Vec<f32>,
    scratch_k: Vec<f32>,
    scratch_v: Vec<f32>,
    /// What a step of generated tokens alone runs on ([`decode`]).
    slices: decode::SliceWeights,
    buffers: decode::Buffers,
}

/// Inverse frequencies as Hugging Face computes them (in f32), with scaling applied.
pub(crate) fn inv_freq(cfg: &ModelConfig) -> Vec<f32> {
    let d = cfg.head_dim;
    let base = cfg.rope_theta as f32;
    let raw: Vec<f32> = (0..d / 2).map(|i| 1.0 / base.powf((2 * i) as f32 / d as f32)).collect();
    match cfg.rope_scaling {
        RopeScaling::None => raw,
        RopeScaling::Linear { factor } => raw.iter().map(|f| f / factor as f32).collect(),
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        } => {
            let (factor, lo, hi, old) = (
                factor as f32,
                low_freq_factor as f32,
                high_freq_factor as f32,
                original_max_position_embeddings as f32,
            );
            let low_wavelen = old / lo;
            let high_wavelen = old / hi;
            raw.iter()
                .map(|&f| {
                    let wavelen = 2.0 * std::f32::consts::PI / f;
                    let scaled = if wavelen > low_wavelen { f / factor } else { f };
                    let medium = wavelen >= high_wavelen && wavelen <= low_wavelen;
                    if medium {
                        let smooth = (old / wavelen - lo) / (hi - lo);
                        (1.0 - smooth) * scaled / factor + smooth * scaled
                    } else {
                        scaled
                    }
                })
                .collect()
        }
    }
}

impl CpuModel {
    /// Builds the model and its RoPE tables for positions `0..max_positions`.
    pub(crate) fn new(cfg: ModelConfig, w: Weights, max_positions: usize) -> candle_core::Result<Self> {
        let inv = inv_freq(&cfg);
        let half = inv.len();
        let mut cos = Vec::with_capacity(max_positions * half);
        let mut sin = Vec::with_capacity(max_positions * half);
        for p in 0..max_positions {
            for f in &inv {
                let a = p as f32 * f;
                cos.push(a.cos());
                sin.push(a.sin());
            }
        }
        let slices = decode::SliceWeights::new(&w)?;
        let (scratch_k, scratch_v, buffers) = Default::default();
        Ok(Self { cfg, w, cos, sin, scratch_k, scratch_v, slices, buffers })
    }

    /// Rotary embedding of `x` (`[tokens, heads, head_dim]`) at `positions`: the halves of each
    /// head rotated with the arithmetic of candle's `rope_thd`, on the calling thread. candle's
    /// runs through the rayon pool, a hand-off between threads that costs more than the
    /// arithmetic at decode sizes (two per layer per step).
    fn rope(&self, x: &Tensor, positions: &[u32]) -> candle_core::Result<Tensor> {
        let (t, h, d) = x.dims3()?;
        let mut v = x.flatten_all()?.to_vec1::<f32>()?;
        for (row, &p) in v.chunks_exact_mut(h * d).zip(positions) {
            rotate(&self.cos, &self.sin, row, d, p)?;
        }
        Tensor::from_vec(v, (t, h, d), &Device::Cpu)
    }

    /// Attention of the step's generated tokens (`single` chunks), all at once straight from
    /// the cache: `[tokens][num_heads * head_dim]`, in chunk order.
    fn decode_attention(
        &self,
        layer: usize,
        q: &Tensor,
        chunks: &[Chunk<'_>],
        cache: &KvCache,
        single: impl Fn(&Chunk<'_>) -> bool,
    ) -> candle_core::Result<Vec<f32>> {
        let (h, d) = (self.cfg.num_heads, self.cfg.head_dim);
        let (mut rows, mut queries, mut offset) = (Vec::new(), Vec::new(), 0);
        for c in chunks {
            if single(c) {
                rows.push(offset as u32);
                queries.push(DecodeQuery { table: c.block_table, len: c.start + 1 });
            }
            offset += c.tokens.len();
        }
        if queries.is_empty() {
            return Ok(Vec::new());
        }
        let q = if rows.len() == offset {
            q.flatten_all()?.to_vec1::<f32>()?
        } else {
            let n = rows.len();
            q.index_select(&Tensor::from_vec(rows, n, &Device::Cpu)?, 0)?.flatten_all()?.to_vec1::<f32>()?
        };
        let mut out = vec![0f32; q.len()];
        let scale = 1.0 / (d as f64).sqrt();
        cache.attend_decode(layer, &queries, &q, h, scale as f32, &mut out);
        Ok(out)
    }

    fn attention(
        &mut self,
        layer: usize,
        q: &Tensor,
        chunks: &[Chunk<'_>],
        cache: &KvCache,
    ) -> candle_core::Result<Tensor> {
        let (h, kvh, d) = (self.cfg.num_heads, self.cfg.kv_heads, self.cfg.head_dim);
        let g = h / kvh;
        let scale = 1.0 / (d as f64).sqrt();
        let mut outs = Vec::with_capacity(chunks.len());
        let mut offset = 0;
        // Generated tokens (chunks of one past the prompt) attend straight from the cache; build
        // their rows first. A prompt token always goes through the chunk path, even alone (a
        // prompt's tail chunk, or the last prompt token a decode recomputes): its K and V, which
        // later tokens read, are then the same however the prompt was cut into chunks.
        let single = |c: &Chunk<'_>| c.tokens.len() == 1 && c.start >= c.prompt_len;
        let decode = self.decode_attention(layer, q, chunks, cache, single)?;
        let mut decoded = decode.chunks_exact(h * d);
        for c in chunks {
            let n = c.tokens.len();
            let len = c.start + n;
            if single(c) {
                let o = decoded.next().unwrap_or_default();
                outs.push(Tensor::from_slice(o, (1, h * d), &Device::Cpu)?);
                offset += 1;
                continue;
            }
            cache.gather(layer, 0, c.block_table, len, &mut self.scratch_k);
            cache.gather(layer, 1, c.block_table, len, &mut self.scratch_v);
            let k = Tensor::from_slice(&self.scratch_k, (kvh, len, d), &Device::Cpu)?;
            let v = Tensor::from_slice(&self.scratch_v, (kvh, len, d), &Device::Cpu)?;
            // [n, H, D] -> [H, n, D] -> [KVH, g * n, D]: heads of one group share a KV head.
            let qc = q.narrow(0, offset, n)?.transpose(0, 1)?.contiguous()?.reshape((kvh, g * n, d))?;
            let mut scores = (row_invariant_matmul(&qc, &k.t()?)? * scale)?;
            if n > 1 {
                let mask: Vec<f32> = (0..n)
                    .flat_map(|i| {
                        (0..len).map(move |j| if j > c.start + i { f32::NEG_INFINITY } else { 0.0 })
                    })
                    .collect();
                let mask = Tensor::from_vec(mask, (1, 1, n, len), &Device::Cpu)?;
                scores =
                    scores.reshape((kvh, g, n, len))?.broadcast_add(&mask)?.reshape((kvh, g * n, len))?;
            }
            let probs = candle_nn::ops::softmax_last_dim(&scores)?;
            let o =
                row_invariant_matmul(&probs, &v)?.reshape((h, n, d))?.transpose(0, 1)?.reshape((n, h * d))?;
            outs.push(o);
            offset += n;
        }
        Tensor::cat(&outs, 0)
    }
}

/// Rotates each `d`-wide head of `heads` to position `p` (see [`CpuModel::rope`]), with the
/// tables of `cos` and `sin` (`[positions][d / 2]`).
fn rotate(cos: &[f32], sin: &[f32], heads: &mut [f32], d: usize, p: u32) -> candle_core::Result<()> {
    let half = d / 2;
    let at = p as usize * half;
    let (Some(cos), Some(sin)) = (cos.get(at..at + half), sin.get(at..at + half)) else {
        candle_core::bail!("position {p} is past the rotary table")
    };
    for head in heads.chunks_exact_mut(d) {
        let (x1, x2) = head.split_at_mut(half);
        for (((a, b), c), s) in x1.iter_mut().zip(x2).zip(cos).zip(sin) {
            (*a, *b) = (*a * c - *b * s, *a * s + *b * c);
        }
    }
    Ok(())
}

/// Rows below which the GEMM under `matmul` takes another path, whose sums differ from a
/// bigger product's in the last bits (seen at 3 rows of 64-wide heads, not at 4 or more).
const MIN_GEMM_ROWS: usize = 8;

/// `a @ b` for batched `a` of `[batch, rows, k]`, each row's result the same as among many rows:
/// fewer than [`MIN_GEMM_ROWS`] rows are padded with zero rows. A prompt token alone in its
/// chunk (a prompt's tail chunk, or the last prompt token a decode recomputes) then gets the
/// scores it gets inside a longer chunk, so its K and V, which every later token reads, do not
/// depend on how the prompt was cut.
fn row_invariant_matmul(a: &Tensor, b: &Tensor) -> candle_core::Result<Tensor> {
    let (batch, rows, k) = a.dims3()?;
    if rows >= MIN_GEMM_ROWS {
        return a.matmul(b);
    }
    let pad = Tensor::zeros((batch, MIN_GEMM_ROWS - rows, k), a.dtype(), a.device())?;
    Tensor::cat(&[a, &pad], 1)?.matmul(b)?.narrow(1, 0, rows)
}

impl ComputeBackend for CpuModel {
    fn forward(&mut self, chunks: &[Chunk<'_>], cache: &mut KvCache) -> candle_core::Result<Vec<Vec<f32>>> {
        if decode::is_decode(chunks) {
            return self.forward_decode(chunks, cache);
        }
        self.forward_chunks(chunks, cache)
    }
}

impl CpuModel {
    /// A step of any chunks, on candle tensors.
    fn forward_chunks(
        &mut self,
        chunks: &[Chunk<'_>],
        cache: &mut KvCache,
    ) -> candle_core::Result<Vec<Vec<f32>>> {
        let cfg = self.cfg.clone();
        let (h, kvh, d) = (cfg.num_heads, cfg.kv_heads, cfg.head_dim);
        let eps = cfg.rms_norm_eps as f32;
        let ids: Vec<u32> = chunks.iter().flat_map(|c| c.tokens.iter().copied()).collect();
        let positions: Vec<u32> =
            chunks.iter().flat_map(|c| (c.start..c.start + c.tokens.len()).map(|p| p as u32)).collect();
        let t = ids.len();
        if t == 0 {
            return Ok(Vec::new());
        }
        let kinds: Vec<bool> = chunks
            .iter()
            .flat_map(|c| {
                (c.start..c.start + c.tokens.len()).map(|p| RowKinds::quantized_at(p, c.prompt_len))
            })
            .collect();
        let rows = RowKinds::new(&kinds)?;
        let ids = Tensor::from_vec(ids, t, &Device::Cpu)?;
        let mut x = self.w.embed.index_select(&ids, 0)?;
        for layer in 0..cfg.num_layers {
            let lw = &self.w.layers[layer];
            let hn = candle_nn::ops::rms_norm(&x, &lw.attn_norm, eps)?;
            let mut qkv = lw.wqkv.forward(&hn, &rows)?;
            if let Some(b) = &lw.bqkv {
                qkv = qkv.broadcast_add(b)?;
            }
            let mut q = qkv.narrow(1, 0, h * d)?.reshape((t, h, d))?;
            let mut k = qkv.narrow(1, h * d, kvh * d)?.reshape((t, kvh, d))?;
            let v = qkv.narrow(1, (h + kvh) * d, kvh * d)?.contiguous()?;
            if let Some(qn) = &lw.q_norm {
                q = candle_nn::ops::rms_norm(&q.contiguous()?, qn, eps)?;
            }
            if let Some(kn) = &lw.k_norm {
                k = candle_nn::ops::rms_norm(&k.contiguous()?, kn, eps)?;
            }
            let q = self.rope(&q, &positions)?;
            let k = self.rope(&k, &positions)?;
            let k_rows = k.flatten_all()?.to_vec1::<f32>()?;
            let v_rows = v.flatten_all()?.to_vec1::<f32>()?;
            let mut off = 0;
            for c in chunks {
                let n = c.tokens.len() * kvh * d;
                cache.write(layer, 0, c.block_table, c.start, &k_rows[off..off + n]);
                cache.write(layer, 1, c.block_table, c.start, &v_rows[off..off + n]);
                off += n;
            }
            let attn = self.attention(layer, &q, chunks, cache)?;
            let lw = &self.w.layers[layer];
            x = (x + lw.wo.forward(&attn, &rows)?)?;
            let hn = candle_nn::ops::rms_norm(&x, &lw.mlp_norm, eps)?;
            let gu = lw.w_gate_up.forward(&hn, &rows)?;
            let i = cfg.intermediate_size;
            let act = (gu.narrow(1, 0, i)?.silu()? * gu.narrow(1, i, i)?)?;
            x = (x + lw.w_down.forward(&act, &rows)?)?;
        }
        let (mut last, mut last_kinds) = (Vec::new(), Vec::new());
        let mut end = 0;
        for c in chunks {
            let start = end;
            end += c.tokens.len();
            let wanted = if c.all_logits {
                start..end
            } else if c.want_logits {
                end - 1..end
            } else {
                end..end
            };
            for row in wanted {
                last.push(row as u32);
                last_kinds.push(kinds[row]);
            }
        }
        if last.is_empty() {
            return Ok(Vec::new());
        }
        let n = last.len();
        let sel = x.index_select(&Tensor::from_vec(last, n, &Device::Cpu)?, 0)?;
        let hn = candle_nn::ops::rms_norm(&sel, &self.w.final_norm, eps)?;
        let logits = self.w.lm_head.forward(&hn, &RowKinds::new(&last_kinds)?)?.to_dtype(DType::F32)?;
        logits.to_vec2::<f32>()
    }
}
