//! `POST /v1/chat/completions`.

use super::{Generation, GenerationRequest, is_set, request_id};
use crate::api::echo::PromptShown;
use crate::api::error::Problem;
use crate::api::openai::{ChatCompletionRequest, InMessage};
use crate::api::sampling::WithSampling;
use crate::api::sse::Flavor;
use actix_web::HttpRequest;
use serde_json::{Map, Value};
use std::sync::Arc;
use xinf_engine::{ChatMessage, GenerateRequest, MAX_TOP_LOGPROBS, Prompt, ToolCall};

/// Content part types that carry something other than text.
const MULTIMODAL_PARTS: &[&str] =
    &["image_url", "input_image", "image", "input_audio", "audio_url", "video_url", "file", "input_file"];

impl GenerationRequest for ChatCompletionRequest {
    fn generation(req: &HttpRequest, body: WithSampling<Self>) -> Result<Generation, Problem> {
        let WithSampling { mut sampling, rest: mut r } = body;
        refuse_unsupported(&r)?;
        let logprobs = logprobs(&r)?;
        let tools = crate::api::tools::read(r.tools.take(), r.tool_choice.as_ref(), r.parallel_tool_calls)?;
        let messages = messages(r.messages)?;
        let mut args = template_args(r.chat_template_kwargs.as_ref())?;
        if let Some(tools) = &tools {
            args.get_or_insert_with(Default::default).insert("tools".into(), tools.template_value().clone());
        }
        let prompt = match args {
            Some(args) => Prompt::ChatWith { messages, template_args: Value::Object(args).to_string() },
            None => Prompt::Chat(messages),
        };
        sampling.max_tokens = r.max_completion_tokens.or(sampling.max_tokens);
        let choices = sampling.choices()?;
        let logit_bias = crate::api::sampling::logit_bias(r.logit_bias.as_ref())?;
        let mut structured = crate::api::response_format::read_either(
            r.response_format.as_ref(),
            r.structured_outputs.as_ref(),
        )?;
        let mut shape_param = crate::api::response_format::shape_param(r.structured_outputs.as_ref());
        if let Some(grammar) = tools.as_ref().and_then(|t| t.grammar()) {
            // Both would hold the output to a grammar of their own.
            if structured.is_some() {
                return Err(Problem::field("tool_choice", "api-tool-choice-with-format", "invalid_value"));
            }
            structured = Some(grammar);
            shape_param = "tools".into();
        }
        let mut sampling = sampling.into_params()?;
        sampling.logprobs = logprobs;
        sampling.logit_bias = logit_bias;
        sampling.structured = structured;
        let stream = r.stream.unwrap_or(false);
        let shown = PromptShown {
            prompt_logprobs: crate::api::echo::read_prompt_logprobs(r.prompt_logprobs, stream)?,
            ..PromptShown::default()
        };
        sampling.prompt_logprobs = shown.engine_count();
        let request_id = request_id(req, r.request_id, "chatcmpl")?;
        Ok(Generation {
            model: r.model,
            requests: vec![GenerateRequest { request_id, prompt, sampling }],
            choices,
            stream,
            include_usage: super::include_usage(r.stream_options, stream)?,
            flavor: Flavor::Chat,
            tools: tools.map(Arc::new),
            shape_param,
            shown,
        })
    }
}

/// The most bytes of `chat_template_kwargs` a request may send: they are rendered into the
/// prompt of every request that has them.
const MAX_TEMPLATE_ARGS_BYTES: usize = 16 * 1024;

/// vLLM's `chat_template_kwargs`: an object whose keys become template variables; `None` when
/// absent, null or empty.
fn template_args(value: Option<&Value>) -> Result<Option<Map<String, Value>>, Problem> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(o)) if o.is_empty() => Ok(None),
        Some(v @ Value::Object(o)) if v.to_string().len() <= MAX_TEMPLATE_ARGS_BYTES => Ok(Some(o.clone())),
        Some(_) => {
            Err(Problem::field("chat_template_kwargs", "api-template-kwargs-invalid", "invalid_value"))
        }
    }
}

/// The alternatives to report with each token's log-probability (`top_logprobs`), when
/// `logprobs` is true; `None` when it is not.
fn logprobs(r: &ChatCompletionRequest) -> Result<Option<usize>, Problem> {
    let top = r.top_logprobs.unwrap_or(0);
    if top > MAX_TOP_LOGPROBS as u64 {
        return Err(Problem::field("top_logprobs", "api-logprobs-too-many", "invalid_value"));
    }
    match r.logprobs {
        Some(true) => Ok(Some(top as usize)),
        // As OpenAI: alternatives are only listed beside the chosen token's log-probability.
        _ if top > 0 => {
            Err(Problem::field("top_logprobs", "api-top-logprobs-without-logprobs", "invalid_value"))
        }
        _ => Ok(None),
    }
}

/// The legacy function-calling fields (`functions`, `function_call`), which `tools` replaced.
fn refuse_unsupported(r: &ChatCompletionRequest) -> Result<(), Problem> {
    let auto = |v: &Option<Value>| v.as_ref().and_then(Value::as_str) == Some("auto");
    if is_set(&r.functions) {
        return Err(Problem::field("functions", "api-tools-unsupported", "unsupported_parameter"));
    }
    if is_set(&r.function_call) && !auto(&r.function_call) {
        return Err(Problem::field("function_call", "api-tools-unsupported", "unsupported_parameter"));
    }
    Ok(())
}

/// The request's messages as the engine takes them: `developer` becomes `system`, content
/// parts are joined with newlines, an assistant's calls and a tool's answer keep their ids.
fn messages(input: Vec<InMessage>) -> Result<Vec<ChatMessage>, Problem> {
    if input.is_empty() {
        return Err(Problem::field("messages", "api-messages-empty", "invalid_value"));
    }
    input
        .into_iter()
        .enumerate()
        .map(|(i, m)| {
            let role = match m.role.as_str() {
                "system" | "user" | "assistant" | "tool" => m.role.clone(),
                "developer" => "system".to_owned(),
                // The legacy answer to a `function_call`, which `tools` replaced.
                "function" => {
                    let field = format!("messages[{i}].role");
                    return Err(Problem::field(field, "api-tools-unsupported", "unsupported_parameter"));
                }
                other => {
                    return Err(Problem::field_with(
                        format!("messages[{i}].role"),
                        "api-role-invalid",
                        "invalid_value",
                        ("role", other.to_owned()),
                    ));
                }
            };
            if is_set(&m.function_call) {
                let field = format!("messages[{i}].function_call");
                return Err(Problem::field(field, "api-tools-unsupported", "unsupported_parameter"));
            }
            let calls = m.tool_calls.unwrap_or_default();
            if !calls.is_empty() && role != "assistant" {
                let field = format!("messages[{i}].tool_calls");
                return Err(Problem::field(field, "api-tool-calls-not-assistant", "invalid_value"));
            }
            let tool_calls = calls
                .into_iter()
                .enumerate()
                .map(|(j, c)| {
                    let arguments = match c.function.arguments {
                        Value::String(s) => s,
                        v @ Value::Object(_) => v.to_string(),
                        _ => {
                            let field = format!("messages[{i}].tool_calls[{j}].function.arguments");
                            return Err(Problem::field(field, "api-tool-arguments-invalid", "invalid_type"));
                        }
                    };
                    Ok(ToolCall { id: c.id, name: c.function.name, arguments })
                })
                .collect::<Result<Vec<_>, _>>()?;
            let field = format!("messages[{i}].content");
            // Only an assistant message may come without content (one that made tool calls).
            if role != "assistant" && matches!(m.content, None | Some(Value::Null)) {
                return Err(Problem::field(field, "api-content-required", "invalid_value"));
            }
            let content = content_text(m.content, &field)?;
            let tool_call_id = if role == "tool" { m.tool_call_id } else { None };
            Ok(ChatMessage { tool_calls, tool_call_id, ..ChatMessage::new(role, content) })
        })
        .collect()
}

/// The text of a message's content: a string, or a list of `{"type": "text", "text": ..}`.
fn content_text(content: Option<Value>, field: &str) -> Result<String, Problem> {
    let invalid = || Problem::field(field, "api-content-invalid", "invalid_value");
    match content {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s),
        Some(Value::Array(parts)) => {
            let mut texts = Vec::with_capacity(parts.len());
            for part in &parts {
                match part.get("type").and_then(Value::as_str) {
                    Some("text") => texts.push(part.get("text").and_then(Value::as_str).ok_or_else(invalid)?),
                    Some(kind) if MULTIMODAL_PARTS.contains(&kind) => {
                        return Err(Problem::field(field, "api-multimodal", "unsupported_parameter"));
                    }
                    _ => return Err(invalid()),
                }
            }
            Ok(texts.join("\n"))
        }
        Some(_) => Err(invalid()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn field_of(p: Problem) -> String {
        match p {
            Problem::Field { field, key, .. } => format!("{field} {key}"),
            other => format!("{other:?}"),
        }
    }

    #[test]
    fn content_parts() {
        let parts = json!([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]);
        assert_eq!(content_text(Some(parts), "c").ok(), Some("a\nb".to_owned()));
        let image = json!([{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "x"}}]);
        let err = content_text(Some(image), "messages[0].content").err().map(field_of);
        assert_eq!(err.as_deref(), Some("messages[0].content api-multimodal"));
        assert!(content_text(Some(json!(3)), "c").is_err());
        assert!(content_text(Some(json!([{"type": "text"}])), "c").is_err());
        assert_eq!(content_text(None, "c").ok(), Some(String::new()));
    }

    fn message(v: Value) -> InMessage {
        serde_json::from_value(v).expect("a message")
    }

    #[test]
    fn content_is_required_except_from_the_assistant() {
        for bad in [json!({"role": "user"}), json!({"role": "user", "content": null})] {
            let err = messages(vec![message(bad)]).err().map(field_of);
            assert_eq!(err.as_deref(), Some("messages[0].content api-content-required"));
        }
        let system = message(json!({"role": "system"}));
        let err =
            messages(vec![system, message(json!({"role": "user", "content": "hi"}))]).err().map(field_of);
        assert_eq!(err.as_deref(), Some("messages[0].content api-content-required"));
        // "none" is text like any other, and an assistant turn may be empty.
        let ok = vec![
            message(json!({"role": "user", "content": "none"})),
            message(json!({"role": "assistant", "content": null})),
            message(json!({"role": "user", "content": ""})),
        ];
        assert_eq!(messages(ok).map(|m| m.len()).ok(), Some(3));
    }

    #[test]
    fn calls_and_answers_keep_their_ids() {
        let call =
            json!({"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"a\": 1}"}});
        let object_arguments = json!({"id": "c2", "function": {"name": "f", "arguments": {"a": 2}}});
        let ok = messages(vec![
            message(json!({"role": "user", "content": "hi"})),
            message(json!({"role": "assistant", "content": null, "tool_calls": [call, object_arguments]})),
            message(json!({"role": "tool", "content": "42", "tool_call_id": "c1"})),
        ])
        .expect("valid messages");
        let calls: Vec<_> = ok[1].tool_calls.iter().map(|c| (c.id.as_str(), c.arguments.as_str())).collect();
        assert_eq!(calls, [("c1", "{\"a\": 1}"), ("c2", "{\"a\":2}")]);
        assert_eq!((ok[2].role.as_str(), ok[2].tool_call_id.as_deref()), ("tool", Some("c1")));
        // The legacy function role, calls on a user message, and arguments that are no text.
        let function = message(json!({"role": "function", "content": "42", "name": "f"}));
        let err = messages(vec![function]).err().map(field_of);
        assert_eq!(err.as_deref(), Some("messages[0].role api-tools-unsupported"));
        let user_call = message(
            json!({"role": "user", "content": "x", "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{}"}}]}),
        );
        let err = messages(vec![user_call]).err().map(field_of);
        assert_eq!(err.as_deref(), Some("messages[0].tool_calls api-tool-calls-not-assistant"));
        let bad = message(
            json!({"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": 3}}]}),
        );
        let err = messages(vec![bad]).err().map(field_of);
        assert_eq!(
            err.as_deref(),
            Some("messages[0].tool_calls[0].function.arguments api-tool-arguments-invalid")
        );
    }
}
