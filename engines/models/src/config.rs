//! The model configuration xinf serves, read from `config.json` or GGUF metadata.
//!
//! Everything xinf does not serve (architectures other than Llama, Qwen2 and Qwen3, multimodal,
//! pre-quantized safetensors, sliding windows, MLP biases) is refused here, at load, with the
//! field named: a model that loads is one every engine behind xinf computes the same way.

use crate::ModelError;
use serde::Deserialize;

/// Supported architecture families.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Architecture {
    /// Llama 2/3 (and SmolLM, which is Llama-shaped).
    Llama,
    /// Qwen2 / Qwen2.5: biases on the Q, K and V projections.
    Qwen2,
    /// Qwen3: RMSNorm on each query and key head, no biases.
    Qwen3,
}

impl Architecture {
    /// Lower-case family name, as used in contracts.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Llama => "llama",
            Self::Qwen2 => "qwen2",
            Self::Qwen3 => "qwen3",
        }
    }
}

/// How positions are scaled before RoPE.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RopeScaling {
    /// Plain RoPE.
    None,
    /// Positions divided by `factor`.
    Linear {
        /// Divisor.
        factor: f64,
    },
    /// Llama 3.1+ frequency-dependent scaling.
    Llama3 {
        /// Scale of low frequencies.
        factor: f64,
        /// Low frequency factor.
        low_freq_factor: f64,
        /// High frequency factor.
        high_freq_factor: f64,
        /// Context the model was trained with before scaling.
        original_max_position_embeddings: f64,
    },
}

/// The shape and settings of a model.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// Family.
    pub architecture: Architecture,
    /// Hidden size.
    pub hidden_size: usize,
    /// MLP inner size.
    pub intermediate_size: usize,
    /// Transformer layers.
    pub num_layers: usize,
    /// Query heads.
    pub num_heads: usize,
    /// KV heads.
    pub kv_heads: usize,
    /// Head dimension.
    pub head_dim: usize,
    /// Vocabulary size.
    pub vocab_size: usize,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f64,
    /// RoPE base.
    pub rope_theta: f64,
    /// RoPE scaling.
    pub rope_scaling: RopeScaling,
    /// Longest position the model supports.
    pub max_position_embeddings: usize,
    /// The output projection is the embedding matrix.
    pub tie_word_embeddings: bool,
    /// Q, K, V projections carry biases.
    pub qkv_bias: bool,
    /// Per-head RMSNorm on queries and keys.
    pub qk_norm: bool,
    /// BOS token id, when the model has one.
    pub bos_token_id: Option<u32>,
    /// End-of-sequence token ids.
    pub eos_token_ids: Vec<u32>,
}

fn unsupported(field: &str, value: impl ToString, reason: &str) -> ModelError {
    ModelError::Unsupported { field: field.to_owned(), value: value.to_string(), reason: reason.to_owned() }
}

/// Raw `config.json`, with the fields that matter.
#[derive(Debug, Deserialize)]
struct HfConfig {
    architectures: Option<Vec<String>>,
    model_type: Option<String>,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    vocab_size: usize,
    rms_norm_eps: f64,
    rope_theta: Option<f64>,
    rope_scaling: Option<serde_json::Value>,
    rope_parameters: Option<serde_json::Value>,
    max_position_embeddings: usize,
    #[serde(default)]
    tie_word_embeddings: Option<bool>,
    hidden_act: Option<String>,
    attention_bias: Option<bool>,
    mlp_bias: Option<bool>,
    bos_token_id: Option<serde_json::Value>,
    eos_token_id: Option<serde_json::Value>,
    use_sliding_window: Option<bool>,
    sliding_window: Option<serde_json::Value>,
    layer_types: Option<Vec<String>>,
    vision_config: Option<serde_json::Value>,
    quantization_config: Option<serde_json::Value>,
}

fn ids(v: &Option<serde_json::Value>) -> Vec<u32> {
    match v {
        Some(serde_json::Value::Number(n)) => n.as_u64().map(|x| vec![x as u32]).unwrap_or_default(),
        Some(serde_json::Value::Array(a)) => a.iter().filter_map(|x| x.as_u64()).map(|x| x as u32).collect(),
        _ => Vec::new(),
    }
}

fn f64_field(v: &serde_json::Value, key: &str, default: f64) -> Result<f64, ModelError> {
    match v.get(key) {
        None => Ok(default),
        Some(x) => {
            x.as_f64().ok_or_else(|| unsupported(&format!("rope_scaling.{key}"), x, "expected a number"))
        }
    }
}

fn parse_rope_scaling(v: Option<&serde_json::Value>) -> Result<RopeScaling, ModelError> {
    let Some(v) = v.filter(|v| !v.is_null()) else { return Ok(RopeScaling::None) };
    let kind = v.get("rope_type").or_else(|| v.get("type")).and_then(|t| t.as_str()).unwrap_or("default");
    match kind {
        "default" => Ok(RopeScaling::None),
        "linear" => Ok(RopeScaling::Linear { factor: f64_field(v, "factor", 1.0)? }),
        "llama3" => Ok(RopeScaling::Llama3 {
            factor: f64_field(v, "factor", 8.0)?,
            low_freq_factor: f64_field(v, "low_freq_factor", 1.0)?,
            high_freq_factor: f64_field(v, "high_freq_factor", 4.0)?,
            original_max_position_embeddings: f64_field(v, "original_max_position_embeddings", 8192.0)?,
        }),
        other => Err(unsupported("rope_scaling.rope_type", other, "supported: default, linear, llama3")),
    }
}

impl ModelConfig {
    /// Parses and checks a Hugging Face `config.json`.
    pub fn from_hf_json(text: &str, file: &str) -> Result<Self, ModelError> {
        let raw: HfConfig = serde_json::from_str(text)
            .map_err(|e| ModelError::Corrupt { file: file.to_owned(), reason: e.to_string() })?;
        let model_type = raw.model_type.clone().unwrap_or_default();
        let arch_name = raw.architectures.as_ref().and_then(|a| a.first().cloned()).unwrap_or_default();
        let architecture = match (model_type.as_str(), arch_name.as_str()) {
            ("llama", _) | (_, "LlamaForCausalLM") => Architecture::Llama,
            ("qwen2", _) | (_, "Qwen2ForCausalLM") => Architecture::Qwen2,
            ("qwen3", _) | (_, "Qwen3ForCausalLM") => Architecture::Qwen3,
            _ => {
                let value = if model_type.is_empty() { arch_name } else { model_type };
                return Err(unsupported("model_type", value, "supported: llama, qwen2, qwen3"));
            }
        };
        if raw.vision_config.is_some() {
            return Err(unsupported("vision_config", "present", "multimodal models are not supported"));
        }
        if let Some(q) = &raw.quantization_config {
            return Err(unsupported("quantization_config", q, "pre-quantized safetensors are not supported"));
        }
        if let Some(act) = &raw.hidden_act
            && act != "silu"
        {
            return Err(unsupported("hidden_act", act, "only silu is supported"));
        }
        if raw.mlp_bias == Some(true) {
            return Err(unsupported("mlp_bias", true, "MLP biases are not supported"));
        }
        if raw.use_sliding_window == Some(true) {
            return Err(unsupported("use_sliding_window", true, "sliding-window attention is not supported"));
        }
        if architecture == Architecture::Llama
            && let Some(w) = raw.sliding_window.as_ref().filter(|w| !w.is_null())
        {
            return Err(unsupported("sliding_window", w, "sliding-window attention is not supported"));
        }
        if let Some(types) = &raw.layer_types
            && let Some(t) = types.iter().find(|t| t.as_str() != "full_attention")
        {
            return Err(unsupported("layer_types", t, "only full attention layers are supported"));
        }
        let rope_params = raw.rope_scaling.as_ref().or(raw.rope_parameters.as_ref());
        let rope_theta = raw
            .rope_theta
            .or_else(|| {
                raw.rope_parameters.as_ref().and_then(|p| p.get("rope_theta")).and_then(|t| t.as_f64())
            })
            .unwrap_or(10_000.0);
        let config = Self {
            architecture,
            hidden_size: raw.hidden_size,
            intermediate_size: raw.intermediate_size,
            num_layers: raw.num_hidden_layers,
            num_heads: raw.num_attention_heads,
            kv_heads: raw.num_key_value_heads.unwrap_or(raw.num_attention_heads),
            head_dim: raw.head_dim.unwrap_or(raw.hidden_size / raw.num_attention_heads.max(1)),
            vocab_size: raw.vocab_size,
            rms_norm_eps: raw.rms_norm_eps,
            rope_theta,
            rope_scaling: parse_rope_scaling(rope_params)?,
            max_position_embeddings: raw.max_position_embeddings,
            tie_word_embeddings: raw.tie_word_embeddings.unwrap_or(architecture != Architecture::Llama),
            qkv_bias: match architecture {
                Architecture::Qwen2 => true,
                _ => raw.attention_bias.unwrap_or(false),
            },
            qk_norm: architecture == Architecture::Qwen3,
            bos_token_id: ids(&raw.bos_token_id).first().copied(),
            eos_token_ids: ids(&raw.eos_token_id),
        };
        config.check()?;
        Ok(config)
    }

    /// Reads the configuration from GGUF metadata (llama.cpp key names).
    pub fn from_gguf(content: &candle_core::quantized::gguf_file::Content) -> Result<Self, ModelError> {
        use candle_core::quantized::gguf_file::Value;
        let md = &content.metadata;
        let get = |k: &str| md.get(k);
        let arch_name =
            get("general.architecture").and_then(|v| v.to_string().ok()).cloned().unwrap_or_default();
        let architecture = match arch_name.as_str() {
            "llama" => Architecture::Llama,
            "qwen2" => Architecture::Qwen2,
            "qwen3" => Architecture::Qwen3,
            other => {
                return Err(unsupported("general.architecture", other, "supported: llama, qwen2, qwen3"));
            }
        };
        let num = |k: &str| -> Result<Option<u64>, ModelError> {
            let key = format!("{arch_name}.{k}");
            match md.get(&key) {
                None => Ok(None),
                Some(v) => v
                    .to_u64()
                    .or_else(|_| v.to_u32().map(u64::from))
                    .or_else(|_| v.to_i32().map(|x| x.max(0) as u64))
                    .map(Some)
                    .map_err(|e| unsupported(&key, format!("{v:?}"), &e.to_string())),
            }
        };
        let float = |k: &str| -> Option<f64> {
            md.get(&format!("{arch_name}.{k}"))
                .and_then(|v| v.to_f32().ok().map(f64::from).or(v.to_f64().ok()))
        };
        let need = |k: &str| -> Result<usize, ModelError> {
            num(k)?.map(|v| v as usize).ok_or_else(|| ModelError::Corrupt {
                file: "GGUF metadata".into(),
                reason: format!("missing `{arch_name}.{k}`"),
            })
        };
        let hidden_size = need("embedding_length")?;
        let num_heads = need("attention.head_count")?;
        let kv_heads = num("attention.head_count_kv")?.map(|v| v as usize).unwrap_or(num_heads);
        let head_dim =
            num("attention.key_length")?.map(|v| v as usize).unwrap_or(hidden_size / num_heads.max(1));
        if let Some(w) = num("attention.sliding_window")?
            && w > 0
        {
            return Err(unsupported(
                &format!("{arch_name}.attention.sliding_window"),
                w,
                "sliding-window attention is not supported",
            ));
        }
        let vocab_size = match get("tokenizer.ggml.tokens") {
            Some(Value::Array(a)) => a.len(),
            _ => need("vocab_size")?,
        };
        let rope_scaling =
            match md.get(&format!("{arch_name}.rope.scaling.type")).and_then(|v| v.to_string().ok()) {
                None => RopeScaling::None,
                Some(t) if t == "none" => RopeScaling::None,
                Some(t) if t == "linear" => {
                    RopeScaling::Linear { factor: float("rope.scaling.factor").unwrap_or(1.0) }
                }
                Some(t) => {
                    return Err(unsupported(
                        &format!("{arch_name}.rope.scaling.type"),
                        t,
                        "supported: none, linear",
                    ));
                }
            };
        let tensor_names = &content.tensor_infos;
        let config = Self {
            architecture,
            hidden_size,
            intermediate_size: need("feed_forward_length")?,
            num_layers: need("block_count")?,
            num_heads,
            kv_heads,
            head_dim,
            vocab_size,
            rms_norm_eps: float("attention.layer_norm_rms_epsilon").unwrap_or(1e-6),
            rope_theta: float("rope.freq_base").unwrap_or(10_000.0),
            rope_scaling,
            max_position_embeddings: need("context_length")?,
            tie_word_embeddings: !tensor_names.contains_key("output.weight"),
            qkv_bias: tensor_names.contains_key("blk.0.attn_q.bias"),
            qk_norm: tensor_names.contains_key("blk.0.attn_q_norm.weight"),
            bos_token_id: get("tokenizer.ggml.bos_token_id").and_then(|v| v.to_u32().ok()),
            eos_token_ids: get("tokenizer.ggml.eos_token_id")
                .and_then(|v| v.to_u32().ok())
                .into_iter()
                .collect(),
        };
        config.check()?;
        Ok(config)
    }

    /// What a peer must match to exchange KV with an engine computing this model: the shape
    /// from here, the rest from the engine (its KV dtype, its context length cap, the digest of
    /// the weight files it loaded, its tokenizer).
    pub fn contract(
        &self,
        tokenizer: &crate::TextTokenizer,
        dtype: xinf_engine::KvDtype,
        context_length: usize,
        weights_digest: String,
    ) -> xinf_engine::ModelContract {
        xinf_engine::ModelContract {
            architecture: self.architecture.as_str().to_owned(),
            dtype,
            num_layers: self.num_layers,
            num_heads: self.num_heads,
            kv_heads: self.kv_heads,
            head_dim: self.head_dim,
            vocab_size: self.vocab_size,
            context_length,
            rope_theta: self.rope_theta,
            weights_digest,
            tokenizer_digest: tokenizer.digest().to_owned(),
        }
    }

    fn check(&self) -> Result<(), ModelError> {
        for (name, v) in [
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_layers),
            ("num_attention_heads", self.num_heads),
            ("num_key_value_heads", self.kv_heads),
            ("head_dim", self.head_dim),
            ("vocab_size", self.vocab_size),
            ("max_position_embeddings", self.max_position_embeddings),
        ] {
            if v == 0 {
                return Err(unsupported(name, 0, "must be positive"));
            }
        }
        if !self.num_heads.is_multiple_of(self.kv_heads) {
            return Err(unsupported("num_key_value_heads", self.kv_heads, "must divide num_attention_heads"));
        }
        if !self.head_dim.is_multiple_of(2) {
            return Err(unsupported("head_dim", self.head_dim, "RoPE needs an even head dimension"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
