//! The mock engine: deterministic tokens from the prompt, a real paged KV cache, and the
//! faults its options ask for.

use crate::kv::{self, KvCache};
use futures::StreamExt;
use futures::future::BoxFuture;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use xinf_engine::{
    Engine, EngineError, EngineStats, FinishReason, GenerateRequest, ImportedKv, KvDtype, KvPages, Logprob,
    MockConfig, MockFaults, ModelContract, PinnedPrefill, Prompt, PromptReport, RemoteKv, TokenEvent,
    TokenLogprobs, TokenStream, Usage,
};
use xinf_transfer::sync::lock;
use xinf_transfer::{LayoutDescriptor, pages_for};

/// Token ids below this are special (none is emitted); a byte `b` is token `b + 3`.
const BYTE_BASE: u32 = 3;
/// Token ids the mock model knows (SmolLM2's vocabulary size); bytes and output are among the
/// first 259.
const VOCAB: usize = 49_152;
/// Context length when `engine_config` gives none.
const DEFAULT_CONTEXT: usize = 4096;
/// KV cache tokens when `engine_config` gives none.
const DEFAULT_CACHE_TOKENS: usize = 8192;

/// The hash of every prompt token that the output is drawn from (computed once per request).
fn prompt_hash(prompt: &[u32]) -> u64 {
    prompt.iter().fold(0xcbf2_9ce4_8422_2325, |h, &id| (h ^ u64::from(id)).wrapping_mul(0x100_0000_01b3))
}

/// The output token `i` of a prompt: a letter or a space, from the prompt's hash.
fn output_token(prompt: &[u32], i: usize) -> u32 {
    token_at(prompt_hash(prompt), i)
}

fn token_at(h: u64, i: usize) -> u32 {
    let x = (h ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)).wrapping_mul(0xBF58_476D_1CE4_E5B9) >> 32;
    let byte = if x.is_multiple_of(6) { b' ' } else { b'a' + (x % 26) as u8 };
    BYTE_BASE + u32::from(byte)
}

fn token_text(id: u32) -> String {
    char::from(u8::try_from(id.saturating_sub(BYTE_BASE)).unwrap_or(b'?')).to_string()
}

/// The log-probabilities of a mock token: its output is certain (log-probability 0), and no
/// other token is possible, so it is also the only alternative listed.
fn certain(id: u32) -> Box<TokenLogprobs> {
    let chosen = Logprob { token_id: id, token: token_text(id), logprob: 0.0 };
    Box::new(TokenLogprobs { top: vec![chosen.clone()], chosen, rank: Some(1) })
}

/// A prompt held for export.
struct Pinned {
    table: Vec<u32>,
    ids: Vec<u32>,
}

/// The engine's state, behind one lock (nothing here is slow).
struct Inner {
    cache: KvCache,
    running: HashMap<String, Arc<AtomicBool>>,
    pinned: HashMap<String, Pinned>,
    pinned_blocks: usize,
    prompt_tokens: u64,
    generated_tokens: u64,
    /// Text and chat prompts turned into ids, so tests can see a prompt is tokenized once.
    texts_tokenized: u64,
}

/// A deterministic engine without weights (see the crate documentation).
#[derive(Clone)]
pub struct MockEngine {
    contract: ModelContract,
    layout: LayoutDescriptor,
    faults: MockFaults,
    recompute_last_token: bool,
    inner: Arc<Mutex<Inner>>,
}

impl std::fmt::Debug for MockEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MockEngine").field("contract", &self.contract).finish_non_exhaustive()
    }
}

fn fault(what: &str) -> EngineError {
    EngineError::Internal(format!("injected fault: {what}"))
}

/// What one stream runs: the prompt, how many tokens, the blocks it holds.
struct Run {
    request_id: String,
    prompt: Vec<u32>,
    max_tokens: usize,
    table: Vec<u32>,
    /// Whether each token comes with its log-probabilities.
    logprobs: bool,
    /// Whether the prompt is reported before the output (`echo`).
    echo: bool,
}

/// The host memory a mock engine's KV cache takes: f16 K and V of every layer per token.
pub(crate) fn host_bytes(config: &MockConfig) -> u64 {
    let tokens = config.engine.kv_cache_tokens.unwrap_or(DEFAULT_CACHE_TOKENS) as u64;
    tokens * (2 * kv::LAYERS * kv::KV_HEADS * kv::HEAD_DIM * 2) as u64
}

impl MockEngine {
    /// A mock engine for `model_name` with `config`'s KV layout, sizes and faults.
    pub fn new(model_name: &str, config: &MockConfig) -> Result<Self, EngineError> {
        let options = &config.engine;
        let cache = KvCache::new(options.layout(), options.kv_cache_tokens.unwrap_or(DEFAULT_CACHE_TOKENS))?;
        let contract = ModelContract {
            architecture: "mock".into(),
            dtype: KvDtype::F16,
            num_layers: kv::LAYERS,
            num_heads: 2 * kv::KV_HEADS,
            kv_heads: kv::KV_HEADS,
            head_dim: kv::HEAD_DIM,
            vocab_size: VOCAB,
            context_length: options.context_length.unwrap_or(DEFAULT_CONTEXT),
            rope_theta: 10_000.0,
            weights_digest: format!("mock:{model_name}"),
            tokenizer_digest: "mock:bytes".into(),
        };
        Ok(Self {
            contract,
            layout: cache.descriptor().clone(),
            faults: config.faults.clone(),
            recompute_last_token: options.recompute_last_token.unwrap_or(false),
            inner: Arc::new(Mutex::new(Inner {
                cache,
                running: HashMap::new(),
                pinned: HashMap::new(),
                pinned_blocks: 0,
                prompt_tokens: 0,
                generated_tokens: 0,
                texts_tokenized: 0,
            })),
        })
    }

    fn tokens(&self, prompt: &Prompt) -> Result<Vec<u32>, EngineError> {
        if !matches!(prompt, Prompt::Tokens(_)) {
            lock(&self.inner).texts_tokenized += 1;
        }
        let ids: Vec<u32> = match prompt {
            Prompt::Text(t) => t.bytes().map(|b| BYTE_BASE + u32::from(b)).collect(),
            Prompt::Chat(messages) | Prompt::ChatWith { messages, .. } => messages
                .iter()
                .flat_map(|m| format!("{}: {}\n", m.role, m.content).into_bytes())
                .map(|b| BYTE_BASE + u32::from(b))
                .collect(),
            Prompt::Tokens(ids) => ids.clone(),
        };
        if ids.is_empty() {
            return Err(EngineError::invalid("prompt", "must not be empty"));
        }
        if let Some(bad) = ids.iter().find(|&&id| id as usize >= self.contract.vocab_size) {
            return Err(EngineError::invalid("prompt", format!("token id {bad} is outside the vocabulary")));
        }
        Ok(ids)
    }

    /// The request's prompt ids and its output tokens at most, where they fit the context.
    fn fits_context(&self, request: &GenerateRequest) -> Result<(Vec<u32>, usize), EngineError> {
        let prompt = self.tokens(&request.prompt)?;
        let context = self.contract.context_length;
        let max_tokens = request.sampling.max_tokens.unwrap_or(context.saturating_sub(prompt.len()));
        if prompt.len() + max_tokens > context {
            return Err(EngineError::ContextLength {
                prompt_tokens: prompt.len(),
                max_tokens,
                context_length: context,
            });
        }
        Ok((prompt, max_tokens))
    }

    /// Checks a request and reserves blocks for its prompt and output.
    fn admit(&self, request: &GenerateRequest) -> Result<Run, EngineError> {
        if self.faults.fail_at_admission == Some(true) {
            return Err(fault("admission refused"));
        }
        request.sampling.validate()?;
        if request.sampling.prompt_logprobs.is_some() {
            return Err(EngineError::invalid(
                "prompt_logprobs",
                "the mock engine has no model to compute them",
            ));
        }
        let (prompt, max_tokens) = self.fits_context(request)?;
        let mut inner = lock(&self.inner);
        if inner.running.contains_key(&request.request_id) || inner.pinned.contains_key(&request.request_id) {
            return Err(EngineError::DuplicateRequest(request.request_id.clone()));
        }
        let Some(table) = inner.cache.allocate(prompt.len() + max_tokens) else {
            return Err(EngineError::Overloaded { queued: inner.running.len(), limit: inner.running.len() });
        };
        Ok(Run {
            request_id: request.request_id.clone(),
            prompt,
            max_tokens,
            table,
            logprobs: request.sampling.logprobs.is_some(),
            echo: request.sampling.echo,
        })
    }

    /// Streams a run's tokens; the run's blocks are freed when the stream ends or is dropped.
    fn stream(&self, run: Run) -> TokenStream {
        let cancel = Arc::new(AtomicBool::new(false));
        lock(&self.inner).running.insert(run.request_id.clone(), cancel.clone());
        let guard = RunGuard {
            inner: self.inner.clone(),
            request_id: run.request_id.clone(),
            table: Some(run.table),
        };
        let step = Duration::from_millis(self.faults.step_ms.unwrap_or(0));
        let fail_after = self.faults.fail_after_tokens;
        let (hash, prompt_tokens) = (prompt_hash(&run.prompt), run.prompt.len());
        let (max_tokens, inner, logprobs) = (run.max_tokens, self.inner.clone(), run.logprobs);
        let state = (0usize, false, guard);
        let lead = run.echo.then(|| Ok(TokenEvent::Prompt(report(&run.prompt))));
        let tokens = futures::stream::unfold(state, move |(i, done, guard)| {
            let (cancel, inner) = (cancel.clone(), inner.clone());
            async move {
                if done {
                    return None;
                }
                if !step.is_zero() {
                    tokio::time::sleep(step).await;
                }
                if cancel.load(Ordering::Acquire) {
                    return Some((Err(EngineError::Aborted), (i, true, guard)));
                }
                if fail_after == Some(i) {
                    return Some((Err(fault(&format!("failed after {i} tokens"))), (i, true, guard)));
                }
                if i == max_tokens {
                    let usage = Usage { prompt_tokens, completion_tokens: i };
                    let end = TokenEvent::Finished { reason: FinishReason::Length, usage };
                    return Some((Ok(end), (i, true, guard)));
                }
                lock(&inner).generated_tokens += 1;
                let token_id = token_at(hash, i);
                let logprobs = logprobs.then(|| certain(token_id));
                let delta = TokenEvent::Delta { token_id, text: token_text(token_id), logprobs };
                Some((Ok(delta), (i + 1, false, guard)))
            }
        });
        Box::pin(futures::stream::iter(lead).chain(tokens))
    }
}

/// The report of a prompt (`echo`): its ids, decoded as mock tokens.
fn report(prompt: &[u32]) -> Box<PromptReport> {
    let text = prompt.iter().map(|&t| token_text(t)).collect();
    Box::new(PromptReport { token_ids: prompt.to_vec(), text, logprobs: None })
}

/// Frees a stream's blocks and its abort flag, however the stream ends.
struct RunGuard {
    inner: Arc<Mutex<Inner>>,
    request_id: String,
    table: Option<Vec<u32>>,
}

impl Drop for RunGuard {
    fn drop(&mut self) {
        let mut inner = lock(&self.inner);
        inner.running.remove(&self.request_id);
        if let Some(table) = self.table.take() {
            inner.cache.release(table);
        }
    }
}

impl Engine for MockEngine {
    fn contract(&self) -> &ModelContract {
        &self.contract
    }

    fn kv_layout(&self) -> &LayoutDescriptor {
        &self.layout
    }

    fn submit(&self, request: GenerateRequest) -> Result<TokenStream, EngineError> {
        let run = self.admit(&request)?;
        let mut inner = lock(&self.inner);
        inner.cache.compute(&run.table, &run.prompt);
        inner.prompt_tokens += run.prompt.len() as u64;
        drop(inner);
        Ok(self.stream(run))
    }

    fn abort(&self, request_id: &str) -> bool {
        match lock(&self.inner).running.get(request_id) {
            Some(flag) => {
                flag.store(true, Ordering::Release);
                true
            }
            None => false,
        }
    }

    fn prefill_pinned(
        &self,
        request: GenerateRequest,
    ) -> BoxFuture<'static, Result<PinnedPrefill, EngineError>> {
        let pinned = self.pin(&request, &[]);
        Box::pin(async move { pinned })
    }

    fn prefill_pinned_with_prefix(
        &self,
        request: GenerateRequest,
        prefix_pages: Vec<u8>,
    ) -> BoxFuture<'static, Result<PinnedPrefill, EngineError>> {
        let pinned = self.pin(&request, &prefix_pages);
        Box::pin(async move { pinned })
    }

    fn prompt_token_ids(&self, prompt: &Prompt) -> Result<Vec<u32>, EngineError> {
        self.tokens(prompt)
    }

    fn export_pages(
        &self,
        request_id: &str,
        first_page: usize,
        count: usize,
    ) -> BoxFuture<'static, Result<Vec<u8>, EngineError>> {
        let (inner, id) = (self.inner.clone(), request_id.to_owned());
        let stall = Duration::from_millis(self.faults.stall_export_ms.unwrap_or(0));
        Box::pin(async move {
            if !stall.is_zero() {
                tokio::time::sleep(stall).await;
            }
            let mut guard = lock(&inner);
            let inner = &mut *guard;
            let pinned = inner.pinned.get(&id).ok_or_else(|| EngineError::UnknownRequest(id.clone()))?;
            let pages = pages_for(pinned.ids.len());
            if first_page + count > pages {
                return Err(EngineError::invalid(
                    "pages",
                    format!("pages {first_page}..{} of a {pages}-page prompt", first_page + count),
                ));
            }
            let words = inner.cache.gather(&pinned.table, pinned.ids.len(), first_page..first_page + count);
            Ok(kv::to_bytes(&words))
        })
    }

    fn release_pinned(&self, request_id: &str) -> bool {
        let mut inner = lock(&self.inner);
        match inner.pinned.remove(request_id) {
            Some(p) => {
                inner.pinned_blocks -= p.table.len();
                inner.cache.release(p.table);
                true
            }
            None => false,
        }
    }

    fn import_len(&self, prompt_len: usize) -> usize {
        if self.recompute_last_token { prompt_len.saturating_sub(1) } else { prompt_len }
    }

    fn submit_imported(&self, request: GenerateRequest, kv: ImportedKv) -> Result<TokenStream, EngineError> {
        let run = self.admit(&request)?;
        let checked = self.import(&run, &kv);
        if let Err(e) = checked {
            lock(&self.inner).cache.release(run.table);
            return Err(e);
        }
        Ok(self.stream(run))
    }

    fn fetches_kv(&self) -> bool {
        self.faults.fetches_kv == Some(true)
    }

    fn submit_remote(&self, request: GenerateRequest, kv: RemoteKv) -> Result<TokenStream, EngineError> {
        if !self.fetches_kv() {
            return Err(EngineError::Internal("this mock engine is handed a handoff's pages".into()));
        }
        let this = self.clone();
        let need = pages_for(self.import_len(kv.prompt_ids.len())) as u32;
        let fetched = async move {
            let policy = xinf_transfer::transport::TransportPolicy::Tcp;
            let timeout = std::time::Duration::from_secs(10);
            let (pages, _) = xinf_transfer::transport::fetch(&kv.endpoint, kv.room, 0, need, policy, timeout)
                .await
                .map_err(|e| EngineError::Import(e.to_string()))?;
            let imported = ImportedKv {
                prompt_ids: kv.prompt_ids,
                first_token: kv.first_token,
                first_logprobs: None,
                pages: pages.into(),
            };
            this.submit_imported(request, imported)
        };
        Ok(Box::pin(futures::stream::once(fetched).flat_map(|started| match started {
            Ok(stream) => stream,
            Err(e) => Box::pin(futures::stream::iter([Err(e)])),
        })))
    }

    fn stats(&self) -> EngineStats {
        let inner = lock(&self.inner);
        EngineStats {
            running: inner.running.len(),
            queued: 0,
            used_blocks: inner.cache.used_blocks(),
            pinned_blocks: inner.pinned_blocks,
            total_blocks: inner.cache.total_blocks(),
            prompt_tokens: inner.prompt_tokens,
            // The mock engine keeps no prefix cache.
            cached_prompt_tokens: 0,
            generated_tokens: inner.generated_tokens,
        }
    }
}

impl MockEngine {
    /// How many text or chat prompts this engine has tokenized.
    pub fn texts_tokenized(&self) -> u64 {
        lock(&self.inner).texts_tokenized
    }

    /// Computes a prompt, or the rest of it after `prefix` (whole canonical pages of its first
    /// tokens, checked like an import), and pins its KV for export.
    fn pin(&self, request: &GenerateRequest, prefix: &[u8]) -> Result<PinnedPrefill, EngineError> {
        // The whole request's `max_tokens` must fit the context; one token is computed.
        self.fits_context(request)?;
        let mut one = request.clone();
        one.sampling.max_tokens = Some(1);
        let run = self.admit(&one)?;
        let page = self.contract.page_bytes();
        // At least the last prompt token is computed: the first output comes from it.
        let prefix_tokens = (prefix.len() / page * xinf_engine::PAGE_TOKENS).min(run.prompt.len() - 1);
        let mut inner = lock(&self.inner);
        if prefix_tokens > 0 {
            let pages = pages_for(prefix_tokens);
            inner.cache.scatter(&run.table, prefix_tokens, &mut kv::from_bytes(&prefix[..pages * page]));
            if inner.cache.gather(&run.table, prefix_tokens, 0..pages)
                != kv::computed_pages(&run.prompt[..prefix_tokens], 0..pages)
            {
                inner.cache.release(run.table);
                return Err(EngineError::Import("the prefix pages are not this prompt's".into()));
            }
        }
        inner.cache.compute(&run.table, &run.prompt);
        inner.prompt_tokens += (run.prompt.len() - prefix_tokens) as u64;
        inner.generated_tokens += 1;
        inner.pinned_blocks += run.table.len();
        let first_token = output_token(&run.prompt, 0);
        inner.pinned.insert(run.request_id.clone(), Pinned { table: run.table, ids: run.prompt.clone() });
        let first_text = request.sampling.stop.is_empty().then(|| token_text(first_token));
        let prompt = request.sampling.echo.then(|| report(&run.prompt));
        Ok(PinnedPrefill {
            request_id: run.request_id,
            prompt_ids: run.prompt,
            first_token,
            first_text,
            first_logprobs: request.sampling.logprobs.map(|_| certain(first_token)),
            prompt,
            remote: None,
        })
    }

    /// Writes imported pages into a run's blocks and checks them against the prompt's own KV:
    /// a page that moved wrong (or the wrong prompt's pages) is refused, naming the page.
    fn import(&self, run: &Run, kv: &ImportedKv) -> Result<(), EngineError> {
        if kv.prompt_ids != run.prompt {
            return Err(EngineError::Import("the imported KV is of another prompt".into()));
        }
        if kv.first_token != output_token(&run.prompt, 0) {
            return Err(EngineError::Import(format!("first token {} is not this prompt's", kv.first_token)));
        }
        let KvPages::Host(bytes) = &kv.pages else {
            return Err(EngineError::Import("the mock engine takes pages in host memory".into()));
        };
        let len = self.import_len(run.prompt.len());
        let pages = pages_for(len);
        let want = pages * self.contract.page_bytes();
        if bytes.len() != want {
            return Err(EngineError::Import(format!("{} bytes of pages, {want} expected", bytes.len())));
        }
        let mut inner = lock(&self.inner);
        inner.cache.scatter(&run.table, len, &mut kv::from_bytes(bytes));
        let got = inner.cache.gather(&run.table, len, 0..pages);
        let expected = kv::computed_pages(&run.prompt[..len], 0..pages);
        if let Some(at) = got.iter().zip(&expected).position(|(a, b)| a != b) {
            return Err(EngineError::Import(format!(
                "page {} differs from the prompt's KV",
                at / kv::SHAPE.page_elems()
            )));
        }
        // The tokens not imported (the last one, for an engine that recomputes it).
        inner.cache.compute(&run.table, &run.prompt);
        Ok(())
    }
}
