use super::*;
use crate::api::openai::Delta;
use serde_json::json;
use std::sync::Arc;

fn tools_in(v: Value) -> Vec<ToolIn> {
    serde_json::from_value(v).expect("tools")
}

fn weather() -> Vec<ToolIn> {
    tools_in(json!([
        {"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters":
            {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
        {"type": "function", "function": {"name": "time", "strict": true}},
    ]))
}

fn read_ok(choice: Value, parallel: Option<bool>) -> Tools {
    read(Some(weather()), Some(&choice), parallel).expect("valid").expect("tools")
}

fn problem(p: Problem) -> String {
    match p {
        Problem::Field { field, key, .. } => format!("{field} {key}"),
        other => format!("{other:?}"),
    }
}

#[test]
fn tools_reach_the_template_as_vllm_passes_them() {
    let t = read_ok(json!("auto"), None);
    assert_eq!(
        t.template_value(),
        &json!([
            {"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters":
                {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
            {"type": "function", "function": {"name": "time", "description": null, "parameters": null, "strict": true}},
        ])
    );
    assert!(t.grammar().is_none());
    // `none`, or no tools, and the model sees none.
    assert!(read(Some(weather()), Some(&json!("none")), None).expect("valid").is_none());
    assert!(read(None, Some(&json!("none")), None).expect("valid").is_none());
    assert!(read(Some(Vec::new()), None, None).expect("valid").is_none());
}

#[test]
fn bad_tool_fields_are_named() {
    let cases = [
        (
            json!([{"type": "function", "function": {"name": "a b"}}]),
            None,
            "tools[0].function.name api-tool-name-invalid",
        ),
        (
            json!([{"type": "function", "function": {"name": ""}}]),
            None,
            "tools[0].function.name api-tool-name-invalid",
        ),
        (
            json!([{"type": "function", "function": {"name": "f"}}, {"type": "function", "function": {"name": "f"}}]),
            None,
            "tools[1].function.name api-tool-name-twice",
        ),
        (
            json!([{"type": "function", "function": {"name": "f", "parameters": [1]}}]),
            None,
            "tools[0].function.parameters api-tool-parameters-invalid",
        ),
        (
            json!([{"type": "function", "function": {"name": "f"}}]),
            Some(json!("sometimes")),
            "tool_choice api-tool-choice-invalid",
        ),
        (
            json!([{"type": "function", "function": {"name": "f"}}]),
            Some(json!(3)),
            "tool_choice api-tool-choice-invalid",
        ),
        (
            json!([{"type": "function", "function": {"name": "f"}}]),
            Some(json!({"type": "function", "function": {"name": "g"}})),
            "tool_choice.function.name api-tool-choice-unknown",
        ),
        (
            json!([{"type": "function", "function": {"name": "f"}}]),
            Some(json!({"type": "function"})),
            "tool_choice api-tool-choice-invalid",
        ),
        (json!([]), Some(json!("auto")), "tool_choice api-tool-choice-without-tools"),
    ];
    for (tools, choice, expected) in cases {
        let err = read(Some(tools_in(tools)), choice.as_ref(), None).err().map(problem);
        assert_eq!(err.as_deref(), Some(expected));
    }
    let many: Vec<Value> =
        (0..=MAX_TOOLS).map(|i| json!({"type": "function", "function": {"name": format!("f{i}")}})).collect();
    let err = read(Some(tools_in(Value::Array(many))), None, None).err().map(problem);
    assert_eq!(err.as_deref(), Some("tools api-tools-too-many"));
    let huge = json!([{"type": "function", "function": {"name": "f", "parameters": {"description": "x".repeat(MAX_SCHEMA_BYTES)}}}]);
    let err = read(Some(tools_in(huge)), None, None).err().map(problem);
    assert_eq!(err.as_deref(), Some("tools[0].function.parameters api-tool-parameters-invalid"));
}

#[test]
fn required_and_named_choices_hold_the_output_to_a_schema() {
    let Some(StructuredOutput::JsonSchema(named)) =
        read_ok(json!({"type": "function", "function": {"name": "time"}}), None).grammar()
    else {
        panic!("a schema")
    };
    assert_eq!(named, r#"{"type":"object","properties":{}}"#);
    let Some(StructuredOutput::JsonSchema(required)) = read_ok(json!("required"), Some(false)).grammar()
    else {
        panic!("a schema")
    };
    let schema: Value = serde_json::from_str(&required).expect("JSON");
    assert_eq!(schema["maxItems"], 1);
    assert_eq!(schema["items"]["anyOf"][0]["properties"]["name"]["enum"], json!(["get_weather"]));
    assert_eq!(schema["items"]["anyOf"][0]["properties"]["arguments"]["required"], json!(["city"]));
}

/// `(content, [(name, arguments)])` of a whole answer.
fn whole(t: &Tools, text: &str) -> (Option<String>, Vec<(String, String)>) {
    let (content, calls) = t.answer(text.to_owned());
    (content, calls.into_iter().map(|c| (c.function.name, c.function.arguments)).collect())
}

/// The same, from the text streamed in pieces of `step` bytes (at character boundaries).
fn streamed(t: &Tools, text: &str, step: usize) -> (Option<String>, Vec<(String, String)>) {
    let mut reader = ToolStream::new(Arc::new(t.clone()));
    let mut deltas: Vec<Delta> = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let mut at = step.min(rest.len());
        while !rest.is_char_boundary(at) {
            at += 1;
        }
        deltas.push(reader.push(&rest[..at]));
        rest = &rest[at..];
    }
    deltas.push(reader.finish());
    let mut content = String::new();
    let mut calls: Vec<(String, String)> = Vec::new();
    for d in deltas {
        content.push_str(d.content.as_deref().unwrap_or_default());
        for c in d.tool_calls.unwrap_or_default() {
            if let Some(name) = c.function.name {
                assert_eq!(c.index as usize, calls.len(), "calls are numbered in order");
                assert!(c.id.is_some_and(|id| id.starts_with("call_")) && c.kind == Some("function"));
                calls.push((name, String::new()));
            }
            calls[c.index as usize].1.push_str(&c.function.arguments);
        }
    }
    ((!content.is_empty()).then_some(content), calls)
}

/// Calls as `(name, arguments)`.
type Calls = Vec<(String, String)>;

fn call(name: &str, arguments: &str) -> (String, String) {
    (name.to_owned(), arguments.to_owned())
}

#[test]
fn auto_reads_hermes_and_llama_calls_of_offered_functions() {
    let t = read_ok(json!("auto"), None);
    let paris = call("get_weather", r#"{"city":"Paris"}"#);
    let cases: Vec<(&str, Option<&str>, Calls)> = vec![
        ("The weather is fine.", Some("The weather is fine."), vec![]),
        (
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
            None,
            vec![paris.clone()],
        ),
        (
            "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"time\", \"arguments\": {}}\n</tool_call>",
            Some("Let me look.\n"),
            vec![paris.clone(), call("time", "{}")],
        ),
        // No closing tag at the end of the output.
        ("<tool_call>{\"name\": \"time\", \"arguments\": \"{}\"}", None, vec![call("time", "{}")]),
        // Llama 3's JSON: one object, with `parameters`, several joined by `;`, a list.
        ("{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}", None, vec![paris.clone()]),
        (
            "<|python_tag|>{\"name\": \"time\", \"parameters\": {}}; {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
            None,
            vec![call("time", "{}"), paris.clone()],
        ),
        ("  [{\"name\": \"time\", \"arguments\": {}}]", None, vec![call("time", "{}")]),
        // Not calls of offered functions, or not calls at all: the text as it is.
        (
            "<tool_call>{\"name\": \"launch\", \"arguments\": {}}</tool_call>",
            Some("<tool_call>{\"name\": \"launch\", \"arguments\": {}}</tool_call>"),
            vec![],
        ),
        ("{\"city\": \"Paris\"}", Some("{\"city\": \"Paris\"}"), vec![]),
        ("<tool_call>{broken", Some("<tool_call>{broken"), vec![]),
        ("Use <tool_ tags.", Some("Use <tool_ tags."), vec![]),
        ("a <tool_call> b", Some("a <tool_call> b"), vec![]),
        ("<", Some("<"), vec![]),
        ("  ", Some("  "), vec![]),
    ];
    for (text, content, calls) in cases {
        let expected = (content.map(str::to_owned), calls);
        assert_eq!(whole(&t, text), expected, "whole: {text:?}");
        for step in [1, 3, 7, 1000] {
            assert_eq!(streamed(&t, text, step), expected, "streamed by {step}: {text:?}");
        }
    }
    // An empty answer is empty content, as without tools.
    assert_eq!(whole(&t, ""), (Some(String::new()), vec![]));
}

#[test]
fn required_and_named_outputs_are_calls() {
    let t = read_ok(json!("required"), None);
    let text =
        r#"[{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "time", "arguments": {}}]"#;
    let expected = (None, vec![call("get_weather", r#"{"city":"Paris"}"#), call("time", "{}")]);
    assert_eq!(whole(&t, text), expected);
    assert_eq!(streamed(&t, text, 5), expected);
    // Cut short (`length`), the text is returned as it is.
    assert_eq!(whole(&t, "[{\"name\": \"ti"), (Some("[{\"name\": \"ti".to_owned()), vec![]));
    // One call only when parallel calls are off.
    let single = read_ok(json!("required"), Some(false));
    assert_eq!(whole(&single, text).1.len(), 1);
    assert_eq!(streamed(&single, text, 4).1.len(), 1);

    let t = read_ok(json!({"type": "function", "function": {"name": "get_weather"}}), None);
    let text = "{\"city\": \"Lyon\"}";
    assert_eq!(whole(&t, text), (None, vec![call("get_weather", text)]));
    assert_eq!(streamed(&t, text, 2), (None, vec![call("get_weather", text)]));
    assert_eq!(streamed(&t, "", 2), (None, vec![call("get_weather", "")]));
}

#[test]
fn finish_reasons() {
    let auto = read_ok(json!("auto"), None);
    assert_eq!(auto.finish_name(FinishReason::Stop, true), "tool_calls");
    assert_eq!(auto.finish_name(FinishReason::Stop, false), "stop");
    assert_eq!(auto.finish_name(FinishReason::Length, true), "length");
    let named = read_ok(json!({"type": "function", "function": {"name": "time"}}), None);
    assert_eq!(named.finish_name(FinishReason::Stop, true), "stop");
}
