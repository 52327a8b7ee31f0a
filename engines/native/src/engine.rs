//! The native engine: a handle that validates and tokenizes requests, and one compute thread
//! that schedules them with continuous batching over the paged KV cache.
//!
//! The compute thread owns the model and the cache; everything reaches it through a command
//! channel, so nothing is locked on the hot path. Each step it admits waiting requests while
//! KV blocks and the sequence limit allow, gives every decoding sequence one token, fills the
//! rest of the token budget with prompt chunks (first come, first served), runs one forward
//! and samples. When the cache runs out of blocks, the most recently admitted sequence is
//! preempted (its blocks freed, its tokens recomputed later) so older requests keep going.

use crate::config::ModelConfig;
use crate::detok::Detokenizer;
use crate::kv_cache::KvCache;
use crate::model::{Chunk, ComputeBackend, CpuModel};
use crate::options::{ComputeDevice, EngineOptions};
use crate::sampler::Sampler;
use crate::stop::{StopMatcher, StopOutcome};
use crate::weights;
use candle_core::DType;
use futures::StreamExt;
use futures::future::BoxFuture;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc as std_mpsc;
use std::sync::{Arc, Mutex};
use tokio::sync::{mpsc, oneshot};
use xinf_engine::{
    Engine, EngineError, EngineStats, FinishReason, GenerateRequest, ImportedKv, KvDtype, KvPages,
    ModelContract, PAGE_TOKENS, PinnedPrefill, Prompt, TokenEvent, TokenStream, Usage,
};
use xinf_models::{ModelError, ResolvedModel, TextTokenizer, WeightsFormat};
use xinf_transfer::LayoutDescriptor;
use xinf_transfer::device::{DeviceLease, DeviceRoute, DeviceSink, KvDevice};

type EventTx = mpsc::UnboundedSender<Result<TokenEvent, EngineError>>;

/// What happens when a sequence has its first sampled token.
enum Mode {
    /// Ordinary generation: stream every token.
    Generate,
    /// Prefill for export: reply with the first token and keep the KV pinned.
    Pinned(Option<oneshot::Sender<Result<PinnedPrefill, EngineError>>>),
}

struct Seq {
    id: String,
    tokens: Vec<u32>,
    prompt_len: usize,
    /// Tokens whose K and V are in the cache.
    computed: usize,
    table: Vec<u32>,
    max_tokens: usize,
    sampler: Sampler,
    stop: StopMatcher,
    detok: Detokenizer,
    stop_ids: Vec<u32>,
    tx: EventTx,
    mode: Mode,
    /// Canonical pages to scatter into the cache on admission.
    import: Option<Import>,
    /// Tokens already known not to need sampling (an imported first token).
    preset: Option<u32>,
}

/// Prompt KV given to a sequence instead of computed.
struct Import {
    /// Canonical pages, back to back (host memory, or received into this engine's GPU).
    pages: KvPages,
    /// Prompt tokens the pages cover (scattered into the cache).
    tokens: usize,
    /// Tokens of cache to hold on admission.
    need: usize,
}

enum Command {
    Submit(Box<Seq>),
    Abort(String),
    Release(String),
    Export {
        id: String,
        first: usize,
        count: usize,
        reply: oneshot::Sender<Result<Vec<u8>, EngineError>>,
    },
    ExportDevice {
        id: String,
        first: usize,
        count: usize,
        route: DeviceRoute,
        reply: oneshot::Sender<Result<DeviceLease, EngineError>>,
    },
    Logits {
        ids: Vec<u32>,
        reply: oneshot::Sender<Result<Vec<f32>, EngineError>>,
    },
}

/// Counters shared by the handle and the compute thread.
#[derive(Default)]
struct Shared {
    running: AtomicUsize,
    queued: AtomicUsize,
    used_blocks: AtomicUsize,
    pinned_blocks: AtomicUsize,
    prompt_tokens: AtomicU64,
    generated_tokens: AtomicU64,
    /// Ids of requests submitted and not finished (duplicate detection, abort answers).
    active: Mutex<HashSet<String>>,
    /// Ids of pinned prompts.
    pinned: Mutex<HashSet<String>>,
}

/// One request left the queue; saturating, so a miscount can never wrap to "overloaded".
fn dequeued(queued: &AtomicUsize) {
    let _ = queued.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |q| Some(q.saturating_sub(1)));
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The native engine's handle. Cheap to share behind an `Arc`; dropping the last handle stops
/// the compute thread.
pub struct NativeEngine {
    tx: std_mpsc::Sender<Command>,
    shared: Arc<Shared>,
    tokenizer: Arc<TextTokenizer>,
    contract: ModelContract,
    layout: LayoutDescriptor,
    options: EngineOptions,
    /// Longest sequence (prompt + output) a request may have.
    max_seq_len: usize,
    eos: Vec<u32>,
    /// Set on a GPU: where the KV lives, and the sink receiving peers' pages GPU to GPU.
    device: Option<(KvDevice, Arc<dyn DeviceSink>)>,
    /// Steps the GPU backend computed by replaying a CUDA graph.
    graph_steps: Arc<AtomicU64>,
}

impl std::fmt::Debug for NativeEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NativeEngine").field("contract", &self.contract).finish_non_exhaustive()
    }
}

fn model_err(e: ModelError) -> EngineError {
    EngineError::Model(e.to_string())
}

impl NativeEngine {
    /// Loads a model and starts its compute thread.
    pub fn load(model: &ResolvedModel, options: EngineOptions) -> Result<Self, EngineError> {
        #[cfg(not(feature = "cuda"))]
        if let ComputeDevice::Cuda(_) = options.device {
            return Err(no_gpu_support(options.device));
        }
        // The CPU computes in f32 whatever the weights; the GPU in the weights' own dtype.
        let on_gpu = options.device != ComputeDevice::Cpu;
        let (cfg, weights, tokenizer, files, weights_dtype) = match model.format {
            WeightsFormat::Gguf => {
                let path = &model.path;
                let mut f = std::fs::File::open(path).map_err(|e| model_err(ModelError::io(path, e)))?;
                let content = candle_core::quantized::gguf_file::Content::read(&mut f).map_err(|e| {
                    model_err(ModelError::Corrupt { file: path.display().to_string(), reason: e.to_string() })
                })?;
                let cfg = ModelConfig::from_gguf(&content).map_err(model_err)?;
                let tok = TextTokenizer::from_gguf(&content).map_err(model_err)?;
                let w = weights::load_gguf(path, &content, &cfg, DType::F32).map_err(model_err)?;
                (cfg, w, tok, vec![path.clone()], KvDtype::F32)
            }
            WeightsFormat::Safetensors => {
                let dir = &model.path;
                let cfg_path = dir.join("config.json");
                let text = std::fs::read_to_string(&cfg_path).map_err(|e| {
                    model_err(if e.kind() == std::io::ErrorKind::NotFound {
                        ModelError::MissingFile { dir: dir.display().to_string(), file: "config.json".into() }
                    } else {
                        ModelError::io(&cfg_path, e)
                    })
                })?;
                let cfg =
                    ModelConfig::from_hf_json(&text, &cfg_path.display().to_string()).map_err(model_err)?;
                let tok = TextTokenizer::from_hf_dir(dir, &cfg.eos_token_ids).map_err(model_err)?;
                let files = weights::safetensors_files(dir).map_err(model_err)?;
                let wdt = safetensors_dtype(&files).unwrap_or(KvDtype::F32);
                let load_dtype = if on_gpu { compute_dtype(wdt) } else { DType::F32 };
                let w = weights::load_safetensors(dir, &cfg, load_dtype).map_err(model_err)?;
                (cfg, w, tok, files, wdt)
            }
        };
        let dtype = options.kv_dtype.unwrap_or(weights_dtype);
        let weight_bytes = crate::memory::weight_bytes(&weights, cfg.tie_word_embeddings, weights_dtype);
        let options = crate::memory::fit_kv_cache(options, &cfg, dtype, weight_bytes)?;
        if tokenizer.vocab_size() > cfg.vocab_size {
            return Err(model_err(ModelError::Unsupported {
                field: "vocab_size".into(),
                value: cfg.vocab_size.to_string(),
                reason: format!(
                    "the tokenizer has {} tokens, more than the model's vocabulary",
                    tokenizer.vocab_size()
                ),
            }));
        }
        let digest = xinf_models::weights_digest(&files).map_err(model_err)?;
        let context_length = options
            .context_length
            .map_or(cfg.max_position_embeddings, |c| c.min(cfg.max_position_embeddings));
        let block_size = options.kv_layout.block_size;
        let num_blocks = options.kv_cache_tokens.div_ceil(block_size) + 1;
        let layout = options
            .kv_layout
            .describe(cfg.num_layers, cfg.kv_heads, cfg.head_dim, num_blocks)
            .map_err(|e| EngineError::invalid("engine_config.kv_layout", e.to_string()))?;
        let max_seq_len = context_length.min((num_blocks - 1) * block_size);
        let contract = ModelContract {
            architecture: cfg.architecture.as_str().to_owned(),
            dtype,
            num_layers: cfg.num_layers,
            num_heads: cfg.num_heads,
            kv_heads: cfg.kv_heads,
            head_dim: cfg.head_dim,
            vocab_size: cfg.vocab_size,
            context_length,
            rope_theta: cfg.rope_theta,
            weights_digest: digest,
            tokenizer_digest: tokenizer.digest().to_owned(),
        };
        let mut eos: Vec<u32> = tokenizer.eos_token_ids().to_vec();
        eos.extend(&cfg.eos_token_ids);
        eos.sort_unstable();
        eos.dedup();
        let graph_steps = Arc::new(AtomicU64::new(0));
        type Device = Option<(KvDevice, Arc<dyn DeviceSink>)>;
        let (backend, cache, device): (Box<dyn ComputeBackend>, KvCache, Device) = match options.device {
            ComputeDevice::Cpu => {
                let backend = CpuModel::new(cfg, weights, context_length)
                    .map_err(|e| EngineError::Internal(format!("building the model: {e}")))?;
                (Box::new(backend), KvCache::new(layout.clone(), dtype), None)
            }
            #[cfg(not(feature = "cuda"))]
            ComputeDevice::Cuda(_) => return Err(no_gpu_support(options.device)),
            #[cfg(feature = "cuda")]
            ComputeDevice::Cuda(ordinal) => {
                let backend = crate::gpu::GpuModel::new(
                    ordinal,
                    cfg,
                    &weights,
                    weights_dtype,
                    dtype,
                    layout.clone(),
                    context_length,
                    crate::gpu::StepLimits {
                        max_tokens: options.max_batch_tokens,
                        max_seqs: options.max_num_seqs,
                        cuda_graphs: options.cuda_graphs,
                        graph_steps: graph_steps.clone(),
                    },
                )
                .map_err(|e| EngineError::Model(format!("engine_config.device = {}: {e}", options.device)))?;
                drop(weights);
                let handoff = backend.handoff();
                let device: Device = Some((handoff.kv_device(), handoff));
                (Box::new(backend), KvCache::accounting_only(layout.clone(), dtype), device)
            }
        };
        let shared = Arc::new(Shared::default());
        let tokenizer = Arc::new(tokenizer);
        let (tx, rx) = std_mpsc::channel();
        let mut worker = Worker {
            backend,
            cache,
            rx,
            shared: shared.clone(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            pinned: HashMap::new(),
            options: options.clone(),
            tokenizer: tokenizer.clone(),
        };
        std::thread::Builder::new()
            .name("xinf-native-engine".into())
            .spawn(move || worker.run())
            .map_err(|e| EngineError::Internal(format!("starting the engine thread: {e}")))?;
        Ok(Self { tx, shared, tokenizer, contract, layout, options, max_seq_len, eos, device, graph_steps })
    }

    /// The tokenizer (for callers that render or count tokens themselves).
    pub fn tokenizer(&self) -> &TextTokenizer {
        &self.tokenizer
    }

    /// The options this engine runs with.
    pub fn options(&self) -> &EngineOptions {
        &self.options
    }

    /// Longest prompt plus output a request may have.
    pub fn max_seq_len(&self) -> usize {
        self.max_seq_len
    }

    /// Steps computed so far by replaying a captured CUDA graph (decode steps on a GPU with
    /// `cuda_graphs` on); always 0 on the CPU. Tells tests and benchmarks that graphs were
    /// really used, since the tokens are the same either way.
    pub fn graph_steps(&self) -> u64 {
        self.graph_steps.load(Ordering::Relaxed)
    }

    /// The logits after the last of `ids`, computed alone (outside any batch) into temporary
    /// KV blocks. A test and diagnosis hook: golden tests compare it with transformers.
    pub async fn prompt_logits(&self, ids: Vec<u32>) -> Result<Vec<f32>, EngineError> {
        if ids.is_empty() || ids.len() > self.max_seq_len {
            return Err(EngineError::invalid(
                "prompt",
                format!("must have 1 to {} tokens", self.max_seq_len),
            ));
        }
        let (reply, rx) = oneshot::channel();
        self.tx.send(Command::Logits { ids, reply }).map_err(|_| EngineError::Stopped)?;
        rx.await.map_err(|_| EngineError::Stopped)?
    }

    /// Tokenizes the prompt of a request.
    pub fn prompt_ids(&self, prompt: &Prompt) -> Result<Vec<u32>, EngineError> {
        let ids = match prompt {
            Prompt::Text(t) => self.tokenizer.encode(t, true).map_err(model_err)?,
            Prompt::Tokens(ids) => ids.clone(),
            Prompt::Chat(messages) => {
                if messages.is_empty() {
                    return Err(EngineError::invalid("messages", "must not be empty"));
                }
                self.tokenizer.encode_chat(messages).map_err(|e| match e {
                    ModelError::Template(m) => EngineError::invalid("messages", m),
                    other => model_err(other),
                })?
            }
        };
        if ids.is_empty() {
            return Err(EngineError::invalid("prompt", "must not be empty"));
        }
        if let Some(bad) = ids.iter().find(|&&t| t as usize >= self.contract.vocab_size) {
            return Err(EngineError::invalid(
                "prompt",
                format!("token id {bad} is outside the vocabulary of {} tokens", self.contract.vocab_size),
            ));
        }
        Ok(ids)
    }

    fn build_seq(
        &self,
        request: GenerateRequest,
        mode: Mode,
    ) -> Result<(Box<Seq>, TokenStream), EngineError> {
        request.sampling.validate()?;
        if request.request_id.is_empty() {
            return Err(EngineError::invalid("request_id", "must not be empty"));
        }
        let prompt = self.prompt_ids(&request.prompt)?;
        let room = self.max_seq_len.saturating_sub(prompt.len());
        let max_tokens = match request.sampling.max_tokens {
            Some(m) if m <= room => m,
            None if room > 0 => room,
            m => {
                return Err(EngineError::ContextLength {
                    prompt_tokens: prompt.len(),
                    max_tokens: m.unwrap_or(1),
                    context_length: self.max_seq_len,
                });
            }
        };
        let mut stop_ids = request.sampling.stop_token_ids.clone();
        if !request.sampling.ignore_eos {
            stop_ids.extend(&self.eos);
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let seq = Box::new(Seq {
            id: request.request_id,
            prompt_len: prompt.len(),
            detok: Detokenizer::new(prompt.len()),
            tokens: prompt,
            computed: 0,
            table: Vec::new(),
            max_tokens,
            sampler: Sampler::new(&request.sampling),
            stop: StopMatcher::new(&request.sampling.stop),
            stop_ids,
            tx,
            mode,
            import: None,
            preset: None,
        });
        let stream = tokio_stream::wrappers::UnboundedReceiverStream::new(rx).boxed();
        Ok((seq, stream))
    }

    fn enqueue(&self, seq: Box<Seq>) -> Result<(), EngineError> {
        let queued = self.shared.queued.load(Ordering::Relaxed);
        if queued >= self.options.max_queue {
            return Err(EngineError::Overloaded { queued, limit: self.options.max_queue });
        }
        {
            let mut active = lock(&self.shared.active);
            if active.contains(&seq.id) || lock(&self.shared.pinned).contains(&seq.id) {
                return Err(EngineError::DuplicateRequest(seq.id.clone()));
            }
            active.insert(seq.id.clone());
        }
        self.shared.queued.fetch_add(1, Ordering::Relaxed);
        let id = seq.id.clone();
        self.tx.send(Command::Submit(seq)).map_err(|_| {
            dequeued(&self.shared.queued);
            lock(&self.shared.active).remove(&id);
            EngineError::Stopped
        })
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
fn safetensors_dtype(files: &[std::path::PathBuf]) -> Option<KvDtype> {
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

impl Engine for NativeEngine {
    fn contract(&self) -> &ModelContract {
        &self.contract
    }

    fn kv_layout(&self) -> &LayoutDescriptor {
        &self.layout
    }

    fn submit(&self, request: GenerateRequest) -> Result<TokenStream, EngineError> {
        let (seq, stream) = self.build_seq(request, Mode::Generate)?;
        self.enqueue(seq)?;
        Ok(stream)
    }

    fn abort(&self, request_id: &str) -> bool {
        let known = lock(&self.shared.active).contains(request_id);
        if known {
            let _ = self.tx.send(Command::Abort(request_id.to_owned()));
        }
        known
    }

    fn prefill_pinned(
        &self,
        mut request: GenerateRequest,
    ) -> BoxFuture<'static, Result<PinnedPrefill, EngineError>> {
        request.sampling.max_tokens = Some(1);
        let (reply, rx) = oneshot::channel();
        let submitted = self.build_seq(request, Mode::Pinned(Some(reply))).and_then(|(seq, stream)| {
            self.enqueue(seq)?;
            Ok(stream)
        });
        Box::pin(async move {
            // The stream only carries errors for a pinned prefill; keep it alive until the reply.
            let _stream = submitted?;
            rx.await.map_err(|_| EngineError::Stopped)?
        })
    }

    fn prefill_pinned_with_prefix(
        &self,
        mut request: GenerateRequest,
        prefix_pages: Vec<u8>,
    ) -> BoxFuture<'static, Result<PinnedPrefill, EngineError>> {
        request.sampling.max_tokens = Some(1);
        let (reply, rx) = oneshot::channel();
        let page_bytes = self.contract.page_bytes();
        let max_batch = self.options.max_batch_tokens;
        let submitted = self.build_seq(request, Mode::Pinned(Some(reply))).and_then(|(mut seq, stream)| {
            if prefix_pages.len() % page_bytes != 0 {
                return Err(EngineError::Import(format!(
                    "a prefix of {} bytes is not a whole number of {page_bytes}-byte pages",
                    prefix_pages.len()
                )));
            }
            let tokens = prefix_pages.len() / page_bytes * PAGE_TOKENS;
            if tokens >= seq.prompt_len {
                return Err(EngineError::Import(format!(
                    "a prefix of {tokens} tokens leaves nothing to compute of a {}-token prompt",
                    seq.prompt_len
                )));
            }
            if tokens > 0 {
                let need = (tokens + max_batch).min(seq.prompt_len);
                seq.import = Some(Import { pages: KvPages::Host(prefix_pages), tokens, need });
            }
            self.enqueue(seq)?;
            Ok(stream)
        });
        Box::pin(async move {
            let _stream = submitted?;
            rx.await.map_err(|_| EngineError::Stopped)?
        })
    }

    fn prompt_token_ids(&self, prompt: &Prompt) -> Result<Vec<u32>, EngineError> {
        self.prompt_ids(prompt)
    }

    fn export_pages(
        &self,
        request_id: &str,
        first_page: usize,
        count: usize,
    ) -> BoxFuture<'static, Result<Vec<u8>, EngineError>> {
        let (reply, rx) = oneshot::channel();
        let sent =
            self.tx.send(Command::Export { id: request_id.to_owned(), first: first_page, count, reply });
        Box::pin(async move {
            sent.map_err(|_| EngineError::Stopped)?;
            rx.await.map_err(|_| EngineError::Stopped)?
        })
    }

    fn kv_device(&self) -> Option<KvDevice> {
        self.device.as_ref().map(|(d, _)| d.clone())
    }

    fn export_pages_device(
        &self,
        request_id: &str,
        first_page: usize,
        count: usize,
        route: DeviceRoute,
    ) -> BoxFuture<'static, Result<DeviceLease, EngineError>> {
        let (reply, rx) = oneshot::channel();
        let sent = self.tx.send(Command::ExportDevice {
            id: request_id.to_owned(),
            first: first_page,
            count,
            route,
            reply,
        });
        Box::pin(async move {
            sent.map_err(|_| EngineError::Stopped)?;
            rx.await.map_err(|_| EngineError::Stopped)?
        })
    }

    fn device_sink(&self) -> Option<Arc<dyn DeviceSink>> {
        self.device.as_ref().map(|(_, sink)| Arc::clone(sink))
    }

    fn release_pinned(&self, request_id: &str) -> bool {
        let known = lock(&self.shared.pinned).remove(request_id);
        if known {
            let _ = self.tx.send(Command::Release(request_id.to_owned()));
        }
        known
    }

    fn submit_imported(&self, request: GenerateRequest, kv: ImportedKv) -> Result<TokenStream, EngineError> {
        let (mut seq, stream) = self.build_seq(request, Mode::Generate)?;
        if seq.tokens != kv.prompt_ids {
            return Err(EngineError::Import("the prompt token ids differ from the prefill side's".into()));
        }
        let expect = self.import_len(seq.prompt_len).div_ceil(PAGE_TOKENS) * self.contract.page_bytes();
        if matches!(kv.pages, KvPages::Device(_)) && self.device.is_none() {
            return Err(EngineError::Import(
                "GPU pages given to an engine whose KV cache is in host memory".into(),
            ));
        }
        if kv.pages.len() != expect {
            return Err(EngineError::Import(format!(
                "{} bytes of pages for a {}-token prompt, expected {expect}",
                kv.pages.len(),
                seq.prompt_len
            )));
        }
        if kv.first_token as usize >= self.contract.vocab_size {
            return Err(EngineError::Import(format!(
                "first token {} is outside the vocabulary",
                kv.first_token
            )));
        }
        let tokens = self.import_len(seq.prompt_len);
        seq.import = Some(Import { pages: kv.pages, tokens, need: seq.prompt_len });
        if !self.options.recompute_last_token {
            seq.preset = Some(kv.first_token);
        } else if seq.prompt_len < 2 {
            return Err(EngineError::invalid(
                "prompt",
                "a 1-token prompt cannot be decoded from imported KV by an engine that recomputes the last prompt token",
            ));
        }
        self.enqueue(seq)?;
        Ok(stream)
    }

    fn import_len(&self, prompt_len: usize) -> usize {
        if self.options.recompute_last_token { prompt_len.saturating_sub(1).max(1) } else { prompt_len }
    }

    fn stats(&self) -> EngineStats {
        let s = &self.shared;
        EngineStats {
            running: s.running.load(Ordering::Relaxed),
            queued: s.queued.load(Ordering::Relaxed),
            used_blocks: s.used_blocks.load(Ordering::Relaxed),
            pinned_blocks: s.pinned_blocks.load(Ordering::Relaxed),
            total_blocks: self.layout.num_blocks - 1,
            prompt_tokens: s.prompt_tokens.load(Ordering::Relaxed),
            generated_tokens: s.generated_tokens.load(Ordering::Relaxed),
        }
    }
}

/// The compute thread's state.
struct Worker {
    backend: Box<dyn ComputeBackend>,
    cache: KvCache,
    rx: std_mpsc::Receiver<Command>,
    shared: Arc<Shared>,
    waiting: VecDeque<Box<Seq>>,
    /// Boxed like `waiting`: sequences move between the two as pointers (preemption, admission).
    #[allow(clippy::vec_box)]
    running: Vec<Box<Seq>>,
    /// Prompts held for export: (blocks, prompt length).
    pinned: HashMap<String, (Vec<u32>, usize)>,
    options: EngineOptions,
    tokenizer: Arc<TextTokenizer>,
}

impl Worker {
    fn run(&mut self) {
        loop {
            let idle = self.running.is_empty() && self.waiting.is_empty();
            let first = if idle {
                match self.rx.recv() {
                    Ok(c) => Some(c),
                    Err(_) => return,
                }
            } else {
                None
            };
            if let Some(c) = first {
                self.handle(c);
            }
            loop {
                match self.rx.try_recv() {
                    Ok(c) => self.handle(c),
                    Err(std_mpsc::TryRecvError::Empty) => break,
                    Err(std_mpsc::TryRecvError::Disconnected) => {
                        if self.running.is_empty() && self.waiting.is_empty() {
                            return;
                        }
                        break;
                    }
                }
            }
            self.drop_disconnected();
            self.step();
            self.publish();
        }
    }

    fn publish(&self) {
        let s = &self.shared;
        s.running.store(self.running.len(), Ordering::Relaxed);
        // `queued` is counted by its submitters and by admission, not stored here: a request
        // in the command channel is queued but not yet in `waiting`.
        s.used_blocks.store(self.cache.capacity_blocks() - self.cache.free_blocks(), Ordering::Relaxed);
        s.pinned_blocks.store(self.pinned.values().map(|p| p.0.len()).sum(), Ordering::Relaxed);
    }

    fn handle(&mut self, c: Command) {
        match c {
            Command::Submit(seq) => self.waiting.push_back(seq),
            Command::Abort(id) => {
                if let Some(i) = self.running.iter().position(|s| s.id == id) {
                    let s = self.running.remove(i);
                    self.finish(s, Some(FinishReason::Abort), None);
                } else if let Some(i) = self.waiting.iter().position(|s| s.id == id) {
                    if let Some(s) = self.waiting.remove(i) {
                        dequeued(&self.shared.queued);
                        self.finish(s, Some(FinishReason::Abort), None);
                    }
                }
            }
            Command::Release(id) => {
                if let Some((mut table, _)) = self.pinned.remove(&id) {
                    self.cache.release(&mut table);
                }
                self.publish();
            }
            Command::Export { id, first, count, reply } => {
                let result = self.pinned_range(id, first, count).and_then(|(table, len)| {
                    self.backend
                        .export_pages(&mut self.cache, &table, len, first, count)
                        .map_err(|e| EngineError::Internal(format!("exporting KV pages: {e}")))
                });
                let _ = reply.send(result);
            }
            Command::ExportDevice { id, first, count, route, reply } => {
                let result = self.pinned_range(id, first, count).and_then(|(table, len)| {
                    self.backend
                        .export_device(&table, len, first, count, route)
                        .map_err(|e| EngineError::Internal(format!("exporting KV pages to GPU staging: {e}")))
                });
                let _ = reply.send(result);
            }
            Command::Logits { ids, reply } => {
                let mut table = Vec::new();
                let result = if self.cache.ensure(&mut table, ids.len()) {
                    let chunk = Chunk { tokens: &ids, start: 0, block_table: &table, want_logits: true };
                    self.backend
                        .forward(&[chunk], &mut self.cache)
                        .map_err(|e| EngineError::Internal(e.to_string()))
                        .and_then(|mut rows| {
                            rows.pop().ok_or_else(|| EngineError::Internal("no logits".into()))
                        })
                } else {
                    Err(EngineError::Overloaded { queued: self.waiting.len(), limit: self.options.max_queue })
                };
                self.cache.release(&mut table);
                let _ = reply.send(result);
            }
        }
    }

    /// The block table and length of pinned prompt `id`, if pages `first..first + count` exist.
    fn pinned_range(&self, id: String, first: usize, count: usize) -> Result<(Vec<u32>, usize), EngineError> {
        let Some((table, len)) = self.pinned.get(&id) else { return Err(EngineError::UnknownRequest(id)) };
        let pages = len.div_ceil(PAGE_TOKENS);
        if first + count > pages {
            return Err(EngineError::invalid(
                "pages",
                format!("pages {first}..{} requested of a {pages}-page prompt", first + count),
            ));
        }
        Ok((table.clone(), *len))
    }

    /// Requests whose client went away are aborted.
    fn drop_disconnected(&mut self) {
        let gone: Vec<String> = self
            .running
            .iter()
            .chain(self.waiting.iter())
            .filter(|s| s.tx.is_closed())
            .map(|s| s.id.clone())
            .collect();
        for id in gone {
            self.handle(Command::Abort(id));
        }
    }

    /// Ends a sequence: frees or pins its blocks, reports, forgets its id.
    fn finish(&mut self, mut s: Box<Seq>, reason: Option<FinishReason>, error: Option<EngineError>) {
        let usage = Usage { prompt_tokens: s.prompt_len, completion_tokens: s.tokens.len() - s.prompt_len };
        lock(&self.shared.active).remove(&s.id);
        // Free before reporting, and publish the counters before the client hears the end.
        if !matches!(s.mode, Mode::Pinned(_)) || error.is_some() || reason == Some(FinishReason::Abort) {
            self.cache.release(&mut s.table);
            self.publish();
        }
        match (&mut s.mode, error) {
            (Mode::Pinned(reply), None) if reason != Some(FinishReason::Abort) => {
                let first_token = s.tokens.get(s.prompt_len).copied().unwrap_or_default();
                let pinned = PinnedPrefill {
                    request_id: s.id.clone(),
                    prompt_ids: s.tokens[..s.prompt_len].to_vec(),
                    first_token,
                };
                let table = std::mem::take(&mut s.table);
                lock(&self.shared.pinned).insert(s.id.clone());
                self.pinned.insert(s.id.clone(), (table, s.prompt_len));
                // Counters first: whoever gets the reply may look at them at once.
                self.publish();
                if let Some(r) = reply.take()
                    && r.send(Ok(pinned)).is_err()
                {
                    // Nobody waits for the pinned prompt any more: free it.
                    lock(&self.shared.pinned).remove(&s.id);
                    if let Some((mut t, _)) = self.pinned.remove(&s.id) {
                        self.cache.release(&mut t);
                    }
                }
            }
            (Mode::Pinned(reply), error) => {
                if let Some(r) = reply.take() {
                    let _ = r.send(Err(error.unwrap_or(EngineError::Aborted)));
                }
            }
            (Mode::Generate, Some(e)) => {
                let _ = s.tx.send(Err(e));
            }
            (Mode::Generate, None) => {
                let tail = s.stop.flush();
                if !tail.is_empty() && reason != Some(FinishReason::Stop) {
                    let last = s.tokens.last().copied().unwrap_or_default();
                    let _ = s.tx.send(Ok(TokenEvent::Delta { token_id: last, text: tail }));
                }
                let _ = s
                    .tx
                    .send(Ok(TokenEvent::Finished { reason: reason.unwrap_or(FinishReason::Stop), usage }));
            }
        }
    }

    /// Moves waiting sequences into the running set while memory and limits allow.
    fn admit(&mut self) {
        while self.running.len() < self.options.max_num_seqs {
            let Some(mut s) = self.waiting.pop_front() else { break };
            let need = match &s.import {
                Some(import) => import.need,
                None => s.tokens.len().min(self.options.max_batch_tokens),
            };
            if !self.cache.ensure(&mut s.table, need) {
                if self.running.is_empty() && self.cache.free_blocks() == self.cache.capacity_blocks() {
                    dequeued(&self.shared.queued);
                    let e = EngineError::invalid("prompt", "the prompt does not fit in the KV cache");
                    self.finish(s, None, Some(e));
                    continue;
                }
                self.waiting.push_front(s);
                break;
            }
            dequeued(&self.shared.queued);
            if let Some(import) = s.import.take() {
                let written = match &import.pages {
                    KvPages::Host(bytes) => {
                        self.backend.import_pages(&mut self.cache, &s.table, import.tokens, bytes)
                    }
                    KvPages::Device(pages) => self.backend.import_device(&s.table, import.tokens, pages),
                };
                if let Err(e) = written {
                    self.finish(s, None, Some(EngineError::Import(format!("writing the KV pages: {e}"))));
                    continue;
                }
                s.computed = import.tokens;
            }
            self.running.push(s);
        }
    }

    /// Frees the most recently admitted sequence other than `keep`, to be recomputed later.
    fn preempt(&mut self, keep: usize) -> bool {
        let Some(victim) = (0..self.running.len()).rev().find(|&i| i != keep) else { return false };
        let mut s = self.running.remove(victim);
        self.cache.release(&mut s.table);
        s.computed = 0;
        s.import = None;
        self.shared.queued.fetch_add(1, Ordering::Relaxed);
        self.waiting.push_front(s);
        true
    }

    fn step(&mut self) {
        // Imported first tokens are emitted without compute.
        let mut i = 0;
        while i < self.running.len() {
            if let Some(t) = self.running[i].preset.take() {
                if let Some(done) = self.accept(i, t) {
                    let s = self.running.remove(i);
                    self.finish(s, Some(done), None);
                    continue;
                }
            }
            i += 1;
        }
        self.admit();
        if self.running.is_empty() {
            return;
        }
        // Plan: decodes first (one token each), then prompt chunks within the budget.
        let mut budget = self.options.max_batch_tokens.max(self.running.len());
        let mut plan: Vec<(usize, usize)> = Vec::new();
        let mut order: Vec<usize> = (0..self.running.len()).collect();
        order.sort_by_key(|&i| self.running[i].tokens.len() - self.running[i].computed > 1);
        let mut i = 0;
        while i < order.len() {
            let idx = order[i];
            let s = &self.running[idx];
            let todo = s.tokens.len() - s.computed;
            let n = todo.min(budget);
            if n == 0 {
                i += 1;
                continue;
            }
            let upto = self.running[idx].computed + n;
            let mut table = std::mem::take(&mut self.running[idx].table);
            let ok = self.cache.ensure(&mut table, upto);
            self.running[idx].table = table;
            if !ok {
                if self.preempt(idx) {
                    // Indices shifted: plan again from scratch next step.
                    return self.publish();
                }
                let s = self.running.remove(idx);
                let e = EngineError::invalid("prompt", "the sequence no longer fits in the KV cache");
                self.finish(s, None, Some(e));
                return;
            }
            budget -= n;
            plan.push((idx, n));
            i += 1;
        }
        let chunks: Vec<Chunk<'_>> = plan
            .iter()
            .map(|&(idx, n)| {
                let s = &self.running[idx];
                Chunk {
                    tokens: &s.tokens[s.computed..s.computed + n],
                    start: s.computed,
                    block_table: &s.table,
                    want_logits: s.computed + n == s.tokens.len(),
                }
            })
            .collect();
        let result = self.backend.forward(&chunks, &mut self.cache);
        drop(chunks);
        let logits = match result {
            Ok(l) => l,
            Err(e) => {
                let msg = format!("forward pass failed: {e}");
                tracing::error!("{msg}");
                for (idx, _) in plan.iter().rev() {
                    let s = self.running.remove(*idx);
                    self.finish(s, None, Some(EngineError::Internal(msg.clone())));
                }
                return;
            }
        };
        let mut logits = logits.into_iter();
        let mut finished = Vec::new();
        for &(idx, n) in &plan {
            let s = &mut self.running[idx];
            let was_prompt = s.computed < s.prompt_len;
            s.computed += n;
            if was_prompt {
                self.shared.prompt_tokens.fetch_add(n.min(s.prompt_len) as u64, Ordering::Relaxed);
            }
            if s.computed < s.tokens.len() {
                continue;
            }
            let Some(mut row) = logits.next() else { continue };
            let s = &mut self.running[idx];
            let (prompt, output) = s.tokens.split_at(s.prompt_len);
            let token = s.sampler.sample(&mut row, prompt, output);
            if let Some(reason) = self.accept(idx, token) {
                finished.push((idx, reason));
            }
        }
        finished.sort_by_key(|f| std::cmp::Reverse(f.0));
        for (idx, reason) in finished {
            let s = self.running.remove(idx);
            self.finish(s, Some(reason), None);
        }
    }

    /// Appends a sampled token to a running sequence and streams it; returns why the sequence
    /// ends, if it does.
    fn accept(&mut self, idx: usize, token: u32) -> Option<FinishReason> {
        self.shared.generated_tokens.fetch_add(1, Ordering::Relaxed);
        let s = &mut self.running[idx];
        s.tokens.push(token);
        let generated = s.tokens.len() - s.prompt_len;
        if matches!(s.mode, Mode::Pinned(_)) {
            return Some(FinishReason::Length);
        }
        let is_stop_token = s.stop_ids.contains(&token);
        let text = if is_stop_token { String::new() } else { s.detok.step(&self.tokenizer, &s.tokens) };
        let (emit, stopped) = match s.stop.push(&text) {
            StopOutcome::Continue { emit } => (emit, false),
            StopOutcome::Stopped { emit } => (emit, true),
        };
        if s.tx.send(Ok(TokenEvent::Delta { token_id: token, text: emit })).is_err() {
            return Some(FinishReason::Abort);
        }
        if stopped || is_stop_token {
            Some(FinishReason::Stop)
        } else if generated >= s.max_tokens {
            Some(FinishReason::Length)
        } else {
            None
        }
    }
}
