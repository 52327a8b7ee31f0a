//! An engine server behind xinf's [`Engine`] trait: xinf tokenizes (so the ids are the same
//! for every engine of a model), the server computes, and each request's stream is proxied.
//! The server's death ends the engine: [`Engine::exited`] resolves and the replica stops. So
//! does a server that hangs: one that answers no health check for `health_timeout_s` is killed
//! ([`crate::health`]).

use crate::Flavor;
use crate::process::ServerProcess;
use crate::stream::{self, Call, Counters};
use futures::future::BoxFuture;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;
use xinf_engine::{
    Engine, EngineError, EngineStats, FinishReason, GenerateRequest, ImportedKv, ModelContract,
    PinnedPrefill, Prompt, RemoteKv, TokenEvent, TokenStream, Usage,
};
use xinf_models::TextTokenizer;
use xinf_transfer::LayoutDescriptor;
use xinf_transfer::sync::lock;
use xinf_transfer::transport::Endpoint;

/// How long a stopping server gets between SIGTERM and SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(20);

/// A running request, for [`Engine::abort`].
struct Running {
    task: tokio::task::AbortHandle,
    /// Set by an abort: the request's stream ends with `Finished(abort)`, whatever the task
    /// still sent before it stopped.
    aborted: Arc<AtomicBool>,
    /// The id the server knows the request by ([`ServerEngine::attempt_id`]).
    upstream: String,
}

/// What a loaded server engine is made of.
pub(crate) struct Parts {
    pub(crate) flavor: Flavor,
    pub(crate) process: ServerProcess,
    /// How long the running server may answer no health check before it counts as hung.
    pub(crate) health_timeout: Duration,
    pub(crate) base_url: String,
    pub(crate) served_name: String,
    pub(crate) tokenizer: TextTokenizer,
    pub(crate) contract: ModelContract,
    pub(crate) layout: LayoutDescriptor,
    /// The server runs with xinf's KV connector.
    pub(crate) connector: bool,
    /// Where an SGLang prefill server's rooms are served (its transfer backend says at start).
    pub(crate) page_host: Option<crate::handoff::PageHost>,
}

/// vLLM or SGLang as an xinf engine.
pub struct ServerEngine {
    flavor: Flavor,
    process: Arc<ServerProcess>,
    health_timeout: Duration,
    base_url: String,
    served_name: String,
    client: reqwest::Client,
    /// Shared with the requests that report log-probabilities (a token's text).
    tokenizer: Arc<TextTokenizer>,
    contract: ModelContract,
    layout: LayoutDescriptor,
    running: Arc<Mutex<HashMap<String, Running>>>,
    counters: Arc<Counters>,
    idle_timeout: Duration,
    /// Whether the server runs with xinf's KV connector (a prefill or decode replica).
    connector: bool,
    /// Rooms the server published for prefills, by request id, until released.
    rooms: Arc<Mutex<HashMap<String, (Endpoint, u64)>>>,
    /// Where an SGLang prefill server's rooms are served.
    page_host: Option<crate::handoff::PageHost>,
    /// Requests sent to the server so far, which numbers each one's id there.
    attempts: AtomicU64,
}

impl ServerEngine {
    pub(crate) fn new(parts: Parts) -> Result<Self, EngineError> {
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .pool_idle_timeout(Duration::from_secs(60))
            .build()
            .map_err(|e| EngineError::Internal(format!("building the HTTP client: {e}")))?;
        Ok(Self {
            flavor: parts.flavor,
            process: Arc::new(parts.process),
            health_timeout: parts.health_timeout,
            base_url: parts.base_url,
            served_name: parts.served_name,
            client,
            tokenizer: Arc::new(parts.tokenizer),
            contract: parts.contract,
            layout: parts.layout,
            running: Arc::default(),
            counters: Arc::default(),
            idle_timeout: stream::IDLE_TIMEOUT,
            connector: parts.connector,
            rooms: Arc::default(),
            page_host: parts.page_host,
            attempts: AtomicU64::new(0),
        })
    }

    /// The id the server is given for one attempt at request `id`: xinf's id and a number no
    /// other request of this engine had. A client that drops a request and sends it again under
    /// its id is served by a new attempt at once; the server may still hold the first one's id
    /// for a moment after its abort (vLLM refuses an id it has running; xinf's connector keys its
    /// handoff state by it), and never sees it twice.
    fn attempt_id(&self, id: &str) -> String {
        format!("{id}.{}", self.attempts.fetch_add(1, Ordering::Relaxed))
    }

    /// The engine's server log (what it printed since it started).
    pub fn log_path(&self) -> &std::path::Path {
        self.process.log()
    }

    /// The address the server listens on (loopback).
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    fn prompt_ids(&self, prompt: &Prompt) -> Result<Vec<u32>, EngineError> {
        self.tokenizer.prompt_ids(prompt, self.contract.vocab_size)
    }

    /// Refuses what the server would refuse anyway, in xinf's words (the same as the native
    /// engine's), before a connection is made.
    fn check(&self, request: &GenerateRequest, prompt_len: usize) -> Result<usize, EngineError> {
        request.sampling.validate()?;
        request.sampling.check_bias_tokens(self.contract.vocab_size)?;
        if request.sampling.structured.is_some() && request.sampling.structured_after.is_some() {
            return Err(EngineError::invalid(
                "response_format",
                format!(
                    "a {} server holds the output to the shape from its first token, so a reasoning model \
                     could not think before it answers; turn thinking off for this request \
                     (chat_template_kwargs: {{\"enable_thinking\": false}}) or serve the model with the \
                     native engine, which applies the shape after the reasoning",
                    self.flavor
                ),
            ));
        }
        if let Some(schema) = request.sampling.structured.as_ref().and_then(|s| s.schema()) {
            // Sent as JSON (vLLM) or as text the engine parses (SGLang): parsed here so that both
            // refuse a broken schema alike, in xinf's words.
            serde_json::from_str::<serde_json::Value>(schema).map_err(|e| {
                EngineError::invalid("response_format", format!("the JSON Schema is not JSON: {e}"))
            })?;
        }
        let context = self.contract.context_length;
        let max_tokens = request.sampling.max_tokens.unwrap_or(context.saturating_sub(prompt_len));
        if prompt_len + max_tokens > context || max_tokens == 0 {
            return Err(EngineError::ContextLength {
                prompt_tokens: prompt_len,
                max_tokens,
                context_length: context,
            });
        }
        Ok(max_tokens)
    }

    /// Refuses prompt log-probabilities on a decode leg: it imports the prompt's KV, so it
    /// computes no logits for the prompt (the prefill leg reports them; the router never asks
    /// a decode leg). The output's log-probabilities pass (the prefill leg reports the first
    /// token's, which go on with it), and so does structured output: the prefill engine samples
    /// the first token under the grammar, an SGLang decode feeds that token to its own grammar,
    /// and a vLLM decode, never shown the first token when a grammar holds (see the actors'
    /// `shows_first`), samples it under its grammar itself.
    fn pd_leg(&self, request: &GenerateRequest) -> Result<(), EngineError> {
        if request.sampling.prompt_logprobs.is_some() {
            return Err(EngineError::invalid(
                "prompt_logprobs",
                format!(
                    "a {} decode replica imports the prompt's KV and computes no prompt log-probabilities \
                     (the prefill side reports them)",
                    self.flavor
                ),
            ));
        }
        Ok(())
    }

    fn not_pd(&self) -> EngineError {
        EngineError::invalid(
            "model_engine",
            format!(
                "this {} replica serves ordinary requests only: prefill/decode needs xinf's KV connector",
                self.flavor
            ),
        )
    }

    /// Starts a streamed generation of `ids`, with `handoff` (a handoff's fields, top-level
    /// keys of the server's request) added to the request.
    fn start(
        &self,
        request: GenerateRequest,
        ids: Vec<u32>,
        handoff: Option<serde_json::Value>,
    ) -> Result<TokenStream, EngineError> {
        if let Some(how) = self.process.exit_status() {
            return Err(self.process.death(&how));
        }
        let max_new = self.check(&request, ids.len())?;
        let id = request.request_id.clone();
        if lock(&self.running).contains_key(&id) {
            return Err(EngineError::DuplicateRequest(id));
        }
        let upstream = self.attempt_id(&id);
        let mut body = crate::protocol::generate_body(
            self.flavor,
            &self.served_name,
            &upstream,
            &ids,
            &request.sampling,
            max_new,
        );
        merge(&mut body, handoff);
        let emitted = Arc::new(AtomicUsize::new(0));
        let call = Call {
            flavor: self.flavor,
            client: self.client.clone(),
            url: format!("{}{}", self.base_url, crate::protocol::generate_path(self.flavor)),
            body,
            prompt_len: ids.len(),
            counters: self.counters.clone(),
            emitted: emitted.clone(),
            idle_timeout: self.idle_timeout,
            scoring: self.scoring(request.sampling.logprobs),
            prompt: request.sampling.reports_prompt().then(|| crate::stream::PromptCall {
                ids: ids.clone(),
                tokenizer: self.tokenizer.clone(),
                score: request.sampling.prompt_logprobs.map(|top| {
                    (top, crate::prompt::score_body(self.flavor, &self.served_name, &upstream, &ids, top))
                }),
            }),
        };
        let (tx, mut rx) = mpsc::channel(256);
        let prompt_len = ids.len();
        // Dropping the stream ends the task (and so the upstream request).
        let Listed { guard, aborted, .. } = self.spawn_listed(&id, upstream, stream::run(call, tx))?;
        let mut done = false;
        Ok(Box::pin(futures::stream::poll_fn(move |cx| {
            let _ = &guard;
            if done {
                return std::task::Poll::Ready(None);
            }
            if aborted.load(Ordering::Acquire) {
                done = true;
                let usage =
                    Usage { prompt_tokens: prompt_len, completion_tokens: emitted.load(Ordering::Relaxed) };
                return std::task::Poll::Ready(Some(Ok(TokenEvent::Finished {
                    reason: FinishReason::Abort,
                    usage,
                })));
            }
            let next = rx.poll_recv(cx);
            if let std::task::Poll::Ready(Some(Ok(TokenEvent::Finished { .. }) | Err(_))) = &next {
                done = true;
            }
            next
        })))
    }

    /// Runs `work`, a request's call to the server, as a task listed under `id` in the running
    /// table until it ends, so that [`Engine::abort`] finds it; dropping the guard ends it too.
    fn spawn_listed<T: Send + 'static>(
        &self,
        id: &str,
        upstream: String,
        work: impl std::future::Future<Output = T> + Send + 'static,
    ) -> Result<Listed<T>, EngineError> {
        let handle = tokio::runtime::Handle::try_current()
            .map_err(|_| EngineError::Internal("a server engine is driven from a tokio runtime".into()))?;
        let mut running = lock(&self.running);
        if running.contains_key(id) {
            return Err(EngineError::DuplicateRequest(id.to_owned()));
        }
        let (table, task_id) = (self.running.clone(), id.to_owned());
        // The task's own removal waits for this lock, so it never runs before the insert.
        let task = handle.spawn(async move {
            let out = work.await;
            lock(&table).remove(&task_id);
            out
        });
        let aborted = Arc::new(AtomicBool::new(false));
        running
            .insert(id.to_owned(), Running { task: task.abort_handle(), aborted: aborted.clone(), upstream });
        drop(running);
        let guard = AbortOnDrop { task: task.abort_handle(), table: self.running.clone(), id: id.to_owned() };
        Ok(Listed { task, guard, aborted })
    }

    /// How log-probabilities with `top` alternatives (where asked) are reported.
    fn scoring(&self, top: Option<usize>) -> Option<crate::stream::Scoring> {
        top.map(|top| crate::stream::Scoring { top, tokenizer: self.tokenizer.clone() })
    }

    /// Whether this replica takes part in handoffs (a server with xinf's connector: vLLM's KV
    /// connector, SGLang's transfer backend).
    fn handoffs(&self) -> bool {
        self.connector
    }

    /// The fields of a prefill leg that publishes its KV as `room`.
    fn prefill_fields(&self, room: u64) -> serde_json::Value {
        match self.flavor {
            Flavor::Vllm => serde_json::json!({ "kv_transfer_params": crate::handoff::prefill_params(room) }),
            Flavor::Sglang => crate::handoff::sglang_prefill_fields(room, &self.contract),
        }
    }
}

impl Engine for ServerEngine {
    fn contract(&self) -> &ModelContract {
        &self.contract
    }

    fn kv_layout(&self) -> &LayoutDescriptor {
        &self.layout
    }

    fn submit(&self, request: GenerateRequest) -> Result<TokenStream, EngineError> {
        let ids = self.prompt_ids(&request.prompt)?;
        self.start(request, ids, None)
    }

    fn abort(&self, request_id: &str) -> bool {
        let Some(r) = lock(&self.running).remove(request_id) else { return false };
        r.aborted.store(true, Ordering::Release);
        // The task's end drops its sender, which wakes the stream to report the abort.
        r.task.abort();
        if self.flavor == Flavor::Sglang {
            // Closing the connection aborts too; this frees the engine without waiting for it.
            let (client, url) = (self.client.clone(), format!("{}/abort_request", self.base_url));
            let rid = r.upstream;
            if let Ok(handle) = tokio::runtime::Handle::try_current() {
                handle.spawn(async move {
                    let call = client.post(url).json(&serde_json::json!({ "rid": rid })).send();
                    if let Ok(Err(e)) = tokio::time::timeout(Duration::from_secs(5), call).await {
                        tracing::debug!(error = %e, "SGLang's abort_request failed (the disconnect aborts anyway)");
                    }
                });
            }
        }
        true
    }

    fn prefill_pinned(
        &self,
        request: GenerateRequest,
    ) -> BoxFuture<'static, Result<PinnedPrefill, EngineError>> {
        let prepared = (|| {
            if !self.handoffs() {
                return Err(self.not_pd());
            }
            if let Some(how) = self.process.exit_status() {
                return Err(self.process.death(&how));
            }
            let ids = self.prompt_ids(&request.prompt)?;
            // The whole request's `max_tokens` must fit the context; the engine computes one.
            self.check(&request, ids.len())?;
            let echo = request.sampling.echo.then(|| crate::prompt::report(&ids, &self.tokenizer, None));
            let mut one = request.clone();
            one.sampling.max_tokens = Some(1);
            let max_new = self.check(&one, ids.len())?;
            let room = (rand::random::<u64>() >> 1).max(1);
            let upstream = self.attempt_id(&request.request_id);
            let mut body = crate::protocol::generate_body(
                self.flavor,
                &self.served_name,
                &upstream,
                &ids,
                &one.sampling,
                max_new,
            );
            body["stream"] = serde_json::json!(false);
            if let Some(o) = body.as_object_mut() {
                o.remove("stream_options");
            }
            if let Some(top) = request.sampling.prompt_logprobs {
                crate::prompt::ask_scores(self.flavor, &mut body, top);
            }
            merge(&mut body, Some(self.prefill_fields(room)));
            Ok((ids, room, body, echo, upstream))
        })();
        let (ids, room, body, echo, upstream) = match prepared {
            Ok(p) => p,
            Err(e) => return Box::pin(async move { Err(e) }),
        };
        let leg = crate::prefill::PrefillLeg {
            flavor: self.flavor,
            client: self.client.clone(),
            url: format!("{}{}", self.base_url, crate::protocol::generate_path(self.flavor)),
            rooms: self.rooms.clone(),
            counters: self.counters.clone(),
            host: self.page_host.clone(),
            request_id: request.request_id.clone(),
            stops: !request.sampling.stop.is_empty(),
            scoring: self.scoring(request.sampling.logprobs),
            prompt_scoring: self.scoring(request.sampling.prompt_logprobs),
        };
        // The leg runs as a task of its own, listed with the running requests: an abort finds
        // it there and ends it, and closing its connection makes the server drop the request.
        let Listed { task, guard, .. } =
            match self.spawn_listed(&request.request_id, upstream, leg.run(ids, room, body)) {
                Ok(listed) => listed,
                Err(e) => return Box::pin(async move { Err(e) }),
            };
        Box::pin(async move {
            let _guard = guard;
            match task.await {
                Ok(result) => result.map(|pinned| PinnedPrefill { prompt: pinned.prompt.or(echo), ..pinned }),
                Err(e) if e.is_cancelled() => Err(EngineError::Aborted),
                Err(e) => Err(EngineError::Internal(format!("the prefill task failed: {e}"))),
            }
        })
    }

    fn prompt_token_ids(&self, prompt: &Prompt) -> Result<Vec<u32>, EngineError> {
        self.prompt_ids(prompt)
    }

    fn export_pages(&self, _: &str, _: usize, _: usize) -> BoxFuture<'static, Result<Vec<u8>, EngineError>> {
        let e = self.not_pd();
        Box::pin(async move { Err(e) })
    }

    fn release_pinned(&self, request_id: &str) -> bool {
        let Some((endpoint, room)) = lock(&self.rooms).remove(request_id) else { return false };
        crate::handoff::release(endpoint, room);
        true
    }

    fn import_len(&self, prompt_len: usize) -> usize {
        match self.flavor {
            // vLLM recomputes the last prompt token to sample the first output from it.
            Flavor::Vllm => prompt_len.saturating_sub(1),
            Flavor::Sglang => prompt_len,
        }
    }

    fn fetches_kv(&self) -> bool {
        self.handoffs()
    }

    fn submit_remote(&self, request: GenerateRequest, kv: RemoteKv) -> Result<TokenStream, EngineError> {
        if !self.handoffs() {
            return Err(self.not_pd());
        }
        self.pd_leg(&request)?;
        // vLLM recomputes the last prompt token and samples the first output from it. When the
        // prefill's first token was shown already, it is given as the prompt's last token
        // instead (the room holds the KV of every token before it), so that the output goes on
        // from what was shown. Never under a grammar, which would then start after that token:
        // vLLM samples the first token under it itself (the router shows none early then).
        if let Some(text) = &kv.first_text
            && self.flavor == Flavor::Vllm
            && request.sampling.max_tokens != Some(1)
            && request.sampling.structured.is_none()
        {
            let (first, text, logprobs) = (kv.first_token, text.clone(), kv.first_logprobs.clone());
            let fields = serde_json::json!({ "kv_transfer_params": crate::handoff::fetch_params(&kv) });
            let mut request = request;
            request.sampling.max_tokens = request.sampling.max_tokens.map(|m| m.saturating_sub(1));
            let mut ids = kv.prompt_ids;
            ids.push(first);
            return Ok(crate::lead::lead_first(
                self.start(request, ids, Some(fields))?,
                first,
                text,
                logprobs,
            ));
        }
        let fields = match self.flavor {
            Flavor::Vllm if kv.prompt_ids.len() < 2 => {
                return Err(EngineError::invalid(
                    "prompt",
                    "a vLLM decode replica needs a prompt of at least 2 tokens: it imports all but the last \
                     prompt token's KV and recomputes the last",
                ));
            }
            Flavor::Vllm => serde_json::json!({ "kv_transfer_params": crate::handoff::fetch_params(&kv) }),
            Flavor::Sglang if request.sampling.logprobs.is_some() && kv.first_logprobs.is_none() => {
                // SGLang's decode would report the first token's from a zeroed metadata row.
                return Err(EngineError::Internal(
                    "the prefill side reported no log-probabilities for the first token, which an SGLang \
                     decode reports from the handoff"
                        .into(),
                ));
            }
            Flavor::Sglang => crate::handoff::sglang_fetch_fields(&kv, &self.contract),
        };
        self.start(request, kv.prompt_ids, Some(fields))
    }

    fn submit_imported(
        &self,
        _request: GenerateRequest,
        _kv: ImportedKv,
    ) -> Result<TokenStream, EngineError> {
        Err(self.not_pd())
    }

    fn stats(&self) -> EngineStats {
        EngineStats {
            running: lock(&self.running).len(),
            // The rooms this prefill server holds for decode sides, until they are released
            // (the server's blocks were freed when the room was staged).
            pinned_blocks: lock(&self.rooms).len(),
            prompt_tokens: self.counters.prompt_tokens.load(Ordering::Relaxed),
            generated_tokens: self.counters.generated_tokens.load(Ordering::Relaxed),
            ..EngineStats::default()
        }
    }

    fn exited(&self) -> BoxFuture<'static, EngineError> {
        let died = self.process.exited();
        let url = format!("{}/health", self.base_url);
        let hung = crate::health::unresponsive(self.client.clone(), url, self.health_timeout);
        let process = self.process.clone();
        Box::pin(async move {
            tokio::select! {
                e = died => e,
                why = hung => {
                    if process.stopping() {
                        // Stopped on purpose (the replica ends): no death to report.
                        return std::future::pending().await;
                    }
                    process.kill();
                    process.hung(&why)
                }
            }
        })
    }

    fn shutdown(&self) {
        for (_, r) in lock(&self.running).drain() {
            r.task.abort();
        }
        self.process.stop(STOP_GRACE);
    }
}

/// Adds `fields` (an object) to the top level of a request body.
fn merge(body: &mut serde_json::Value, fields: Option<serde_json::Value>) {
    if let (Some(o), Some(serde_json::Value::Object(fields))) = (body.as_object_mut(), fields) {
        o.extend(fields);
    }
}

/// A request's task in the running table ([`ServerEngine::spawn_listed`]).
struct Listed<T> {
    task: tokio::task::JoinHandle<T>,
    /// Ends the task when dropped (the caller went away).
    guard: AbortOnDrop,
    /// Set by an abort.
    aborted: Arc<AtomicBool>,
}

/// Ends a request's task when its stream is dropped.
struct AbortOnDrop {
    task: tokio::task::AbortHandle,
    table: Arc<Mutex<HashMap<String, Running>>>,
    id: String,
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        if !self.task.is_finished() {
            self.task.abort();
            lock(&self.table).remove(&self.id);
        }
    }
}
