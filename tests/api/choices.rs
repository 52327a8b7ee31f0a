//! Several choices for one request (`n`), and several prompts (a completions batch): each its
//! own, reproducible with a seed, streamed interleaved by index, counted together, aborted
//! together.

use super::{UID, chat, chunks, completion, merged, read_events, shared};
use crate::util::http;
use serde_json::{Value, json};
use std::io::Read;

/// Each choice's streamed text, by index, and the finish reasons in the order they came.
fn streamed_texts(events: &[Value], n: usize) -> (Vec<String>, Vec<(usize, String)>) {
    let (mut texts, mut finishes) = (vec![String::new(); n], Vec::new());
    for c in events {
        let Some(choice) = c["choices"].get(0) else { continue };
        let i = choice["index"].as_u64().expect("index") as usize;
        let part = choice["delta"]["content"].as_str().or(choice["text"].as_str()).unwrap_or_default();
        texts[i].push_str(part);
        if let Some(reason) = choice["finish_reason"].as_str() {
            finishes.push((i, reason.to_owned()));
        }
    }
    (texts, finishes)
}

#[test]
fn several_choices_are_each_their_own_and_stream_by_index() {
    let a = shared().addr();
    let req = chat(json!({"n": 3, "temperature": 1.0, "seed": 5, "max_tokens": 10}));
    let whole = http::post(a, "/v1/chat/completions", &req).json();
    let choices = whole["choices"].as_array().expect("choices");
    let indices: Vec<u64> = choices.iter().map(|c| c["index"].as_u64().expect("index")).collect();
    assert_eq!(indices, [0, 1, 2], "{whole}");
    let texts: Vec<String> =
        choices.iter().map(|c| c["message"]["content"].as_str().expect("content").to_owned()).collect();
    assert!(texts.iter().any(|t| *t != texts[0]), "seeded choices differ: {texts:?}");
    // Usage: the prompt once, every choice's output.
    let one = http::post(a, "/v1/chat/completions", &chat(json!({"max_tokens": 1}))).json();
    assert_eq!(whole["usage"]["prompt_tokens"], one["usage"]["prompt_tokens"], "{whole}");
    let outputs = whole["usage"]["completion_tokens"].as_u64().expect("usage");
    assert!((3..=30).contains(&outputs), "{whole}");

    // Streamed: a role chunk per choice first, then tokens by index, a finish per choice, and
    // the usage of all of them; the same texts, since each choice keeps its seed.
    let stream = merged(req, json!({"stream": true, "stream_options": {"include_usage": true}}));
    let events = chunks(&http::post(a, "/v1/chat/completions", &stream));
    let roles: Vec<&Value> = events.iter().take(3).map(|c| &c["choices"][0]).collect();
    assert!(
        roles.iter().enumerate().all(|(i, c)| c["index"] == i && c["delta"]["role"] == "assistant"),
        "{events:?}"
    );
    let (streamed, finishes) = streamed_texts(&events, 3);
    assert_eq!(streamed, texts);
    let mut finished: Vec<usize> = finishes.iter().map(|f| f.0).collect();
    finished.sort_unstable();
    assert_eq!(finished, [0, 1, 2], "{finishes:?}");
    assert_eq!(events.last().map(|c| c["usage"].clone()), Some(whole["usage"].clone()), "{events:?}");

    // Completions, greedy: every choice alike.
    let greedy =
        http::post(a, "/v1/completions", &completion(json!({"n": 2, "temperature": 0, "max_tokens": 6})))
            .json();
    let texts: Vec<&Value> =
        greedy["choices"].as_array().expect("choices").iter().map(|c| &c["text"]).collect();
    assert!(texts.len() == 2 && texts[0] == texts[1] && texts[0] != "", "{greedy}");
}

#[test]
fn the_abort_route_ends_every_choice() {
    let a = shared().addr();
    let rid = format!("abort-choices-{}", std::process::id());
    let body =
        chat(json!({"n": 2, "max_tokens": 2000, "ignore_eos": true, "stream": true, "request_id": rid}));
    let mut stream = http::send(a, "POST", "/v1/chat/completions", &[], body.to_string().as_bytes());
    let mut raw = read_events(&mut stream, 5);
    let abort = http::request(a, "POST", &format!("/v1/models/{UID}/requests/{rid}/abort"), &[], b"");
    assert_eq!(abort.json(), json!({"msg": "DONE"}));
    stream.read_to_end(&mut raw).expect("read the rest");
    let events = chunks(&http::parse(&raw));
    assert!(events.iter().all(|c| c["id"] == rid.as_str()), "{events:?}");
    let (_, finishes) = streamed_texts(&events, 2);
    let mut aborted: Vec<usize> = finishes.iter().filter(|f| f.1 == "abort").map(|f| f.0).collect();
    aborted.sort_unstable();
    assert_eq!(aborted, [0, 1], "{finishes:?}");
    // Once it has ended, the id is unknown again.
    let again = http::request(a, "POST", &format!("/v1/models/{UID}/requests/{rid}/abort"), &[], b"");
    assert_eq!(again.json(), json!({"msg": "NOT_FOUND"}));
}

#[test]
fn a_batch_of_prompts_answers_each_as_alone() {
    let a = shared().addr();
    let prompts = ["The capital of France is", "One, two, three,"];
    let body = |prompt: Value, n: usize| json!({"model": UID, "prompt": prompt, "n": n, "temperature": 0, "max_tokens": 6});
    let alone: Vec<Value> =
        prompts.iter().map(|p| http::post(a, "/v1/completions", &body(json!(p), 1)).json()).collect();
    // Token ids and text mixed; two greedy choices each, numbered prompt by prompt.
    let ids = crate::util::shared_smollm2().tokenizer().encode(prompts[1], true).expect("encode");
    let batch = json!([prompts[0], ids]);
    let whole = http::post(a, "/v1/completions", &body(batch.clone(), 2)).json();
    let texts: Vec<&Value> =
        whole["choices"].as_array().expect("choices").iter().map(|c| &c["text"]).collect();
    let want: Vec<&Value> = alone.iter().flat_map(|o| [&o["choices"][0]["text"]; 2]).collect();
    assert_eq!(texts, want, "{whole}");
    let indices: Vec<&Value> =
        whole["choices"].as_array().expect("choices").iter().map(|c| &c["index"]).collect();
    assert_eq!(indices, [0, 1, 2, 3], "{whole}");
    // Usage: each prompt once, every choice's output.
    let prompt_tokens: u64 = alone.iter().map(|o| o["usage"]["prompt_tokens"].as_u64().expect("usage")).sum();
    assert_eq!(whole["usage"]["prompt_tokens"], prompt_tokens, "{whole}");
    let outputs: u64 =
        alone.iter().map(|o| 2 * o["usage"]["completion_tokens"].as_u64().expect("usage")).sum();
    assert_eq!(whole["usage"]["completion_tokens"], outputs, "{whole}");

    let stream = merged(body(batch, 2), json!({"stream": true, "stream_options": {"include_usage": true}}));
    let events = chunks(&http::post(a, "/v1/completions", &stream));
    let (streamed, finishes) = streamed_texts(&events, 4);
    let want: Vec<String> = want.iter().map(|t| t.as_str().unwrap_or_default().to_owned()).collect();
    assert_eq!(streamed, want, "{events:?}");
    assert_eq!(finishes.len(), 4, "{finishes:?}");
    assert_eq!(events.last().map(|c| c["usage"].clone()), Some(whole["usage"].clone()), "{events:?}");
}
