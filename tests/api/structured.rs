//! `response_format` on the real default model: the output follows the JSON Schema (or is a
//! JSON object) however it is sampled, streamed alike, and a schema that cannot be followed is
//! refused naming the field.

use super::{UID, assert_error, chat, chunks, merged, shared};
use crate::util::http;
use serde_json::{Value, json};

/// A capital and its country, the country one of three names.
fn city_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "capital": {"type": "string", "maxLength": 24},
            "country": {"enum": ["France", "Spain", "Italy"]}
        },
        "required": ["capital", "country"],
        "additionalProperties": false
    })
}

/// Whether `text` is a document of [`city_schema`].
fn is_city(text: &str) -> bool {
    let Ok(Value::Object(o)) = serde_json::from_str::<Value>(text) else { return false };
    let capital = o.get("capital").and_then(Value::as_str).is_some_and(|c| c.chars().count() <= 24);
    let country =
        o.get("country").and_then(Value::as_str).is_some_and(|c| ["France", "Spain", "Italy"].contains(&c));
    o.len() == 2 && capital && country
}

fn content(res: &Value, i: usize) -> String {
    res["choices"][i]["message"]["content"].as_str().unwrap_or_default().to_owned()
}

#[test]
fn output_follows_the_json_schema_greedy_sampled_and_streamed() {
    let a = shared().addr();
    let format = json!({"type": "json_schema", "json_schema": {"name": "city", "schema": city_schema()}});
    let ask = |extra: Value| {
        let res = http::post(a, "/v1/chat/completions", &chat(merged(json!({"max_tokens": 120}), extra)));
        assert_eq!(res.status, 200, "{}", res.text());
        res.json()
    };
    // Unconstrained, the model answers in prose.
    let free = ask(json!({"temperature": 0}));
    assert!(!is_city(&content(&free, 0)), "{free}");
    let greedy = ask(json!({"temperature": 0, "response_format": format}));
    assert!(is_city(&content(&greedy, 0)), "{greedy}");
    assert_eq!(greedy["choices"][0]["finish_reason"], "stop", "{greedy}");

    // Sampled, three seeded choices: each a document of the schema.
    let hot =
        ask(json!({"temperature": 1.0, "seed": 3, "n": 3, "max_tokens": 300, "response_format": format}));
    for i in 0..3 {
        assert!(is_city(&content(&hot, i)), "choice {i}: {hot}");
    }

    // Streamed: the same text as whole.
    let stream =
        chat(json!({"max_tokens": 120, "temperature": 0, "response_format": format, "stream": true}));
    let events = chunks(&http::post(a, "/v1/chat/completions", &stream));
    let streamed: String =
        events.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
    assert_eq!(streamed, content(&greedy, 0));
}

#[test]
fn json_object_and_completions_take_a_shape_too() {
    let a = shared().addr();
    let question = r#"Reply with JSON like {"answer": "..."}. What is the capital of France?"#;
    let body = json!({"model": UID, "messages": [{"role": "user", "content": question}], "max_tokens": 200,
        "temperature": 0, "response_format": {"type": "json_object"}});
    let res = http::post(a, "/v1/chat/completions", &body);
    assert_eq!(res.status, 200, "{}", res.text());
    let text = content(&res.json(), 0);
    assert!(matches!(serde_json::from_str::<Value>(&text), Ok(Value::Object(_))), "{text:?}");

    // Completions (as vLLM): an integer between 1000 and 2100.
    let year = json!({"type": "json_schema", "json_schema": {"name": "year", "schema": {"type": "integer", "minimum": 1000, "maximum": 2100}}});
    let body = json!({"model": UID, "prompt": "The Eiffel Tower was finished in the year", "max_tokens": 10, "temperature": 0, "response_format": year});
    let res = http::post(a, "/v1/completions", &body);
    assert_eq!(res.status, 200, "{}", res.text());
    let text = res.json()["choices"][0]["text"].as_str().unwrap_or_default().to_owned();
    let n: i64 = text.trim().parse().unwrap_or_else(|e| panic!("{text:?}: {e}"));
    assert!((1000..=2100).contains(&n), "{text:?}");
}

#[test]
fn a_schema_that_cannot_be_followed_is_refused_by_name() {
    let a = shared().addr();
    for schema in [json!({"type": "no-such-type"}), json!({"$ref": "#/definitions/missing"})] {
        let format = json!({"type": "json_schema", "json_schema": {"name": "x", "schema": schema}});
        let res = http::post(a, "/v1/chat/completions", &chat(json!({"response_format": format})));
        assert_error(&res, 400, Some("response_format"), "JSON Schema");
    }
    // The server keeps answering.
    let res = http::post(a, "/v1/chat/completions", &chat(json!({"max_tokens": 2})));
    assert_eq!(res.status, 200, "{}", res.text());
}

#[test]
fn vllm_structured_outputs_choice_and_regex() {
    let a = shared().addr();
    let texts = |body: Value| -> Vec<String> {
        let res = http::post(a, "/v1/completions", &body);
        assert_eq!(res.status, 200, "{}", res.text());
        let v = res.json();
        v["choices"]
            .as_array()
            .map(|c| c.iter().map(|x| x["text"].as_str().unwrap_or("?").to_owned()).collect())
            .unwrap_or_default()
    };
    let prompt = "The capital of France is";
    // Choices with characters that mean something in a regular expression are matched literally.
    let options = ["Paris", "a.b (c)", "x|y", "Lyon?"];
    let got = texts(
        json!({"model": UID, "prompt": prompt, "max_tokens": 10, "temperature": 1.0, "seed": 1, "n": 4,
        "structured_outputs": {"choice": options}}),
    );
    assert_eq!(got.len(), 4);
    assert!(got.iter().all(|t| options.contains(&t.as_str())), "{got:?}");
    let greedy = texts(json!({"model": UID, "prompt": prompt, "max_tokens": 10, "temperature": 0,
        "structured_outputs": {"choice": options}}));
    assert_eq!(greedy, ["Paris"]);
    let got = texts(
        json!({"model": UID, "prompt": "The year is", "max_tokens": 10, "temperature": 1.0, "seed": 2, "n": 3,
        "structured_outputs": {"regex": " [12][0-9]{3}"}}),
    );
    assert!(
        got.iter().all(|t| t.len() == 5 && t.starts_with(' ') && t[1..].chars().all(|c| c.is_ascii_digit())),
        "{got:?}"
    );
    // Chat takes it too; one shape at a time.
    let res = http::post(
        a,
        "/v1/chat/completions",
        &chat(json!({"max_tokens": 10, "structured_outputs": {"choice": ["yes", "no"]}})),
    );
    assert_eq!(res.status, 200, "{}", res.text());
    let answer = content(&res.json(), 0);
    assert!(answer == "yes" || answer == "no", "{answer:?}");
    let both =
        chat(json!({"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}}));
    assert_error(
        &http::post(a, "/v1/chat/completions", &both),
        400,
        Some("structured_outputs"),
        "response_format",
    );
    // Named by the key that gave the pattern, with the cause alone.
    let bad = chat(json!({"structured_outputs": {"regex": "(unclosed"}}));
    let res = http::post(a, "/v1/chat/completions", &bad);
    assert_error(
        &res,
        400,
        Some("structured_outputs.regex"),
        "regular expression cannot be followed: unclosed group",
    );
    assert!(!res.text().contains("start:"), "{}", res.text());
}

#[test]
fn odd_schemas_get_an_answer_or_a_400_and_the_server_keeps_serving() {
    let a = shared().addr();
    let mut deep = json!({"type": "integer"});
    for _ in 0..60 {
        deep = json!({"type": "array", "items": deep});
    }
    let schemas = [
        json!({"type": "string", "pattern": "(a|b"}),
        json!({"type": "string", "minLength": 10, "maxLength": 2}),
        json!({"anyOf": []}),
        json!({"allOf": [{"type": "string"}, {"type": "integer"}]}),
        json!({"$ref": "#"}),
        json!({"type": "array", "minItems": 1_000_000_000u64}),
        json!({"enum": []}),
        json!({"const": {"a": [1, 2, {"b": null}]}}),
        json!({"type": "object", "patternProperties": {"[": {}}}),
        json!({"type": "string", "format": "no-such-format"}),
        json!(false),
        json!(true),
        deep,
    ];
    for schema in schemas {
        let format = json!({"type": "json_schema", "json_schema": {"name": "x", "schema": schema}});
        let res =
            http::post(a, "/v1/chat/completions", &chat(json!({"max_tokens": 8, "response_format": format})));
        assert!(res.status == 200 || res.status == 400, "{schema}: {} {}", res.status, res.text());
        if res.status == 400 {
            assert_eq!(res.json()["error"]["param"], "response_format", "{schema}: {}", res.text());
        }
    }
    for rx in ["(", "a{1000000000}", "[z-a]", "\\p{NoSuchClass}", ""] {
        let res = http::post(
            a,
            "/v1/chat/completions",
            &chat(json!({"max_tokens": 8, "structured_outputs": {"regex": rx}})),
        );
        assert!(res.status == 200 || res.status == 400, "{rx}: {} {}", res.status, res.text());
    }
    let res = http::post(a, "/v1/chat/completions", &chat(json!({"max_tokens": 2})));
    assert_eq!(res.status, 200, "{}", res.text());
}
