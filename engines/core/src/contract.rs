//! The model contract: what two engines must share to exchange KV pages.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Element type of the KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KvDtype {
    /// 32-bit float.
    F32,
    /// IEEE half.
    F16,
    /// bfloat16.
    Bf16,
}

impl KvDtype {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::F16 | Self::Bf16 => 2,
        }
    }
}

impl fmt::Display for KvDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::F32 => "f32",
            Self::F16 => "f16",
            Self::Bf16 => "bf16",
        })
    }
}

/// Everything about a loaded model that decides whether KV computed by one engine means the
/// same thing to another.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelContract {
    /// Architecture family (`llama`, `qwen2`, `qwen3`).
    pub architecture: String,
    /// KV cache element type.
    pub dtype: KvDtype,
    /// Transformer layers.
    pub num_layers: usize,
    /// Attention (query) heads.
    pub num_heads: usize,
    /// KV heads.
    pub kv_heads: usize,
    /// Head dimension.
    pub head_dim: usize,
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Longest sequence the engine accepts (prompt plus output).
    pub context_length: usize,
    /// RoPE base.
    pub rope_theta: f64,
    /// Hex digest of the weights' content.
    pub weights_digest: String,
    /// Hex digest of the tokenizer.
    pub tokenizer_digest: String,
}

impl ModelContract {
    /// The first field in which two contracts differ, named as in the API, or `None`.
    pub fn first_difference(&self, other: &Self) -> Option<&'static str> {
        let checks: [(&'static str, bool); 11] = [
            ("weights", self.weights_digest == other.weights_digest),
            ("tokenizer", self.tokenizer_digest == other.tokenizer_digest),
            ("architecture", self.architecture == other.architecture),
            ("dtype", self.dtype == other.dtype),
            ("num_layers", self.num_layers == other.num_layers),
            ("num_heads", self.num_heads == other.num_heads),
            ("kv_heads", self.kv_heads == other.kv_heads),
            ("head_dim", self.head_dim == other.head_dim),
            ("vocab_size", self.vocab_size == other.vocab_size),
            ("context_length", self.context_length == other.context_length),
            ("rope_theta", self.rope_theta.to_bits() == other.rope_theta.to_bits()),
        ];
        checks.iter().find(|(_, same)| !same).map(|(name, _)| *name)
    }

    /// Bytes of one canonical page (`[layers][2][64][kv_heads][head_dim]`).
    pub fn page_bytes(&self) -> usize {
        self.num_layers * 2 * crate::PAGE_TOKENS * self.kv_heads * self.head_dim * self.dtype.size()
    }
}

#[cfg(test)]
mod tests;
