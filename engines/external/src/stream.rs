//! One proxied request: a task that posts it to the engine server and turns the streamed answer
//! into xinf's token events. Dropping the events' stream (the client went away) or aborting
//! ends the task, which drops the HTTP response: the engine sees its client disconnect and
//! aborts the request itself.

use crate::Flavor;
use crate::protocol::{self, Chunk, Scored};
use crate::sse::SseDecoder;
use futures::StreamExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;
use tokio::sync::mpsc;
use xinf_engine::{EngineError, FinishReason, Logprob, TokenEvent, TokenLogprobs, Usage};
use xinf_models::TextTokenizer;

/// How long the server may take to answer with headers (it answers as soon as it queued the
/// request).
const HEADERS_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a stream may go without a chunk before the request is failed: a long queue or a
/// long prompt delays the first token, a stuck engine delays it for ever.
pub(crate) const IDLE_TIMEOUT: Duration = Duration::from_secs(600);
/// The most of an error body that is read.
const MAX_ERROR_BODY: usize = 64 << 10;

/// Token counters shared by all requests of an engine.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) prompt_tokens: AtomicU64,
    pub(crate) generated_tokens: AtomicU64,
}

/// One request to run.
pub(crate) struct Call {
    pub(crate) flavor: Flavor,
    pub(crate) client: reqwest::Client,
    pub(crate) url: String,
    pub(crate) body: serde_json::Value,
    pub(crate) prompt_len: usize,
    pub(crate) counters: Arc<Counters>,
    /// Tokens sent so far (read by an abort, for its usage).
    pub(crate) emitted: Arc<AtomicUsize>,
    pub(crate) idle_timeout: Duration,
    /// When the request asked for log-probabilities: how many alternatives, and the tokenizer
    /// that gives each token its text.
    pub(crate) scoring: Option<Scoring>,
    /// When the request asked for its prompt's report ([`crate::prompt`]).
    pub(crate) prompt: Option<PromptCall>,
}

/// What a request asked to be told of its prompt.
pub(crate) struct PromptCall {
    pub(crate) ids: Vec<u32>,
    pub(crate) tokenizer: Arc<TextTokenizer>,
    /// With prompt log-probabilities: how many alternatives, and the body of the call that
    /// scores the prompt.
    pub(crate) score: Option<(usize, serde_json::Value)>,
}

/// How a request's log-probabilities are reported.
pub(crate) struct Scoring {
    pub(crate) top: usize,
    pub(crate) tokenizer: Arc<TextTokenizer>,
}

impl Scoring {
    /// Token `token_id`'s log-probabilities as xinf reports them: the engine's alternatives
    /// cut to the count asked for (vLLM adds the sampled token when it is not among them).
    /// The report of prompt `ids` with the log-probabilities an answer `v` of the server
    /// gives them (a scoring call's, or a prefill leg's that asked for them).
    pub(crate) fn prompt_report(
        &self,
        flavor: Flavor,
        v: &serde_json::Value,
        ids: &[u32],
    ) -> Result<Box<xinf_engine::PromptReport>, EngineError> {
        let scores = crate::prompt::parse_scores(flavor, v, ids)?;
        let rest = ids.iter().skip(1).zip(&scores).map(|(&id, s)| *self.of(id, s)).collect();
        Ok(crate::prompt::report(ids, &self.tokenizer, Some(rest)))
    }

    pub(crate) fn of(&self, token_id: u32, scored: &Scored) -> Box<TokenLogprobs> {
        let entry = |id: u32, logprob: f32| Logprob {
            token_id: id,
            token: self.tokenizer.decode(&[id], false).unwrap_or_default(),
            logprob,
        };
        Box::new(TokenLogprobs {
            chosen: entry(token_id, scored.logprob),
            top: scored.top.iter().take(self.top).map(|&(id, lp)| entry(id, lp)).collect(),
            rank: scored.rank,
        })
    }
}

type Tx = mpsc::Sender<Result<TokenEvent, EngineError>>;

/// Runs the request, sending its events; the last is `Finished` or an error.
pub(crate) async fn run(mut call: Call, tx: Tx) {
    if let Some(prompt) = call.prompt.take() {
        let event = prompt_report(&call, prompt).await.map(TokenEvent::Prompt);
        let failed = event.is_err();
        if tx.send(event).await.is_err() || failed {
            return;
        }
    }
    let prompt_len = call.prompt_len;
    let counters = call.counters.clone();
    let emitted = call.emitted.clone();
    match drive(call, &tx).await {
        Ok((reason, usage)) => {
            counters.prompt_tokens.fetch_add(prompt_len as u64, Ordering::Relaxed);
            counters.generated_tokens.fetch_add(usage.completion_tokens as u64, Ordering::Relaxed);
            let _ = tx.send(Ok(TokenEvent::Finished { reason, usage })).await;
        }
        Err(e) => {
            counters.generated_tokens.fetch_add(emitted.load(Ordering::Relaxed) as u64, Ordering::Relaxed);
            let _ = tx.send(Err(e)).await;
        }
    }
}

/// The prompt's report: its decoding, and its log-probabilities from a call of their own
/// where asked for.
async fn prompt_report(call: &Call, p: PromptCall) -> Result<Box<xinf_engine::PromptReport>, EngineError> {
    let Some((top, body)) = p.score else { return Ok(crate::prompt::report(&p.ids, &p.tokenizer, None)) };
    let flavor = call.flavor;
    let send = call.client.post(&call.url).json(&body).send();
    let response = tokio::time::timeout(call.idle_timeout, send)
        .await
        .map_err(|_| EngineError::Process(format!("the {flavor} server did not score the prompt in time")))?
        .map_err(|e| EngineError::Process(format!("the {flavor} server could not be reached: {e}")))?;
    let status = response.status();
    if !status.is_success() {
        return Err(refusal(flavor, status, response).await);
    }
    // Each position lists the prompt's token and `top` others, a few dozen bytes each.
    let limit = (p.ids.len() * (top + 2)).saturating_mul(256).saturating_add(1 << 20);
    let v = tokio::time::timeout(call.idle_timeout, json_body(flavor, response, limit, "prompt scores"))
        .await
        .map_err(|_| {
            EngineError::Process(format!("the {flavor} server did not send the prompt scores in time"))
        })??;
    Scoring { top, tokenizer: p.tokenizer.clone() }.prompt_report(flavor, &v, &p.ids)
}

/// Posts the request and forwards its tokens; returns how it finished.
async fn drive(call: Call, tx: &Tx) -> Result<(FinishReason, Usage), EngineError> {
    // Timings at debug level (`XINF_LOG=xinf_engine_external=debug`): where a request's time to
    // its first token goes, the server's answer or its first token.
    let started = std::time::Instant::now();
    let rid = call.body.get("rid").or_else(|| call.body.get("request_id")).cloned().unwrap_or_default();
    let send = call.client.post(&call.url).json(&call.body).send();
    let response = tokio::time::timeout(HEADERS_TIMEOUT, send)
        .await
        .map_err(|_| {
            EngineError::Process(format!(
                "the {} server did not answer within {HEADERS_TIMEOUT:?}",
                call.flavor
            ))
        })?
        .map_err(|e| EngineError::Process(format!("the {} server could not be reached: {e}", call.flavor)))?;
    let status = response.status();
    tracing::debug!(flavor = %call.flavor, %rid, ms = started.elapsed().as_secs_f64() * 1e3, "the server answered");
    if !status.is_success() {
        return Err(refusal(call.flavor, status, response).await);
    }
    let mut body = response.bytes_stream();
    let mut first = true;
    let mut sse = SseDecoder::default();
    let mut state = Progress::default();
    loop {
        let next = tokio::time::timeout(call.idle_timeout, body.next()).await.map_err(|_| {
            EngineError::Process(format!(
                "the {} server sent nothing for {} s; the request was given up",
                call.flavor,
                call.idle_timeout.as_secs()
            ))
        })?;
        let ended = next.is_none();
        let payloads = match next {
            Some(Ok(bytes)) => sse.push(&bytes)?,
            Some(Err(e)) => {
                return Err(EngineError::Process(format!("the {} server's stream broke: {e}", call.flavor)));
            }
            None => sse.finish().into_iter().collect(),
        };
        for data in payloads {
            if let Some(chunk) = protocol::parse_chunk(call.flavor, &data)? {
                state.apply(chunk, tx, &call.emitted, call.scoring.as_ref()).await?;
            }
        }
        if first && call.emitted.load(Ordering::Relaxed) > 0 {
            first = false;
            let ms = started.elapsed().as_secs_f64() * 1e3;
            tracing::debug!(flavor = %call.flavor, %rid, ms, prompt_len = call.prompt_len, "first token from the server");
        }
        if ended {
            break;
        }
    }
    match state.finish {
        Some(reason) => {
            let generated = call.emitted.load(Ordering::Relaxed);
            let usage =
                state.usage.unwrap_or(Usage { prompt_tokens: call.prompt_len, completion_tokens: generated });
            Ok((reason, usage))
        }
        None => Err(EngineError::Process(format!(
            "the {} server ended the stream before the request finished",
            call.flavor
        ))),
    }
}

/// What the chunks said so far.
#[derive(Default)]
struct Progress {
    finish: Option<FinishReason>,
    usage: Option<Usage>,
    /// Text that came without a token id, sent with the next one.
    pending_text: String,
}

impl Progress {
    /// Forwards a chunk's tokens (one event per token id, the chunk's text with the last).
    async fn apply(
        &mut self,
        chunk: Chunk,
        tx: &Tx,
        emitted: &AtomicUsize,
        scoring: Option<&Scoring>,
    ) -> Result<(), EngineError> {
        self.pending_text.push_str(&chunk.text);
        let n = chunk.token_ids.len();
        for (i, token_id) in chunk.token_ids.into_iter().enumerate() {
            let text = if i + 1 == n { std::mem::take(&mut self.pending_text) } else { String::new() };
            emitted.fetch_add(1, Ordering::Relaxed);
            let logprobs = scoring.zip(chunk.logprobs.get(i)).map(|(s, scored)| s.of(token_id, scored));
            if tx.send(Ok(TokenEvent::Delta { token_id, text, logprobs })).await.is_err() {
                // Nobody reads any more: stop, which drops the response and aborts upstream.
                return Err(EngineError::Aborted);
            }
        }
        if chunk.finish.is_some() {
            self.finish = chunk.finish;
        }
        if chunk.usage.is_some() {
            self.usage = chunk.usage;
        }
        Ok(())
    }
}

/// A whole JSON answer of at most `limit` bytes: a server that sends more, or something that
/// is not JSON, fails the request instead of filling memory.
pub(crate) async fn json_body(
    flavor: Flavor,
    response: reqwest::Response,
    limit: usize,
    what: &str,
) -> Result<serde_json::Value, EngineError> {
    let mut body = Vec::new();
    let mut stream = response.bytes_stream();
    while let Some(bytes) = stream.next().await {
        let bytes = bytes.map_err(|e| EngineError::Process(format!("the {flavor} server's {what}: {e}")))?;
        if body.len() + bytes.len() > limit {
            return Err(EngineError::Process(format!("the {flavor} server's {what} is over {limit} bytes")));
        }
        body.extend_from_slice(&bytes);
    }
    serde_json::from_slice(&body)
        .map_err(|e| EngineError::Process(format!("the {flavor} server's {what}: {e}")))
}

/// The error of a non-success answer: the engine's own message, as a refusal of the request
/// for a 4xx status; for 503, a server that cannot take it now (unavailable: try later); for
/// any other 5xx, a server up and answering that failed on this request (an internal error, as
/// a failed stream's error chunk is: sending it again would fail again).
pub(crate) async fn refusal(
    flavor: Flavor,
    status: reqwest::StatusCode,
    response: reqwest::Response,
) -> EngineError {
    let mut body = Vec::new();
    let mut stream = response.bytes_stream();
    while let Ok(Some(Ok(bytes))) = tokio::time::timeout(Duration::from_secs(5), stream.next()).await {
        body.extend_from_slice(&bytes);
        if body.len() >= MAX_ERROR_BODY {
            body.truncate(MAX_ERROR_BODY);
            break;
        }
    }
    let text = String::from_utf8_lossy(&body).into_owned();
    let message = serde_json::from_str(&text).ok().and_then(|v| protocol::error_message(&v)).unwrap_or(text);
    if status.is_client_error() {
        EngineError::Rejected(message)
    } else if status == reqwest::StatusCode::SERVICE_UNAVAILABLE || !status.is_server_error() {
        EngineError::Process(format!("the {flavor} server answered {status}: {message}"))
    } else {
        EngineError::Internal(format!("the {flavor} server failed on the request ({status}): {message}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// The answer of a one-shot HTTP server on a real socket that sends `body`.
    async fn answer(body: &'static str) -> reqwest::Response {
        answer_with("200 OK", body).await
    }

    /// The same with the status line's `status`.
    async fn answer_with(status: &'static str, body: &'static str) -> reqwest::Response {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("address");
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.expect("accept");
            let mut request = [0u8; 1024];
            let _ = socket.read(&mut request).await;
            let head =
                format!("HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len());
            socket.write_all(head.as_bytes()).await.expect("head");
            socket.write_all(body.as_bytes()).await.expect("body");
        });
        reqwest::get(format!("http://{addr}/")).await.expect("answer")
    }

    #[test]
    fn a_whole_answer_is_read_within_its_bound() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        rt.block_on(async {
            let v = json_body(Flavor::Vllm, answer(r#"{"a": [1, 2]}"#).await, 64, "answer").await;
            assert_eq!(v.expect("read"), serde_json::json!({"a": [1, 2]}));
            let over = json_body(Flavor::Vllm, answer(r#"{"a": "0123456789"}"#).await, 8, "answer").await;
            assert!(over.expect_err("refused").to_string().contains("over 8 bytes"));
            let broken = json_body(Flavor::Sglang, answer("{\"a\":").await, 64, "answer").await;
            assert!(broken.expect_err("refused").to_string().contains("sglang server's answer"));
        });
    }

    #[test]
    fn a_refusal_is_the_request_a_failure_is_the_server_or_the_request() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        rt.block_on(async {
            let error = r#"{"error": {"message": "bad regex", "code": 400}}"#;
            let e = answer_with("400 Bad Request", error).await;
            let e = refusal(Flavor::Vllm, e.status(), e).await;
            assert!(matches!(&e, EngineError::Rejected(m) if m == "bad regex"), "{e:?}");
            let crash = r#"{"error": {"message": "No module named 'x'", "code": 500}}"#;
            let e = answer_with("500 Internal Server Error", crash).await;
            let e = refusal(Flavor::Vllm, e.status(), e).await;
            assert_eq!(e.class(), xinf_engine::ErrorClass::Internal, "{e:?}");
            assert!(e.to_string().contains("vllm server failed on the request (500 Internal Server Error)"));
            assert!(e.to_string().contains("No module named 'x'"));
            let busy = answer_with("503 Service Unavailable", "overloaded").await;
            let e = refusal(Flavor::Sglang, busy.status(), busy).await;
            assert_eq!(e.class(), xinf_engine::ErrorClass::Unavailable, "{e:?}");
        });
    }
}
