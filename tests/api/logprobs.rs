//! Token log-probabilities through both generation APIs, whole and streamed, on the real
//! default model.

use super::{assert_error, chat, chunks, completion, merged, shared};
use crate::util::http;
use serde_json::{Value, json};

/// Greedy tokens' log-probabilities in chat's shape: one entry per generated token (the end
/// of sequence included, as usage counts it), the token first among its alternatives.
fn assert_chat_logprobs(content: &Value, tokens: u64, top: usize) {
    let content = content.as_array().expect("logprobs.content");
    assert_eq!(content.len() as u64, tokens, "{content:?}");
    for t in content {
        let (token, logprob) = (t["token"].as_str().expect("token"), t["logprob"].as_f64().expect("logprob"));
        assert!(logprob <= 0.0 && logprob > -100.0, "{t}");
        let bytes: Vec<u8> =
            t["bytes"].as_array().expect("bytes").iter().map(|b| b.as_u64().expect("byte") as u8).collect();
        assert_eq!(bytes, token.as_bytes(), "{t}");
        let alternatives = t["top_logprobs"].as_array().expect("top_logprobs");
        assert_eq!(alternatives.len(), top, "{t}");
        if top > 0 {
            assert_eq!(alternatives[0]["token"], t["token"], "greedy takes the most likely: {t}");
            assert_eq!(alternatives[0]["logprob"], t["logprob"], "{t}");
        }
        let values: Vec<f64> = alternatives.iter().map(|a| a["logprob"].as_f64().expect("logprob")).collect();
        assert!(values.windows(2).all(|w| w[0] >= w[1]), "most likely first: {t}");
        // The alternatives' probabilities cannot add up to more than 1.
        assert!(values.iter().map(|v| v.exp()).sum::<f64>() <= 1.0 + 1e-4, "{t}");
    }
}

#[test]
fn logprobs_come_with_every_token_in_both_apis() {
    let s = shared();
    let a = s.addr();
    // Chat: whole and streamed, the same greedy tokens with the same log-probabilities.
    let req = chat(json!({"max_tokens": 12, "temperature": 0, "logprobs": true, "top_logprobs": 3}));
    let res = http::post(a, "/v1/chat/completions", &req);
    assert_eq!(res.status, 200, "{}", res.text());
    let whole = res.json();
    let tokens = whole["usage"]["completion_tokens"].as_u64().expect("usage");
    let content = &whole["choices"][0]["logprobs"]["content"];
    assert_chat_logprobs(content, tokens, 3);
    let streamed: Vec<Value> =
        chunks(&http::post(a, "/v1/chat/completions", &merged(req.clone(), json!({"stream": true}))))
            .iter()
            .filter_map(|c| c["choices"][0]["logprobs"]["content"].as_array().cloned())
            .flatten()
            .collect();
    assert_eq!(Value::from(streamed), *content);
    // Without top_logprobs: the chosen token's alone; without logprobs: null.
    let bare = http::post(a, "/v1/chat/completions", &merged(req.clone(), json!({"top_logprobs": 0}))).json();
    assert_chat_logprobs(&bare["choices"][0]["logprobs"]["content"], tokens, 0);
    let none = http::post(a, "/v1/chat/completions", &chat(json!({"max_tokens": 2}))).json();
    assert!(none["choices"][0]["logprobs"].is_null(), "{none}");

    // Completions: parallel lists, offsets into the text, alternatives by text.
    let req = completion(json!({"max_tokens": 8, "temperature": 0, "logprobs": 2, "ignore_eos": true}));
    let whole = http::post(a, "/v1/completions", &req).json();
    let choice = &whole["choices"][0];
    let l = &choice["logprobs"];
    let list = |k: &str| l[k].as_array().cloned().unwrap_or_else(|| panic!("{k}: {whole}"));
    let (toks, lps, tops, offsets) =
        (list("tokens"), list("token_logprobs"), list("top_logprobs"), list("text_offset"));
    assert!(
        [lps.len(), tops.len(), offsets.len()].iter().all(|&n| n == toks.len()) && toks.len() == 8,
        "{l}"
    );
    let text: String = toks.iter().map(|t| t.as_str().expect("token")).collect();
    assert_eq!(text, choice["text"].as_str().expect("text"), "the tokens spell the text");
    let mut at = 0;
    for (i, t) in toks.iter().enumerate() {
        assert_eq!(offsets[i].as_u64(), Some(at as u64), "{l}");
        at += t.as_str().expect("token").chars().count();
        assert_eq!(
            tops[i][t.as_str().expect("token")],
            lps[i],
            "the greedy token is its own top alternative: {l}"
        );
    }
    let streamed: Vec<Value> =
        chunks(&http::post(a, "/v1/completions", &merged(req, json!({"stream": true}))))
            .iter()
            .filter_map(|c| c["choices"][0]["logprobs"]["token_logprobs"].as_array().cloned())
            .flatten()
            .collect();
    assert_eq!(streamed, lps);
}

#[test]
fn out_of_range_logprobs_are_refused_naming_the_field() {
    let a = shared().addr();
    let cases = [
        (
            "/v1/chat/completions",
            chat(json!({"logprobs": true, "top_logprobs": 21})),
            "top_logprobs",
            "at most 20",
        ),
        ("/v1/chat/completions", chat(json!({"top_logprobs": 3})), "top_logprobs", "`logprobs`"),
        ("/v1/completions", completion(json!({"logprobs": 21})), "logprobs", "at most 20"),
    ];
    for (route, body, param, needle) in cases {
        assert_error(&http::post(a, route, &body), 400, Some(param), needle);
    }
}

/// `echo` with `logprobs` and one output token, as lm-evaluation-harness scores a text: the
/// prompt's tokens first (the first without a log-probability), their log-probabilities those
/// of vLLM's `prompt_logprobs`, then the output's; the text is the prompt's and the output's;
/// a stream sends the same.
#[test]
fn an_echoed_prompt_comes_with_its_log_probabilities() {
    let a = shared().addr();
    let prompt = "The capital of France is";
    let req = json!({"model": super::UID, "prompt": prompt, "max_tokens": 1, "temperature": 0,
        "logprobs": 2, "echo": true, "prompt_logprobs": 3});
    let res = http::post(a, "/v1/completions", &req);
    assert_eq!(res.status, 200, "{}", res.text());
    let whole = res.json();
    let choice = &whole["choices"][0];
    let text = choice["text"].as_str().expect("text");
    assert!(text.starts_with(prompt) && text.len() > prompt.len(), "the prompt, then the output: {text:?}");
    let prompt_tokens = whole["usage"]["prompt_tokens"].as_u64().expect("usage") as usize;
    let l = &choice["logprobs"];
    let list = |k: &str| l[k].as_array().cloned().unwrap_or_else(|| panic!("{k}: {whole}"));
    let (toks, lps, tops, offsets) =
        (list("tokens"), list("token_logprobs"), list("top_logprobs"), list("text_offset"));
    assert_eq!(toks.len(), prompt_tokens + 1, "every prompt token and the output's: {l}");
    assert!(lps[0].is_null() && tops[0].is_null(), "nothing comes before the first token: {l}");
    let spelled: String = toks.iter().map(|t| t.as_str().expect("token")).collect();
    assert_eq!(spelled, text, "the tokens spell the text");
    let mut at = 0;
    for (i, t) in toks.iter().enumerate() {
        assert_eq!(offsets[i].as_u64(), Some(at as u64), "{l}");
        at += t.as_str().expect("token").chars().count();
        if i > 0 {
            let lp = lps[i].as_f64().expect("logprob");
            assert!(lp <= 0.0, "{l}");
            let alternatives = tops[i].as_object().expect("alternatives");
            assert!(!alternatives.is_empty() && alternatives.len() <= 2, "{l}");
            let best = alternatives.values().map(|v| v.as_f64().expect("logprob")).fold(f64::MIN, f64::max);
            assert!(lp <= best + 1e-6, "no token is likelier than the likeliest: {l}");
        }
    }
    // vLLM's shape, from the same computation: each prompt token by id, with its rank.
    let vllm = choice["prompt_logprobs"].as_array().expect("prompt_logprobs");
    assert_eq!(vllm.len(), prompt_tokens);
    assert!(vllm[0].is_null());
    for (i, position) in vllm.iter().enumerate().skip(1) {
        let entries = position.as_object().expect("entries");
        assert!(entries.len() <= 4, "the prompt's token and the 3 most likely: {position}");
        let mine = entries.values().find(|e| e["decoded_token"] == toks[i]).expect("the prompt's token");
        assert_eq!(mine["logprob"].as_f64(), lps[i].as_f64(), "{position}");
        assert!(mine["rank"].as_u64().is_some_and(|r| r >= 1), "{position}");
    }
    // Streamed: the echo first, then the output, the same lists.
    let events = chunks(&http::post(
        a,
        "/v1/completions",
        &merged(req.clone(), json!({"stream": true, "prompt_logprobs": null})),
    ));
    let streamed: String = events.iter().filter_map(|c| c["choices"][0]["text"].as_str()).collect();
    assert_eq!(streamed, text);
    let streamed_lps: Vec<Value> = events
        .iter()
        .filter_map(|c| c["choices"][0]["logprobs"]["token_logprobs"].as_array().cloned())
        .flatten()
        .collect();
    assert_eq!(streamed_lps, lps);
    // A prompt of token ids echoes their decoding; without logprobs, no lists.
    let ids = json!({"model": super::UID, "prompt": [504, 3575, 282], "max_tokens": 2, "echo": true});
    let out = http::post(a, "/v1/completions", &ids).json();
    assert!(out["choices"][0]["logprobs"].is_null(), "{out}");
    assert!(out["choices"][0]["prompt_logprobs"].is_null(), "{out}");
    assert_eq!(out["usage"]["prompt_tokens"], 3, "{out}");
    assert!(out["choices"][0]["text"].as_str().is_some_and(|t| t.len() > 2), "{out}");
}

/// Chat answers vLLM's `prompt_logprobs` at the top of the response; a stream refuses a count
/// above 0, as vLLM does.
#[test]
fn chat_reports_prompt_log_probabilities() {
    let a = shared().addr();
    let res = http::post(a, "/v1/chat/completions", &chat(json!({"max_tokens": 2, "prompt_logprobs": 0})));
    assert_eq!(res.status, 200, "{}", res.text());
    let body = res.json();
    let list = body["prompt_logprobs"].as_array().expect("prompt_logprobs");
    assert_eq!(list.len() as u64, body["usage"]["prompt_tokens"].as_u64().expect("usage"));
    assert!(
        list[0].is_null() && list[1..].iter().all(|p| p.as_object().is_some_and(|o| o.len() == 1)),
        "{body}"
    );
    let streamed = chat(json!({"max_tokens": 2, "prompt_logprobs": 1, "stream": true}));
    assert_error(&http::post(a, "/v1/chat/completions", &streamed), 400, Some("prompt_logprobs"), "stream");
    let plain = http::post(a, "/v1/chat/completions", &chat(json!({"max_tokens": 2}))).json();
    assert!(plain.get("prompt_logprobs").is_none(), "{plain}");
}

/// `echo` with `max_tokens: 0` answers the prompt alone, as vLLM does: its text, its tokens'
/// log-probabilities, no output; without `echo`, 0 tokens is refused.
#[test]
fn an_echo_of_no_tokens_is_the_prompt_alone() {
    let a = shared().addr();
    let prompt = "The capital of France is";
    let req = json!({"model": super::UID, "prompt": prompt, "max_tokens": 0, "echo": true, "logprobs": 1});
    let whole = http::post(a, "/v1/completions", &req).json();
    let choice = &whole["choices"][0];
    assert_eq!(choice["text"], prompt, "{whole}");
    assert_eq!(choice["finish_reason"], "length", "{whole}");
    assert_eq!(whole["usage"]["completion_tokens"], 0, "{whole}");
    let tokens = choice["logprobs"]["tokens"].as_array().expect("tokens");
    assert_eq!(Some(tokens.len() as u64), whole["usage"]["prompt_tokens"].as_u64(), "{whole}");
    let events = chunks(&http::post(a, "/v1/completions", &merged(req, json!({"stream": true}))));
    let streamed: String = events.iter().filter_map(|c| c["choices"][0]["text"].as_str()).collect();
    assert_eq!(streamed, prompt);
    let bare = completion(json!({"max_tokens": 0}));
    assert_error(&http::post(a, "/v1/completions", &bare), 400, Some("max_tokens"), "");
}
