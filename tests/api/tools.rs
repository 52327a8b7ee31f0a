//! Function calling on the real default model: the tools reach the prompt, `required` and a
//! named function hold the output to calls of the tools' schemas, `auto` reads the model's
//! Hermes calls, streamed alike; bad tool fields are refused naming them.

use super::{UID, assert_error, chat, chunks, merged, shared};
use crate::util::http;
use serde_json::{Value, json};

fn weather_tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                "required": ["city"], "additionalProperties": false}}},
        {"type": "function", "function": {"name": "get_time", "description": "The time in a time zone",
            "parameters": {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}},
                "required": ["zone"], "additionalProperties": false}}},
    ])
}

fn weather_question(extra: Value) -> Value {
    merged(
        json!({"model": UID, "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
            "tools": weather_tools(), "max_tokens": 80, "temperature": 0}),
        extra,
    )
}

/// Whether a call is of one of [`weather_tools`] with arguments of its schema.
fn valid_call(call: &Value) -> bool {
    let Ok(Value::Object(args)) =
        serde_json::from_str::<Value>(call["function"]["arguments"].as_str().unwrap_or(""))
    else {
        return false;
    };
    let well_formed =
        call["type"] == "function" && call["id"].as_str().is_some_and(|id| id.starts_with("call_"));
    let ok = match call["function"]["name"].as_str() {
        Some("get_weather") => {
            args.len() == 1
                && args.get("city").and_then(Value::as_str).is_some_and(|c| c.chars().count() <= 20)
        }
        Some("get_time") => {
            args.len() == 1 && matches!(args.get("zone").and_then(Value::as_str), Some("UTC" | "CET"))
        }
        _ => false,
    };
    well_formed && ok
}

/// The whole answer's first choice, asserting a 200.
fn ask(body: &Value) -> Value {
    let res = http::post(shared().addr(), "/v1/chat/completions", body);
    assert_eq!(res.status, 200, "{}", res.text());
    res.json()["choices"][0].clone()
}

/// The streamed answer put back together: its content, its calls as `(name, arguments)`, its
/// finish reason.
fn streamed(body: &Value) -> (String, Vec<(String, String)>, String) {
    let events = chunks(&http::post(
        shared().addr(),
        "/v1/chat/completions",
        &merged(body.clone(), json!({"stream": true})),
    ));
    let (mut content, mut calls, mut finish) = (String::new(), Vec::<(String, String)>::new(), String::new());
    for e in &events {
        let choice = &e["choices"][0];
        content.push_str(choice["delta"]["content"].as_str().unwrap_or_default());
        for c in choice["delta"]["tool_calls"].as_array().into_iter().flatten() {
            let i = c["index"].as_u64().unwrap_or(u64::MAX) as usize;
            if let Some(name) = c["function"]["name"].as_str() {
                assert_eq!(i, calls.len(), "{c}");
                assert!(c["id"].as_str().is_some_and(|id| id.starts_with("call_")), "{c}");
                calls.push((name.to_owned(), String::new()));
            }
            calls[i].1.push_str(c["function"]["arguments"].as_str().unwrap_or_default());
        }
        if let Some(f) = choice["finish_reason"].as_str() {
            finish = f.to_owned();
        }
    }
    (content, calls, finish)
}

fn calls_of(choice: &Value) -> Vec<(String, String)> {
    let calls = choice["message"]["tool_calls"].as_array().cloned().unwrap_or_default();
    calls
        .iter()
        .map(|c| {
            (
                c["function"]["name"].as_str().unwrap_or("").to_owned(),
                c["function"]["arguments"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect()
}

#[test]
fn tools_reach_the_prompt() {
    let a = shared().addr();
    let usage = |body: &Value| {
        let res = http::post(a, "/v1/chat/completions", body);
        assert_eq!(res.status, 200, "{}", res.text());
        res.json()["usage"]["prompt_tokens"].as_u64().unwrap_or(0)
    };
    let plain = chat(json!({"max_tokens": 1}));
    let with_tools = chat(json!({"max_tokens": 1, "tools": weather_tools()}));
    // SmolLM2's template reads no tools: they are written into a system message.
    assert!(usage(&with_tools) > usage(&plain) + 100, "the tools are in the prompt");
    // `none` leaves them out.
    let none = chat(json!({"max_tokens": 1, "tools": weather_tools(), "tool_choice": "none"}));
    assert_eq!(usage(&none), usage(&plain));
}

#[test]
fn required_holds_the_output_to_calls_of_the_tools() {
    let body = weather_question(json!({"tool_choice": "required"}));
    let choice = ask(&body);
    assert_eq!(choice["finish_reason"], "tool_calls", "{choice}");
    assert!(choice["message"]["content"].is_null(), "{choice}");
    let calls = choice["message"]["tool_calls"].as_array().cloned().unwrap_or_default();
    assert!(!calls.is_empty() && calls.iter().all(valid_call), "{choice}");
    // Streamed: the same calls.
    let (content, streamed_calls, finish) = streamed(&body);
    assert_eq!((content.as_str(), finish.as_str()), ("", "tool_calls"));
    assert_eq!(streamed_calls, calls_of(&choice));
    // Sampled, each of three choices is calls too; with parallel calls off, exactly one.
    let hot = merged(body, json!({"temperature": 1.0, "seed": 5, "n": 3, "parallel_tool_calls": false}));
    let res = http::post(shared().addr(), "/v1/chat/completions", &hot);
    assert_eq!(res.status, 200, "{}", res.text());
    for choice in res.json()["choices"].as_array().cloned().unwrap_or_default() {
        let calls = choice["message"]["tool_calls"].as_array().cloned().unwrap_or_default();
        assert!(calls.len() == 1 && valid_call(&calls[0]), "{choice}");
    }
}

#[test]
fn a_named_function_is_called_with_arguments_of_its_schema() {
    let body =
        weather_question(json!({"tool_choice": {"type": "function", "function": {"name": "get_time"}}}));
    let choice = ask(&body);
    // As OpenAI's: a call the request named ends with `stop`.
    assert_eq!(choice["finish_reason"], "stop", "{choice}");
    let calls = choice["message"]["tool_calls"].as_array().cloned().unwrap_or_default();
    assert!(
        calls.len() == 1 && calls[0]["function"]["name"] == "get_time" && valid_call(&calls[0]),
        "{choice}"
    );
    let (content, streamed_calls, finish) = streamed(&body);
    assert_eq!((content.as_str(), finish.as_str()), ("", "stop"));
    assert_eq!(streamed_calls, calls_of(&choice));
}

#[test]
fn auto_reads_the_models_hermes_calls_and_leaves_text_alone() {
    // The model is held to a Hermes call by a regular expression, so what comes back is the
    // model's own text of a call, read as it would be from a model trained on the format.
    let hermes =
        r#"<tool_call>\n\{"name": "get_weather", "arguments": \{"city": "(Paris|Lyon)"\}\}\n</tool_call>"#;
    let body = weather_question(json!({"structured_outputs": {"regex": hermes}}));
    let choice = ask(&body);
    assert_eq!(choice["finish_reason"], "tool_calls", "{choice}");
    assert!(choice["message"]["content"].is_null(), "{choice}");
    let calls = calls_of(&choice);
    assert!(matches!(calls.as_slice(), [(name, _)] if name == "get_weather"), "{choice}");
    assert!(valid_call(&choice["message"]["tool_calls"][0]), "{choice}");
    let (content, streamed_calls, finish) = streamed(&body);
    assert_eq!((content.as_str(), finish.as_str()), ("", "tool_calls"));
    assert_eq!(streamed_calls, calls);

    // A call of a function that was not offered stays text, as does prose.
    let other = r#"<tool_call>\n\{"name": "launch", "arguments": \{\}\}\n</tool_call>"#;
    let choice = ask(&weather_question(json!({"structured_outputs": {"regex": other}})));
    assert_eq!(choice["finish_reason"], "stop", "{choice}");
    assert!(choice["message"]["content"].as_str().is_some_and(|c| c.starts_with("<tool_call>")), "{choice}");
    assert!(choice["message"].get("tool_calls").is_none(), "{choice}");
    let prose = weather_question(json!({"structured_outputs": {"choice": ["It is sunny."]}}));
    let choice = ask(&prose);
    assert_eq!(
        (choice["message"]["content"].as_str(), choice["finish_reason"].as_str()),
        (Some("It is sunny."), Some("stop"))
    );
    assert_eq!(streamed(&prose), ("It is sunny.".to_owned(), vec![], "stop".to_owned()));
}

#[test]
fn a_conversation_with_calls_and_answers_goes_on() {
    let a = shared().addr();
    let messages = json!([
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 degrees"},
    ]);
    let body = json!({"model": UID, "messages": messages, "tools": weather_tools(), "tool_choice": "none",
        "max_tokens": 30, "temperature": 0});
    let res = http::post(a, "/v1/chat/completions", &body);
    assert_eq!(res.status, 200, "{}", res.text());
    let text = res.json()["choices"][0]["message"]["content"].as_str().unwrap_or_default().to_owned();
    assert!(!text.is_empty());
    // The answer was rendered into the prompt: it costs tokens.
    let bare = json!({"model": UID, "messages": [messages[0]], "max_tokens": 1});
    let tokens = |b: &Value| {
        http::post(a, "/v1/chat/completions", b).json()["usage"]["prompt_tokens"].as_u64().unwrap_or(0)
    };
    assert!(tokens(&merged(body, json!({"max_tokens": 1}))) > tokens(&bare) + 20);
}

#[test]
fn tool_fields_are_checked_by_name() {
    let a = shared().addr();
    let cases = [
        (
            json!({"tool_choice": "required", "response_format": {"type": "json_object"}}),
            "tool_choice",
            "response_format",
        ),
        (
            json!({"tool_choice": {"type": "function", "function": {"name": "launch"}}}),
            "tool_choice.function.name",
            "launch",
        ),
        (json!({"tool_choice": "maybe"}), "tool_choice", "`required`"),
        (
            json!({"tools": [{"type": "function", "function": {"name": "a b"}}]}),
            "tools[0].function.name",
            "64",
        ),
        (
            json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]}),
            "tools[0].function.parameters",
            "JSON Schema",
        ),
    ];
    for (extra, param, needle) in cases {
        let res = http::post(a, "/v1/chat/completions", &weather_question(extra));
        assert_error(&res, 400, Some(param), needle);
    }
    // A schema the grammar cannot follow is refused before anything runs, blamed on the tools
    // (the grammar is theirs, not a `response_format`).
    let bad =
        json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "no-such-type"}}}]);
    let res = http::post(
        a,
        "/v1/chat/completions",
        &weather_question(json!({"tools": bad, "tool_choice": "required"})),
    );
    assert_error(&res, 400, Some("tools"), "");
    let res = http::post(a, "/v1/chat/completions", &chat(json!({"max_tokens": 2})));
    assert_eq!(res.status, 200, "{}", res.text());
}
