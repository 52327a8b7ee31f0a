//! Building an engine's parts from a resolved model: the config, tokenizer and weights read
//! from GGUF or safetensors, the KV cache sized to the memory there is, the contract peers
//! check before a handoff, and the backend (CPU, or a GPU with the feature `cuda`).

use crate::kv_cache::KvCache;
use crate::model::{ComputeBackend, CpuModel};
use crate::options::{ComputeDevice, EngineOptions};
use crate::weights::{self, Weights};
use candle_core::DType;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use xinf_engine::{EngineError, KvDtype, ModelContract};
use xinf_models::ModelConfig;
use xinf_models::{ModelError, ResolvedModel, TextTokenizer, WeightsFormat};
use xinf_transfer::LayoutDescriptor;
use xinf_transfer::device::{DeviceSink, KvDevice};

/// Set on a GPU: where the KV lives, and the sink receiving peers' pages GPU to GPU.
pub(super) type Device = Option<(KvDevice, Arc<dyn DeviceSink>)>;

/// Everything an engine is made of, before its compute thread starts.
pub(super) struct Loaded {
    pub(super) backend: Box<dyn ComputeBackend>,
    pub(super) cache: KvCache,
    pub(super) device: Device,
    pub(super) tokenizer: TextTokenizer,
    pub(super) contract: ModelContract,
    pub(super) layout: LayoutDescriptor,
    /// The options, with the KV cache's size fitted to memory.
    pub(super) options: EngineOptions,
    /// Longest sequence (prompt + output) a request may have.
    pub(super) max_seq_len: usize,
    pub(super) eos: Vec<u32>,
    /// Steps the GPU backend computed by replaying a CUDA graph.
    pub(super) graph_steps: Arc<AtomicU64>,
    /// Programmatic edges between kernels in the GPU backend's captured graphs.
    pub(super) graph_links: Arc<AtomicU64>,
}

/// What a model's files hold.
struct ModelFiles {
    cfg: ModelConfig,
    weights: Weights,
    tokenizer: TextTokenizer,
    /// The weight files (their digest goes into the contract).
    files: Vec<PathBuf>,
    /// The dtype the weights are stored in.
    weights_dtype: KvDtype,
}

/// The KV cache a backend is built for.
struct CacheShape {
    layout: LayoutDescriptor,
    dtype: KvDtype,
    context_length: usize,
}

/// A model that cannot be read or served, as callers see it.
pub(super) fn model_err(e: ModelError) -> EngineError {
    EngineError::from(e)
}

/// The context a replica serves: `asked` (`engine_config.context_length`), else the model's
/// `max_position_embeddings`. More than the model was trained for is refused, as vLLM and SGLang
/// refuse it: positions past it give text that looks like an answer and is not one.
fn context_length(asked: Option<usize>, max_positions: usize) -> Result<usize, EngineError> {
    match asked {
        Some(c) if c > max_positions => Err(EngineError::invalid(
            "engine_config.context_length",
            format!("{c} is more than the model's max_position_embeddings ({max_positions})"),
        )),
        c => Ok(c.unwrap_or(max_positions)),
    }
}

/// Reads `model` and builds the backend `options` ask for, with its cache.
pub(super) fn load(model: &ResolvedModel, options: EngineOptions) -> Result<Loaded, EngineError> {
    #[cfg(not(feature = "cuda"))]
    if let ComputeDevice::Cuda(_) = options.device {
        return Err(no_gpu_support(options.device));
    }
    // The CPU computes in f32 whatever the weights; the GPU in the weights' own dtype.
    let on_gpu = options.device != ComputeDevice::Cpu;
    let read = match model.format {
        WeightsFormat::Gguf => read_gguf(&model.path, !on_gpu && options.quantized_matmul)?,
        WeightsFormat::Safetensors => read_safetensors(&model.path, on_gpu)?,
    };
    let dtype = options.kv_dtype.unwrap_or(read.weights_dtype);
    let weight_bytes =
        crate::memory::weight_bytes(&read.weights, read.cfg.tie_word_embeddings, read.weights_dtype);
    let options = crate::memory::fit_kv_cache(options, &read.cfg, [read.weights_dtype, dtype], weight_bytes)?;
    check_vocab(&read.cfg, &read.tokenizer)?;
    let digest = xinf_models::weights_digest(&read.files).map_err(model_err)?;
    let ModelFiles { cfg, weights, tokenizer, weights_dtype, .. } = read;
    let context_length = context_length(options.context_length, cfg.max_position_embeddings)?;
    let block_size = options.kv_layout.block_size;
    let num_blocks = options.kv_cache_tokens.div_ceil(block_size) + 1;
    let layout = options
        .kv_layout
        .describe(cfg.num_layers, cfg.kv_heads, cfg.head_dim, num_blocks)
        .map_err(|e| EngineError::invalid("engine_config.kv_layout", e.to_string()))?;
    let max_seq_len = context_length.min((num_blocks - 1) * block_size);
    let contract = cfg.contract(&tokenizer, dtype, context_length, digest);
    let eos = eos_ids(&cfg, &tokenizer);
    let (graph_steps, graph_links) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let shape = CacheShape { layout: layout.clone(), dtype, context_length };
    let (backend, cache, device) =
        backend(cfg, weights, weights_dtype, shape, &options, [&graph_steps, &graph_links])?;
    Ok(Loaded {
        backend,
        cache,
        device,
        tokenizer,
        contract,
        layout,
        options,
        max_seq_len,
        eos,
        graph_steps,
        graph_links,
    })
}

/// The model's config alone (a GGUF file's metadata, or `config.json`), without its weights.
fn read_config(model: &ResolvedModel) -> Result<ModelConfig, EngineError> {
    match model.format {
        WeightsFormat::Gguf => ModelConfig::from_gguf(&gguf_content(&model.path)?).map_err(model_err),
        WeightsFormat::Safetensors => {
            let cfg_path = model.path.join("config.json");
            let text =
                std::fs::read_to_string(&cfg_path).map_err(|e| model_err(ModelError::io(&cfg_path, e)))?;
            ModelConfig::from_hf_json(&text, &cfg_path.display().to_string()).map_err(model_err)
        }
    }
}

/// The model's config and the bytes its weights take in a CPU replica
/// ([`crate::memory::cpu_weight_bytes`]), from its metadata and tensor index alone.
pub(crate) fn cpu_weights(
    model: &ResolvedModel,
    options: &EngineOptions,
) -> Result<(ModelConfig, u64), EngineError> {
    match model.format {
        WeightsFormat::Gguf => {
            let content = gguf_content(&model.path)?;
            let cfg = ModelConfig::from_gguf(&content).map_err(model_err)?;
            let bytes = crate::memory::cpu_weight_bytes(&cfg, Some(&content), options);
            Ok((cfg, bytes))
        }
        WeightsFormat::Safetensors => {
            let cfg = read_config(model)?;
            let bytes = crate::memory::cpu_weight_bytes(&cfg, None, options);
            Ok((cfg, bytes))
        }
    }
}

/// A GGUF file's metadata and tensor index (no tensor data).
fn gguf_content(path: &Path) -> Result<candle_core::quantized::gguf_file::Content, EngineError> {
    let mut f = std::fs::File::open(path).map_err(|e| model_err(ModelError::io(path, e)))?;
    candle_core::quantized::gguf_file::Content::read(&mut f).map_err(|e| {
        model_err(ModelError::Corrupt {
            file: path.display().to_string(),
            reason: crate::weights::candle_reason(&e),
        })
    })
}

/// A GGUF file: config, tokenizer and weights all come from it (loaded as f32, or with the
/// projections in their quantized blocks: `keep_quantized`).
fn read_gguf(path: &Path, keep_quantized: bool) -> Result<ModelFiles, EngineError> {
    let content = gguf_content(path)?;
    let cfg = ModelConfig::from_gguf(&content).map_err(model_err)?;
    let tokenizer = TextTokenizer::from_gguf(&content).map_err(model_err)?;
    let weights = weights::load_gguf(path, &content, &cfg, DType::F32, keep_quantized).map_err(model_err)?;
    Ok(ModelFiles { cfg, weights, tokenizer, files: vec![path.to_owned()], weights_dtype: KvDtype::F32 })
}

/// A Hugging Face directory: `config.json`, the tokenizer files and safetensors weights,
/// loaded in their own dtype for a GPU and in f32 for the CPU.
fn read_safetensors(dir: &Path, on_gpu: bool) -> Result<ModelFiles, EngineError> {
    let cfg_path = dir.join("config.json");
    let text = std::fs::read_to_string(&cfg_path).map_err(|e| {
        model_err(if e.kind() == std::io::ErrorKind::NotFound {
            ModelError::MissingFile { dir: dir.display().to_string(), file: "config.json".into() }
        } else {
            ModelError::io(&cfg_path, e)
        })
    })?;
    let cfg = ModelConfig::from_hf_json(&text, &cfg_path.display().to_string()).map_err(model_err)?;
    let tokenizer = TextTokenizer::from_hf_dir(dir, &cfg.eos_token_ids).map_err(model_err)?;
    let files = xinf_models::safetensors_files(dir).map_err(model_err)?;
    let weights_dtype = safetensors_dtype(&files).unwrap_or(KvDtype::F32);
    let load_dtype = if on_gpu { compute_dtype(weights_dtype) } else { DType::F32 };
    let weights = weights::load_safetensors(dir, &cfg, load_dtype).map_err(model_err)?;
    Ok(ModelFiles { cfg, weights, tokenizer, files, weights_dtype })
}

/// Refuses a tokenizer that can produce ids the model has no embedding for.
fn check_vocab(cfg: &ModelConfig, tokenizer: &TextTokenizer) -> Result<(), EngineError> {
    if tokenizer.vocab_size() <= cfg.vocab_size {
        return Ok(());
    }
    Err(model_err(ModelError::Unsupported {
        field: "vocab_size".into(),
        value: cfg.vocab_size.to_string(),
        reason: format!(
            "the tokenizer has {} tokens, more than the model's vocabulary",
            tokenizer.vocab_size()
        ),
    }))
}

/// The end-of-sequence ids of the tokenizer and of the model config, sorted, once each.
fn eos_ids(cfg: &ModelConfig, tokenizer: &TextTokenizer) -> Vec<u32> {
    let mut eos: Vec<u32> = tokenizer.eos_token_ids().to_vec();
    eos.extend(&cfg.eos_token_ids);
    eos.sort_unstable();
    eos.dedup();
    eos
}

/// The backend of `options.device` and the cache it computes in (accounting only on a GPU,
/// whose memory holds the cache itself).
#[cfg_attr(not(feature = "cuda"), allow(unused_variables))]
fn backend(
    cfg: ModelConfig,
    weights: Weights,
    weights_dtype: KvDtype,
    shape: CacheShape,
    options: &EngineOptions,
    [graph_steps, graph_links]: [&Arc<AtomicU64>; 2],
) -> Result<(Box<dyn ComputeBackend>, KvCache, Device), EngineError> {
    let CacheShape { layout, dtype, context_length } = shape;
    match options.device {
        ComputeDevice::Cpu => {
            let backend = CpuModel::new(cfg, weights, context_length)
                .map_err(|e| EngineError::Internal(format!("building the model: {e}")))?;
            Ok((
                Box::new(backend),
                KvCache::new(layout, dtype)
                    .with_prefix_caching(options.prefix_caching, options.quantized_matmul),
                None,
            ))
        }
        #[cfg(not(feature = "cuda"))]
        ComputeDevice::Cuda(_) => Err(no_gpu_support(options.device)),
        #[cfg(feature = "cuda")]
        ComputeDevice::Cuda(ordinal) => {
            let limits = crate::gpu::StepLimits {
                max_tokens: options.max_batch_tokens,
                max_seqs: options.max_num_seqs,
                cuda_graphs: options.cuda_graphs,
                graph_steps: graph_steps.clone(),
                graph_links: graph_links.clone(),
            };
            // Its weights and KV cache go on the GPU while no other engine of the host starts
            // there (engine servers size their caches from the memory free then).
            let starting = xinf_engine::gpu_start_gate(ordinal, xinf_engine::GPU_START_PATIENCE)?;
            let backend = crate::gpu::GpuModel::new(
                ordinal,
                cfg,
                &weights,
                weights_dtype,
                dtype,
                layout.clone(),
                context_length,
                limits,
            )
            .map_err(|e| EngineError::Model(format!("engine_config.device = {}: {e}", options.device)))?;
            drop(starting);
            drop(weights);
            let handoff = backend.handoff();
            let device: Device = Some((handoff.kv_device(), handoff));
            Ok((
                Box::new(backend),
                KvCache::accounting_only(layout, dtype).with_prefix_caching(options.prefix_caching, false),
                device,
            ))
        }
    }
}

/// A GPU was asked of a build without GPU support.
#[cfg(not(feature = "cuda"))]
fn no_gpu_support(device: ComputeDevice) -> EngineError {
    EngineError::invalid(
        "engine_config.device",
        format!("{device}: this build has no GPU support (built without the cargo feature `cuda`)"),
    )
}

/// The candle dtype weights are loaded in to compute in `dt`.
fn compute_dtype(dt: KvDtype) -> DType {
    match dt {
        KvDtype::F32 => DType::F32,
        KvDtype::F16 => DType::F16,
        KvDtype::Bf16 => DType::BF16,
    }
}

/// The dtype of the first floating tensor of a safetensors file, read from its header.
fn safetensors_dtype(files: &[PathBuf]) -> Option<KvDtype> {
    use std::io::Read;
    let mut f = std::fs::File::open(files.first()?).ok()?;
    let mut len = [0u8; 8];
    f.read_exact(&mut len).ok()?;
    let n = u64::from_le_bytes(len).min(100 << 20) as usize;
    let mut header = vec![0u8; n];
    f.read_exact(&mut header).ok()?;
    let v: serde_json::Value = serde_json::from_slice(&header).ok()?;
    v.as_object()?.values().find_map(|t| match t.get("dtype")?.as_str()? {
        "F16" => Some(KvDtype::F16),
        "BF16" => Some(KvDtype::Bf16),
        "F32" => Some(KvDtype::F32),
        _ => None,
    })
}
