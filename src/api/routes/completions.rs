//! `POST /v1/completions`.

use super::{Generation, GenerationRequest, request_id};
use crate::api::error::Problem;
use crate::api::openai::CompletionRequest;
use crate::api::sampling::WithSampling;
use crate::api::sse::Flavor;
use actix_web::HttpRequest;
use serde_json::Value;
use xinf_engine::{GenerateRequest, MAX_TOP_LOGPROBS, Prompt};

/// OpenAI's default `max_tokens` for completions.
const DEFAULT_MAX_TOKENS: usize = 16;

impl GenerationRequest for CompletionRequest {
    fn generation(req: &HttpRequest, body: WithSampling<Self>) -> Result<Generation, Problem> {
        let WithSampling { mut sampling, rest: r } = body;
        if r.echo == Some(true) {
            return Err(Problem::field("echo", "api-echo-unsupported", "unsupported_parameter"));
        }
        if r.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
            return Err(Problem::field("suffix", "api-suffix-unsupported", "unsupported_parameter"));
        }
        let choices = sampling.choices()?;
        if r.best_of.is_some_and(|b| b != choices as u64) {
            return Err(Problem::field("best_of", "api-best-of-unsupported", "unsupported_parameter"));
        }
        if r.logprobs.is_some_and(|n| n > MAX_TOP_LOGPROBS as u64) {
            return Err(Problem::field("logprobs", "api-logprobs-too-many", "invalid_value"));
        }
        let prompt = prompt(r.prompt)?;
        sampling.max_tokens.get_or_insert(DEFAULT_MAX_TOKENS);
        let logit_bias = crate::api::sampling::logit_bias(r.logit_bias.as_ref())?;
        let mut sampling = sampling.into_params()?;
        // The count was checked above.
        sampling.logprobs = r.logprobs.map(|n| n as usize);
        sampling.logit_bias = logit_bias;
        let request_id = request_id(req, r.request_id, "cmpl")?;
        Ok(Generation {
            model: r.model,
            request: GenerateRequest { request_id, prompt, sampling },
            choices,
            stream: r.stream.unwrap_or(false),
            include_usage: r.stream_options.and_then(|o| o.include_usage).unwrap_or(false),
            flavor: Flavor::Completion,
        })
    }
}

/// The prompt: a string, a list of token ids, or a list holding exactly one of them.
fn prompt(value: Value) -> Result<Prompt, Problem> {
    let invalid = || Problem::field("prompt", "api-prompt-invalid", "invalid_value");
    match value {
        Value::String(s) => Ok(Prompt::Text(s)),
        Value::Array(items) => {
            if items.is_empty() {
                return Err(Problem::field("prompt", "api-prompt-empty", "invalid_value"));
            }
            if items.iter().all(Value::is_number) {
                return token_ids(&items).map(Prompt::Tokens).ok_or_else(invalid);
            }
            if items.len() > 1 {
                if items.iter().all(|v| v.is_string() || v.is_array()) {
                    return Err(Problem::field_with(
                        "prompt",
                        "api-prompt-batch",
                        "unsupported_parameter",
                        ("count", items.len().to_string()),
                    ));
                }
                return Err(invalid());
            }
            match items.into_iter().next() {
                Some(Value::String(s)) => Ok(Prompt::Text(s)),
                Some(Value::Array(ids)) if !ids.is_empty() => {
                    token_ids(&ids).map(Prompt::Tokens).ok_or_else(invalid)
                }
                Some(Value::Array(_)) => Err(Problem::field("prompt", "api-prompt-empty", "invalid_value")),
                _ => Err(invalid()),
            }
        }
        _ => Err(invalid()),
    }
}

fn token_ids(items: &[Value]) -> Option<Vec<u32>> {
    items.iter().map(|v| v.as_u64().and_then(|n| u32::try_from(n).ok())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn code(r: Result<Prompt, Problem>) -> String {
        match r {
            Ok(p) => format!("{p:?}"),
            Err(Problem::Field { key, .. }) => key.to_owned(),
            Err(other) => format!("{other:?}"),
        }
    }

    #[test]
    fn prompt_forms() {
        assert_eq!(prompt(json!("hi")).ok(), Some(Prompt::Text("hi".into())));
        assert_eq!(prompt(json!(["hi"])).ok(), Some(Prompt::Text("hi".into())));
        assert_eq!(prompt(json!([1, 2])).ok(), Some(Prompt::Tokens(vec![1, 2])));
        assert_eq!(prompt(json!([[1, 2]])).ok(), Some(Prompt::Tokens(vec![1, 2])));
        assert_eq!(code(prompt(json!(["a", "b"]))), "api-prompt-batch");
        assert_eq!(code(prompt(json!([[1], [2]]))), "api-prompt-batch");
        assert_eq!(code(prompt(json!([]))), "api-prompt-empty");
        assert_eq!(code(prompt(json!([-1]))), "api-prompt-invalid");
        assert_eq!(code(prompt(json!([1.5]))), "api-prompt-invalid");
        assert_eq!(code(prompt(json!({"a": 1}))), "api-prompt-invalid");
    }
}
