use super::time::{civil_from_days, days_from_civil, format_time};
use super::*;

/// SmolLM2's ChatML template, verbatim from its `tokenizer_config.json`.
const SMOLLM2: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// Meta-Llama-3-8B-Instruct's template, verbatim.
const LLAMA3: &str = "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";

fn msg(role: &str, content: &str) -> ChatMessage {
    ChatMessage::new(role, content)
}

fn template(source: &str) -> ChatTemplate {
    ChatTemplate::new(source, Some("<s>".to_owned()), Some("</s>".to_owned())).expect("template compiles")
}

fn render(source: &str, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String, ModelError> {
    template(source).render(messages, add_generation_prompt)
}

#[test]
fn chat_template_is_send_and_sync() {
    fn assert_send_sync<T: Send + Sync + 'static>() {}
    assert_send_sync::<ChatTemplate>();
}

#[test]
fn source_is_kept() {
    assert_eq!(template(SMOLLM2).source(), SMOLLM2);
}

#[test]
fn smollm2_adds_default_system_prompt_and_generation_prompt() {
    let out = render(SMOLLM2, &[msg("user", "Hi")], true).expect("renders");
    assert_eq!(
        out,
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
         <|im_start|>user\nHi<|im_end|>\n\
         <|im_start|>assistant\n"
    );
}

#[test]
fn smollm2_with_system_message_and_no_generation_prompt() {
    let messages =
        [msg("system", "Be brief."), msg("user", "Hi"), msg("assistant", "Hello!"), msg("user", "Bye")];
    let out = render(SMOLLM2, &messages, false).expect("renders");
    assert_eq!(
        out,
        "<|im_start|>system\nBe brief.<|im_end|>\n\
         <|im_start|>user\nHi<|im_end|>\n\
         <|im_start|>assistant\nHello!<|im_end|>\n\
         <|im_start|>user\nBye<|im_end|>\n"
    );
}

#[test]
fn smollm2_with_system_message_and_generation_prompt() {
    let out = render(SMOLLM2, &[msg("system", "S"), msg("user", "U")], true).expect("renders");
    assert_eq!(
        out,
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"
    );
}

#[test]
fn llama3_uses_bos_token_and_trims_content() {
    let out = render(LLAMA3, &[msg("system", "  Sys \n"), msg("user", "Hello")], true).expect("renders");
    assert_eq!(
        out,
        "<s><|start_header_id|>system<|end_header_id|>\n\nSys<|eot_id|>\
         <|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>\
         <|start_header_id|>assistant<|end_header_id|>\n\n"
    );
}

#[test]
fn missing_special_token_renders_as_nothing() {
    let t = ChatTemplate::new("[{{ bos_token }}]{{ eos_token is defined }}", None, None).expect("compiles");
    assert_eq!(t.render(&[], false).expect("renders"), "[]False");
}

#[test]
fn eos_token_is_available() {
    let out = render("{{ messages[0].content }}{{ eos_token }}", &[msg("assistant", "ok")], false);
    assert_eq!(out.expect("renders"), "ok</s>");
}

#[test]
fn tools_and_documents_are_none() {
    let out = render("{{ tools is none }} {{ tools is defined }} {{ documents is none }}", &[], false);
    assert_eq!(out.expect("renders"), "True True True");
}

#[test]
fn raise_exception_fails_with_the_template_message() {
    let source = "{% if messages[0]['role'] != 'user' %}\
                  {{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}\
                  {% endif %}ok";
    let err = render(source, &[msg("assistant", "x")], false).expect_err("template raises");
    match err {
        ModelError::Template(message) => {
            assert_eq!(message, "Conversation roles must alternate user/assistant/user/assistant/...");
        }
        other => panic!("unexpected error {other:?}"),
    }
    assert_eq!(render(source, &[msg("user", "x")], false).expect("renders"), "ok");
}

#[test]
fn syntax_error_is_reported_at_construction() {
    let err = ChatTemplate::new("{% if messages %}never closed", None, None).expect_err("does not compile");
    assert!(matches!(err, ModelError::Template(_)), "{err:?}");
}

#[test]
fn evaluation_error_is_a_template_error() {
    let err = render("{{ messages[0].content + 1 }}", &[msg("user", "x")], false).expect_err("fails");
    assert!(matches!(err, ModelError::Template(_)), "{err:?}");
}

#[test]
fn trim_blocks_and_lstrip_blocks_remove_block_lines() {
    // Block tags on their own, indented lines must leave no trace in the output: lstrip removes
    // the indentation before them and trim the newline after them.
    let source = "{% for message in messages %}
    {% if message['role'] == 'user' %}
User: {{ message['content'] }}
    {% else %}
Bot: {{ message['content'] }}
    {% endif %}
{% endfor %}
{% if add_generation_prompt %}
Bot:
{% endif %}
";
    let messages = [msg("user", "a"), msg("assistant", "b"), msg("user", "c")];
    assert_eq!(render(source, &messages, true).expect("renders"), "User: a\nBot: b\nUser: c\nBot:\n");
    assert_eq!(render(source, &messages, false).expect("renders"), "User: a\nBot: b\nUser: c\n");
}

#[test]
fn trailing_newline_is_dropped() {
    assert_eq!(render("x\n", &[], false).expect("renders"), "x");
}

#[test]
fn python_string_methods_work() {
    let source = "{% for message in messages %}\
                  {% if message['content'].startswith('/') %}[cmd:{{ message['content'][1:].strip() }}]\
                  {% else %}[{{ message['content'].strip().upper() }}]{% endif %}\
                  {% endfor %}";
    let out = render(source, &[msg("user", "/ help  "), msg("user", "  hi ")], false);
    assert_eq!(out.expect("renders"), "[cmd:help][HI]");
}

#[test]
fn python_dict_methods_work() {
    let out = render("{% for k, v in {'a': 1}.items() %}{{ k }}={{ v }}{% endfor %}", &[], false);
    assert_eq!(out.expect("renders"), "a=1");
}

#[test]
fn message_items_keep_role_then_content() {
    let out = render(
        "{% for k, v in messages[0].items() %}{{ k }}={{ v }};{% endfor %}",
        &[msg("user", "x")],
        false,
    );
    assert_eq!(out.expect("renders"), "role=user;content=x;");
}

#[test]
fn namespace_and_loop_variables_work() {
    let source = "{% set ns = namespace(n=0) %}{% for m in messages %}{% if m.role == 'user' %}\
                  {% set ns.n = ns.n + 1 %}{% endif %}{% if loop.last %}{{ ns.n }}{% endif %}{% endfor %}";
    let messages = [msg("user", "a"), msg("assistant", "b"), msg("user", "c")];
    assert_eq!(render(source, &messages, false).expect("renders"), "2");
}

#[test]
fn tojson_formats_like_python_json_dumps() {
    let out = render("{{ {'a': 1, 'b': [1, 2.5, 'x<y&\"z\"'], 'c': none, 'd': true} | tojson }}", &[], false);
    assert_eq!(out.expect("renders"), r#"{"a": 1, "b": [1, 2.5, "x<y&\"z\""], "c": null, "d": true}"#);
}

#[test]
fn tojson_indents_like_python() {
    let out = render("{{ {'a': [1, {}], 'b': []} | tojson(indent=2) }}", &[], false);
    assert_eq!(out.expect("renders"), "{\n  \"a\": [\n    1,\n    {}\n  ],\n  \"b\": []\n}");
}

#[test]
fn tojson_options() {
    let out = render(
        "{{ {'b': 'é', 'a': 1.0} | tojson(ensure_ascii=true, sort_keys=true, separators=(',', ':')) }}",
        &[],
        false,
    );
    assert_eq!(out.expect("renders"), r#"{"a":1.0,"b":"\u00e9"}"#);
}

#[test]
fn tojson_of_messages() {
    let out = render("{{ messages | tojson }}", &[msg("user", "line\nbreak")], false);
    assert_eq!(out.expect("renders"), r#"[{"role": "user", "content": "line\nbreak"}]"#);
}

#[test]
fn strftime_now_renders_the_current_year() {
    let out = render("{{ strftime_now('%Y') }}", &[], false).expect("renders");
    let year: i64 = out.parse().expect("a year");
    assert!((2024..3000).contains(&year), "{out}");
}

#[test]
fn format_time_matches_python_strftime() {
    // Expected strings from Python's `datetime.fromtimestamp(t, timezone.utc).strftime(...)`.
    let fmt = "%a %A %b %B %d %e %H %I %j %m %M %S %p %y %Y %u %w %F %c|%-d %-m|%Q";
    let cases = [
        (
            1_700_000_000,
            "Tue Tuesday Nov November 14 14 22 10 318 11 13 20 PM 23 2023 2 2 2023-11-14 \
             Tue Nov 14 22:13:20 2023|14 11|%Q",
        ),
        (
            951_829_262,
            "Tue Tuesday Feb February 29 29 13 01 060 02 01 02 PM 00 2000 2 2 2000-02-29 \
             Tue Feb 29 13:01:02 2000|29 2|%Q",
        ),
        (
            0,
            "Thu Thursday Jan January 01  1 00 12 001 01 00 00 AM 70 1970 4 4 1970-01-01 \
             Thu Jan  1 00:00:00 1970|1 1|%Q",
        ),
        (
            -1,
            "Wed Wednesday Dec December 31 31 23 11 365 12 59 59 PM 69 1969 3 3 1969-12-31 \
             Wed Dec 31 23:59:59 1969|31 12|%Q",
        ),
        (
            1_735_689_599,
            "Tue Tuesday Dec December 31 31 23 11 366 12 59 59 PM 24 2024 2 2 2024-12-31 \
             Tue Dec 31 23:59:59 2024|31 12|%Q",
        ),
    ];
    for (secs, expected) in cases {
        assert_eq!(format_time(fmt, secs), expected, "at {secs}");
    }
    assert_eq!(format_time("%d %b %Y", 1_700_000_000), "14 Nov 2023");
    assert_eq!(format_time("100%% %", 0), "100% %");
}

#[test]
fn civil_date_round_trips() {
    for days in (-800_000..800_000).step_by(997) {
        let (y, m, d) = civil_from_days(days);
        assert_eq!(days_from_civil(y, m, d), days);
    }
}

/// transformers enables Jinja2's `loopcontrols` extension; minijinja gates `{% break %}` and
/// `{% continue %}` behind its `loop_controls` cargo feature, which the workspace does not
/// enable yet.
#[test]
fn loop_controls_work() {
    let source = "{% for m in messages %}{% if m.role == 'system' %}{% continue %}{% endif %}\
                  {{ m.content }}{% if loop.index == 2 %}{% break %}{% endif %}{% endfor %}";
    let messages = [msg("system", "s"), msg("user", "a"), msg("user", "b")];
    assert_eq!(render(source, &messages, false).expect("renders"), "a");
}

#[test]
fn template_arguments_are_variables_that_cannot_replace_xinfs() {
    // Qwen3's switch, as its template reads it.
    let source = "{% for m in messages %}{{ m.content }}{% endfor %}{% if add_generation_prompt %}<a>\
        {% if enable_thinking is defined and enable_thinking is false %}<think></think>{% endif %}{% endif %}{{ bos_token }}";
    let t = template(source);
    let hi = [msg("user", "Hi")];
    assert_eq!(t.render(&hi, true).expect("renders"), "Hi<a><s>");
    let args: serde_json::Map<String, serde_json::Value> = serde_json::from_str(
        r#"{"enable_thinking": false, "messages": [], "bos_token": "X", "add_generation_prompt": false}"#,
    )
    .expect("json");
    assert_eq!(t.render_with(&hi, true, Some(&args)).expect("renders"), "Hi<a><think></think><s>");
}

/// Qwen2.5-Instruct's template, verbatim from its `tokenizer_config.json`.
const QWEN2_5: &str = include_str!("testdata/qwen2_5.jinja");

/// A conversation with two tools (one with neither description nor parameters, as vLLM passes
/// it), two calls and their answers, and the template arguments that carry the tools.
fn tool_conversation() -> (Vec<ChatMessage>, serde_json::Map<String, serde_json::Value>) {
    let tools = serde_json::json!({"tools": [
        {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city, <now> & \"today\"",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["city"]}}},
        {"type": "function", "function": {"name": "time", "description": null, "parameters": null}},
    ]});
    let call = |id: &str, arguments: &str| xinf_engine::ToolCall {
        id: id.into(),
        name: "get_weather".into(),
        arguments: arguments.into(),
    };
    let answer = |id: &str, text: &str| ChatMessage { tool_call_id: Some(id.into()), ..msg("tool", text) };
    let messages = vec![
        msg("system", "Be brief."),
        msg("user", "Weather in Paris and Lyon?"),
        ChatMessage {
            tool_calls: vec![
                call("call_1", r#"{"city": "Paris"}"#),
                call("call_2", r#"{"city":"Lyon","unit":"f"}"#),
            ],
            ..msg("assistant", "")
        },
        answer("call_1", "18"),
        answer("call_2", "64"),
    ];
    let serde_json::Value::Object(args) = tools else { unreachable!("an object") };
    (messages, args)
}

/// transformers' `render_jinja_template` of Qwen2.5's template on [`tool_conversation`] (the
/// call arguments as objects, as vLLM passes them).
const QWEN2_5_TOOLS_EXPECTED: &str = "<|im_start|>system\nBe brief.\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Weather in a city, <now> & \\\"today\\\"\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}, \"unit\": {\"type\": \"string\", \"enum\": [\"c\", \"f\"]}}, \"required\": [\"city\"]}}}\n{\"type\": \"function\", \"function\": {\"name\": \"time\", \"description\": null, \"parameters\": null}}\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n<|im_start|>user\nWeather in Paris and Lyon?<|im_end|>\n<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Lyon\", \"unit\": \"f\"}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n18\n</tool_response>\n<tool_response>\n64\n</tool_response><|im_end|>\n<|im_start|>assistant\n";

#[test]
fn qwen2_5_renders_tools_calls_and_answers_as_transformers_does() {
    let (messages, args) = tool_conversation();
    let out = template(QWEN2_5).render_with(&messages, true, Some(&args)).expect("renders");
    assert_eq!(out, QWEN2_5_TOOLS_EXPECTED);
}

#[test]
fn a_template_without_tools_gets_them_in_the_hermes_format() {
    // SmolLM2's ChatML template reads no `tools`: the tools, calls and answers are written into
    // the messages as Qwen2.5's template writes them, so the prompt is the same text.
    let (messages, args) = tool_conversation();
    let out = template(SMOLLM2).render_with(&messages, true, Some(&args)).expect("renders");
    assert_eq!(out, QWEN2_5_TOOLS_EXPECTED);
    // Without a system message one is made for the tools (SmolLM2's default prompt goes).
    let out = template(SMOLLM2).render_with(&messages[1..], true, Some(&args)).expect("renders");
    assert!(out.starts_with("<|im_start|>system\n# Tools\n\nYou may call"), "{out}");
    // A template that reads `tools` is left to write them itself.
    assert!(template(QWEN2_5).takes_tools && !template(SMOLLM2).takes_tools);
}

#[test]
fn messages_show_their_calls_and_call_ids() {
    let (messages, _) = tool_conversation();
    // The template reads `tools`, so the messages reach it as they are.
    let source = "{% if tools %}{% endif %}{% for m in messages %}{{ m | tojson }}\n{% endfor %}";
    let out = template(source).render_with(&messages[2..4], false, None).expect("renders");
    assert_eq!(
        out,
        "{\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": [{\"id\": \"call_1\", \"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}}, {\"id\": \"call_2\", \"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Lyon\", \"unit\": \"f\"}}}]}\n{\"role\": \"tool\", \"content\": \"18\", \"tool_call_id\": \"call_1\"}\n"
    );
}
