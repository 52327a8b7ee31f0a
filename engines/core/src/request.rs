//! Requests, sampling settings and the events a request produces.

use crate::EngineError;
use serde::{Deserialize, Serialize};

/// One chat message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// The text.
    pub content: String,
    /// The functions an assistant message called (the chat template renders them in the
    /// model's own format); empty for other messages.
    pub tool_calls: Vec<ToolCall>,
    /// The call a `tool` message answers.
    pub tool_call_id: Option<String>,
}

impl ChatMessage {
    /// A message with the given role and text.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self { role: role.into(), content: content.into(), tool_calls: Vec::new(), tool_call_id: None }
    }
}

/// A function call an assistant made, as OpenAI's `tool_calls` carries it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The call's id, which the `tool` message answering it repeats.
    pub id: String,
    /// The function's name.
    pub name: String,
    /// The arguments as JSON text (normally an object).
    pub arguments: String,
}

/// What to generate from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Prompt {
    /// Raw text, tokenized with the tokenizer's special-token rules (BOS where the model wants
    /// one).
    Text(String),
    /// Token ids, used as they are.
    Tokens(Vec<u32>),
    /// Chat messages, rendered with the model's chat template and a generation prompt.
    Chat(Vec<ChatMessage>),
    /// Chat messages rendered with more variables for the chat template (vLLM's
    /// `chat_template_kwargs`, such as Qwen3's `enable_thinking`, and the request's `tools`),
    /// given as a JSON object's text.
    ChatWith {
        /// The conversation.
        messages: Vec<ChatMessage>,
        /// A JSON object: each key a template variable.
        template_args: String,
    },
}

/// Sampling settings, with OpenAI/vLLM semantics.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SamplingParams {
    /// Tokens to generate at most; `None` means until the context is full.
    pub max_tokens: Option<usize>,
    /// 0 means greedy.
    pub temperature: f32,
    /// Nucleus mass in (0, 1].
    pub top_p: f32,
    /// Keep the `k` most likely tokens; 0 keeps all.
    pub top_k: usize,
    /// Drop tokens whose probability is below `min_p` times the top one; 0 disables.
    pub min_p: f32,
    /// Seed of the request's own random generator (reproducible sampling).
    pub seed: Option<u64>,
    /// Stop strings; the output ends before the first of them.
    pub stop: Vec<String>,
    /// Token ids that end the output (besides the model's end-of-sequence tokens).
    pub stop_token_ids: Vec<u32>,
    /// Keep generating past end-of-sequence tokens.
    pub ignore_eos: bool,
    /// Tokens to generate before an end-of-sequence or stop token may be sampled (vLLM's
    /// `min_tokens`); 0 lets them come at once. Stop strings and a structured output's end are
    /// not held back.
    pub min_tokens: usize,
    /// OpenAI presence penalty, in [-2, 2].
    pub presence_penalty: f32,
    /// OpenAI frequency penalty, in [-2, 2].
    pub frequency_penalty: f32,
    /// Multiplicative repetition penalty (1 disables), over prompt and output tokens.
    pub repetition_penalty: f32,
    /// Log-probabilities reported with each generated token: `Some(n)` reports the chosen
    /// token's and the `n` most likely tokens' (`n` at most [`MAX_TOP_LOGPROBS`]); `None`
    /// reports none. They are the model's own distribution (a log-softmax of its logits), before
    /// penalties, temperature or any filter, as vLLM reports them.
    pub logprobs: Option<usize>,
    /// Log-probabilities of the prompt's tokens (vLLM's `prompt_logprobs`): `Some(n)` reports,
    /// for every prompt token after the first, its log-probability given the tokens before it
    /// and the `n` most likely tokens' there (`n` at most [`MAX_TOP_LOGPROBS`]), in a
    /// [`TokenEvent::Prompt`] before the output. Computing them needs the logits of every
    /// prompt position, so such a prompt is computed whole, never taken from a prefix cache.
    pub prompt_logprobs: Option<usize>,
    /// Report the prompt itself (its token ids and text) in a [`TokenEvent::Prompt`] before
    /// the output, as OpenAI's `echo` shows it.
    pub echo: bool,
    /// Added to these tokens' logits before anything else samples from them (OpenAI's
    /// `logit_bias`), at most [`MAX_LOGIT_BIAS`] entries, each within [-100, 100].
    pub logit_bias: Vec<(u32, f32)>,
    /// A shape the output must take (OpenAI's `response_format`); `None`: any text.
    pub structured: Option<StructuredOutput>,
    /// A reasoning model's closing mark (`</think>`): the output is free text up to the first
    /// one and takes the shape of `structured` after it, so that the model thinks before it
    /// answers in the shape. `None`: the shape holds from the first token.
    pub structured_after: Option<String>,
}

/// A shape the output must take: the engine samples only tokens that keep the output a prefix
/// of some text of that shape, and ends it once the shape is complete.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum StructuredOutput {
    /// Any JSON object (OpenAI's `json_object`).
    JsonObject,
    /// JSON valid against this JSON Schema, given as its text (OpenAI's `json_schema`).
    JsonSchema(String),
    /// Text matching this regular expression whole (vLLM's `structured_outputs.regex`).
    Regex(String),
    /// Exactly one of these texts (vLLM's `structured_outputs.choice`).
    Choice(Vec<String>),
}

impl StructuredOutput {
    /// The JSON Schema the output follows, as text, for the JSON shapes.
    pub fn schema(&self) -> Option<&str> {
        match self {
            Self::JsonObject => Some(r#"{"type": "object"}"#),
            Self::JsonSchema(s) => Some(s),
            Self::Regex(_) | Self::Choice(_) => None,
        }
    }

    /// The regular expression the output matches whole, for the text shapes: a choice is its
    /// texts as alternatives, each matched literally.
    pub fn regex(&self) -> Option<String> {
        match self {
            Self::Regex(r) => Some(r.clone()),
            Self::Choice(texts) => Some(texts.iter().map(|t| literal(t)).collect::<Vec<_>>().join("|")),
            Self::JsonObject | Self::JsonSchema(_) => None,
        }
    }

    /// The bytes of text the shape was given as, which bounds the work of compiling it (at
    /// most [`MAX_SCHEMA_BYTES`]).
    pub fn text_len(&self) -> usize {
        match self {
            Self::JsonObject => 0,
            Self::JsonSchema(s) | Self::Regex(s) => s.len(),
            Self::Choice(texts) => texts.iter().map(String::len).sum(),
        }
    }
}

/// `text` as a regular expression that matches exactly it: every character with a meaning in
/// a regular expression escaped.
fn literal(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('(');
    for c in text.chars() {
        // The characters regex-syntax's `escape` escapes (what llguidance and xgrammar read alike).
        if "\\.+*?()|[]{}^$#&-~".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out.push(')');
    out
}

/// The longest text (a JSON Schema, a regular expression, all choices) a request's shape may be
/// given as: it is compiled for every request that has one.
pub const MAX_SCHEMA_BYTES: usize = 64 * 1024;

/// The most texts a `Choice` shape may list.
pub const MAX_CHOICES_TEXTS: usize = 1024;

/// The most tokens one request may bias.
pub const MAX_LOGIT_BIAS: usize = 1024;

/// The most alternatives a token's [`TokenLogprobs`] may list (OpenAI's and vLLM's limit).
pub const MAX_TOP_LOGPROBS: usize = 20;

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            max_tokens: Some(16),
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            seed: None,
            stop: Vec::new(),
            stop_token_ids: Vec::new(),
            ignore_eos: false,
            min_tokens: 0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repetition_penalty: 1.0,
            logprobs: None,
            prompt_logprobs: None,
            echo: false,
            logit_bias: Vec::new(),
            structured: None,
            structured_after: None,
        }
    }
}

impl SamplingParams {
    /// Greedy decoding of at most `max_tokens` tokens.
    pub fn greedy(max_tokens: usize) -> Self {
        Self { max_tokens: Some(max_tokens), temperature: 0.0, ..Self::default() }
    }

    /// Whether the request asked for a [`TokenEvent::Prompt`].
    pub fn reports_prompt(&self) -> bool {
        self.echo || self.prompt_logprobs.is_some()
    }

    /// Whether sampling reduces to argmax.
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0 || self.top_k == 1
    }

    /// The output tokens a request may generate after a `prompt_len`-token prompt in a context
    /// of `context` tokens: `max_tokens`, or all the room left when it is unset; a request
    /// that does not fit is refused with [`EngineError::ContextLength`].
    pub fn max_tokens_within(&self, prompt_len: usize, context: usize) -> Result<usize, EngineError> {
        let room = context.saturating_sub(prompt_len);
        match self.max_tokens {
            Some(m) if m <= room => Ok(m),
            None if room > 0 => Ok(room),
            m => Err(EngineError::ContextLength {
                prompt_tokens: prompt_len,
                max_tokens: m.unwrap_or(1),
                context_length: context,
            }),
        }
    }

    /// Checks the tokens of `logit_bias` against a vocabulary of `vocab_size` tokens.
    pub fn check_bias_tokens(&self, vocab_size: usize) -> Result<(), EngineError> {
        match self.logit_bias.iter().find(|&&(id, _)| id as usize >= vocab_size) {
            Some(&(id, _)) => Err(EngineError::invalid(
                "logit_bias",
                format!("token {id} is outside the vocabulary ({vocab_size} tokens)"),
            )),
            None => Ok(()),
        }
    }

    /// Checks every field; the error names the first bad one.
    pub fn validate(&self) -> Result<(), EngineError> {
        let finite = |name: &str, v: f32| {
            if v.is_finite() { Ok(()) } else { Err(EngineError::invalid(name, "must be a finite number")) }
        };
        finite("temperature", self.temperature)?;
        finite("top_p", self.top_p)?;
        finite("min_p", self.min_p)?;
        finite("presence_penalty", self.presence_penalty)?;
        finite("frequency_penalty", self.frequency_penalty)?;
        finite("repetition_penalty", self.repetition_penalty)?;
        if self.max_tokens == Some(0) {
            return Err(EngineError::invalid("max_tokens", "must be at least 1"));
        }
        if self.max_tokens.is_some_and(|m| self.min_tokens > m) {
            return Err(EngineError::invalid("min_tokens", "must be at most max_tokens"));
        }
        if !(0.0..=2.0).contains(&self.temperature) {
            return Err(EngineError::invalid("temperature", "must be between 0 and 2"));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(EngineError::invalid("top_p", "must be in (0, 1]"));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(EngineError::invalid("min_p", "must be in [0, 1]"));
        }
        if !(-2.0..=2.0).contains(&self.presence_penalty) {
            return Err(EngineError::invalid("presence_penalty", "must be between -2 and 2"));
        }
        if !(-2.0..=2.0).contains(&self.frequency_penalty) {
            return Err(EngineError::invalid("frequency_penalty", "must be between -2 and 2"));
        }
        if !(self.repetition_penalty > 0.0 && self.repetition_penalty <= 2.0) {
            return Err(EngineError::invalid("repetition_penalty", "must be in (0, 2]"));
        }
        if self.stop.iter().any(String::is_empty) {
            return Err(EngineError::invalid("stop", "stop strings must not be empty"));
        }
        if self.stop.len() > 16 {
            return Err(EngineError::invalid("stop", "at most 16 stop strings"));
        }
        if self.logit_bias.len() > MAX_LOGIT_BIAS {
            return Err(EngineError::invalid("logit_bias", format!("at most {MAX_LOGIT_BIAS} tokens")));
        }
        if self.logit_bias.iter().any(|&(_, b)| !(-100.0..=100.0).contains(&b)) {
            return Err(EngineError::invalid("logit_bias", "biases must be between -100 and 100"));
        }
        if self.structured_after.as_ref().is_some_and(|m| m.is_empty() || m.len() > 64) {
            return Err(EngineError::invalid("response_format", "a reasoning mark is 1 to 64 bytes"));
        }
        if let Some(shape) = &self.structured {
            if shape.text_len() > MAX_SCHEMA_BYTES {
                return Err(EngineError::invalid(
                    "response_format",
                    format!("the output's shape is given in more than {MAX_SCHEMA_BYTES} bytes"),
                ));
            }
            if let StructuredOutput::Choice(texts) = shape
                && (texts.is_empty() || texts.len() > MAX_CHOICES_TEXTS)
            {
                return Err(EngineError::invalid(
                    "structured_outputs.choice",
                    format!("must list 1 to {MAX_CHOICES_TEXTS} texts"),
                ));
            }
        }
        if self.logprobs.is_some_and(|n| n > MAX_TOP_LOGPROBS) {
            return Err(EngineError::invalid("logprobs", format!("must be at most {MAX_TOP_LOGPROBS}")));
        }
        if self.prompt_logprobs.is_some_and(|n| n > MAX_TOP_LOGPROBS) {
            return Err(EngineError::invalid(
                "prompt_logprobs",
                format!("must be at most {MAX_TOP_LOGPROBS}"),
            ));
        }
        Ok(())
    }
}

/// A generation request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GenerateRequest {
    /// Unique among running requests of the engine.
    pub request_id: String,
    /// What to generate from.
    pub prompt: Prompt,
    /// How to sample.
    pub sampling: SamplingParams,
}

/// Why a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// An end-of-sequence token, a stop token or a stop string.
    Stop,
    /// `max_tokens` or the context length was reached.
    Length,
    /// The request was aborted.
    Abort,
}

impl FinishReason {
    /// The OpenAI name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stop => "stop",
            Self::Length => "length",
            Self::Abort => "abort",
        }
    }
}

/// Token counts of a request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Generated tokens.
    pub completion_tokens: usize,
}

/// One token's log-probability under the model, with the token's own text.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Logprob {
    /// The token id.
    pub token_id: u32,
    /// The token decoded alone (a piece of a multi-byte character decodes to U+FFFD).
    pub token: String,
    /// Its natural log-probability.
    pub logprob: f32,
}

/// The log-probabilities that come with a generated token when the request asked for them
/// ([`SamplingParams::logprobs`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenLogprobs {
    /// The generated token's.
    pub chosen: Logprob,
    /// The most likely tokens', most likely first (ties by token id), as many as were asked.
    pub top: Vec<Logprob>,
    /// The chosen token's rank among all tokens (1: the most likely; equal values share the
    /// better rank), where the engine reports it (vLLM's `prompt_logprobs` show it).
    #[serde(default)]
    pub rank: Option<u32>,
}

/// The log-probabilities of a prompt's tokens ([`SamplingParams::prompt_logprobs`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PromptLogprobs {
    /// The first prompt token decoded alone: nothing comes before it, so it has no
    /// log-probability.
    pub first: String,
    /// Each later prompt token's, in order: the token given the ones before it (`chosen`), and
    /// the most likely tokens at its position.
    pub rest: Vec<TokenLogprobs>,
}

/// The prompt as an engine took it ([`TokenEvent::Prompt`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PromptReport {
    /// The prompt's token ids.
    pub token_ids: Vec<u32>,
    /// The ids decoded (special tokens kept).
    pub text: String,
    /// With [`SamplingParams::prompt_logprobs`], the prompt tokens' log-probabilities.
    pub logprobs: Option<PromptLogprobs>,
}

/// What a running request reports.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum TokenEvent {
    /// The prompt as the engine took it, once, before any output, when the request asked for
    /// it ([`SamplingParams::reports_prompt`]).
    Prompt(Box<PromptReport>),
    /// A new token and the text it completes (possibly empty while a multi-byte character or a
    /// possible stop string is pending).
    Delta {
        /// The token id.
        token_id: u32,
        /// New text.
        text: String,
        /// The token's log-probabilities, when the request asked for them; `None` also on the
        /// text a stream flushes at its end, which is no new token.
        logprobs: Option<Box<TokenLogprobs>>,
    },
    /// The request ended.
    Finished {
        /// Why.
        reason: FinishReason,
        /// Token counts.
        usage: Usage,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choices_become_literal_alternatives() {
        let c = StructuredOutput::Choice(vec!["a.b".into(), "x|y (z)".into(), "plain".into()]);
        assert_eq!(c.regex().as_deref(), Some(r"(a\.b)|(x\|y \(z\))|(plain)"));
        assert_eq!(c.schema(), None);
        assert_eq!(StructuredOutput::JsonObject.regex(), None);
        let mut s = SamplingParams {
            structured: Some(StructuredOutput::Choice(Vec::new())),
            ..SamplingParams::default()
        };
        assert!(s.validate().is_err());
        s.structured = Some(StructuredOutput::Regex("x".repeat(MAX_SCHEMA_BYTES + 1)));
        assert!(s.validate().is_err());
        s.structured = Some(StructuredOutput::Regex("[0-9]+".into()));
        assert!(s.validate().is_ok());
    }
}
