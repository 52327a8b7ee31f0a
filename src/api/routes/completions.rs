//! `POST /v1/completions`.

use super::{Generation, GenerationRequest, request_id};
use crate::api::choices::MAX_FANOUT;
use crate::api::echo::PromptShown;
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
        let prompts = prompts(r.prompt)?;
        if prompts.len() * choices > MAX_FANOUT {
            return Err(Problem::field_with(
                "prompt",
                "api-prompt-batch-too-large",
                "invalid_value",
                ("count", prompts.len().to_string()),
            ));
        }
        let echo = r.echo == Some(true);
        // `echo` with `max_tokens: 0` (as vLLM takes it) shows the prompt alone: the engine
        // generates one token, which the answer leaves out.
        let prompt_only = echo && sampling.max_tokens == Some(0);
        if prompt_only {
            sampling.max_tokens = Some(1);
        }
        sampling.max_tokens.get_or_insert(DEFAULT_MAX_TOKENS);
        let logit_bias = crate::api::sampling::logit_bias(r.logit_bias.as_ref())?;
        // Not in OpenAI's completions API; vLLM takes it there too.
        let structured = crate::api::response_format::read_either(
            r.response_format.as_ref(),
            r.structured_outputs.as_ref(),
        )?;
        let shape_param = crate::api::response_format::shape_param(r.structured_outputs.as_ref());
        let mut sampling = sampling.into_params()?;
        sampling.structured = structured;
        // The count was checked above.
        sampling.logprobs = r.logprobs.map(|n| n as usize);
        sampling.logit_bias = logit_bias;
        let stream = r.stream.unwrap_or(false);
        let shown = PromptShown {
            prompt_only,
            // The client's text is shown as given; token ids as the engine decodes them.
            echo: echo.then(|| {
                prompts.iter().map(|p| if let Prompt::Text(t) = p { Some(t.clone()) } else { None }).collect()
            }),
            echo_logprobs: if echo { sampling.logprobs } else { None },
            prompt_logprobs: crate::api::echo::read_prompt_logprobs(r.prompt_logprobs, stream)?,
        };
        sampling.prompt_logprobs = shown.engine_count();
        sampling.echo = echo;
        let request_id = request_id(req, r.request_id, "cmpl")?;
        Ok(Generation {
            model: r.model,
            requests: prompts
                .into_iter()
                .map(|prompt| GenerateRequest {
                    request_id: request_id.clone(),
                    prompt,
                    sampling: sampling.clone(),
                })
                .collect(),
            choices,
            stream,
            include_usage: super::include_usage(r.stream_options, stream)?,
            flavor: Flavor::Completion,
            tools: None,
            shape_param,
            shown,
        })
    }
}

/// The prompts: a string, a list of token ids, or a list of strings and token-id lists (a
/// batch, each answered as its own choices).
fn prompts(value: Value) -> Result<Vec<Prompt>, Problem> {
    let invalid = || Problem::field("prompt", "api-prompt-invalid", "invalid_value");
    let empty = || Problem::field("prompt", "api-prompt-empty", "invalid_value");
    match value {
        Value::String(s) => Ok(vec![Prompt::Text(s)]),
        Value::Array(items) if items.is_empty() => Err(empty()),
        Value::Array(items) if items.iter().all(Value::is_number) => {
            token_ids(&items).map(|ids| vec![Prompt::Tokens(ids)]).ok_or_else(invalid)
        }
        Value::Array(items) => items
            .into_iter()
            .map(|item| match item {
                Value::String(s) => Ok(Prompt::Text(s)),
                Value::Array(ids) if ids.is_empty() => Err(empty()),
                Value::Array(ids) => token_ids(&ids).map(Prompt::Tokens).ok_or_else(invalid),
                _ => Err(invalid()),
            })
            .collect(),
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

    fn code(r: Result<Vec<Prompt>, Problem>) -> String {
        match r {
            Ok(p) => format!("{p:?}"),
            Err(Problem::Field { key, .. }) => key.to_owned(),
            Err(other) => format!("{other:?}"),
        }
    }

    #[test]
    fn prompt_forms() {
        let text = |s: &str| Prompt::Text(s.into());
        assert_eq!(prompts(json!("hi")).ok(), Some(vec![text("hi")]));
        assert_eq!(prompts(json!(["hi"])).ok(), Some(vec![text("hi")]));
        assert_eq!(prompts(json!([1, 2])).ok(), Some(vec![Prompt::Tokens(vec![1, 2])]));
        assert_eq!(prompts(json!([[1, 2]])).ok(), Some(vec![Prompt::Tokens(vec![1, 2])]));
        assert_eq!(prompts(json!(["a", "b"])).ok(), Some(vec![text("a"), text("b")]));
        assert_eq!(
            prompts(json!([[1], "b", [2, 3]])).ok(),
            Some(vec![Prompt::Tokens(vec![1]), text("b"), Prompt::Tokens(vec![2, 3])])
        );
        assert_eq!(code(prompts(json!([]))), "api-prompt-empty");
        assert_eq!(code(prompts(json!(["a", []]))), "api-prompt-empty");
        assert_eq!(code(prompts(json!([-1]))), "api-prompt-invalid");
        assert_eq!(code(prompts(json!([1.5]))), "api-prompt-invalid");
        assert_eq!(code(prompts(json!(["a", 1]))), "api-prompt-invalid");
        assert_eq!(code(prompts(json!([["a"]]))), "api-prompt-invalid");
        assert_eq!(code(prompts(json!({"a": 1}))), "api-prompt-invalid");
    }
}
