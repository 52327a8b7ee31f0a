//! Random-weight checkpoints from a model's `config.json`, for measuring models whose weights
//! are not available (compute and memory traffic depend on the shapes, not the values).
//!
//! The folder is an ordinary Hugging Face checkpoint (`config.json`, `model.safetensors`,
//! tokenizer files) that any loader reads, so it is marked twice as not a real model: the
//! config carries `"xinf_random_weights": true` (xinf's loader warns when it loads one) and a
//! `README.md` says so. Nothing in xinf writes or loads such a folder unless asked to by path.

use crate::{ModelError, TextTokenizer};
use safetensors::tensor::{Dtype, TensorView};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;

#[cfg(test)]
mod tests;

/// Element type of the written weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RandomDtype {
    /// IEEE half.
    F16,
    /// bfloat16.
    Bf16,
    /// 32-bit float.
    F32,
}

impl RandomDtype {
    /// The dtype named `f16`/`float16`, `bf16`/`bfloat16` or `f32`/`float32`.
    pub fn parse(s: &str) -> Option<Self> {
        match s.to_ascii_lowercase().as_str() {
            "f16" | "float16" | "fp16" | "half" => Some(Self::F16),
            "bf16" | "bfloat16" => Some(Self::Bf16),
            "f32" | "float32" | "fp32" | "float" => Some(Self::F32),
            _ => None,
        }
    }

    fn safetensors(self) -> Dtype {
        match self {
            Self::F16 => Dtype::F16,
            Self::Bf16 => Dtype::BF16,
            Self::F32 => Dtype::F32,
        }
    }

    fn torch_name(self) -> &'static str {
        match self {
            Self::F16 => "float16",
            Self::Bf16 => "bfloat16",
            Self::F32 => "float32",
        }
    }

    /// Bytes of one element.
    fn size(self) -> usize {
        match self {
            Self::F16 | Self::Bf16 => 2,
            Self::F32 => 4,
        }
    }

    /// Writes `x` into `out`, which holds one element.
    fn put(self, x: f32, out: &mut [u8]) {
        match self {
            Self::F16 => out.copy_from_slice(&half::f16::from_f32(x).to_le_bytes()),
            Self::Bf16 => out.copy_from_slice(&half::bf16::from_f32(x).to_le_bytes()),
            Self::F32 => out.copy_from_slice(&x.to_le_bytes()),
        }
    }
}

/// What a written checkpoint holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RandomCheckpoint {
    /// Parameters written.
    pub parameters: u64,
    /// Bytes of `model.safetensors`' tensors.
    pub bytes: u64,
}

/// SplitMix64: a tiny generator whose sequence for a seed is fixed here, so a seed gives the
/// same weights (or benchmark prompts) in every version; library generators do not promise
/// that.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

/// SplitMix64's increment: its state after `n` outputs is the seed plus `n` of these, which is
/// what lets [`SplitMix64::skip`] jump ahead and threads fill one stream's parts.
const GOLDEN_GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;

impl SplitMix64 {
    /// The generator for `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// Moves past the next `n` outputs without computing them.
    pub fn skip(&mut self, n: u64) {
        self.0 = self.0.wrapping_add(n.wrapping_mul(GOLDEN_GAMMA));
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(GOLDEN_GAMMA);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }

    /// Uniform in `[-a, a)`.
    pub fn uniform(&mut self, a: f32) -> f32 {
        let u = (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32;
        (2.0 * u - 1.0) * a
    }
}

fn field(config: &Value, key: &str) -> Result<usize, ModelError> {
    config.get(key).and_then(Value::as_u64).map(|v| v as usize).ok_or_else(|| ModelError::Unsupported {
        field: key.to_owned(),
        value: config.get(key).map_or_else(|| "missing".to_owned(), Value::to_string),
        reason: "a non-negative integer is needed".into(),
    })
}

/// The tensors of a Llama / Qwen2 / Qwen3 checkpoint as `(name, shape, is_norm)`, in the
/// order Hugging Face writes them.
fn tensor_shapes(config: &Value) -> Result<Vec<(String, Vec<usize>, bool)>, ModelError> {
    let model_type = config.get("model_type").and_then(Value::as_str).unwrap_or_default();
    if !matches!(model_type, "llama" | "qwen2" | "qwen3") {
        return Err(ModelError::Unsupported {
            field: "model_type".into(),
            value: model_type.to_owned(),
            reason: "random checkpoints are made for llama, qwen2 and qwen3".into(),
        });
    }
    let hidden = field(config, "hidden_size")?;
    let heads = field(config, "num_attention_heads")?;
    let kv_heads = config.get("num_key_value_heads").and_then(Value::as_u64).map_or(heads, |v| v as usize);
    let head_dim =
        config.get("head_dim").and_then(Value::as_u64).map_or(hidden / heads.max(1), |v| v as usize);
    let inter = field(config, "intermediate_size")?;
    let layers = field(config, "num_hidden_layers")?;
    let vocab = field(config, "vocab_size")?;
    let tied = config.get("tie_word_embeddings").and_then(Value::as_bool).unwrap_or(model_type != "llama");
    let mut t = vec![("model.embed_tokens.weight".to_owned(), vec![vocab, hidden], false)];
    for i in 0..layers {
        let p = format!("model.layers.{i}");
        t.push((format!("{p}.input_layernorm.weight"), vec![hidden], true));
        t.push((format!("{p}.self_attn.q_proj.weight"), vec![heads * head_dim, hidden], false));
        t.push((format!("{p}.self_attn.k_proj.weight"), vec![kv_heads * head_dim, hidden], false));
        t.push((format!("{p}.self_attn.v_proj.weight"), vec![kv_heads * head_dim, hidden], false));
        if model_type == "qwen2" {
            t.push((format!("{p}.self_attn.q_proj.bias"), vec![heads * head_dim], false));
            t.push((format!("{p}.self_attn.k_proj.bias"), vec![kv_heads * head_dim], false));
            t.push((format!("{p}.self_attn.v_proj.bias"), vec![kv_heads * head_dim], false));
        }
        if model_type == "qwen3" {
            t.push((format!("{p}.self_attn.q_norm.weight"), vec![head_dim], true));
            t.push((format!("{p}.self_attn.k_norm.weight"), vec![head_dim], true));
        }
        t.push((format!("{p}.self_attn.o_proj.weight"), vec![hidden, heads * head_dim], false));
        t.push((format!("{p}.post_attention_layernorm.weight"), vec![hidden], true));
        t.push((format!("{p}.mlp.gate_proj.weight"), vec![inter, hidden], false));
        t.push((format!("{p}.mlp.up_proj.weight"), vec![inter, hidden], false));
        t.push((format!("{p}.mlp.down_proj.weight"), vec![hidden, inter], false));
    }
    t.push(("model.norm.weight".to_owned(), vec![hidden], true));
    if !tied {
        t.push(("lm_head.weight".to_owned(), vec![vocab, hidden], false));
    }
    Ok(t)
}

/// Fills `out` with `rng`'s next uniform values in `[-a, a)` as `dtype` elements, the values
/// `rng.uniform(a)` would give one after another, on up to `threads` threads: an 8B model's
/// eight billion values take a minute on one core. Each thread starts its part's stream
/// where that part begins ([`SplitMix64::skip`]), so the bytes do not depend on `threads`.
fn fill_uniform(dtype: RandomDtype, rng: &SplitMix64, a: f32, out: &mut [u8], threads: usize) {
    let es = dtype.size();
    let elems = out.len() / es;
    // Parts of at least 64 Ki elements: a thread's start costs more than that many values.
    let per = elems.div_ceil(threads.max(1)).max(1 << 16);
    std::thread::scope(|scope| {
        for (k, part) in out.chunks_mut(per * es).enumerate() {
            let mut r = rng.clone();
            r.skip((k * per) as u64);
            scope.spawn(move || part.chunks_exact_mut(es).for_each(|e| dtype.put(r.uniform(a), e)));
        }
    });
}

/// Writes a checkpoint of `config` with random weights into `out` (created; must be empty or
/// absent): matrices uniform with standard deviation 0.02 (a typical initialiser's scale),
/// norm weights 1. `tokenizer` is saved alongside so the folder loads as a model; token ids
/// past its vocabulary are still valid inputs.
pub fn write_random_checkpoint(
    config: &Value,
    dtype: RandomDtype,
    seed: u64,
    tokenizer: &TextTokenizer,
    out: &Path,
) -> Result<RandomCheckpoint, ModelError> {
    let shapes = tensor_shapes(config)?;
    if out.exists() && std::fs::read_dir(out).map_err(io(out))?.next().is_some() {
        let source = std::io::Error::new(std::io::ErrorKind::AlreadyExists, "the folder is not empty");
        return Err(ModelError::Io { path: out.display().to_string(), source });
    }
    std::fs::create_dir_all(out).map_err(io(out))?;
    let mut rng = SplitMix64::new(seed);
    let a = 0.02 * 3f32.sqrt();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut data: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::with_capacity(shapes.len());
    let mut parameters = 0u64;
    for (name, shape, norm) in shapes {
        let n: usize = shape.iter().product();
        let mut bytes = vec![0u8; n * dtype.size()];
        if norm {
            bytes.chunks_exact_mut(dtype.size()).for_each(|e| dtype.put(1.0, e));
        } else {
            fill_uniform(dtype, &rng, a, &mut bytes, threads);
            rng.skip(n as u64);
        }
        parameters += n as u64;
        data.push((name, shape, bytes));
    }
    let views: BTreeMap<String, TensorView<'_>> = data
        .iter()
        .map(|(name, shape, bytes)| {
            TensorView::new(dtype.safetensors(), shape.clone(), bytes)
                .map(|v| (name.clone(), v))
                .map_err(|e| ModelError::Corrupt { file: name.clone(), reason: e.to_string() })
        })
        .collect::<Result<_, _>>()?;
    let meta = std::collections::HashMap::from([("format".to_owned(), "pt".to_owned())]);
    let weights = out.join("model.safetensors");
    safetensors::serialize_to_file(&views, Some(meta), &weights)
        .map_err(|e| ModelError::Corrupt { file: weights.display().to_string(), reason: e.to_string() })?;

    let mut config = config.clone();
    if let Some(obj) = config.as_object_mut() {
        obj.insert("torch_dtype".into(), dtype.torch_name().into());
        obj.insert("xinf_random_weights".into(), true.into());
        obj.insert("xinf_random_seed".into(), seed.into());
    }
    write(out, "config.json", &serde_json::to_string_pretty(&config).unwrap_or_default())?;
    tokenizer.save_hf(out)?;
    write(
        out,
        "README.md",
        "# Random weights\n\nThis checkpoint was written by `xinf random-checkpoint`: its weights are random \
         numbers, not a trained model. It exists to measure speed and memory for this configuration; its \
         outputs are meaningless.\n",
    )?;
    let bytes = data.iter().map(|d| d.2.len() as u64).sum();
    Ok(RandomCheckpoint { parameters, bytes })
}

/// Whether the checkpoint folder (or the folder of a weights file) at `path` was written by
/// [`write_random_checkpoint`].
pub(crate) fn is_random(path: &Path) -> bool {
    let dir = if path.is_dir() { path } else { path.parent().unwrap_or(path) };
    std::fs::read(dir.join("config.json"))
        .ok()
        .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
        .is_some_and(|c| c.get("xinf_random_weights").and_then(Value::as_bool) == Some(true))
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> ModelError + '_ {
    move |source| ModelError::Io { path: path.display().to_string(), source }
}

fn write(dir: &Path, name: &str, text: &str) -> Result<(), ModelError> {
    let path = dir.join(name);
    std::fs::write(&path, text).map_err(io(&path))
}
