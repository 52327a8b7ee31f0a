//! Token streams as OpenAI server-sent events, and collected into one response.
//!
//! The event stream owns the engine's [`TokenStream`]: when the client goes away, actix drops
//! the response body, which drops the token stream, which aborts the request in the engine.
//!
//! Events: `data: {chunk}\n\n` for every chunk, then `data: [DONE]\n\n`. A chunk carries one
//! choice, named by its `index` (several with `n` > 1 or several prompts, their chunks
//! interleaved as the tokens come; choice `k·n + i` is prompt `k`'s choice `i`). Chat streams
//! start with a chunk per choice whose delta is `{"role": "assistant", "content": ""}`. Empty text deltas (a multi-byte character or a
//! possible stop string still pending) are not sent, unless they carry a token's
//! log-probabilities (the request asked for them: one token per chunk). The last chunk of each
//! choice carries its `finish_reason`; a model whose answers show its reasoning apart sends it
//! as `delta.reasoning_content` (see the `reasoning` module); with `stream_options.include_usage` a chunk with
//! `choices: []` and the token counts of all choices follows the last. An error after the stream
//! started is sent as `data: {"error": {...}}` followed by `data: [DONE]`.

use crate::api::choices::{self, ChoiceStream, Registered};
use crate::api::echo::PromptShown;
use crate::api::error::Problem;
use crate::api::logprobs::{self, ChatLogprobs, TextLogprobs};
use crate::api::openai::{ChatChunk, ChunkChoice, Completion, Delta, TextChoice, UsageOut};
use crate::api::reasoning::ReasoningStream;
use crate::api::tools::{ToolStream, Tools};
use actix_web::HttpResponse;
use actix_web::http::header;
use actix_web::web::Bytes;
use futures::{Stream, StreamExt};
use serde::Serialize;
use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use xinf_engine::{EngineError, FinishReason, PromptReport, TokenEvent, TokenLogprobs, TokenStream, Usage};
use xinf_models::ReasoningMarks;

/// Which OpenAI API a stream answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flavor {
    /// `chat.completion.chunk` events with deltas.
    Chat,
    /// `text_completion` events with text.
    Completion,
}

/// What every chunk of one response repeats.
#[derive(Debug, Clone)]
pub(crate) struct ResponseMeta {
    pub(crate) id: String,
    pub(crate) model: String,
    pub(crate) created: u64,
}

/// The OpenAI name of a finish reason. An aborted request reports `"abort"`, as vLLM does.
pub(crate) fn finish_name(reason: FinishReason) -> &'static str {
    reason.as_str()
}

enum Phase {
    /// The role chunk of this choice next (chat).
    Role(usize),
    Tokens,
    Usage,
    Done,
    End,
}

struct EventState {
    tokens: ChoiceStream,
    flavor: Flavor,
    meta: ResponseMeta,
    include_usage: bool,
    lang: &'static str,
    phase: Phase,
    /// Per choice, the characters of completion text its tokens account for (`text_offset`).
    offsets: Vec<usize>,
    /// Choices not finished yet.
    open: usize,
    /// Choices per prompt: choices `k·per_prompt .. (k+1)·per_prompt` share prompt `k`.
    per_prompt: usize,
    /// Token counts of the finished choices: each prompt once, the outputs summed.
    usage: Usage,
    /// Keeps a multi-choice request where the abort route finds it while it streams.
    _fanout: Option<Registered>,
    /// Per choice, the reader of its calls when the request offered tools.
    tools: Vec<ToolStream>,
    /// The request's tools, which name each choice's finish.
    tool_finish: Option<Arc<Tools>>,
    /// Per choice, the reader of its reasoning when the model's answers show it apart.
    reasoning: Vec<ReasoningStream>,
    /// Events made and not sent yet (a choice's last text or calls before its finish).
    queued: VecDeque<Bytes>,
    /// What the stream shows of the prompt (`echo`).
    shown: PromptShown,
}

fn event<T: Serialize>(value: &T) -> Bytes {
    match serde_json::to_string(value) {
        Ok(json) => Bytes::from(format!("data: {json}\n\n")),
        // Serializing these plain structs cannot fail; never break the stream over it.
        Err(e) => Bytes::from(format!("data: {{\"error\": {{\"message\": \"{e}\"}}}}\n\n")),
    }
}

impl EventState {
    fn chat_chunk(
        &self,
        index: usize,
        delta: Delta,
        logprobs: Option<ChatLogprobs>,
        finish: Option<&'static str>,
    ) -> Bytes {
        event(&ChatChunk {
            id: self.meta.id.clone(),
            object: "chat.completion.chunk",
            created: self.meta.created,
            model: self.meta.model.clone(),
            choices: vec![ChunkChoice { index: index as u32, delta, logprobs, finish_reason: finish }],
            usage: None,
        })
    }

    fn text_chunk(
        &self,
        index: usize,
        text: String,
        logprobs: Option<TextLogprobs>,
        finish: Option<&'static str>,
    ) -> Bytes {
        event(&Completion {
            id: self.meta.id.clone(),
            object: "text_completion",
            created: self.meta.created,
            model: self.meta.model.clone(),
            choices: vec![TextChoice {
                index: index as u32,
                text,
                logprobs,
                finish_reason: finish,
                prompt_logprobs: None,
            }],
            usage: None,
        })
    }

    /// A chunk of choice `index`'s `text`, with one token's log-probabilities when it has them;
    /// `None` when there is nothing to send (a call's text held back, no log-probabilities).
    fn content(
        &mut self,
        index: usize,
        text: String,
        token: Option<&TokenLogprobs>,
        finish: Option<&'static str>,
    ) -> Option<Bytes> {
        match self.flavor {
            Flavor::Chat => {
                let (reasoning, text) = match self.reasoning.get_mut(index) {
                    Some(reader) => {
                        let split = reader.push(&text);
                        (split.reasoning, split.content)
                    }
                    None => (String::new(), text),
                };
                let mut delta = match self.tools.get_mut(index) {
                    Some(reader) if !text.is_empty() => reader.push(&text),
                    Some(_) => Delta::default(),
                    None => Delta { content: (!text.is_empty()).then_some(text), ..Delta::default() },
                };
                delta.reasoning_content = (!reasoning.is_empty()).then_some(reasoning);
                let logprobs = token.map(|t| {
                    let mut l = ChatLogprobs::default();
                    l.push(t);
                    l
                });
                let empty = delta.content.is_none()
                    && delta.tool_calls.is_none()
                    && delta.reasoning_content.is_none();
                if empty && logprobs.is_none() && finish.is_none() {
                    return None;
                }
                Some(self.chat_chunk(index, delta, logprobs, finish))
            }
            Flavor::Completion => {
                let logprobs = token.map(|t| {
                    let mut l = TextLogprobs::default();
                    let offset = self.offsets.get(index).copied().unwrap_or_default();
                    l.push(t, offset);
                    if let Some(o) = self.offsets.get_mut(index) {
                        *o += logprobs::width(t);
                    }
                    l
                });
                Some(self.text_chunk(index, text, logprobs, finish))
            }
        }
    }

    /// The echo of choice `index`'s prompt (completions' `echo`): its text, and its tokens'
    /// log-probabilities when asked for; `None` when the request did not ask for an echo.
    fn echo(&mut self, index: usize, report: &PromptReport) -> Option<Bytes> {
        if self.flavor != Flavor::Completion {
            return None;
        }
        let text = self.shown.text(index, self.per_prompt, Some(report))?;
        let logprobs = self.shown.text_logprobs(Some(report)).map(|(l, width)| {
            if let Some(o) = self.offsets.get_mut(index) {
                *o = width;
            }
            l
        });
        Some(self.text_chunk(index, text, logprobs, None))
    }

    /// The finish chunk of choice `index`, after its held text or calls where the request
    /// offered tools (queued to follow).
    fn finish(&mut self, index: usize, reason: FinishReason) -> Option<Bytes> {
        // An unclosed reasoning's last characters, held back in case they began its mark.
        let reasoning = self.reasoning.get_mut(index).map(|r| r.finish().reasoning).unwrap_or_default();
        if !reasoning.is_empty() {
            let delta = Delta { reasoning_content: Some(reasoning), ..Delta::default() };
            let chunk = self.chat_chunk(index, delta, None, None);
            self.queued.push_back(chunk);
        }
        let Some(reader) = self.tools.get_mut(index) else {
            let last = self.content(index, String::new(), None, Some(finish_name(reason)));
            self.queued.extend(last);
            return self.queued.pop_front();
        };
        let rest = reader.finish();
        let name =
            self.tool_finish.as_ref().map_or(finish_name(reason), |t| t.finish_name(reason, reader.called()));
        if rest.content.is_some() || rest.tool_calls.is_some() {
            let chunk = self.chat_chunk(index, rest, None, None);
            self.queued.push_back(chunk);
        }
        let last = self.chat_chunk(index, Delta::default(), None, Some(name));
        self.queued.push_back(last);
        self.queued.pop_front()
    }

    fn usage_chunk(&self, usage: Usage) -> Bytes {
        let usage = Some(UsageOut::from(usage));
        match self.flavor {
            Flavor::Chat => event(&ChatChunk {
                id: self.meta.id.clone(),
                object: "chat.completion.chunk",
                created: self.meta.created,
                model: self.meta.model.clone(),
                choices: Vec::new(),
                usage,
            }),
            Flavor::Completion => event(&Completion {
                id: self.meta.id.clone(),
                object: "text_completion",
                created: self.meta.created,
                model: self.meta.model.clone(),
                choices: Vec::new(),
                usage,
            }),
        }
    }

    fn error(&self, e: EngineError) -> Bytes {
        tracing::warn!(target: "xinf::api", request_id = %self.meta.id, "request failed mid-stream: {e}");
        event(&Problem::from(e).body(self.lang))
    }

    /// The next event, or `None` after `[DONE]`.
    async fn next_event(&mut self) -> Option<Bytes> {
        loop {
            if let Some(queued) = self.queued.pop_front() {
                return Some(queued);
            }
            match std::mem::replace(&mut self.phase, Phase::End) {
                Phase::Role(index) => {
                    self.phase =
                        if index + 1 < self.offsets.len() { Phase::Role(index + 1) } else { Phase::Tokens };
                    if self.flavor == Flavor::Chat {
                        let delta = Delta {
                            role: Some("assistant"),
                            content: Some(String::new()),
                            ..Delta::default()
                        };
                        return Some(self.chat_chunk(index, delta, None, None));
                    }
                }
                Phase::Tokens => match self.tokens.next().await {
                    Some((index, Ok(TokenEvent::Prompt(report)))) => {
                        self.phase = Phase::Tokens;
                        if let Some(chunk) = self.echo(index, &report) {
                            return Some(chunk);
                        }
                    }
                    Some((index, Ok(TokenEvent::Delta { text, logprobs, .. }))) => {
                        self.phase = Phase::Tokens;
                        if (!text.is_empty() || logprobs.is_some())
                            && let Some(chunk) = self.content(index, text, logprobs.as_deref(), None)
                        {
                            return Some(chunk);
                        }
                    }
                    Some((index, Ok(TokenEvent::Finished { reason, usage }))) => {
                        self.open = self.open.saturating_sub(1);
                        if index % self.per_prompt == 0 {
                            self.usage.prompt_tokens += usage.prompt_tokens;
                        }
                        self.usage.completion_tokens += usage.completion_tokens;
                        self.phase = match (self.open, self.include_usage) {
                            (0, true) => Phase::Usage,
                            (0, false) => Phase::Done,
                            _ => Phase::Tokens,
                        };
                        if let Some(chunk) = self.finish(index, reason) {
                            return Some(chunk);
                        }
                    }
                    Some((_, Err(e))) => {
                        self.phase = Phase::Done;
                        return Some(self.error(e));
                    }
                    None => {
                        self.phase = Phase::Done;
                        return Some(self.error(unfinished()));
                    }
                },
                Phase::Usage => {
                    self.phase = Phase::Done;
                    return Some(self.usage_chunk(self.usage));
                }
                Phase::Done => return Some(Bytes::from_static(b"data: [DONE]\n\n")),
                Phase::End => return None,
            }
        }
    }
}

fn unfinished() -> EngineError {
    EngineError::Internal("the token stream ended without a finish event".into())
}

/// What a streamed response is made of: the choices' token streams and how to answer.
pub(crate) struct Streamed {
    /// One token stream per choice, in choice order.
    pub(crate) choices: Vec<TokenStream>,
    pub(crate) flavor: Flavor,
    pub(crate) meta: ResponseMeta,
    pub(crate) include_usage: bool,
    /// Choices per prompt (`n`).
    pub(crate) per_prompt: usize,
    pub(crate) lang: &'static str,
    /// A multi-choice request's entry for the abort route, kept while the response streams.
    pub(crate) fanout: Option<Registered>,
    /// The chat request's tools, by which each choice's output is read for calls.
    pub(crate) tools: Option<Arc<Tools>>,
    /// What the stream shows of the prompt (`echo`).
    pub(crate) shown: PromptShown,
    /// The marks of the model's reasoning, when the answer shows it apart.
    pub(crate) reasoning: Option<ReasoningMarks>,
}

/// The SSE events of a response's token streams.
pub(crate) fn events(s: Streamed) -> impl Stream<Item = Result<Bytes, Infallible>> + 'static {
    let n = s.choices.len();
    let state = EventState {
        tokens: choices::merge(s.choices),
        flavor: s.flavor,
        meta: s.meta,
        include_usage: s.include_usage,
        lang: s.lang,
        phase: Phase::Role(0),
        offsets: vec![0; n],
        open: n,
        per_prompt: s.per_prompt.max(1),
        usage: Usage::default(),
        _fanout: s.fanout,
        tools: s.tools.iter().flat_map(|t| (0..n).map(|_| ToolStream::new(Arc::clone(t)))).collect(),
        tool_finish: s.tools,
        reasoning: s.reasoning.iter().flat_map(|m| (0..n).map(|_| ReasoningStream::new(*m))).collect(),
        queued: VecDeque::new(),
        shown: s.shown,
    };
    futures::stream::unfold(state, |mut state| async move {
        let bytes = state.next_event().await?;
        Some((Ok(bytes), state))
    })
}

/// A `text/event-stream` response over a request's token streams.
pub(crate) fn response(s: Streamed) -> HttpResponse {
    let id = s.meta.id.clone();
    HttpResponse::Ok()
        .content_type("text/event-stream")
        .insert_header((header::CACHE_CONTROL, "no-cache"))
        .insert_header(("X-Accel-Buffering", "no"))
        .insert_header(("X-Request-Id", id))
        .streaming(events(s))
}

/// A whole request's output.
#[derive(Debug, Clone)]
pub(crate) struct Collected {
    pub(crate) text: String,
    pub(crate) finish: FinishReason,
    pub(crate) usage: Usage,
    /// Each token's log-probabilities, when the request asked for them.
    pub(crate) logprobs: Vec<TokenLogprobs>,
    /// The prompt as the engine reported it, when the request asked for it.
    pub(crate) prompt: Option<Box<PromptReport>>,
}

impl Collected {
    /// Chat's `logprobs` of the choice: `None` when the request did not ask for them.
    pub(crate) fn chat_logprobs(&self, asked: bool) -> Option<ChatLogprobs> {
        asked.then(|| {
            let mut l = ChatLogprobs::default();
            self.logprobs.iter().for_each(|t| l.push(t));
            l
        })
    }

    /// The completions API's `logprobs` of the choice, the first token's text starting at
    /// character `start` of the choice's text: `None` when the request did not ask.
    pub(crate) fn text_logprobs(&self, asked: bool, start: usize) -> Option<TextLogprobs> {
        asked.then(|| {
            let (mut l, mut offset) = (TextLogprobs::default(), start);
            for t in &self.logprobs {
                l.push(t, offset);
                offset += logprobs::width(t);
            }
            l
        })
    }
}

/// Runs every choice's token stream to its end, side by side.
pub(crate) async fn collect_all(choices: Vec<TokenStream>) -> Result<Vec<Collected>, EngineError> {
    futures::future::try_join_all(choices.into_iter().map(collect)).await
}

/// Runs a token stream to its end.
async fn collect(mut tokens: TokenStream) -> Result<Collected, EngineError> {
    let (mut text, mut logprobs, mut prompt) = (String::new(), Vec::new(), None);
    while let Some(event) = tokens.next().await {
        match event? {
            TokenEvent::Prompt(report) => prompt = Some(report),
            TokenEvent::Delta { text: t, logprobs: l, .. } => {
                text.push_str(&t);
                logprobs.extend(l.map(|l| *l));
            }
            TokenEvent::Finished { reason, usage } => {
                return Ok(Collected { text, finish: reason, usage, logprobs, prompt });
            }
        }
    }
    Err(unfinished())
}
