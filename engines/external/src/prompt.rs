//! A prompt's report ([`TokenEvent::Prompt`](xinf_engine::TokenEvent::Prompt)) from an engine
//! server: its text is xinf's decoding of the ids it sent, and its log-probabilities come from
//! a call of their own before the generation.
//!
//! Why a call of its own: vLLM lists prompt log-probabilities only in an answer that is not
//! streamed (`prompt_logprobs` with `stream` is refused), while the generation is streamed.
//! The call generates one token, greedily, and is not streamed; its prompt is computed again
//! by the generation that follows (a prefix cache, where the server keeps one, saves that).
//!
//! vLLM: `POST /v1/completions` with `prompt_logprobs: n`; the answer's
//! `choices[0].prompt_logprobs` is `null` for the first token, then an object from token id to
//! `{"logprob", "rank", "decoded_token"}` holding the prompt's token and the `n` most likely.
//! SGLang: `POST /generate` with `return_logprob`, `logprob_start_len: 0` and
//! `top_logprobs_num: n`; `meta_info.input_token_logprobs` is `[logprob, id, text]` per prompt
//! token (the first one's log-probability `null`), `input_top_logprobs` the alternatives of
//! each (`null` for the first).

use crate::Flavor;
use crate::protocol::{Scored, by_likelihood, logprob};
use serde_json::{Value, json};
use xinf_engine::{EngineError, PromptLogprobs, PromptReport, TokenLogprobs};
use xinf_models::TextTokenizer;

/// The body of the call that scores the prompt `ids` with `top` alternatives per position.
pub(crate) fn score_body(
    flavor: Flavor,
    served_name: &str,
    request_id: &str,
    ids: &[u32],
    top: usize,
) -> Value {
    let rid = format!("{request_id}-prompt");
    match flavor {
        Flavor::Vllm => json!({
            "model": served_name,
            "prompt": ids,
            "request_id": rid,
            "stream": false,
            "max_tokens": 1,
            "temperature": 0.0,
            "prompt_logprobs": top,
        }),
        Flavor::Sglang => json!({
            "input_ids": ids,
            "rid": rid,
            "stream": false,
            "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
            "return_logprob": true,
            "logprob_start_len": 0,
            "top_logprobs_num": top,
        }),
    }
}

/// Asks a generation's (not streamed) `body` to score its prompt with `top` alternatives
/// per position as well: a P/D prefill leg, whose answer then carries the scores. SGLang has
/// one count of alternatives for the prompt and the output, so the larger one is asked (each
/// report is cut to its own).
pub(crate) fn ask_scores(flavor: Flavor, body: &mut Value, top: usize) {
    match flavor {
        Flavor::Vllm => body["prompt_logprobs"] = json!(top),
        Flavor::Sglang => {
            let asked = body.get("top_logprobs_num").and_then(Value::as_u64).unwrap_or(0);
            body["return_logprob"] = json!(true);
            body["logprob_start_len"] = json!(0);
            body["top_logprobs_num"] = json!((top as u64).max(asked));
        }
    }
}

/// Each prompt token's log-probability after the first, read from the answer of
/// [`score_body`]'s call, one per token of a `prompt_len`-token prompt (less the first).
pub(crate) fn parse_scores(flavor: Flavor, v: &Value, ids: &[u32]) -> Result<Vec<Scored>, EngineError> {
    let scores = match flavor {
        Flavor::Vllm => vllm_scores(v, ids),
        Flavor::Sglang => sglang_scores(v),
    };
    let want = ids.len().saturating_sub(1);
    match scores {
        Some(s) if s.len() == want => Ok(s),
        Some(s) => Err(EngineError::Process(format!(
            "the {flavor} server scored {} prompt tokens of {want}",
            s.len()
        ))),
        None => {
            Err(EngineError::Process(format!("the {flavor} server's answer has no prompt log-probabilities")))
        }
    }
}

/// vLLM's `choices[0].prompt_logprobs`, positions `1..`: the prompt's own token read by its id.
fn vllm_scores(v: &Value, ids: &[u32]) -> Option<Vec<Scored>> {
    let list = v.get("choices")?.get(0)?.get("prompt_logprobs")?.as_array()?;
    let mut out = Vec::with_capacity(list.len().saturating_sub(1));
    for (position, &id) in list.iter().zip(ids).skip(1) {
        let entries = position.as_object()?;
        let mine = entries.get(&id.to_string())?;
        let top =
            entries.iter().filter_map(|(k, e)| Some((k.parse().ok()?, logprob(e.get("logprob"))))).collect();
        let rank = mine.get("rank").and_then(Value::as_u64).and_then(|r| u32::try_from(r).ok());
        out.push(Scored { logprob: logprob(mine.get("logprob")), top: by_likelihood(top), rank });
    }
    Some(out)
}

/// SGLang's `meta_info.input_token_logprobs` and `input_top_logprobs`, positions `1..`.
fn sglang_scores(v: &Value) -> Option<Vec<Scored>> {
    let meta = v.get("meta_info")?;
    let chosen = meta.get("input_token_logprobs")?.as_array()?;
    let tops = meta.get("input_top_logprobs").and_then(Value::as_array);
    let entry = |e: &Value| Some((u32::try_from(e.get(1)?.as_u64()?).ok()?, logprob(e.get(0))));
    let out = chosen
        .iter()
        .enumerate()
        .skip(1)
        .map(|(i, c)| {
            let top = tops
                .and_then(|t| t.get(i))
                .and_then(Value::as_array)
                .map(|t| t.iter().filter_map(entry).collect())
                .unwrap_or_default();
            Scored { logprob: logprob(c.get(0)), top: by_likelihood(top), rank: None }
        })
        .collect();
    Some(out)
}

/// The report of prompt `ids`: their decoding, and with `rest` the log-probabilities of every
/// token after the first.
pub(crate) fn report(
    ids: &[u32],
    tokenizer: &TextTokenizer,
    rest: Option<Vec<TokenLogprobs>>,
) -> Box<PromptReport> {
    let text = tokenizer.decode(ids, false).unwrap_or_default();
    let logprobs = rest.map(|rest| PromptLogprobs {
        first: ids.first().and_then(|&t| tokenizer.decode(&[t], false).ok()).unwrap_or_default(),
        rest,
    });
    Box::new(PromptReport { token_ids: ids.to_vec(), text, logprobs })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefill_leg_asks_its_server_for_the_prompt_s_scores_in_its_own_shape() {
        let mut vllm = json!({"logprobs": 1});
        ask_scores(Flavor::Vllm, &mut vllm, 3);
        assert_eq!(vllm, json!({"logprobs": 1, "prompt_logprobs": 3}));
        // SGLang: one count of alternatives for prompt and output, the larger one.
        for (output, prompt, want) in [(Some(5), 2, 5), (Some(1), 4, 4), (None, 2, 2)] {
            let mut body = json!({"input_ids": [1, 2]});
            if let Some(k) = output {
                body["return_logprob"] = json!(true);
                body["top_logprobs_num"] = json!(k);
                body["logprob_start_len"] = json!(-1);
            }
            ask_scores(Flavor::Sglang, &mut body, prompt);
            assert_eq!(
                (&body["return_logprob"], &body["logprob_start_len"], &body["top_logprobs_num"]),
                (&json!(true), &json!(0), &json!(want))
            );
        }
    }
}
