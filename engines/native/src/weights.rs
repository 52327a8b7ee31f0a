//! Loading weights into the tensors the forward pass uses, from safetensors or GGUF.
//!
//! Weights are held in the compute dtype (F32 on CPU). Q, K and V projections are fused into
//! one matrix, and so are the gate and up projections: one matmul each instead of three and
//! two, which matters most at decode where every matmul is small.

use candle_core::quantized::gguf_file;
use candle_core::{DType, Device, Tensor};
use std::collections::HashMap;
use std::path::Path;
use xinf_models::ModelError;
use xinf_models::{Architecture, ModelConfig};

/// One transformer layer.
pub(crate) struct LayerWeights {
    pub(crate) attn_norm: Tensor,
    /// `[q + k + v, hidden]`.
    pub(crate) wqkv: Tensor,
    /// `[q + k + v]` when the model has biases.
    pub(crate) bqkv: Option<Tensor>,
    pub(crate) q_norm: Option<Tensor>,
    pub(crate) k_norm: Option<Tensor>,
    /// `[hidden, q]`.
    pub(crate) wo: Tensor,
    pub(crate) mlp_norm: Tensor,
    /// `[2 * intermediate, hidden]`, gate rows first.
    pub(crate) w_gate_up: Tensor,
    /// `[hidden, intermediate]`.
    pub(crate) w_down: Tensor,
}

/// All weights of a model.
pub(crate) struct Weights {
    /// `[vocab, hidden]`.
    pub(crate) embed: Tensor,
    pub(crate) layers: Vec<LayerWeights>,
    pub(crate) final_norm: Tensor,
    /// `[vocab, hidden]`; the embedding when tied.
    pub(crate) lm_head: Tensor,
}

fn corrupt(file: &Path, reason: impl ToString) -> ModelError {
    ModelError::Corrupt { file: file.display().to_string(), reason: reason.to_string() }
}

/// A candle error as a client reads it: its message and context, without the backtrace
/// candle captures when `RUST_BACKTRACE` is set (a client has no use for the server's stack).
pub(crate) fn candle_reason(e: &candle_core::Error) -> String {
    use candle_core::Error as E;
    match e {
        E::WithBacktrace { inner, .. } => candle_reason(inner),
        E::Context { inner, context } => format!("{context}: {}", candle_reason(inner)),
        E::WithPath { inner, path } => format!("{}: {}", path.display(), candle_reason(inner)),
        other => other.to_string(),
    }
}

/// [`corrupt`] for a candle error.
fn corrupt_by(file: &Path, e: candle_core::Error) -> ModelError {
    corrupt(file, candle_reason(&e))
}

/// A name → tensor source that knows which file it reads, for error messages.
struct Source<'a> {
    tensors: HashMap<String, Tensor>,
    file: &'a Path,
    dtype: DType,
}

impl Source<'_> {
    fn take(&mut self, name: &str, shape: &[usize]) -> Result<Tensor, ModelError> {
        let t = self
            .tensors
            .remove(name)
            .ok_or_else(|| corrupt(self.file, format!("tensor `{name}` is missing")))?;
        if t.dims() != shape {
            return Err(corrupt(
                self.file,
                format!("tensor `{name}` has shape {:?}, expected {shape:?}", t.dims()),
            ));
        }
        t.to_dtype(self.dtype).map_err(|e| corrupt_by(self.file, e))
    }

    fn take_opt(&mut self, name: &str, shape: &[usize]) -> Result<Option<Tensor>, ModelError> {
        if self.tensors.contains_key(name) { self.take(name, shape).map(Some) } else { Ok(None) }
    }
}

/// Tensor names of one format.
struct Names {
    embed: &'static str,
    final_norm: &'static str,
    lm_head: &'static str,
    layer: fn(usize, &str) -> String,
}

const HF_NAMES: Names = Names {
    embed: "model.embed_tokens.weight",
    final_norm: "model.norm.weight",
    lm_head: "lm_head.weight",
    layer: |i, part| {
        let p = match part {
            "attn_norm" => "input_layernorm.weight",
            "q" => "self_attn.q_proj.weight",
            "k" => "self_attn.k_proj.weight",
            "v" => "self_attn.v_proj.weight",
            "q_bias" => "self_attn.q_proj.bias",
            "k_bias" => "self_attn.k_proj.bias",
            "v_bias" => "self_attn.v_proj.bias",
            "q_norm" => "self_attn.q_norm.weight",
            "k_norm" => "self_attn.k_norm.weight",
            "o" => "self_attn.o_proj.weight",
            "mlp_norm" => "post_attention_layernorm.weight",
            "gate" => "mlp.gate_proj.weight",
            "up" => "mlp.up_proj.weight",
            _ => "mlp.down_proj.weight",
        };
        format!("model.layers.{i}.{p}")
    },
};

const GGUF_NAMES: Names = Names {
    embed: "token_embd.weight",
    final_norm: "output_norm.weight",
    lm_head: "output.weight",
    layer: |i, part| {
        let p = match part {
            "attn_norm" => "attn_norm.weight",
            "q" => "attn_q.weight",
            "k" => "attn_k.weight",
            "v" => "attn_v.weight",
            "q_bias" => "attn_q.bias",
            "k_bias" => "attn_k.bias",
            "v_bias" => "attn_v.bias",
            "q_norm" => "attn_q_norm.weight",
            "k_norm" => "attn_k_norm.weight",
            "o" => "attn_output.weight",
            "mlp_norm" => "ffn_norm.weight",
            "gate" => "ffn_gate.weight",
            "up" => "ffn_up.weight",
            _ => "ffn_down.weight",
        };
        format!("blk.{i}.{p}")
    },
};

fn build(cfg: &ModelConfig, src: &mut Source<'_>, names: &Names) -> Result<Weights, ModelError> {
    let (h, d) = (cfg.hidden_size, cfg.head_dim);
    let (q_out, kv_out) = (cfg.num_heads * d, cfg.kv_heads * d);
    let cat = |ts: &[&Tensor], file: &Path| Tensor::cat(ts, 0).map_err(|e| corrupt_by(file, e));
    let file = src.file;
    let embed = src.take(names.embed, &[cfg.vocab_size, h])?;
    let mut layers = Vec::with_capacity(cfg.num_layers);
    for i in 0..cfg.num_layers {
        let n = |part: &str| (names.layer)(i, part);
        let q = src.take(&n("q"), &[q_out, h])?;
        let k = src.take(&n("k"), &[kv_out, h])?;
        let v = src.take(&n("v"), &[kv_out, h])?;
        let bqkv = if cfg.qkv_bias {
            let bq = src.take(&n("q_bias"), &[q_out])?;
            let bk = src.take(&n("k_bias"), &[kv_out])?;
            let bv = src.take(&n("v_bias"), &[kv_out])?;
            Some(cat(&[&bq, &bk, &bv], file)?)
        } else {
            None
        };
        let (q_norm, k_norm) = if cfg.qk_norm {
            (Some(src.take(&n("q_norm"), &[d])?), Some(src.take(&n("k_norm"), &[d])?))
        } else {
            (src.take_opt(&n("q_norm"), &[d])?, src.take_opt(&n("k_norm"), &[d])?)
        };
        let gate = src.take(&n("gate"), &[cfg.intermediate_size, h])?;
        let up = src.take(&n("up"), &[cfg.intermediate_size, h])?;
        layers.push(LayerWeights {
            attn_norm: src.take(&n("attn_norm"), &[h])?,
            wqkv: cat(&[&q, &k, &v], file)?,
            bqkv,
            q_norm,
            k_norm,
            wo: src.take(&n("o"), &[h, q_out])?,
            mlp_norm: src.take(&n("mlp_norm"), &[h])?,
            w_gate_up: cat(&[&gate, &up], file)?,
            w_down: src.take(&n("down"), &[h, cfg.intermediate_size])?,
        });
    }
    let final_norm = src.take(names.final_norm, &[h])?;
    let lm_head =
        if cfg.tie_word_embeddings { embed.clone() } else { src.take(names.lm_head, &[cfg.vocab_size, h])? };
    Ok(Weights { embed, layers, final_norm, lm_head })
}

/// Loads safetensors weights from a Hugging Face folder (single file or sharded with an index).
pub(crate) fn load_safetensors(dir: &Path, cfg: &ModelConfig, dtype: DType) -> Result<Weights, ModelError> {
    let files = xinf_models::safetensors_files(dir)?;
    let mut tensors = HashMap::new();
    for f in &files {
        let part = candle_core::safetensors::load(f, &Device::Cpu).map_err(|e| corrupt_by(f, e))?;
        tensors.extend(part);
    }
    let index = dir.join("model.safetensors");
    let file = files.first().map(|p| p.as_path()).unwrap_or(index.as_path());
    build(cfg, &mut Source { tensors, file, dtype }, &HF_NAMES)
}

/// Undoes llama.cpp's Q/K row permutation, so that HF's rotate-half RoPE applies.
fn unpermute(t: &Tensor, heads: usize) -> candle_core::Result<Tensor> {
    let (out, inp) = t.dims2()?;
    t.reshape((heads, out / heads / 2, 2, inp))?.transpose(1, 2)?.reshape((out, inp))
}

/// Loads (dequantizes) GGUF weights.
pub(crate) fn load_gguf(
    path: &Path,
    content: &gguf_file::Content,
    cfg: &ModelConfig,
    dtype: DType,
) -> Result<Weights, ModelError> {
    let mut file = std::fs::File::open(path).map_err(|e| ModelError::io(path, e))?;
    let mut tensors = HashMap::new();
    for name in content.tensor_infos.keys() {
        let q = content.tensor(&mut file, name, &Device::Cpu).map_err(|e| corrupt_by(path, e))?;
        let mut t = q.dequantize(&Device::Cpu).map_err(|e| corrupt_by(path, e))?;
        if cfg.architecture == Architecture::Llama {
            if name.ends_with("attn_q.weight") {
                t = unpermute(&t, cfg.num_heads).map_err(|e| corrupt_by(path, e))?;
            } else if name.ends_with("attn_k.weight") {
                t = unpermute(&t, cfg.kv_heads).map_err(|e| corrupt_by(path, e))?;
            }
        }
        tensors.insert(name.clone(), t);
    }
    build(cfg, &mut Source { tensors, file: path, dtype }, &GGUF_NAMES)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candle_errors_reach_clients_without_a_backtrace() {
        let inner = candle_core::Error::Msg("unknown magic 0x4c4c".into());
        let e = candle_core::Error::WithBacktrace {
            inner: Box::new(inner),
            backtrace: Box::new(std::backtrace::Backtrace::force_capture()),
        }
        .with_path("/m/model.gguf");
        assert!(e.to_string().lines().count() > 1, "candle prints the backtrace itself");
        assert_eq!(candle_reason(&e), "/m/model.gguf: unknown magic 0x4c4c");
    }
}
