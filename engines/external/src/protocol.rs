//! What xinf sends each engine server and how it reads the answer: the prompt always goes as
//! token ids (xinf tokenizes once, so both sides of a handoff see the same ids), the answer is a
//! server-sent-event stream whose chunks carry the new token ids and text.
//!
//! vLLM: `POST /v1/completions` with `return_token_ids` (each chunk's `choices[0].token_ids`
//! are the new ids) and `stream_options.include_usage`. SGLang: `POST /generate` with
//! `input_ids`, started with `--incremental-streaming-output` (each chunk's `output_ids` are
//! the new ids; `meta_info` carries the finish reason and the counts).
//!
//! Log-probabilities, when a request asks for them: vLLM's `logprobs` (the completions API's
//! lists, with `return_tokens_as_token_ids` so that tokens come as `token_id:N`), SGLang's
//! `return_logprob` and `top_logprobs_num` (`meta_info.output_token_logprobs` and
//! `output_top_logprobs`, `[logprob, id, text]` each, sliced per chunk like `output_ids`).

use crate::Flavor;
use serde_json::{Value, json};
use xinf_engine::{EngineError, FinishReason, SamplingParams, StructuredOutput, Usage};

/// What one chunk of an engine's stream says.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Chunk {
    /// New token ids.
    pub(crate) token_ids: Vec<u32>,
    /// New text.
    pub(crate) text: String,
    /// Set on the last chunk.
    pub(crate) finish: Option<FinishReason>,
    /// Token counts, when the chunk carries them.
    pub(crate) usage: Option<Usage>,
    /// The new tokens' log-probabilities, one per id, when the request asked for them.
    pub(crate) logprobs: Vec<Scored>,
}

/// One generated token's log-probability and the most likely tokens' as the engine sent them.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct Scored {
    pub(crate) logprob: f32,
    /// `(id, logprob)`, most likely first (equal ones by id).
    pub(crate) top: Vec<(u32, f32)>,
    /// The token's rank among all, where the engine gave it.
    pub(crate) rank: Option<u32>,
}

/// The path a generation request goes to.
pub(crate) fn generate_path(flavor: Flavor) -> &'static str {
    match flavor {
        Flavor::Vllm => "/v1/completions",
        Flavor::Sglang => "/generate",
    }
}

/// The body of a streamed generation of `ids` with `sampling`. `max_new` is the output limit
/// when the request has none (what is left of the context: SGLang's own default is 128).
pub(crate) fn generate_body(
    flavor: Flavor,
    served_name: &str,
    request_id: &str,
    ids: &[u32],
    sampling: &SamplingParams,
    max_new: usize,
) -> Value {
    let max_tokens = sampling.max_tokens.unwrap_or(max_new);
    // The settings both engines spell alike.
    let mut params = json!({
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "min_p": sampling.min_p,
        "stop": sampling.stop,
        "stop_token_ids": sampling.stop_token_ids,
        "ignore_eos": sampling.ignore_eos,
        "presence_penalty": sampling.presence_penalty,
        "frequency_penalty": sampling.frequency_penalty,
        "repetition_penalty": sampling.repetition_penalty,
    });
    if !sampling.logit_bias.is_empty() {
        // Both take OpenAI's shape: token ids as strings.
        let bias: serde_json::Map<String, Value> =
            sampling.logit_bias.iter().map(|&(id, b)| (id.to_string(), json!(b))).collect();
        params["logit_bias"] = Value::Object(bias);
    }
    let seed = sampling.seed.map(|s| json!(s as i64));
    match flavor {
        Flavor::Vllm => {
            params["model"] = json!(served_name);
            params["prompt"] = json!(ids);
            params["request_id"] = json!(request_id);
            params["stream"] = json!(true);
            params["stream_options"] = json!({"include_usage": true});
            params["return_token_ids"] = json!(true);
            params["max_tokens"] = json!(max_tokens);
            params["top_k"] = json!(sampling.top_k);
            if sampling.min_tokens > 0 {
                params["min_tokens"] = json!(sampling.min_tokens);
            }
            if let Some(top) = sampling.logprobs {
                params["logprobs"] = json!(top);
                params["return_tokens_as_token_ids"] = json!(true);
            }
            if let Some(seed) = seed {
                params["seed"] = seed;
            }
            match &sampling.structured {
                Some(StructuredOutput::Regex(rx)) => params["structured_outputs"] = json!({"regex": rx}),
                Some(StructuredOutput::Choice(texts)) => {
                    params["structured_outputs"] = json!({"choice": texts})
                }
                Some(shape) => params["response_format"] = response_format(shape),
                None => {}
            }
            params
        }
        Flavor::Sglang => {
            params["max_new_tokens"] = json!(max_tokens);
            if sampling.min_tokens > 0 {
                params["min_new_tokens"] = json!(sampling.min_tokens);
            }
            // SGLang's "all tokens" is -1 (0 is refused).
            params["top_k"] = json!(if sampling.top_k == 0 { -1 } else { sampling.top_k as i64 });
            if let Some(seed) = seed {
                params["sampling_seed"] = seed;
            }
            if let Some(shape) = &sampling.structured {
                match (shape.schema(), shape.regex()) {
                    // SGLang's own OpenAI server turns `json_object` into this schema too.
                    (Some(schema), _) => params["json_schema"] = json!(schema),
                    (None, Some(rx)) => params["regex"] = json!(rx),
                    (None, None) => {}
                }
            }
            let mut body = json!({
                "input_ids": ids,
                "rid": request_id,
                "stream": true,
                "sampling_params": params,
            });
            if let Some(top) = sampling.logprobs {
                body["return_logprob"] = json!(true);
                body["top_logprobs_num"] = json!(top);
                // The output's only: no prompt log-probabilities.
                body["logprob_start_len"] = json!(-1);
            }
            body
        }
    }
}

/// OpenAI's `response_format` for `shape`, as vLLM's completions API takes it. The schema was
/// checked to be JSON when the request was (`Null` otherwise, which vLLM refuses).
fn response_format(shape: &StructuredOutput) -> Value {
    match shape.schema() {
        Some(text) if *shape != StructuredOutput::JsonObject => {
            let schema: Value = serde_json::from_str(text).unwrap_or(Value::Null);
            json!({"type": "json_schema", "json_schema": {"name": "output", "schema": schema}})
        }
        _ => json!({"type": "json_object"}),
    }
}

/// Reads one `data:` payload of an engine's stream; `None` for `[DONE]` and for chunks that
/// carry nothing xinf uses.
pub(crate) fn parse_chunk(flavor: Flavor, data: &str) -> Result<Option<Chunk>, EngineError> {
    if data.trim() == "[DONE]" {
        return Ok(None);
    }
    let v: Value = serde_json::from_str(data).map_err(|e| {
        EngineError::Process(format!("the engine sent a chunk that is not JSON ({e}): {data:.200}"))
    })?;
    if let Some(message) = error_message(&v) {
        // An error chunk with a server error's code is the engine failing, not a refusal.
        let code = v.get("error").and_then(|e| e.get("code")).and_then(Value::as_u64);
        if code.is_some_and(|c| c >= 500) {
            return Err(EngineError::Internal(format!(
                "the {flavor} server failed on the request: {message}"
            )));
        }
        return Err(EngineError::Rejected(message));
    }
    Ok(Some(match flavor {
        Flavor::Vllm => vllm_chunk(&v),
        Flavor::Sglang => sglang_chunk(&v),
    }))
}

fn ids(v: Option<&Value>) -> Vec<u32> {
    v.and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_u64).filter_map(|x| u32::try_from(x).ok()).collect())
        .unwrap_or_default()
}

fn finish(reason: Option<&str>) -> Option<FinishReason> {
    match reason? {
        "length" => Some(FinishReason::Length),
        "abort" => Some(FinishReason::Abort),
        _ => Some(FinishReason::Stop),
    }
}

fn count(v: &Value, key: &str) -> usize {
    v.get(key).and_then(Value::as_u64).map_or(0, |n| n as usize)
}

fn vllm_chunk(v: &Value) -> Chunk {
    let mut chunk = Chunk::default();
    if let Some(choice) = v.get("choices").and_then(Value::as_array).and_then(|c| c.first()) {
        chunk.token_ids = ids(choice.get("token_ids"));
        chunk.text = choice.get("text").and_then(Value::as_str).unwrap_or_default().to_owned();
        chunk.finish = finish(choice.get("finish_reason").and_then(Value::as_str));
        chunk.logprobs = choice.get("logprobs").map(vllm_logprobs).unwrap_or_default();
    }
    if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
        chunk.usage = Some(Usage {
            prompt_tokens: count(u, "prompt_tokens"),
            completion_tokens: count(u, "completion_tokens"),
        });
    }
    chunk
}

fn sglang_chunk(v: &Value) -> Chunk {
    let meta = v.get("meta_info");
    let reason =
        meta.and_then(|m| m.get("finish_reason")).and_then(|r| r.get("type")).and_then(Value::as_str);
    let finish = finish(reason);
    Chunk {
        token_ids: ids(v.get("output_ids")),
        text: v.get("text").and_then(Value::as_str).unwrap_or_default().to_owned(),
        finish,
        usage: meta.filter(|_| finish.is_some()).map(|m| Usage {
            prompt_tokens: count(m, "prompt_tokens"),
            completion_tokens: count(m, "completion_tokens"),
        }),
        logprobs: meta.map(sglang_logprobs).unwrap_or_default(),
    }
}

/// The first output token's log-probabilities in a whole (non-streamed) answer: vLLM's
/// `choices[0].logprobs`, SGLang's `meta_info`. `None` when the answer has none.
pub(crate) fn answer_logprobs(flavor: Flavor, v: &Value) -> Option<Scored> {
    let all = match flavor {
        Flavor::Vllm => vllm_logprobs(v.pointer("/choices/0/logprobs")?),
        Flavor::Sglang => sglang_logprobs(v.get("meta_info")?),
    };
    all.into_iter().next()
}

/// `(id, logprob)` pairs most likely first, equal ones by id.
pub(crate) fn by_likelihood(mut top: Vec<(u32, f32)>) -> Vec<(u32, f32)> {
    top.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    top
}

/// A log-probability as sent: a number, or null (minus infinity).
pub(crate) fn logprob(v: Option<&Value>) -> f32 {
    v.and_then(Value::as_f64).map_or(f32::NEG_INFINITY, |x| x as f32)
}

/// The tokens' [`Scored`] from a list of chosen entries and a parallel list of alternatives,
/// each read by the engine's own rule.
fn scored(
    chosen: &[Value],
    tops: Option<&Vec<Value>>,
    logprob_of: impl Fn(&Value) -> f32,
    top_of: impl Fn(&Value) -> Vec<(u32, f32)>,
) -> Vec<Scored> {
    let top = |i: usize| tops.and_then(|t| t.get(i)).map(&top_of).unwrap_or_default();
    chosen
        .iter()
        .enumerate()
        .map(|(i, c)| Scored { logprob: logprob_of(c), top: by_likelihood(top(i)), rank: None })
        .collect()
}

/// vLLM's completion `logprobs`: `token_logprobs[i]` and `top_logprobs[i]`, an object from
/// `token_id:N` to the log-probability (the sampled token among them).
fn vllm_logprobs(l: &Value) -> Vec<Scored> {
    let Some(chosen) = l.get("token_logprobs").and_then(Value::as_array) else { return Vec::new() };
    let top_of = |t: &Value| {
        let pairs = t.as_object().into_iter().flatten();
        pairs
            .filter_map(|(k, v)| Some((k.strip_prefix("token_id:")?.parse().ok()?, logprob(Some(v)))))
            .collect()
    };
    scored(chosen, l.get("top_logprobs").and_then(Value::as_array), |c| logprob(Some(c)), top_of)
}

/// SGLang's `meta_info.output_token_logprobs` (`[logprob, id, text]` per token) and
/// `output_top_logprobs` (a list of those per token).
fn sglang_logprobs(meta: &Value) -> Vec<Scored> {
    let entry = |e: &Value| Some((u32::try_from(e.get(1)?.as_u64()?).ok()?, logprob(e.get(0))));
    let Some(chosen) = meta.get("output_token_logprobs").and_then(Value::as_array) else { return Vec::new() };
    let top_of = |t: &Value| t.as_array().into_iter().flatten().filter_map(entry).collect();
    scored(chosen, meta.get("output_top_logprobs").and_then(Value::as_array), |c| logprob(c.get(0)), top_of)
}

/// The message of an error body, in either engine's shape (`{"error": {"message"}}`,
/// `{"error": "…"}`, `{"object": "error", "message"}`, FastAPI's `{"detail"}`).
pub(crate) fn error_message(v: &Value) -> Option<String> {
    let text = |v: &Value| match v {
        Value::String(s) => Some(s.clone()),
        Value::Null => None,
        other => Some(other.to_string()),
    };
    if let Some(e) = v.get("error") {
        // A server error may come without a message (vLLM's 500s): its type and code then.
        let message = e.get("message").and_then(text).filter(|m| !m.trim().is_empty());
        let kind = || {
            let kind = e.get("type").and_then(text)?;
            Some(match e.get("code").filter(|c| !c.is_null()) {
                Some(code) => format!("{kind} (code {})", text(code).unwrap_or_default()),
                None => kind,
            })
        };
        return message.or_else(kind).or_else(|| text(e));
    }
    if v.get("object").and_then(Value::as_str) == Some("error") {
        return v.get("message").and_then(text);
    }
    v.get("detail").and_then(text)
}

#[cfg(test)]
mod tests;
