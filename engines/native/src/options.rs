//! Engine options, as given per replica in `engine_config`.

use serde_json::Value;
use xinf_engine::{EngineError, KvDtype};
use xinf_transfer::{KvLayout, KvLayoutKind, KvOrder};

/// Where the forward pass runs (`device`).
///
/// The cluster layer sets it from a replica's GPU index; a model loads on a GPU only in a build
/// with the cargo feature `cuda`, on a host with an NVIDIA driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ComputeDevice {
    /// candle's CPU kernels (`"cpu"`).
    #[default]
    Cpu,
    /// The NVIDIA GPU of this ordinal (`"cuda"` for 0, `"cuda:N"`).
    Cuda(usize),
}

impl std::fmt::Display for ComputeDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Cpu => f.write_str("cpu"),
            Self::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

impl std::str::FromStr for ComputeDevice {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "cpu" => Ok(Self::Cpu),
            "cuda" | "gpu" => Ok(Self::Cuda(0)),
            _ => s
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(Self::Cuda)
                .ok_or_else(|| "must be cpu, cuda or cuda:N (N the GPU ordinal)".to_owned()),
        }
    }
}

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
    /// Tokens per step at most; prompts are computed in chunks of this (`max_batch_tokens`).
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
}

impl Default for EngineOptions {
    fn default() -> Self {
        Self {
            kv_layout: KvLayout { kind: KvLayoutKind::PagedKvFirst, order: KvOrder::Nhd, block_size: 16 },
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
        }
    }
}

/// Keys `engine_config` accepts for the native engine.
pub const ENGINE_CONFIG_KEYS: &[&str] = &[
    "kv_layout",
    "kv_order",
    "block_size",
    "kv_dtype",
    "kv_cache_tokens",
    "max_num_seqs",
    "max_batch_tokens",
    "max_queue",
    "context_length",
    "recompute_last_token",
    "device",
    "gpu_memory_utilization",
    "cuda_graphs",
];

fn field(key: &str) -> String {
    format!("engine_config.{key}")
}

fn uint(key: &str, v: &Value, min: usize) -> Result<usize, EngineError> {
    match v.as_u64() {
        Some(n) if n as usize >= min => Ok(n as usize),
        _ => Err(EngineError::invalid(field(key), format!("must be an integer ≥ {min}"))),
    }
}

/// A fraction in (0, 1] (booleans and strings refused).
fn fraction(key: &str, v: &Value) -> Result<f64, EngineError> {
    match v.as_f64() {
        Some(f) if f > 0.0 && f <= 1.0 => Ok(f),
        _ => Err(EngineError::invalid(field(key), format!("must be a number in (0, 1], not {v}"))),
    }
}

impl EngineOptions {
    /// Reads options from an `engine_config` JSON object; unknown keys and bad values are
    /// refused with the key named. The token-pool layout defaults to pages of 1 token, as
    /// SGLang does, unless `block_size` is given.
    pub fn from_engine_config(config: &Value) -> Result<Self, EngineError> {
        let mut o = Self::default();
        let map = match config {
            Value::Null => return Ok(o),
            Value::Object(m) => m,
            _ => return Err(EngineError::invalid("engine_config", "must be a JSON object")),
        };
        if let Some(k) = map.keys().find(|k| !ENGINE_CONFIG_KEYS.contains(&k.as_str())) {
            return Err(EngineError::invalid(
                field(k),
                format!("unknown key for the native engine (known: {})", ENGINE_CONFIG_KEYS.join(", ")),
            ));
        }
        let string = |key: &str| -> Result<Option<&str>, EngineError> {
            match map.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.as_str())),
                Some(_) => Err(EngineError::invalid(field(key), "must be a string")),
            }
        };
        if let Some(s) = string("kv_layout")? {
            o.kv_layout.kind = s.parse().map_err(|e: xinf_transfer::LayoutError| {
                EngineError::invalid(field("kv_layout"), e.to_string())
            })?;
            if o.kv_layout.kind == KvLayoutKind::TokenPool {
                o.kv_layout.block_size = 1;
            }
        }
        if let Some(s) = string("kv_order")? {
            o.kv_layout.order = s.parse().map_err(|e: xinf_transfer::LayoutError| {
                EngineError::invalid(field("kv_order"), e.to_string())
            })?;
        }
        if let Some(v) = map.get("block_size") {
            o.kv_layout.block_size = uint("block_size", v, 1)?;
        }
        o.kv_layout.validate().map_err(|e| {
            let key = match e {
                xinf_transfer::LayoutError::PoolOrder => "kv_order",
                _ => "block_size",
            };
            EngineError::invalid(field(key), e.to_string())
        })?;
        if let Some(s) = string("kv_dtype")? {
            o.kv_dtype = match s {
                "auto" => None,
                "f32" | "float32" => Some(KvDtype::F32),
                "f16" | "float16" => Some(KvDtype::F16),
                "bf16" | "bfloat16" => Some(KvDtype::Bf16),
                _ => return Err(EngineError::invalid(field("kv_dtype"), "must be auto, f32, f16 or bf16")),
            };
        }
        if let Some(v) = map.get("kv_cache_tokens") {
            o.kv_cache_tokens = uint("kv_cache_tokens", v, 64)?;
            o.kv_cache_tokens_explicit = true;
        }
        if let Some(v) = map.get("max_num_seqs") {
            o.max_num_seqs = uint("max_num_seqs", v, 1)?;
        }
        if let Some(v) = map.get("max_batch_tokens") {
            o.max_batch_tokens = uint("max_batch_tokens", v, 16)?;
        }
        if let Some(v) = map.get("max_queue") {
            o.max_queue = uint("max_queue", v, 1)?;
        }
        if let Some(v) = map.get("context_length") {
            o.context_length = Some(uint("context_length", v, 2)?);
        }
        if let Some(v) = map.get("recompute_last_token") {
            o.recompute_last_token = v
                .as_bool()
                .ok_or_else(|| EngineError::invalid(field("recompute_last_token"), "must be a boolean"))?;
        }
        if let Some(v) = map.get("cuda_graphs") {
            o.cuda_graphs =
                v.as_bool().ok_or_else(|| EngineError::invalid(field("cuda_graphs"), "must be a boolean"))?;
        }
        if let Some(s) = string("device")? {
            o.device = s.parse().map_err(|e: String| EngineError::invalid(field("device"), e))?;
        }
        if let Some(v) = map.get("gpu_memory_utilization").filter(|v| !v.is_null()) {
            o.gpu_memory_utilization = Some(fraction("gpu_memory_utilization", v)?);
            // Without a `device` the cluster may still place the replica on a GPU; an
            // explicit CPU never has GPU memory to share.
            if string("device")? == Some("cpu") {
                return Err(EngineError::invalid(
                    field("gpu_memory_utilization"),
                    "is a share of a GPU's memory, and engine_config.device is cpu",
                ));
            }
        }
        Ok(o)
    }
}

#[cfg(test)]
mod tests;
