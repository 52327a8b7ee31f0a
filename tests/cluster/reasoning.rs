//! Reasoning apart from the answer (`reasoning_content`), on the real default model launched
//! under a name of its own with Xinference's `reasoning_content` and `enable_thinking` launch
//! keys. SmolLM2 does not reason by itself, so earlier turns of the conversation teach it a
//! reasoning model's shape; the same request to an ordinary launch of the same weights gives
//! the text the reasoning and the answer must add up to.

use crate::util::procs::local;
use crate::util::{self, http};
use serde_json::{Value, json};
use std::net::SocketAddr;

/// `base` with the keys of `extra` added.
fn merged(mut base: Value, extra: &Value) -> Value {
    if let (Some(b), Value::Object(e)) = (base.as_object_mut(), extra) {
        b.extend(e.clone());
    }
    base
}

fn ask(addr: SocketAddr, uid: &str, extra: &Value) -> http::Response {
    let body = json!({
        "model": uid, "temperature": 0, "max_tokens": 80,
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
    });
    http::post(addr, "/v1/chat/completions", &merged(body, extra))
}

/// `(reasoning_content, content)` of a whole answer.
fn parts(res: &http::Response) -> (Option<String>, String) {
    assert_eq!(res.status, 200, "{}", res.text());
    let m = &res.json()["choices"][0]["message"];
    (m["reasoning_content"].as_str().map(str::to_owned), m["content"].as_str().unwrap_or_default().to_owned())
}

/// The reasoning and the content a stream's deltas add up to.
fn streamed(res: &http::Response) -> (String, String) {
    assert_eq!(res.status, 200, "{}", res.text());
    let (mut reasoning, mut content) = (String::new(), String::new());
    for line in res.text().lines() {
        let Some(data) = line.strip_prefix("data: ").filter(|d| *d != "[DONE]") else { continue };
        let chunk: Value = serde_json::from_str(data).expect("a JSON chunk");
        let delta = &chunk["choices"][0]["delta"];
        reasoning.push_str(delta["reasoning_content"].as_str().unwrap_or_default());
        content.push_str(delta["content"].as_str().unwrap_or_default());
    }
    (reasoning, content)
}

#[test]
fn answers_show_the_reasoning_apart_where_the_launch_asks() {
    let (_server, addr) = local("plain", &[]);
    let path = util::smollm2().path.display().to_string();
    // Thinking is off unless a request turns it on.
    let launch = json!({
        "model_name": "smollm2-thinker", "model_uid": "thinker", "model_path": path,
        "reasoning_content": true, "enable_thinking": false,
    });
    let res = http::post(addr, "/v1/models", &launch);
    assert_eq!(res.status, 200, "{}", res.text());
    let on = json!({"chat_template_kwargs": {"enable_thinking": true}});

    // Qwen3's shape (both marks) and DeepSeek-R1's (the template opened the reasoning), which
    // two earlier turns teach SmolLM2 to write.
    for opening in ["<think>", ""] {
        let taught = json!({"messages": util::thinking_lesson(opening, ["Yes", "No"])});
        let (none, whole) = parts(&ask(addr, "plain", &taught));
        assert_eq!(none, None, "an ordinary launch shows no reasoning");
        let (before, answer) = whole.split_once("</think>").expect("the closing mark");
        let thought = before.strip_prefix("<think>").unwrap_or(before);
        assert!(!thought.is_empty() && !answer.is_empty(), "{whole}");
        assert_eq!(whole.starts_with("<think>"), !opening.is_empty(), "{whole}");

        let read = merged(taught.clone(), &on);
        let (reasoning, content) = parts(&ask(addr, "thinker", &read));
        assert_eq!((reasoning.as_deref(), content.as_str()), (Some(thought), answer), "{whole}");
        let stream = streamed(&ask(addr, "thinker", &merged(read, &json!({"stream": true}))));
        assert_eq!(stream, (thought.to_owned(), answer.to_owned()), "{whole}");

        // Thinking off (the launch's default here): the output is all content.
        assert_eq!(parts(&ask(addr, "thinker", &taught)), (None, whole.clone()));
        let stream = merged(taught, &json!({"stream": true}));
        assert_eq!(streamed(&ask(addr, "thinker", &stream)), (String::new(), whole.clone()));
    }

    // A shape asked of a reasoning answer holds after the reasoning: the model thinks freely,
    // then answers in the shape. Two earlier turns teach SmolLM2 to think before it answers.
    let turns = util::thinking_lesson("", [r#"{"answer": "yes"}"#, r#"{"answer": "no"}"#]);
    let schema = json!({"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}},
                        "required": ["answer"], "additionalProperties": false});
    let shaped = json!({"messages": turns, "response_format": {"type": "json_schema",
                        "json_schema": {"name": "answer", "schema": schema}}});
    let is_answer = |text: &str| {
        serde_json::from_str::<Value>(text).is_ok_and(|v| v["answer"] == "yes" || v["answer"] == "no")
    };
    let read = merged(shaped.clone(), &on);
    let (reasoning, content) = parts(&ask(addr, "thinker", &read));
    assert_eq!(reasoning.as_deref(), Some("Let me think."), "{content}");
    assert!(is_answer(&content), "{content}");
    let (r, c) = streamed(&ask(addr, "thinker", &merged(read, &json!({"stream": true}))));
    assert_eq!((Some(r), c), (reasoning, content));
    // Thinking off: the shape holds from the first token, so the answer is all shape.
    let (none, content) = parts(&ask(addr, "thinker", &shaped));
    assert!(none.is_none() && is_answer(&content), "{content}");

    // An answer cut short inside its reasoning (no closing mark yet) is all reasoning.
    let (reasoning, content) = parts(&ask(addr, "thinker", &merged(json!({"max_tokens": 4}), &on)));
    assert!(reasoning.is_some_and(|r| !r.is_empty()));
    assert_eq!(content, "");

    // `xinf chat` shows the thinking on standard error and keeps standard output for answers:
    // a model that thinks by default (this one never closes its reasoning, so all of its
    // output is thinking).
    let deep = json!({"model_name": "smollm2-thinker", "model_uid": "deep", "model_path": path,
                      "reasoning_content": true});
    let res = http::post(addr, "/v1/models", &deep);
    assert_eq!(res.status, 200, "{}", res.text());
    let (thought, content) = parts(&ask(addr, "deep", &json!({"max_tokens": 24})));
    let thought = thought.expect("reasoning");
    assert_eq!(content, "");
    let out =
        crate::util::procs::xinf_chat(&format!("http://{addr}"), "deep", "What is the capital of France?\n");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    assert!(stdout.trim().is_empty(), "the answer is empty: {stdout:?}");
    assert!(stderr.contains(thought.trim()), "{stderr:?} should show {thought:?}");

    // A registry family that does not reason is refused the key, naming it.
    let res =
        http::post(addr, "/v1/models", &json!({"model_name": "smollm2-instruct", "reasoning_content": true}));
    assert_eq!(res.status, 400, "{}", res.text());
    assert_eq!(res.json()["error"]["param"], "reasoning_content", "{}", res.text());
    // Qwen3's registration says it reasons, with its marks, as Xinference's does.
    let qwen3 = http::get(addr, "/v1/model_registrations/LLM/qwen3").json();
    assert_eq!(qwen3["reasoning_start_tag"], "<think>", "{qwen3}");
    assert_eq!(qwen3["reasoning_end_tag"], "</think>", "{qwen3}");
    assert!(qwen3["model_ability"].as_array().is_some_and(|a| a.contains(&json!("reasoning"))), "{qwen3}");
}
