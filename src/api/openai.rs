//! OpenAI wire types: request bodies (strict: unknown fields are refused) and responses.
//!
//! Fields that OpenAI defines and xinf does not support yet are still declared, so that a
//! request using them gets "not supported" naming the field rather than "unknown field".

use crate::api::logprobs::{ChatLogprobs, PromptLogprobsOut, TextLogprobs};
use serde::de::IgnoredAny;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `stop`: one string or a list of strings.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub(crate) enum StopField {
    /// One stop string.
    One(String),
    /// Several stop strings.
    Many(Vec<String>),
}

impl StopField {
    pub(crate) fn into_vec(self) -> Vec<String> {
        match self {
            Self::One(s) => vec![s],
            Self::Many(v) => v,
        }
    }
}

/// `stream_options`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct StreamOptions {
    /// Send a last chunk with the token counts (and `choices: []`).
    #[serde(default)]
    pub(crate) include_usage: Option<bool>,
    /// Token counts in every chunk (not supported: only the last chunk has them).
    #[serde(default, rename = "continuous_usage_stats")]
    _continuous_usage_stats: Option<IgnoredAny>,
}

/// One message of a chat request.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct InMessage {
    /// `system`, `developer`, `user`, `assistant` or `tool`.
    pub(crate) role: String,
    /// A string, a list of content parts, or null (assistant messages).
    #[serde(default)]
    pub(crate) content: Option<Value>,
    /// The author's name; ignored.
    #[serde(default, rename = "name")]
    _name: Option<IgnoredAny>,
    /// The functions an assistant message called.
    #[serde(default)]
    pub(crate) tool_calls: Option<Vec<ToolCallIn>>,
    /// The call a `tool` message answers.
    #[serde(default)]
    pub(crate) tool_call_id: Option<String>,
    /// Legacy function call of an assistant message (refused unless null).
    #[serde(default)]
    pub(crate) function_call: Option<Value>,
    /// Echoed back by clients that replay assistant messages; ignored.
    #[serde(default, rename = "refusal")]
    _refusal: Option<IgnoredAny>,
    /// Echoed back by clients that replay assistant messages; ignored.
    #[serde(default, rename = "annotations")]
    _annotations: Option<IgnoredAny>,
    /// Echoed back by clients that replay assistant messages; ignored.
    #[serde(default, rename = "audio")]
    _audio: Option<IgnoredAny>,
}

/// One entry of `tools`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ToolIn {
    /// Only `function`.
    #[serde(rename = "type")]
    _kind: FunctionKind,
    pub(crate) function: FunctionIn,
}

/// The one kind of tool and of tool call: `"function"`.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
pub(crate) enum FunctionKind {
    #[default]
    #[serde(rename = "function")]
    Function,
}

/// A function a model may call.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FunctionIn {
    pub(crate) name: String,
    #[serde(default)]
    pub(crate) description: Option<String>,
    /// A JSON Schema of the arguments' object.
    #[serde(default)]
    pub(crate) parameters: Option<Value>,
    /// OpenAI's strict schema adherence; xinf always follows the schema where it constrains.
    #[serde(default)]
    pub(crate) strict: Option<bool>,
}

/// A call in an assistant message's `tool_calls`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ToolCallIn {
    pub(crate) id: String,
    #[serde(rename = "type", default)]
    _kind: FunctionKind,
    pub(crate) function: CalledFunctionIn,
}

/// The function of a [`ToolCallIn`].
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CalledFunctionIn {
    pub(crate) name: String,
    /// JSON text, as OpenAI sends it (an object is taken too).
    pub(crate) arguments: Value,
}

/// `POST /v1/chat/completions`, less the sampling fields: the body is parsed as
/// [`WithSampling<ChatCompletionRequest>`](crate::api::sampling::WithSampling).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ChatCompletionRequest {
    pub(crate) model: String,
    pub(crate) messages: Vec<InMessage>,
    /// vLLM's extension: more variables for the chat template.
    #[serde(default)]
    pub(crate) chat_template_kwargs: Option<Value>,
    #[serde(default)]
    pub(crate) max_completion_tokens: Option<usize>,
    #[serde(default)]
    pub(crate) stream: Option<bool>,
    #[serde(default)]
    pub(crate) stream_options: Option<StreamOptions>,
    #[serde(default)]
    pub(crate) logprobs: Option<bool>,
    #[serde(default)]
    pub(crate) top_logprobs: Option<u64>,
    /// vLLM's extension: every prompt token's log-probability, with this many alternatives.
    #[serde(default)]
    pub(crate) prompt_logprobs: Option<u64>,
    #[serde(default)]
    pub(crate) response_format: Option<Value>,
    /// vLLM's structured-output extension.
    #[serde(default)]
    pub(crate) structured_outputs: Option<Value>,
    #[serde(default, rename = "user")]
    _user: Option<IgnoredAny>,
    #[serde(default)]
    pub(crate) request_id: Option<String>,
    #[serde(default)]
    pub(crate) tools: Option<Vec<ToolIn>>,
    #[serde(default)]
    pub(crate) tool_choice: Option<Value>,
    #[serde(default)]
    pub(crate) parallel_tool_calls: Option<bool>,
    #[serde(default)]
    pub(crate) functions: Option<Value>,
    #[serde(default)]
    pub(crate) function_call: Option<Value>,
    #[serde(default)]
    pub(crate) logit_bias: Option<Value>,
    #[serde(default, rename = "metadata")]
    _metadata: Option<IgnoredAny>,
    #[serde(default, rename = "store")]
    _store: Option<IgnoredAny>,
}

/// `POST /v1/completions`, less the sampling fields: the body is parsed as
/// [`WithSampling<CompletionRequest>`](crate::api::sampling::WithSampling).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CompletionRequest {
    pub(crate) model: String,
    pub(crate) prompt: Value,
    #[serde(default)]
    pub(crate) stream: Option<bool>,
    #[serde(default)]
    pub(crate) stream_options: Option<StreamOptions>,
    #[serde(default)]
    pub(crate) best_of: Option<u64>,
    #[serde(default)]
    pub(crate) logprobs: Option<u64>,
    #[serde(default)]
    pub(crate) echo: Option<bool>,
    /// vLLM's extension: every prompt token's log-probability, with this many alternatives.
    #[serde(default)]
    pub(crate) prompt_logprobs: Option<u64>,
    #[serde(default)]
    pub(crate) suffix: Option<String>,
    #[serde(default)]
    pub(crate) logit_bias: Option<Value>,
    #[serde(default)]
    pub(crate) response_format: Option<Value>,
    /// vLLM's structured-output extension.
    #[serde(default)]
    pub(crate) structured_outputs: Option<Value>,
    #[serde(default, rename = "user")]
    _user: Option<IgnoredAny>,
    #[serde(default)]
    pub(crate) request_id: Option<String>,
}

/// Token counts of a response.
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct UsageOut {
    pub(crate) prompt_tokens: usize,
    pub(crate) completion_tokens: usize,
    pub(crate) total_tokens: usize,
}

impl From<xinf_engine::Usage> for UsageOut {
    fn from(u: xinf_engine::Usage) -> Self {
        Self {
            prompt_tokens: u.prompt_tokens,
            completion_tokens: u.completion_tokens,
            total_tokens: u.prompt_tokens + u.completion_tokens,
        }
    }
}

/// The assistant message of a chat response: `content` is null when the answer is only calls.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct OutMessage {
    pub(crate) role: &'static str,
    pub(crate) content: Option<String>,
    /// The model's reasoning, apart from its answer (a model launched with
    /// `reasoning_content: true`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) tool_calls: Vec<OutToolCall>,
}

/// A function call of a chat response.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct OutToolCall {
    pub(crate) id: String,
    #[serde(rename = "type")]
    pub(crate) kind: &'static str,
    pub(crate) function: OutFunction,
}

/// The function of an [`OutToolCall`]: `arguments` is JSON text.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct OutFunction {
    pub(crate) name: String,
    pub(crate) arguments: String,
}

/// A piece of a function call in a chat chunk: the first piece of call `index` has its id,
/// type and name; later pieces add to its arguments.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct DeltaToolCall {
    pub(crate) index: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) id: Option<String>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub(crate) kind: Option<&'static str>,
    pub(crate) function: DeltaFunction,
}

/// The function piece of a [`DeltaToolCall`].
#[derive(Debug, Clone, Serialize)]
pub(crate) struct DeltaFunction {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) name: Option<String>,
    pub(crate) arguments: String,
}

/// One choice of a chat response.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ChatChoice {
    pub(crate) index: u32,
    pub(crate) message: OutMessage,
    pub(crate) logprobs: Option<ChatLogprobs>,
    pub(crate) finish_reason: &'static str,
}

/// A non-streaming chat response (`object: "chat.completion"`).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ChatCompletion {
    pub(crate) id: String,
    pub(crate) object: &'static str,
    pub(crate) created: u64,
    pub(crate) model: String,
    pub(crate) choices: Vec<ChatChoice>,
    pub(crate) usage: UsageOut,
    /// vLLM's `prompt_logprobs`, where the request asked for them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) prompt_logprobs: Option<PromptLogprobsOut>,
}

/// What a chat chunk adds.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct Delta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) content: Option<String>,
    /// A piece of the model's reasoning (see [`OutMessage::reasoning_content`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) tool_calls: Option<Vec<DeltaToolCall>>,
}

/// One choice of a chat chunk.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ChunkChoice {
    pub(crate) index: u32,
    pub(crate) delta: Delta,
    pub(crate) logprobs: Option<ChatLogprobs>,
    pub(crate) finish_reason: Option<&'static str>,
}

/// A streamed chat chunk (`object: "chat.completion.chunk"`).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ChatChunk {
    pub(crate) id: String,
    pub(crate) object: &'static str,
    pub(crate) created: u64,
    pub(crate) model: String,
    pub(crate) choices: Vec<ChunkChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) usage: Option<UsageOut>,
}

/// One choice of a completion (or completion chunk).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct TextChoice {
    pub(crate) index: u32,
    pub(crate) text: String,
    pub(crate) logprobs: Option<TextLogprobs>,
    pub(crate) finish_reason: Option<&'static str>,
    /// vLLM's `prompt_logprobs`, where the request asked for them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) prompt_logprobs: Option<PromptLogprobsOut>,
}

/// A completion response or streamed chunk (`object: "text_completion"`).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Completion {
    pub(crate) id: String,
    pub(crate) object: &'static str,
    pub(crate) created: u64,
    pub(crate) model: String,
    pub(crate) choices: Vec<TextChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) usage: Option<UsageOut>,
}

/// The body of every error response: `{"error": {...}, "detail": message}`. `detail` is where
/// Xinference's clients read the message (FastAPI's error shape); OpenAI's clients read `error`.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ErrorBody {
    pub(crate) error: ErrorDetail,
    pub(crate) detail: String,
}

/// OpenAI's error object.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ErrorDetail {
    pub(crate) message: String,
    #[serde(rename = "type")]
    pub(crate) kind: &'static str,
    pub(crate) param: Option<String>,
    pub(crate) code: &'static str,
}

/// One entry of `GET /v1/models`, and the answer of `GET /v1/models/{uid}`: OpenAI's model
/// object, the keys of Xinference's model description that its client dispatches on
/// (`model_type`, `model_ability`), and xinf's own description.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ModelObject {
    pub(crate) id: String,
    pub(crate) object: &'static str,
    pub(crate) created: u64,
    pub(crate) owned_by: &'static str,
    /// Xinference's model type: xinf serves `LLM`s only.
    pub(crate) model_type: &'static str,
    /// The registry name, as Xinference describes it.
    pub(crate) model_name: String,
    /// What the model answers (see [`model_ability`]).
    pub(crate) model_ability: &'static [&'static str],
    /// The registry's line for the family; empty for a model launched from a path.
    pub(crate) model_description: &'static str,
    /// Longest prompt plus output, in tokens: the model's own, else its family's.
    pub(crate) context_length: Option<usize>,
    /// Replicas serving it, as Xinference counts them.
    pub(crate) replica: usize,
    /// xinf's own description of the model.
    pub(crate) xinf: crate::api::ModelInfo,
}

/// What a model answers, as Xinference lists it: every model xinf serves takes completions,
/// chats and tools; a family that reasons says so.
pub(crate) fn model_ability(family: Option<&xinf_models::ModelFamily>) -> &'static [&'static str] {
    match family.and_then(|f| f.reasoning) {
        Some(_) => &["generate", "chat", "tools", "reasoning"],
        None => &["generate", "chat", "tools"],
    }
}

impl From<crate::api::ModelInfo> for ModelObject {
    fn from(mut info: crate::api::ModelInfo) -> Self {
        let family = xinf_models::find_family(&info.model_name);
        // One figure in both places: the model's own, else its family's.
        info.context_length = info.context_length.or(family.map(|f| f.context_length as usize));
        Self {
            id: info.uid.clone(),
            object: "model",
            created: info.created,
            owned_by: "xinf",
            model_type: "LLM",
            model_name: info.model_name.clone(),
            model_ability: model_ability(family),
            model_description: family.map_or("", |f| f.description),
            context_length: info.context_length,
            replica: info.replicas,
            xinf: info,
        }
    }
}

/// `GET /v1/models`.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ModelList {
    pub(crate) object: &'static str,
    pub(crate) data: Vec<ModelObject>,
}

#[cfg(test)]
mod tests {
    use super::model_ability;

    #[test]
    fn reasoning_families_say_so() {
        let of = |name: &str| model_ability(xinf_models::find_family(name));
        assert_eq!(of("qwen3"), ["generate", "chat", "tools", "reasoning"]);
        assert_eq!(of("smollm2-instruct"), ["generate", "chat", "tools"]);
        assert_eq!(of("a-model-from-a-path"), ["generate", "chat", "tools"]);
    }
}
