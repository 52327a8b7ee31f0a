//! The completions API: text and token-id prompts, streamed and not, usage.

use super::{UID, chunks, completion, merged, shared, usage_ok};
use crate::util::{self, http};
use serde_json::{Value, json};

#[test]
fn completions_take_text_or_token_prompts_and_stream() {
    let s = shared();
    let post = |body: Value| {
        let res = http::post(s.addr(), "/v1/completions", &body);
        assert_eq!(res.status, 200, "{}", res.text());
        res.json()
    };
    let greedy = json!({"temperature": 0, "max_tokens": 8});
    let base = post(completion(greedy.clone()));
    assert_eq!(base["object"], "text_completion");
    assert!(base["id"].as_str().is_some_and(|id| id.starts_with("cmpl-")), "{base}");
    let text = base["choices"][0]["text"].as_str().expect("text").to_owned();
    assert!(!text.is_empty());
    usage_ok(&base["usage"]);
    assert!(base["usage"]["completion_tokens"].as_u64() <= Some(8));

    let ids = util::shared_smollm2().tokenizer().encode("The capital of France is", true).expect("encode");
    for prompt in [json!(["The capital of France is"]), json!(ids), json!([ids])] {
        let r = post(merged(json!({"model": UID, "prompt": prompt}), greedy.clone()));
        assert_eq!(r["choices"][0]["text"], text.as_str(), "prompt {prompt}");
    }

    let req = completion(json!({"temperature": 0, "max_tokens": 8, "stream": true,
        "stream_options": {"include_usage": true}}));
    let events = chunks(&http::post(s.addr(), "/v1/completions", &req));
    assert!(events.iter().all(|c| c["object"] == "text_completion"), "{events:?}");
    let (usage_chunk, rest) = events.split_last().expect("usage chunk");
    assert_eq!(usage_chunk["usage"], base["usage"]);
    assert_eq!(
        rest.last().map(|c| c["choices"][0]["finish_reason"].clone()),
        Some(base["choices"][0]["finish_reason"].clone())
    );
    let streamed: String = rest.iter().filter_map(|c| c["choices"][0]["text"].as_str()).collect();
    assert_eq!(streamed, text);

    // Without include_usage the last chunk before [DONE] is the finish chunk.
    let events = chunks(&http::post(
        s.addr(),
        "/v1/completions",
        &completion(json!({"max_tokens": 4, "stream": true})),
    ));
    assert!(events.last().is_some_and(|c| c["choices"][0]["finish_reason"].is_string()), "{events:?}");
}

#[test]
fn min_tokens_holds_the_end_of_sequence_back() {
    let a = shared().addr();
    let ask = |extra: Value| {
        let res = http::post(
            a,
            "/v1/chat/completions",
            &super::chat(merged(json!({"temperature": 0, "max_tokens": 80}), extra)),
        );
        assert_eq!(res.status, 200, "{}", res.text());
        res.json()
    };
    let free = ask(json!({}));
    assert_eq!(free["choices"][0]["finish_reason"], "stop", "{free}");
    let k = free["usage"]["completion_tokens"].as_u64().expect("usage");
    assert!(k < 60, "{free}");
    let held = ask(json!({"min_tokens": k + 10}));
    let n = held["usage"]["completion_tokens"].as_u64().expect("usage");
    assert!(n >= k + 10, "{k} tokens freely, {n} with min_tokens {}: {held}", k + 10);
    let text = held["choices"][0]["message"]["content"].as_str().unwrap_or_default();
    let first = free["choices"][0]["message"]["content"].as_str().unwrap_or_default();
    assert!(text.starts_with(first.trim_end()), "{text:?} should go on from {first:?}");
    let res = http::post(a, "/v1/completions", &completion(json!({"max_tokens": 4, "min_tokens": 5})));
    super::assert_error(&res, 400, Some("min_tokens"), "max_tokens");
}
