//! Engine options: what a loaded native engine runs with, from the typed `engine_config`
//! ([`NativeConfig`], checked at launch) with the engine's defaults filled in.

use serde_json::Value;
pub use xinf_engine::ComputeDevice;
use xinf_engine::{EngineError, KvDtype, KvDtypeChoice, NativeConfig};
use xinf_transfer::KvLayout;

/// How a native engine instance is set up.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineOptions {
    /// KV cache layout (`kv_layout`, `kv_order`, `block_size`).
    pub kv_layout: KvLayout,
    /// KV element type (`kv_dtype`); `None` follows the weights (F32 for GGUF and F32 weights).
    pub kv_dtype: Option<KvDtype>,
    /// Tokens the KV cache holds across all sequences (`kv_cache_tokens`).
    pub kv_cache_tokens: usize,
    /// Whether `kv_cache_tokens` was given: when it was not and a memory fraction is, the
    /// fraction sizes the cache at load (see [`crate::memory`]).
    pub kv_cache_tokens_explicit: bool,
    /// Sequences computed together at most (`max_num_seqs`).
    pub max_num_seqs: usize,
    /// Tokens per step at most; prompts are computed in chunks of this (`max_batch_tokens`;
    /// default 512 on the CPU, [`GPU_MAX_BATCH_TOKENS`] on a GPU).
    pub max_batch_tokens: usize,
    /// Requests waiting for admission at most; more are refused as overloaded (`max_queue`).
    pub max_queue: usize,
    /// Caps the model's context length (`context_length`).
    pub context_length: Option<usize>,
    /// Recompute the last prompt token when decoding imported KV, as vLLM does
    /// (`recompute_last_token`); otherwise the prefill side's first token is used, as SGLang does.
    pub recompute_last_token: bool,
    /// Where the model computes (`device`); the KV cache lives there too.
    pub device: ComputeDevice,
    /// The share of the GPU's memory this engine may take, weights and KV cache together
    /// (`gpu_memory_utilization`, in (0, 1], vLLM's name). It lets several replicas share one
    /// GPU without one of them taking the memory the others need; `None` sizes the KV cache
    /// by `kv_cache_tokens` alone.
    pub gpu_memory_utilization: Option<f64>,
    /// On a GPU, replay decode steps of up to 64 sequences as CUDA graphs, captured once per
    /// batch size (`cuda_graphs`, default on). Small-batch decoding is bound by the time the
    /// host takes to launch each step's few hundred kernels, which a graph launches at once;
    /// the results are the same either way. Off is for comparison in benchmarks.
    pub cuda_graphs: bool,
    /// Keep the KV cache's full blocks after their sequences end, under a key of their tokens
    /// and all before them, and give them to later prompts that begin with the same tokens
    /// instead of computing those again (`enable_prefix_caching`, default on, as in vLLM and
    /// SGLang): a conversation's next turn, a shared system prompt, `n` choices. Requests that
    /// come together with one prompt wait a step for the first of them to compute it. Cached
    /// blocks nobody holds count as free and go, oldest first, when a new block is needed.
    pub prefix_caching: bool,
    /// On the CPU, multiply a GGUF file's quantized weights as they are stored, block by block
    /// against activations quantized to 8 bits (`quantized_matmul`, default on), as llama.cpp
    /// does: decoding reads a fraction of the bytes that F32 weights take (Q8_0: 8.5 bits a
    /// weight instead of 32), and decoding is bound by those reads (SmolLM2 Q4_1 on two cores:
    /// 3.4× the tokens/s at batch 1). Prompts of 32 tokens or more are multiplied in F32 (each
    /// weight dequantized for one GEMM), generated tokens and short prompts block by block;
    /// which one is decided per token, so a request's output does not depend on its batch.
    /// Logits move by ~2% of their spread against F32; off multiplies everything in F32 (exact
    /// against a reference computing in F32 on the same weights).
    pub quantized_matmul: bool,
}

impl Default for EngineOptions {
    fn default() -> Self {
        Self {
            kv_layout: NativeConfig::default().layout(),
            kv_dtype: None,
            kv_cache_tokens: 8_192,
            kv_cache_tokens_explicit: false,
            max_num_seqs: 64,
            max_batch_tokens: 512,
            max_queue: 256,
            context_length: None,
            recompute_last_token: false,
            device: ComputeDevice::Cpu,
            gpu_memory_utilization: None,
            cuda_graphs: true,
            prefix_caching: true,
            quantized_matmul: true,
        }
    }
}

/// `max_batch_tokens` on a GPU when not given. A GPU computes a step of several thousand tokens
/// in far less than the time of as many small steps (the tensor cores are far from busy below
/// that, and every step pays for its few hundred kernels), so large steps cut a long prompt's
/// time to first token and carry several prompts at once under load: on an H200 with a
/// Qwen2.5-0.5B-shaped model, output tokens/s at 16 / 64 concurrent requests went from 3,760 /
/// 5,043 at 2,048 to ~4,090 / ~6,140 at 8,192 (4,366 / 6,454 at 16,384), the time between
/// tokens at 16 from 3.3 to 2.9 ms. Its buffers are set aside from the memory share
/// (`memory::step_buffer_bytes`). SGLang chunks prompts at 8,192 tokens on GPUs of this class,
/// vLLM batches up to 8,192 tokens a step.
pub const GPU_MAX_BATCH_TOKENS: usize = 8_192;

/// Keys `engine_config` accepts for the native engine.
pub const ENGINE_CONFIG_KEYS: &[&str] = NativeConfig::KEYS;

impl EngineOptions {
    /// Reads options from an `engine_config` JSON object; unknown keys and bad values are
    /// refused with the key named. The token-pool layout defaults to pages of 1 token, as
    /// SGLang does, unless `block_size` is given.
    pub fn from_engine_config(config: &Value) -> Result<Self, EngineError> {
        NativeConfig::from_json(config).map(|c| Self::from_config(&c))
    }

    /// The options a checked [`NativeConfig`] gives, defaults where it is silent.
    pub fn from_config(c: &NativeConfig) -> Self {
        let d = Self::default();
        Self {
            kv_layout: c.layout(),
            kv_dtype: c.kv_dtype.and_then(KvDtypeChoice::dtype),
            kv_cache_tokens: c.kv_cache_tokens.unwrap_or(d.kv_cache_tokens),
            kv_cache_tokens_explicit: c.kv_cache_tokens.is_some(),
            max_num_seqs: c.max_num_seqs.unwrap_or(d.max_num_seqs),
            max_batch_tokens: c.max_batch_tokens.unwrap_or(match c.device {
                Some(ComputeDevice::Cuda(_)) => GPU_MAX_BATCH_TOKENS,
                _ => d.max_batch_tokens,
            }),
            max_queue: c.max_queue.unwrap_or(d.max_queue),
            context_length: c.context_length,
            recompute_last_token: c.recompute_last_token.unwrap_or(d.recompute_last_token),
            device: c.device.unwrap_or(d.device),
            gpu_memory_utilization: c.gpu_memory_utilization,
            cuda_graphs: c.cuda_graphs.unwrap_or(d.cuda_graphs),
            prefix_caching: c.enable_prefix_caching.unwrap_or(d.prefix_caching),
            quantized_matmul: c.quantized_matmul.unwrap_or(d.quantized_matmul),
        }
    }
}

#[cfg(test)]
mod tests;
