//! A decode step on slices: every chunk of the step is one generated token.
//!
//! The general forward pass builds a candle tensor for every operation of every layer, and at
//! decode sizes (a few rows of 576 values) each one costs more in allocation and dispatch than
//! in arithmetic; candle also hands its RMS norm to rayon's threads, which wake while the
//! products' pool spins on the same cores. Here the norms, biases, RoPE, SiLU and residuals run
//! on the calling thread over buffers kept from step to step, between the projections, which
//! run on the CPU pool. Each operation does candle's arithmetic in candle's order (the RMS norm
//! sums the squares in order and computes `x / m * alpha`; SiLU is `v / (1 + exp(-v))`), and
//! the projections are the same calls, so a token's logits are the same bits whether its step
//! runs here or through the general pass beside a prompt chunk.

use super::{Chunk, CpuModel, rotate};
use crate::kv_cache::{DecodeQuery, KvCache};
use crate::weights::Weights;
use candle_core::{DType, Tensor};

/// The norms' weights and the QKV bias as slices.
pub(super) struct SliceWeights {
    layers: Vec<LayerSlices>,
    final_norm: Vec<f32>,
}

struct LayerSlices {
    attn_norm: Vec<f32>,
    mlp_norm: Vec<f32>,
    bqkv: Option<Vec<f32>>,
    q_norm: Option<Vec<f32>>,
    k_norm: Option<Vec<f32>>,
}

impl SliceWeights {
    pub(super) fn new(w: &Weights) -> candle_core::Result<Self> {
        let values = |t: &Tensor| t.to_dtype(DType::F32)?.to_vec1::<f32>();
        let optional = |t: &Option<Tensor>| t.as_ref().map(values).transpose();
        let layers = w
            .layers
            .iter()
            .map(|l| {
                Ok(LayerSlices {
                    attn_norm: values(&l.attn_norm)?,
                    mlp_norm: values(&l.mlp_norm)?,
                    bqkv: optional(&l.bqkv)?,
                    q_norm: optional(&l.q_norm)?,
                    k_norm: optional(&l.k_norm)?,
                })
            })
            .collect::<candle_core::Result<_>>()?;
        Ok(Self { layers, final_norm: values(&w.final_norm)? })
    }
}

/// The step's activations, kept between steps so that a decode step allocates nothing once
/// they have grown to the batch.
#[derive(Default)]
pub(super) struct Buffers {
    /// The residual stream, `[tokens][hidden]`.
    x: Vec<f32>,
    /// A norm's output, the input of the next projection.
    normed: Vec<f32>,
    /// `[tokens][q | k | v]`.
    qkv: Vec<f32>,
    /// The queries alone, `[tokens][heads * head_dim]`, and attention's output.
    q: Vec<f32>,
    attn: Vec<f32>,
    /// The output or down projection's result, added to `x`.
    proj: Vec<f32>,
    /// `[tokens][gate | up]`, and `silu(gate) * up`.
    gate_up: Vec<f32>,
    act: Vec<f32>,
}

/// Whether a step is made only of generated tokens, which [`CpuModel::forward_decode`] runs:
/// one token per chunk, past the prompt. A prompt token takes the general pass even alone (see
/// `attention` there).
pub(super) fn is_decode(chunks: &[Chunk<'_>]) -> bool {
    !chunks.is_empty() && chunks.iter().all(|c| c.tokens.len() == 1 && c.start >= c.prompt_len)
}

/// candle's RMS norm of `x`'s root mean square: the squares summed in order.
fn rms(x: &[f32], eps: f32) -> f32 {
    let sum2 = x.iter().map(|&v| v * v).sum::<f32>();
    (sum2 / x.len() as f32 + eps).sqrt()
}

/// Each `alpha.len()`-wide row of `x` normed into `out`.
fn norm_rows(x: &[f32], alpha: &[f32], eps: f32, out: &mut Vec<f32>) {
    out.resize(x.len(), 0.0);
    for (row, o) in x.chunks_exact(alpha.len()).zip(out.chunks_exact_mut(alpha.len())) {
        let m = rms(row, eps);
        for ((o, &v), &a) in o.iter_mut().zip(row).zip(alpha) {
            *o = v / m * a;
        }
    }
}

/// Each `alpha.len()`-wide part of `heads` normed where it is.
fn norm_heads(heads: &mut [f32], alpha: &[f32], eps: f32) {
    for head in heads.chunks_exact_mut(alpha.len()) {
        let m = rms(head, eps);
        for (v, &a) in head.iter_mut().zip(alpha) {
            *v = *v / m * a;
        }
    }
}

fn add(x: &mut [f32], y: &[f32]) {
    for (a, &b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

impl CpuModel {
    /// [`forward`](super::ComputeBackend::forward) of a step that [`is_decode`].
    pub(super) fn forward_decode(
        &mut self,
        chunks: &[Chunk<'_>],
        cache: &mut KvCache,
    ) -> candle_core::Result<Vec<Vec<f32>>> {
        let Self { cfg, w, cos, sin, slices, buffers: b, .. } = self;
        let (h, kvh, d, hidden) = (cfg.num_heads, cfg.kv_heads, cfg.head_dim, cfg.hidden_size);
        let (inter, eps, t) = (cfg.intermediate_size, cfg.rms_norm_eps as f32, chunks.len());
        let (q_width, kv_width) = (h * d, kvh * d);
        let width = q_width + 2 * kv_width;
        let scale = (1.0 / (d as f64).sqrt()) as f32;
        let queries: Vec<DecodeQuery<'_>> =
            chunks.iter().map(|c| DecodeQuery { table: c.block_table, len: c.start + 1 }).collect();
        b.x.clear();
        for c in chunks {
            b.x.extend(w.embed.get(c.tokens[0] as usize)?.to_vec1::<f32>()?);
        }
        for (layer, (lw, ls)) in w.layers.iter().zip(&slices.layers).enumerate() {
            norm_rows(&b.x, &ls.attn_norm, eps, &mut b.normed);
            lw.wqkv.forward_generated(&b.normed, t, &mut b.qkv)?;
            b.q.clear();
            for (row, c) in b.qkv.chunks_exact_mut(width).zip(chunks) {
                if let Some(bias) = &ls.bqkv {
                    add(row, bias);
                }
                let (q, kv) = row.split_at_mut(q_width);
                let k = &mut kv[..kv_width];
                if let Some(alpha) = &ls.q_norm {
                    norm_heads(q, alpha, eps);
                }
                if let Some(alpha) = &ls.k_norm {
                    norm_heads(k, alpha, eps);
                }
                rotate(cos, sin, q, d, c.start as u32)?;
                rotate(cos, sin, k, d, c.start as u32)?;
                b.q.extend_from_slice(q);
                cache.write(layer, 0, c.block_table, c.start, &kv[..kv_width]);
                cache.write(layer, 1, c.block_table, c.start, &kv[kv_width..]);
            }
            b.attn.resize(t * q_width, 0.0);
            cache.attend_decode(layer, &queries, &b.q, h, scale, &mut b.attn);
            lw.wo.forward_generated(&b.attn, t, &mut b.proj)?;
            add(&mut b.x, &b.proj);
            norm_rows(&b.x, &ls.mlp_norm, eps, &mut b.normed);
            lw.w_gate_up.forward_generated(&b.normed, t, &mut b.gate_up)?;
            b.act.clear();
            for row in b.gate_up.chunks_exact(2 * inter) {
                let (gate, up) = row.split_at(inter);
                b.act.extend(gate.iter().zip(up).map(|(&g, &u)| g / (1.0 + (-g).exp()) * u));
            }
            lw.w_down.forward_generated(&b.act, t, &mut b.proj)?;
            add(&mut b.x, &b.proj);
        }
        let wanted: Vec<usize> = (0..t).filter(|&i| chunks[i].want_logits || chunks[i].all_logits).collect();
        if wanted.is_empty() {
            return Ok(Vec::new());
        }
        b.q.clear();
        for &i in &wanted {
            b.q.extend_from_slice(&b.x[i * hidden..(i + 1) * hidden]);
        }
        norm_rows(&b.q, &slices.final_norm, eps, &mut b.normed);
        w.lm_head.forward_generated(&b.normed, wanted.len(), &mut b.proj)?;
        let vocab = b.proj.len() / wanted.len();
        Ok(b.proj.chunks_exact(vocab).map(<[f32]>::to_vec).collect())
    }
}
