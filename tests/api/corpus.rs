//! The bad-input corpus: hundreds of malformed generation requests, each refused with a 4xx in
//! OpenAI's error shape naming the field at fault, while the server keeps answering a good
//! request with the same greedy text.

use super::{UID, chat, completion, merged, shared};
use crate::util::http;
use serde_json::{Value, json};

/// Values of the wrong JSON type for a field that takes a number.
fn not_numbers() -> Vec<Value> {
    vec![json!("7"), json!(""), json!(true), json!([1]), json!({"v": 1})]
}

/// Values of the wrong JSON type for a field that takes a boolean.
fn not_booleans() -> Vec<Value> {
    vec![json!("yes"), json!(1), json!([true]), json!({"v": true})]
}

/// `(field, bad value)` pairs that both generation APIs must refuse, naming the field.
fn sampling_cases() -> Vec<(&'static str, Value)> {
    let mut cases = Vec::new();
    let numeric = [
        "max_tokens",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "seed",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "n",
    ];
    for field in numeric {
        cases.extend(not_numbers().into_iter().map(|v| (field, v)));
    }
    let out_of_range = [
        ("max_tokens", json!(-1)),
        ("max_tokens", json!(1.5)),
        ("max_tokens", json!(1e300)),
        ("temperature", json!(-0.5)),
        ("temperature", json!(2.5)),
        ("top_p", json!(0)),
        ("top_p", json!(1.5)),
        ("top_p", json!(-1)),
        ("top_k", json!(-5)),
        ("top_k", json!(1.5)),
        ("min_p", json!(-0.1)),
        ("min_p", json!(1.5)),
        ("seed", json!(-1)),
        ("seed", json!(1.5)),
        ("presence_penalty", json!(3)),
        ("presence_penalty", json!(-3)),
        ("frequency_penalty", json!(2.5)),
        ("frequency_penalty", json!(-2.5)),
        ("repetition_penalty", json!(0)),
        ("repetition_penalty", json!(-1)),
        ("n", json!(17)),
        ("n", json!(0)),
        ("prompt_logprobs", json!(21)),
        ("prompt_logprobs", json!(-1)),
        ("prompt_logprobs", json!("x")),
        ("stop", json!(5)),
        ("stop", json!([1])),
        ("stop", json!(["a", 1])),
        ("stop", json!({"s": "a"})),
        ("stop", json!(true)),
        ("stop_token_ids", json!("2")),
        ("stop_token_ids", json!([-1])),
        ("stop_token_ids", json!([1.5])),
        ("stop_token_ids", json!({"id": 2})),
        ("request_id", json!(5)),
        ("request_id", json!(["r"])),
        ("request_id", json!("")),
        ("request_id", json!("x".repeat(300))),
        ("stream_options", json!("usage")),
        ("stream_options", json!({"include_usage": "yes"})),
        ("stream_options", json!({"bogus": true})),
        ("stream_options", json!({"include_usage": true})),
        ("model", json!(5)),
        ("model", json!(["smollm2"])),
        ("model", json!(null)),
    ];
    cases.extend(out_of_range);
    for field in ["stream", "ignore_eos"] {
        cases.extend(not_booleans().into_iter().map(|v| (field, v)));
    }
    for unknown in ["foo", "temprature", "Max_tokens", "max-tokens", "use_beam_search", "guided_json"] {
        cases.push((unknown, json!(1)));
    }
    cases
}

/// Chat-only `(body, param)` cases: messages, and fields chat has and completions has not.
fn chat_cases() -> Vec<(Value, String)> {
    let mut cases: Vec<(Value, String)> = Vec::new();
    let bad_messages = [
        (json!("hi"), "messages"),
        (json!(5), "messages"),
        (json!({"role": "user"}), "messages"),
        (json!([]), "messages"),
        (json!([5]), "messages[0]"),
        (json!(["hi"]), "messages[0]"),
        (json!([{"content": "x"}]), "messages[0].role"),
        (json!([{"role": 5, "content": "x"}]), "messages[0].role"),
        (json!([{"role": "robot", "content": "x"}]), "messages[0].role"),
        (json!([{"role": "user"}]), "messages[0].content"),
        (json!([{"role": "user", "content": null}]), "messages[0].content"),
        (json!([{"role": "user", "content": 5}]), "messages[0].content"),
        (json!([{"role": "user", "content": {"text": "x"}}]), "messages[0].content"),
        (json!([{"role": "user", "content": [5]}]), "messages[0].content"),
        (json!([{"role": "user", "content": [{"type": "text"}]}]), "messages[0].content"),
        (
            json!([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]),
            "messages[0].content",
        ),
        (json!([{"role": "user", "content": [{"type": "input_audio"}]}]), "messages[0].content"),
        (json!([{"role": "user", "content": "x", "extra": 1}]), "messages[0].extra"),
        (json!([{"role": "system"}, {"role": "user", "content": "x"}]), "messages[0].content"),
        (
            json!([{"role": "user", "content": "x"}, {"role": "function", "content": "1", "name": "f"}]),
            "messages[1].role",
        ),
        (
            json!([{"role": "user", "content": "x"}, {"role": "tool", "tool_call_id": "c"}]),
            "messages[1].content",
        ),
        (
            json!([{"role": "assistant", "content": "x", "tool_calls": [{"id": "c"}]}]),
            "messages[0].tool_calls[0]",
        ),
        (
            json!([{"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": 1}}]}]),
            "messages[0].tool_calls[0].function.arguments",
        ),
        (
            json!([{"role": "user", "content": "x", "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{}"}}]}]),
            "messages[0].tool_calls",
        ),
        (json!([{"role": "tool", "content": "1", "tool_call_id": 5}]), "messages[0].tool_call_id"),
        (
            json!([{"role": "assistant", "content": "x", "function_call": {"name": "f"}}]),
            "messages[0].function_call",
        ),
        (json!([{"role": "user", "content": "x", "name": "n"}, 7]), "messages[1]"),
    ];
    for (messages, param) in bad_messages {
        cases.push((json!({"model": UID, "messages": messages}), param.to_owned()));
    }
    let refused = [
        ("max_completion_tokens", json!("7")),
        ("max_completion_tokens", json!(-3)),
        ("logprobs", json!("x")),
        ("top_logprobs", json!(3)),
        ("top_logprobs", json!(21)),
        ("top_logprobs", json!(-1)),
        ("top_logprobs", json!("x")),
        ("response_format", json!({"type": "grammar"})),
        ("response_format", json!({})),
        ("response_format", json!(5)),
        ("tools", json!([{"type": "function", "function": {"name": "f g"}}])),
        ("tools", json!({"type": "function"})),
        ("tools", json!([{"type": "retrieval"}])),
        ("tools", json!([{"type": "function", "function": {"name": "f", "extra": 1}}])),
        ("tool_choice", json!("auto")),
        ("tool_choice", json!("required")),
        ("tool_choice", json!({"type": "function"})),
        ("parallel_tool_calls", json!("yes")),
        ("functions", json!([{"name": "f"}])),
        ("function_call", json!({"name": "f"})),
        ("logit_bias", json!({"15": 101})),
        ("logit_bias", json!({"x": 1})),
        ("prompt", json!("not a chat field")),
        ("echo", json!(true)),
    ];
    for (field, value) in refused {
        cases.push((chat(json!({ field: value })), field.to_owned()));
    }
    for format in [json!({"type": "json_schema", "json_schema": {}}), json!({"type": "json_schema"})] {
        cases.push((
            chat(json!({"response_format": format})),
            "response_format.json_schema.schema".to_owned(),
        ));
    }
    cases
}

/// Completion-only `(body, param)` cases: the prompt and fields completions has and chat has
/// not.
fn completion_cases() -> Vec<(Value, String)> {
    let mut cases: Vec<(Value, String)> = Vec::new();
    let bad_prompts = [
        json!(5),
        json!(true),
        json!({"text": "x"}),
        json!([]),
        json!([[]]),
        json!(["a", 5]),
        json!([["a"]]),
        json!([[1, 2], []]),
        json!([-1]),
        json!([1.5]),
        json!(["a", 1]),
        json!([999_999_999]),
        json!([[999_999_999]]),
        json!(null),
    ];
    for prompt in bad_prompts {
        cases.push((json!({"model": UID, "prompt": prompt}), "prompt".to_owned()));
    }
    cases.push((json!({"model": UID}), "prompt".to_owned()));
    let refused = [
        ("echo", json!("yes")),
        ("suffix", json!("end")),
        ("suffix", json!(5)),
        ("logprobs", json!(21)),
        ("logprobs", json!(-1)),
        ("logprobs", json!("x")),
        ("best_of", json!(2)),
        ("best_of", json!(0)),
        ("best_of", json!("x")),
        ("logit_bias", json!({"15": 101})),
        ("logit_bias", json!({"x": 1})),
        ("messages", json!([{"role": "user", "content": "x"}])),
    ];
    for (field, value) in refused {
        cases.push((completion(json!({ field: value })), field.to_owned()));
    }
    cases
}

/// Every case as `(path, body, param)`: the sampling cases on both APIs, then each API's own.
fn corpus() -> Vec<(&'static str, Value, String)> {
    let mut all = Vec::new();
    for (field, value) in sampling_cases() {
        let extra = json!({ field: value });
        all.push(("/v1/chat/completions", merged(chat(json!({})), extra.clone()), field.to_owned()));
        all.push(("/v1/completions", merged(completion(json!({})), extra), field.to_owned()));
    }
    all.extend(chat_cases().into_iter().map(|(b, p)| ("/v1/chat/completions", b, p)));
    all.extend(completion_cases().into_iter().map(|(b, p)| ("/v1/completions", b, p)));
    all
}

/// The greedy answer of a good request, the reference every check compares with.
fn good_answer(addr: std::net::SocketAddr) -> String {
    let res = http::post(addr, "/v1/completions", &completion(json!({"max_tokens": 6, "temperature": 0})));
    assert_eq!(res.status, 200, "{}", res.text());
    res.json()["choices"][0]["text"].as_str().unwrap_or_default().to_owned()
}

/// Bodies that are not JSON objects at all: a good chat body cut short at every third byte, and
/// other shapes. Refused with 400 in the error shape (no field to name).
fn raw_bodies() -> Vec<Vec<u8>> {
    let good = chat(json!({"max_tokens": 4})).to_string().into_bytes();
    let mut bodies: Vec<Vec<u8>> = (1..good.len()).step_by(3).map(|n| good[..n].to_vec()).collect();
    for other in ["", "null", "[]", "[1, 2]", "\"chat\"", "42", "{]", "{\"model\": }", "\u{0}\u{1}\u{2}"] {
        bodies.push(other.as_bytes().to_vec());
    }
    bodies.push(b"\xff\xfe{\"model\": 1}".to_vec());
    bodies.push(format!("{} trailing", String::from_utf8_lossy(&good)).into_bytes());
    bodies
}

/// Whether a response is a 4xx in OpenAI's error shape (a message, a type, a code).
fn refused_in_shape(res: &http::Response) -> Option<Value> {
    let parsed: Value = serde_json::from_slice(&res.body).ok()?;
    let e = &parsed["error"];
    let shaped = e["message"].as_str().is_some_and(|m| !m.is_empty())
        && e["type"].is_string()
        && e["code"].is_string();
    ((400..500).contains(&res.status) && shaped).then(|| e.clone())
}

#[test]
fn the_bad_input_corpus_is_refused_naming_each_field_and_the_server_keeps_answering() {
    let s = shared();
    let addr = s.addr();
    let want = good_answer(addr);
    assert!(!want.is_empty());
    let cases = corpus();
    let raw = raw_bodies();
    assert!(cases.len() + raw.len() >= 300, "{} cases", cases.len() + raw.len());
    let mut failures = Vec::new();
    for (i, (path, body, param)) in cases.iter().enumerate() {
        let res = http::post(addr, path, body);
        let named = refused_in_shape(&res)
            .is_some_and(|e| e["param"].as_str().is_some_and(|p| p.starts_with(param.as_str())));
        if !named {
            failures.push(format!("{path} {body} → {} {} (wanted param {param})", res.status, res.text()));
        }
        if i % 40 == 39 {
            assert_eq!(good_answer(addr), want, "after case {i}");
        }
    }
    for (i, body) in raw.iter().enumerate() {
        let path = if i % 2 == 0 { "/v1/chat/completions" } else { "/v1/completions" };
        let res = http::request(addr, "POST", path, &[], body);
        if refused_in_shape(&res).is_none() {
            failures.push(format!(
                "{path} {:?} → {} {}",
                String::from_utf8_lossy(body),
                res.status,
                res.text()
            ));
        }
    }
    assert_eq!(good_answer(addr), want);
    let total = cases.len() + raw.len();
    assert!(failures.is_empty(), "{} of {total} cases:\n{}", failures.len(), failures.join("\n"));
}
