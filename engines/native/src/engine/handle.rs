//! The engine's handle: what callers hold. It validates and tokenizes requests, answers what
//! it can from the shared counters, and sends everything else to the compute thread.

use super::load::{self, Device};
use super::prompt::PromptTally;
use super::seq::{Import, Mode, Seq};
use super::shared::{Command, Shared, dequeued};
use super::worker::Worker;
use crate::detok::Detokenizer;
use crate::grammar::{Constraint, Grammars};
use crate::options::EngineOptions;
use crate::sampler::Sampler;
use crate::stop::StopMatcher;
use futures::StreamExt;
use futures::future::BoxFuture;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc as std_mpsc;
use std::sync::{Arc, OnceLock};
use tokio::sync::{mpsc, oneshot};
use xinf_engine::{
    Engine, EngineError, EngineStats, GenerateRequest, ImportedKv, KvPages, ModelContract, PAGE_TOKENS,
    PinnedPrefill, Prompt, TokenStream,
};
use xinf_models::{ResolvedModel, TextTokenizer};
use xinf_transfer::LayoutDescriptor;
use xinf_transfer::device::{DeviceLease, DeviceRoute, DeviceSink, KvDevice};
use xinf_transfer::sync::lock;

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
    device: Device,
    /// Steps the GPU backend computed by replaying a CUDA graph.
    graph_steps: Arc<AtomicU64>,
    graph_links: Arc<AtomicU64>,
    /// Compiles structured-output requests' schemas; built by the first such request (the
    /// vocabulary's trie takes a moment and memory that other requests never need).
    grammars: OnceLock<Result<Grammars, String>>,
    /// The compute thread, waited for when the handle drops.
    worker: Option<std::thread::JoinHandle<()>>,
}

/// How long dropping the handle waits for the compute thread to end: a step and freeing the
/// model's memory, unless requests whose streams are still held keep it computing.
const WORKER_END_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

impl Drop for NativeEngine {
    /// Stops the compute thread (its command channel closes) and, on a GPU, waits for it to
    /// free what it holds, so that a process exiting after dropping its engine does not tear the
    /// GPU driver down under a thread still releasing device memory. A thread still serving
    /// requests whose streams are held elsewhere is left to finish them after
    /// [`WORKER_END_WAIT`]; on the CPU, where a step may take seconds, nothing is waited for.
    fn drop(&mut self) {
        drop(std::mem::replace(&mut self.tx, std_mpsc::channel().0));
        let Some(worker) = self.worker.take().filter(|_| self.device.is_some()) else { return };
        let deadline = std::time::Instant::now() + WORKER_END_WAIT;
        while !worker.is_finished() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        if worker.is_finished() {
            if worker.join().is_err() {
                tracing::error!("the native engine's compute thread panicked");
            }
        } else {
            tracing::warn!("the native engine's compute thread still serves requests; not waiting for it");
        }
    }
}

impl std::fmt::Debug for NativeEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NativeEngine").field("contract", &self.contract).finish_non_exhaustive()
    }
}

impl NativeEngine {
    /// Loads a model and starts its compute thread.
    pub fn load(model: &ResolvedModel, options: EngineOptions) -> Result<Self, EngineError> {
        let parts = load::load(model, options)?;
        let shared = Arc::new(Shared::default());
        let tokenizer = Arc::new(parts.tokenizer);
        let (tx, rx) = std_mpsc::channel();
        let worker = Worker::new(
            parts.backend,
            parts.cache,
            rx,
            shared.clone(),
            parts.options.clone(),
            tokenizer.clone(),
        );
        let worker = Some(worker.spawn()?);
        Ok(Self {
            tx,
            shared,
            tokenizer,
            contract: parts.contract,
            layout: parts.layout,
            options: parts.options,
            max_seq_len: parts.max_seq_len,
            eos: parts.eos,
            device: parts.device,
            graph_steps: parts.graph_steps,
            graph_links: parts.graph_links,
            grammars: OnceLock::new(),
            worker,
        })
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

    /// Programmatic edges put between kernels of the captured graphs so far (Hopper and later
    /// with `cuda_graphs` on; 0 elsewhere): each lets a kernel be launched before the one it
    /// follows has finished. Tells tests and benchmarks they were really used.
    pub fn graph_links(&self) -> u64 {
        self.graph_links.load(Ordering::Relaxed)
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
        self.tokenizer.prompt_ids(prompt, self.contract.vocab_size)
    }

    /// Validates `request` and makes the sequence the compute thread runs for it, with the
    /// stream its events go to. `max_tokens` defaults to the room the context leaves.
    fn build_seq(
        &self,
        request: GenerateRequest,
        mode: Mode,
    ) -> Result<(Box<Seq>, TokenStream), EngineError> {
        request.sampling.validate()?;
        request.sampling.check_bias_tokens(self.contract.vocab_size)?;
        if request.request_id.is_empty() {
            return Err(EngineError::invalid("request_id", "must not be empty"));
        }
        let after = request.sampling.structured_after.as_deref();
        let constraint =
            request.sampling.structured.as_ref().map(|s| self.constraint(s, after)).transpose()?;
        let prompt = self.prompt_ids(&request.prompt)?;
        let max_tokens = request.sampling.max_tokens_within(prompt.len(), self.max_seq_len)?;
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
            min_tokens: request.sampling.min_tokens,
            tx,
            mode,
            import: None,
            preset: None,
            logprobs: request.sampling.logprobs,
            first_logprobs: None,
            constraint,
            block_keys: Vec::new(),
            prompt: request
                .sampling
                .reports_prompt()
                .then(|| PromptTally::new(request.sampling.prompt_logprobs, self.contract.vocab_size)),
        });
        let stream = tokio_stream::wrappers::UnboundedReceiverStream::new(rx).boxed();
        Ok((seq, stream))
    }

    /// The constraint of a request asking for `shape`, compiled here so that a bad schema is
    /// refused before the request is queued.
    fn constraint(
        &self,
        shape: &xinf_engine::StructuredOutput,
        after: Option<&str>,
    ) -> Result<Constraint, EngineError> {
        let grammars = self
            .grammars
            .get_or_init(|| {
                // Built from the model's vocabulary, which no client chooses; guarded all the same,
                // since this runs on the caller's thread.
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    Grammars::new(&self.tokenizer, self.contract.vocab_size, &self.eos)
                }))
                .unwrap_or_else(|_| Err("building the vocabulary's trie failed".into()))
            })
            .as_ref()
            .map_err(|e| {
                EngineError::invalid(
                    "response_format",
                    format!("structured output is unavailable for this model: {e}"),
                )
            })?;
        grammars.constraint(shape, after)
    }

    /// Hands a sequence to the compute thread, unless the queue is full or its id is in use
    /// (running, queued or pinned). Counted as queued here, before it reaches the thread, so a
    /// burst of submissions cannot overshoot `max_queue`.
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
        request: GenerateRequest,
    ) -> BoxFuture<'static, Result<PinnedPrefill, EngineError>> {
        let (reply, rx) = oneshot::channel();
        // Checked against the context with the request's own `max_tokens`; one token computed.
        let submitted = self.build_seq(request, Mode::Pinned(Some(reply))).and_then(|(mut seq, stream)| {
            seq.max_tokens = 1;
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
        request: GenerateRequest,
        prefix_pages: Vec<u8>,
    ) -> BoxFuture<'static, Result<PinnedPrefill, EngineError>> {
        let (reply, rx) = oneshot::channel();
        let page_bytes = self.contract.page_bytes();
        let max_batch = self.options.max_batch_tokens;
        let submitted = self.build_seq(request, Mode::Pinned(Some(reply))).and_then(|(mut seq, stream)| {
            seq.max_tokens = 1;
            if !prefix_pages.len().is_multiple_of(page_bytes) {
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
            // Prompt log-probabilities need every position's logits: the prefix is computed too.
            if tokens > 0 && !seq.wants_prompt_logits() {
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
        if request.sampling.prompt_logprobs.is_some() {
            return Err(EngineError::invalid(
                "prompt_logprobs",
                "a decode side imports the prompt's KV and has no logits for it: the prefill side reports them",
            ));
        }
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
            seq.preset = Some((kv.first_token, kv.first_logprobs));
            seq.sampler.skip_draw();
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
            cached_prompt_tokens: s.cached_prompt_tokens.load(Ordering::Relaxed),
            generated_tokens: s.generated_tokens.load(Ordering::Relaxed),
        }
    }
}
