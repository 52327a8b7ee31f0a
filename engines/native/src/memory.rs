//! Sizing the KV cache from a share of the GPU's memory (`gpu_memory_utilization`).
//!
//! Several replicas may share one GPU; each states the fraction of the GPU's memory it may take.
//! Within its fraction a replica holds its weights, its KV cache and its activations
//! (forward-pass buffers, cuBLAS workspace, kernels), for which a reserve is set aside: a fixed
//! part and the step buffers, which grow with `max_batch_tokens`.
//! Without `kv_cache_tokens` the KV cache takes whatever is left; with it, the cache is checked
//! to fit. The arithmetic is [`kv_cache_tokens`], a pure function; [`fit_kv_cache`] feeds it
//! the GPU's total memory from the driver.

use crate::options::{ComputeDevice, EngineOptions};
use crate::weights::Weights;
use xinf_engine::{EngineError, KvDtype};
use xinf_models::ModelConfig;

#[cfg(test)]
mod tests;

/// Device memory set aside, within a replica's fraction, for the cuBLAS workspace, the compiled
/// kernels and the CUDA graphs; the step buffers ([`step_buffer_bytes`]) come on top.
pub const RUNTIME_RESERVE_BYTES: u64 = 512 << 20;

pub use crate::gpu::step_buffer_bytes;

/// The smallest KV cache an engine runs with (as `kv_cache_tokens` allows).
const MIN_KV_TOKENS: usize = 64;

const FIELD: &str = "engine_config.gpu_memory_utilization";

/// What the KV cache is sized from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MemoryBudget {
    /// The GPU's total memory, in bytes.
    pub total_memory: u64,
    /// The replica's share of it, in (0, 1].
    pub fraction: f64,
    /// The weights as they sit on the GPU, in bytes.
    pub weight_bytes: u64,
    /// Set aside for activations ([`RUNTIME_RESERVE_BYTES`] and the step buffers).
    pub reserve_bytes: u64,
    /// Bytes one token takes in the KV cache: 2 (K, V) × layers × kv_heads × head_dim × dtype.
    pub bytes_per_token: u64,
    /// Tokens per KV block; the engine allocates whole blocks, plus one spare block.
    pub block_size: usize,
}

fn gib(bytes: u64) -> String {
    format!("{:.2} GiB", bytes as f64 / f64::from(1u32 << 30))
}

/// Bytes one token takes in a KV cache of this shape.
pub fn kv_bytes_per_token(layers: usize, kv_heads: usize, head_dim: usize, dtype: KvDtype) -> u64 {
    (2 * layers * kv_heads * head_dim * dtype.size()) as u64
}

/// The bytes a cache of `tokens` takes: whole blocks, plus the engine's one spare block.
fn cache_bytes(tokens: usize, block_size: usize, bytes_per_token: u64) -> u64 {
    let block = block_size.max(1) as u64;
    (tokens as u64)
        .div_ceil(block)
        .saturating_add(1)
        .saturating_mul(block.saturating_mul(bytes_per_token).max(1))
}

/// The most tokens a cache of at most `bytes` holds ([`cache_bytes`] inverted).
fn tokens_fitting(bytes: u64, block_size: usize, bytes_per_token: u64) -> u64 {
    let block = block_size.max(1) as u64;
    let blocks = bytes / block.saturating_mul(bytes_per_token).max(1);
    blocks.saturating_sub(1).saturating_mul(block)
}

/// The KV cache tokens that fit in the budget, or `explicit` when it fits (the engine holds
/// `ceil(tokens / block_size) + 1` blocks). An error names `gpu_memory_utilization` and gives
/// the numbers when the weights, the reserve and the smallest (or the explicit) cache do not
/// fit in the fraction.
pub fn kv_cache_tokens(budget: &MemoryBudget, explicit: Option<usize>) -> Result<usize, EngineError> {
    let b = budget;
    let share = (b.total_memory as f64 * b.fraction).floor() as u64;
    let fixed = b.weight_bytes.saturating_add(b.reserve_bytes);
    let what = format!(
        "{} of the GPU's {} is {}, and the weights take {} plus {} reserved for activations",
        b.fraction,
        gib(b.total_memory),
        gib(share),
        gib(b.weight_bytes),
        gib(b.reserve_bytes)
    );
    let cache_bytes = |tokens: usize| cache_bytes(tokens, b.block_size, b.bytes_per_token);
    if let Some(tokens) = explicit {
        let need = fixed.saturating_add(cache_bytes(tokens));
        if need > share {
            return Err(EngineError::invalid(
                FIELD,
                format!(
                    "{what}: engine_config.kv_cache_tokens = {tokens} needs {} more for its KV cache, \
                     {} in all; raise gpu_memory_utilization or lower kv_cache_tokens",
                    gib(cache_bytes(tokens)),
                    gib(need)
                ),
            ));
        }
        return Ok(tokens);
    }
    let tokens = tokens_fitting(share.saturating_sub(fixed), b.block_size, b.bytes_per_token);
    if tokens < MIN_KV_TOKENS as u64 {
        return Err(EngineError::invalid(
            FIELD,
            format!(
                "{what}: {} is left for the KV cache, less than its smallest size ({MIN_KV_TOKENS} tokens, \
                 {}); raise gpu_memory_utilization",
                gib(share.saturating_sub(fixed)),
                gib(cache_bytes(MIN_KV_TOKENS))
            ),
        ));
    }
    Ok(usize::try_from(tokens).unwrap_or(usize::MAX))
}

/// The bytes the weights take on the GPU, in the dtype they are uploaded in (a tied LM head is
/// the embedding, uploaded once).
pub(crate) fn weight_bytes(weights: &Weights, tied: bool, dtype: KvDtype) -> u64 {
    let mut elems = weights.embed.elem_count() + weights.final_norm.elem_count();
    if !tied {
        elems += weights.lm_head.elem_count();
    }
    for l in &weights.layers {
        elems += l.attn_norm.elem_count() + l.mlp_norm.elem_count();
        elems += [&l.wqkv, &l.wo, &l.w_gate_up, &l.w_down].iter().map(|w| w.elem_count()).sum::<usize>();
        elems += [&l.bqkv, &l.q_norm, &l.k_norm]
            .iter()
            .filter_map(|t| t.as_ref())
            .map(|t| t.elem_count())
            .sum::<usize>();
    }
    (elems * dtype.size()) as u64
}

/// The parameters of a model of this config, from its shapes (the norms aside, which are
/// too small to matter here).
pub(crate) fn param_count(cfg: &ModelConfig) -> u64 {
    let (h, q, kv) = (cfg.hidden_size, cfg.num_heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim);
    let per_layer = h * q + 2 * h * kv + q * h + 3 * h * cfg.intermediate_size;
    let embeddings = cfg.vocab_size * h * if cfg.tie_word_embeddings { 1 } else { 2 };
    (cfg.num_layers * per_layer + embeddings) as u64
}

/// The host memory a replica computing on the CPU takes: its weights' `weight_bytes` as it
/// holds them (see [`cpu_weight_bytes`]) and its KV cache as `options` size it.
pub(crate) fn host_bytes(weight_bytes: u64, cfg: &ModelConfig, options: &EngineOptions) -> u64 {
    let dtype = options.kv_dtype.unwrap_or(KvDtype::F32);
    let per_token = kv_bytes_per_token(cfg.num_layers, cfg.kv_heads, cfg.head_dim, dtype);
    let cache = cache_bytes(options.kv_cache_tokens, options.kv_layout.block_size, per_token);
    weight_bytes.saturating_add(cache)
}

/// The bytes a CPU replica's weights take: a GGUF file's projections in their quantized blocks
/// when `quantized_matmul` keeps them so (`gguf` is the file's index), every weight in F32
/// otherwise (safetensors, or a GGUF file widened), whatever the file stores.
pub(crate) fn cpu_weight_bytes(
    cfg: &ModelConfig,
    gguf: Option<&candle_core::quantized::gguf_file::Content>,
    options: &EngineOptions,
) -> u64 {
    match gguf {
        Some(content) if options.quantized_matmul => crate::weights::gguf_held_bytes(content, cfg),
        _ => param_count(cfg) * 4,
    }
}

/// The options with `kv_cache_tokens` sized from `gpu_memory_utilization`, when it is given:
/// the weights (`weight_bytes` on the GPU), the reserve and the KV cache must fit in the fraction
/// of the GPU's total memory. Options without a fraction come back unchanged. A fraction is
/// refused on the CPU, which has no GPU memory to share.
pub(crate) fn fit_kv_cache(
    mut options: EngineOptions,
    cfg: &ModelConfig,
    [weights_dtype, kv_dtype]: [KvDtype; 2],
    weight_bytes: u64,
) -> Result<EngineOptions, EngineError> {
    let Some(fraction) = options.gpu_memory_utilization else {
        check_kv_fits_device(&options, cfg, kv_dtype, weight_bytes)?;
        return Ok(options);
    };
    let ordinal = match options.device {
        ComputeDevice::Cpu => {
            return Err(EngineError::invalid(
                FIELD,
                "is a share of a GPU's memory, and this engine computes on the CPU (engine_config.device)",
            ));
        }
        ComputeDevice::Cuda(n) => n,
    };
    let budget = MemoryBudget {
        total_memory: gpu_total_memory(ordinal, options.device)?,
        fraction,
        weight_bytes,
        reserve_bytes: RUNTIME_RESERVE_BYTES.saturating_add(step_buffer_bytes(
            cfg,
            options.max_batch_tokens.max(options.max_num_seqs),
            options.max_num_seqs,
            [weights_dtype, kv_dtype],
        )),
        bytes_per_token: kv_bytes_per_token(cfg.num_layers, cfg.kv_heads, cfg.head_dim, kv_dtype),
        block_size: options.kv_layout.block_size,
    };
    let explicit = options.kv_cache_tokens_explicit.then_some(options.kv_cache_tokens);
    options.kv_cache_tokens = kv_cache_tokens(&budget, explicit)?;
    tracing::info!(
        gpu = ordinal,
        fraction,
        total_memory = budget.total_memory,
        weight_bytes,
        kv_cache_tokens = options.kv_cache_tokens,
        "KV cache sized from gpu_memory_utilization"
    );
    Ok(options)
}

/// Without a memory share, `kv_cache_tokens` (default or given) must at least fit, with the
/// weights, in all of the device's memory (the host's RAM for the CPU): an absurd value is
/// refused naming the field and the limit, rather than accepted and left to fail (or hang)
/// at its first allocation.
fn check_kv_fits_device(
    options: &EngineOptions,
    cfg: &ModelConfig,
    kv_dtype: KvDtype,
    weight_bytes: u64,
) -> Result<(), EngineError> {
    let (total, what) = match options.device {
        ComputeDevice::Cpu => match host_memory() {
            Some(total) => (total, "this machine's memory"),
            None => return Ok(()),
        },
        ComputeDevice::Cuda(n) => (gpu_total_memory(n, options.device)?, "the GPU's memory"),
    };
    let (block, per_token) = (
        options.kv_layout.block_size,
        kv_bytes_per_token(cfg.num_layers, cfg.kv_heads, cfg.head_dim, kv_dtype),
    );
    let tokens = options.kv_cache_tokens;
    let cache = cache_bytes(tokens, block, per_token);
    if weight_bytes.saturating_add(cache) <= total {
        return Ok(());
    }
    let most = tokens_fitting(total.saturating_sub(weight_bytes), block, per_token);
    Err(EngineError::invalid(
        "engine_config.kv_cache_tokens",
        format!(
            "{tokens} tokens need {} for the KV cache, and with the weights ({}) that is more than \
             {what} ({}): at most {most} tokens fit",
            gib(cache),
            gib(weight_bytes),
            gib(total)
        ),
    ))
}

/// The host's total memory (`MemTotal` of /proc/meminfo), where the system says.
fn host_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib.saturating_mul(1024))
}

/// The total memory of GPU `ordinal`, from the driver.
#[cfg(feature = "cuda")]
fn gpu_total_memory(ordinal: usize, device: ComputeDevice) -> Result<u64, EngineError> {
    xinf_transfer::gpu::device(ordinal)
        .map(|d| d.total_memory)
        .map_err(|e| EngineError::invalid("engine_config.device", format!("{device}: {e}")))
}

/// Without GPU support there is no GPU memory (the load refuses a GPU device before this).
#[cfg(not(feature = "cuda"))]
fn gpu_total_memory(_ordinal: usize, device: ComputeDevice) -> Result<u64, EngineError> {
    Err(EngineError::invalid(
        "engine_config.device",
        format!("{device}: this build has no GPU support (built without the cargo feature `cuda`)"),
    ))
}
