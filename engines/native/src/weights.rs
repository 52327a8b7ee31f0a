//! Loading weights into the tensors the forward pass uses, from safetensors or GGUF.
//!
//! Weights are held in the compute dtype (F32 on CPU), or, for a GGUF file on the CPU, as its
//! quantized blocks ([`Linear::Quantized`]; Q4_1 and Q8_0 repacked for xinf's kernels in
//! [`Linear::Q4_1`] and [`Linear::Q8_0`]). Q, K and V projections are fused into one matrix,
//! and so are the gate and up projections: one matmul each instead of three and two, which
//! matters most at decode where every matmul is small.

use crate::q4_1::Packed;
use candle_core::quantized::{GgmlDType, QStorage, QTensor, gguf_file};
use candle_core::{DType, Device, Tensor};
use std::borrow::Cow;
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use xinf_models::ModelError;
use xinf_models::{Architecture, ModelConfig};

mod bytes;
mod footprint;
#[cfg(feature = "cuda")]
pub(crate) use bytes::with_le_bytes;
pub(crate) use footprint::gguf_held_bytes;

/// A projection's weight, `[out, in]`.
pub(crate) enum Linear {
    /// In the compute dtype.
    Dense(Tensor),
    /// A GGUF file's quantized blocks, multiplied as stored (candle's quantized matmul, which
    /// quantizes the activations to 8 bits and works block by block, as llama.cpp does).
    Quantized(Arc<QTensor>),
    /// Q4_1 blocks repacked for xinf's kernel, where this CPU runs it.
    Q4_1(Arc<Packed>),
    /// Q8_0 blocks repacked for xinf's kernel, where this CPU runs it.
    Q8_0(Arc<crate::q8_0::Packed>),
}

/// A prompt of at least this many tokens has its rows multiplied in F32, with each quantized
/// weight widened to F32 for a GEMM: block-by-block dot products win while the weight's bytes
/// dominate (decode, short prompts), a GEMM once there are enough rows to reuse each weight
/// (prefill), where dequantizing costs a few percent of the multiply.
const DENSE_FROM_TOKENS: usize = 32;

/// Which rows of a step a quantized weight multiplies in F32 and which block by block.
///
/// Decided per row from what the row is, never from the step it is in: a prompt token of a
/// prompt of [`DENSE_FROM_TOKENS`] or more is dense, every other row (generated tokens, short
/// prompts) quantized. So a request's output is the same alone or batched, in one prompt chunk
/// or several, and after a preemption recomputes it.
pub(crate) enum RowKinds {
    Dense,
    Quantized,
    /// Both: the rows of each kind (by index) and, for putting the results back in row order,
    /// where each row lands in `[dense results; quantized results]`.
    Mixed {
        dense: Tensor,
        quantized: Tensor,
        order: Tensor,
    },
}

impl RowKinds {
    /// From each row's kind (`true`: quantized).
    pub(crate) fn new(quantized: &[bool]) -> candle_core::Result<Self> {
        if quantized.iter().all(|&q| q) {
            return Ok(Self::Quantized);
        }
        if !quantized.iter().any(|&q| q) {
            return Ok(Self::Dense);
        }
        let pick = |kind: bool| -> Vec<u32> {
            (0..quantized.len() as u32).filter(|&i| quantized[i as usize] == kind).collect()
        };
        let (dense, quant) = (pick(false), pick(true));
        let mut order = vec![0u32; quantized.len()];
        for (at, &row) in dense.iter().chain(&quant).enumerate() {
            order[row as usize] = at as u32;
        }
        let index = |v: Vec<u32>| {
            let n = v.len();
            Tensor::from_vec(v, n, &Device::Cpu)
        };
        Ok(Self::Mixed { dense: index(dense)?, quantized: index(quant)?, order: index(order)? })
    }

    /// The kind of position `pos` of a sequence whose prompt has `prompt_len` tokens.
    pub(crate) fn quantized_at(pos: usize, prompt_len: usize) -> bool {
        pos >= prompt_len || prompt_len < DENSE_FROM_TOKENS
    }
}

/// `x @ qᵀ` in F32, each row as it would be among many: block types widened a slice of rows at
/// a time ([`crate::widened`], as [`Packed::matmul_f32`] does for Q4_1), which sees to that
/// itself; anything else dequantized whole here, where a lone row is multiplied as one of two,
/// since the GEMM takes another path for one row (a matrix-vector product, whose sums differ in
/// the last bits), which would make a prompt's last token differ with how the prompt was cut
/// into chunks, or when a decode recomputes it.
fn prompt_rows(x: &Tensor, q: &QTensor) -> candle_core::Result<Tensor> {
    if let Some(product) = crate::widened::quantized(q, x) {
        return product;
    }
    let w = q.dequantize(x.device())?;
    if x.dim(0)? == 1 {
        return Tensor::cat(&[x, x], 0)?.matmul(&w.t()?)?.narrow(0, 0, 1);
    }
    x.matmul(&w.t()?)
}

/// `x @ qᵀ` block by block, by candle's kernels (Q4_1 and Q8_0 have xinf's where the CPU
/// runs them, [`Linear::blocks`]).
fn generated_rows(x: &Tensor, q: &QTensor) -> candle_core::Result<Tensor> {
    x.contiguous()?.apply_op1_no_bwd(q)
}

/// `x @ wᵀ` for a quantized `w`, each row multiplied as `rows` says: in F32 by `dense`, block
/// by block by `blocks`.
fn by_rows(
    x: &Tensor,
    rows: &RowKinds,
    dense: impl Fn(&Tensor) -> candle_core::Result<Tensor>,
    blocks: impl Fn(&Tensor) -> candle_core::Result<Tensor>,
) -> candle_core::Result<Tensor> {
    match rows {
        RowKinds::Dense => dense(x),
        RowKinds::Quantized => blocks(x),
        RowKinds::Mixed { dense: d, quantized, order } => {
            let d = dense(&x.index_select(d, 0)?)?;
            let r = blocks(&x.index_select(quantized, 0)?)?;
            Tensor::cat(&[d, r], 0)?.index_select(order, 0)
        }
    }
}

impl Linear {
    /// `x @ wᵀ`, a quantized weight multiplying each row as `rows` says.
    pub(crate) fn forward(&self, x: &Tensor, rows: &RowKinds) -> candle_core::Result<Tensor> {
        match self {
            Self::Dense(w) => x.matmul(&w.t()?),
            Self::Quantized(q) => by_rows(x, rows, |x| prompt_rows(x, q), |x| generated_rows(x, q)),
            Self::Q4_1(p) => by_rows(x, rows, |x| p.matmul_f32(x), |x| p.matmul(x)),
            Self::Q8_0(p) => by_rows(x, rows, |x| p.matmul_f32(x), |x| p.matmul(x)),
        }
    }

    /// [`forward`](Self::forward) of `m` rows that are all generated tokens, on slices: `xs`
    /// holds `m` rows of the input, `out` is given `m` rows of the output. The same product,
    /// bit for bit, as `forward` gives those rows; xinf's kernels without a tensor around them.
    pub(crate) fn forward_generated(
        &self,
        xs: &[f32],
        m: usize,
        out: &mut Vec<f32>,
    ) -> candle_core::Result<()> {
        let rows = match self {
            Self::Dense(w) => w.dim(0)?,
            Self::Quantized(q) => q.shape().dims2()?.0,
            Self::Q4_1(p) => p.rows(),
            Self::Q8_0(p) => p.rows(),
        };
        out.resize(m * rows, 0.0);
        match self {
            Self::Q4_1(p) => return p.matmul_into(xs, m, out),
            Self::Q8_0(p) => return p.matmul_into(xs, m, out),
            _ => {}
        }
        let x = Tensor::from_slice(xs, (m, xs.len() / m.max(1)), &Device::Cpu)?;
        let y = self.forward(&x, &RowKinds::Quantized)?;
        *out = y.flatten_all()?.to_vec1::<f32>()?;
        Ok(())
    }

    /// The dense weight; quantized weights are computed on the CPU only.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn dense(&self) -> candle_core::Result<&Tensor> {
        match self {
            Self::Dense(w) => Ok(w),
            Self::Quantized(_) | Self::Q4_1(_) | Self::Q8_0(_) => Err(candle_core::Error::Msg(
                "quantized weights are multiplied on the CPU only (load them dequantized)".into(),
            )),
        }
    }

    /// Its elements (`out × in`).
    pub(crate) fn elem_count(&self) -> usize {
        match self {
            Self::Dense(w) => w.elem_count(),
            Self::Quantized(q) => q.shape().elem_count(),
            Self::Q4_1(p) => p.elem_count(),
            Self::Q8_0(p) => p.elem_count(),
        }
    }

    /// A GGUF file's blocks as held: Q4_1 and Q8_0 repacked where this CPU runs xinf's kernels.
    pub(crate) fn blocks(q: QTensor) -> candle_core::Result<Self> {
        if crate::q4_1::applies(&q) {
            return Ok(Self::Q4_1(Arc::new(Packed::new(&q)?)));
        }
        if crate::q8_0::applies(&q) {
            return Ok(Self::Q8_0(Arc::new(crate::q8_0::Packed::new(&q)?)));
        }
        Ok(Self::Quantized(Arc::new(q)))
    }
}

/// One transformer layer.
pub(crate) struct LayerWeights {
    pub(crate) attn_norm: Tensor,
    /// `[q + k + v, hidden]`.
    pub(crate) wqkv: Linear,
    /// `[q + k + v]` when the model has biases.
    pub(crate) bqkv: Option<Tensor>,
    pub(crate) q_norm: Option<Tensor>,
    pub(crate) k_norm: Option<Tensor>,
    /// `[hidden, q]`.
    pub(crate) wo: Linear,
    pub(crate) mlp_norm: Tensor,
    /// `[2 * intermediate, hidden]`, gate rows first.
    pub(crate) w_gate_up: Linear,
    /// `[hidden, intermediate]`.
    pub(crate) w_down: Linear,
}

/// All weights of a model.
pub(crate) struct Weights {
    /// `[vocab, hidden]`.
    pub(crate) embed: Tensor,
    pub(crate) layers: Vec<LayerWeights>,
    pub(crate) final_norm: Tensor,
    /// `[vocab, hidden]`; the embedding when tied.
    pub(crate) lm_head: Linear,
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
    /// Projection weights kept quantized (a GGUF file's, for the CPU).
    quantized: HashMap<String, QTensor>,
    file: &'a Path,
    dtype: DType,
}

impl Source<'_> {
    fn take(&mut self, name: &str, shape: &[usize]) -> Result<Tensor, ModelError> {
        let t = match self.quantized.remove(name) {
            Some(q) => q.dequantize(&Device::Cpu).map_err(|e| corrupt_by(self.file, e))?,
            None => self
                .tensors
                .remove(name)
                .ok_or_else(|| corrupt(self.file, format!("tensor `{name}` is missing")))?,
        };
        if t.dims() != shape {
            return Err(corrupt(
                self.file,
                format!("tensor `{name}` has shape {:?}, expected {shape:?}", t.dims()),
            ));
        }
        t.to_dtype(self.dtype).map_err(|e| corrupt_by(self.file, e))
    }

    fn take_opt(&mut self, name: &str, shape: &[usize]) -> Result<Option<Tensor>, ModelError> {
        let present = self.tensors.contains_key(name) || self.quantized.contains_key(name);
        if present { self.take(name, shape).map(Some) } else { Ok(None) }
    }

    /// The projection made of `parts` (names and their `[out, in]` shapes) stacked by rows:
    /// quantized when every part is, in one block type; dense otherwise.
    fn linear(&mut self, parts: &[(String, [usize; 2])]) -> Result<Linear, ModelError> {
        let quantized: Vec<&QTensor> = parts.iter().filter_map(|(n, _)| self.quantized.get(n)).collect();
        let one_type = quantized.first().map(|q| q.dtype());
        if quantized.len() == parts.len() && quantized.iter().all(|q| Some(q.dtype()) == one_type) {
            let mut bytes = Vec::new();
            let mut rows = 0;
            for (name, shape) in parts {
                let q = self
                    .quantized
                    .remove(name)
                    .ok_or_else(|| corrupt(self.file, "a quantized part vanished"))?;
                if q.shape().dims() != shape {
                    let dims = q.shape().dims().to_vec();
                    return Err(corrupt(
                        self.file,
                        format!("tensor `{name}` has shape {dims:?}, expected {shape:?}"),
                    ));
                }
                bytes.extend_from_slice(&q.data().map_err(|e| corrupt_by(self.file, e))?);
                rows += shape[0];
            }
            let (dtype, cols) = (one_type.unwrap_or(GgmlDType::F32), parts[0].1[1]);
            let q = blocks_tensor(bytes, dtype, (rows, cols)).map_err(|e| corrupt_by(self.file, e))?;
            return Linear::blocks(q).map_err(|e| corrupt_by(self.file, e));
        }
        let dense = parts.iter().map(|(n, shape)| self.take(n, shape)).collect::<Result<Vec<_>, _>>()?;
        let dense = if dense.len() == 1 {
            dense.into_iter().next().ok_or_else(|| corrupt(self.file, "no part"))?
        } else {
            Tensor::cat(&dense, 0).map_err(|e| corrupt_by(self.file, e))?
        };
        Ok(Linear::Dense(dense))
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
    // A tied LM head multiplies by the embedding: quantized, it stays so (the lookup needs it
    // dense too).
    let tied_head = match src.quantized.get(names.embed) {
        Some(q) if cfg.tie_word_embeddings => {
            let q = match vectorized(q).map_err(|e| corrupt_by(file, e))? {
                Some(reblocked) => reblocked,
                None => requantized(q, file)?,
            };
            Some(Linear::blocks(q).map_err(|e| corrupt_by(file, e))?)
        }
        _ => None,
    };
    let embed = src.take(names.embed, &[cfg.vocab_size, h])?;
    let mut layers = Vec::with_capacity(cfg.num_layers);
    for i in 0..cfg.num_layers {
        let n = |part: &str| (names.layer)(i, part);
        let wqkv = src.linear(&[(n("q"), [q_out, h]), (n("k"), [kv_out, h]), (n("v"), [kv_out, h])])?;
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
        let inter = cfg.intermediate_size;
        layers.push(LayerWeights {
            attn_norm: src.take(&n("attn_norm"), &[h])?,
            wqkv,
            bqkv,
            q_norm,
            k_norm,
            wo: src.linear(&[(n("o"), [h, q_out])])?,
            mlp_norm: src.take(&n("mlp_norm"), &[h])?,
            w_gate_up: src.linear(&[(n("gate"), [inter, h]), (n("up"), [inter, h])])?,
            w_down: src.linear(&[(n("down"), [h, inter])])?,
        });
    }
    let final_norm = src.take(names.final_norm, &[h])?;
    let lm_head = match tied_head {
        Some(head) => head,
        None if cfg.tie_word_embeddings => Linear::Dense(embed.clone()),
        None => src.linear(&[(names.lm_head.to_owned(), [cfg.vocab_size, h])])?,
    };
    Ok(Weights { embed, layers, final_norm, lm_head })
}

/// A quantized CPU tensor of `dims` made of the blocks `bytes` (of type `dtype`).
fn blocks_tensor(bytes: Vec<u8>, dtype: GgmlDType, dims: (usize, usize)) -> candle_core::Result<QTensor> {
    QTensor::new(QStorage::from_data(Cow::Owned(bytes), &Device::Cpu, dtype)?, dims)
}

/// A copy of a quantized tensor.
fn requantized(q: &QTensor, file: &Path) -> Result<QTensor, ModelError> {
    let copy = |q: &QTensor| blocks_tensor(q.data()?.into_owned(), q.dtype(), q.shape().dims2()?);
    copy(q).map_err(|e| corrupt_by(file, e))
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
    build(cfg, &mut Source { tensors, quantized: HashMap::new(), file, dtype }, &HF_NAMES)
}

/// Undoes llama.cpp's Q/K row permutation, so that HF's rotate-half RoPE applies.
fn unpermute(t: &Tensor, heads: usize) -> candle_core::Result<Tensor> {
    let (out, inp) = t.dims2()?;
    t.reshape((heads, out / heads / 2, 2, inp))?.transpose(1, 2)?.reshape((out, inp))
}

/// Rows of a quantized `[out, in]` tensor in `unpermute`'s order.
fn unpermute_rows(q: &QTensor, heads: usize) -> candle_core::Result<QTensor> {
    let (out, cols) = q.shape().dims2()?;
    if heads == 0 || out % (2 * heads) != 0 {
        candle_core::bail!("{out} rows do not split into {heads} heads of rotary pairs");
    }
    let data = q.data()?;
    let row = data.len() / out;
    let half = out / heads / 2;
    let mut rows = Vec::with_capacity(data.len());
    for head in 0..heads {
        for j in 0..2 {
            for i in 0..half {
                let r = head * 2 * half + 2 * i + j;
                rows.extend_from_slice(&data[r * row..(r + 1) * row]);
            }
        }
    }
    blocks_tensor(rows, q.dtype(), (out, cols))
}

/// `q` re-blocked where neither candle nor [`crate::q4_1`] has SIMD code for its block type
/// (`None`: one has): Q4_1 (without AVX2), Q5_0 and Q5_1 have only scalar code on x86 (ten
/// times slower than Q8_0's), so they are re-blocked as Q8_0, which
/// holds their values to within 1/254 of each block's range and reads 8.5 bits a weight.
fn vectorized(q: &QTensor) -> candle_core::Result<Option<QTensor>> {
    match reblocked_type(q.dtype(), q.shape().dims()) {
        Some(to) => QTensor::quantize(&q.dequantize(&Device::Cpu)?, to).map(Some),
        None => Ok(None),
    }
}

/// The block type [`vectorized`] re-blocks a tensor of `dtype` and `dims` to (`None`: it stays).
fn reblocked_type(dtype: GgmlDType, dims: &[usize]) -> Option<GgmlDType> {
    match dtype {
        GgmlDType::Q4_1 if crate::q4_1::applies_to(dtype, dims) => None,
        GgmlDType::Q4_1 | GgmlDType::Q5_0 | GgmlDType::Q5_1 => Some(GgmlDType::Q8_0),
        _ => None,
    }
}

/// The block type a GGUF tensor is held in when [`load_gguf`] keeps the projections quantized,
/// or `None` where it is widened to F32 (16- and 32-bit floats, vectors). The embedding keeps
/// its own type (a tied head re-blocks a copy of it); other matrices are [`vectorized`].
fn held_type(name: &str, dtype: GgmlDType, dims: &[usize]) -> Option<GgmlDType> {
    let float = matches!(dtype, GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16);
    if float || dims.len() != 2 {
        return None;
    }
    if name == GGUF_NAMES.embed { Some(dtype) } else { Some(reblocked_type(dtype, dims).unwrap_or(dtype)) }
}

/// Loads GGUF weights: dequantized, or with the projections kept in their quantized blocks
/// (`keep_quantized`, for the CPU).
pub(crate) fn load_gguf(
    path: &Path,
    content: &gguf_file::Content,
    cfg: &ModelConfig,
    dtype: DType,
    keep_quantized: bool,
) -> Result<Weights, ModelError> {
    let mut file = std::fs::File::open(path).map_err(|e| ModelError::io(path, e))?;
    let mut tensors = HashMap::new();
    let mut quantized = HashMap::new();
    let llama = cfg.architecture == Architecture::Llama;
    for name in content.tensor_infos.keys() {
        let q = content.tensor(&mut file, name, &Device::Cpu).map_err(|e| corrupt_by(path, e))?;
        let heads = match name {
            n if llama && n.ends_with("attn_q.weight") => Some(cfg.num_heads),
            n if llama && n.ends_with("attn_k.weight") => Some(cfg.kv_heads),
            _ => None,
        };
        if keep_quantized && held_type(name, q.dtype(), q.shape().dims()).is_some() {
            // The embedding is looked up dense; a tied head re-blocks its own copy.
            let reblocked = if name == GGUF_NAMES.embed {
                None
            } else {
                vectorized(&q).map_err(|e| corrupt_by(path, e))?
            };
            let q = reblocked.unwrap_or(q);
            let q = match heads {
                Some(heads) => unpermute_rows(&q, heads).map_err(|e| corrupt_by(path, e))?,
                None => q,
            };
            quantized.insert(name.clone(), q);
            continue;
        }
        let mut t = q.dequantize(&Device::Cpu).map_err(|e| corrupt_by(path, e))?;
        if let Some(heads) = heads {
            t = unpermute(&t, heads).map_err(|e| corrupt_by(path, e))?;
        }
        tensors.insert(name.clone(), t);
    }
    build(cfg, &mut Source { tensors, quantized, file: path, dtype }, &GGUF_NAMES)
}

#[cfg(test)]
mod tests;
