use super::*;
use crate::cli::{Cli, Command, expand_short_flags};
use clap::{CommandFactory, Parser};
use serde_json::json;

/// `xinf launch` as `main` reads its command line.
fn launch_args(line: &[&str]) -> Result<LaunchArgs, String> {
    let args = expand_short_flags(line.iter().map(Into::into));
    let args = extra_engine_options(args, &Cli::command());
    match Cli::try_parse_from(args) {
        Ok(Cli { command: Command::Launch(args) }) => Ok(args),
        Ok(other) => Err(format!("{other:?}")),
        Err(e) => Err(e.to_string()),
    }
}

#[test]
fn unknown_options_become_engine_options() {
    let line = [
        "xinf",
        "launch",
        "-n",
        "smollm2-instruct",
        "--max_model_len",
        "4096",
        "-e",
        "http://h:1",
        "--enforce-eager",
        "--gpu-memory-utilization=0.5",
        "--seed",
        "-1",
        "--engine-option",
        "kv_cache_tokens=1024",
        "--no-wait",
    ];
    let args = launch_args(&line);
    let Ok(args) = args else { panic!("{args:?}") };
    assert_eq!(
        args.source.engine_option,
        [
            "max_model_len=4096",
            "enforce-eager=true",
            "gpu-memory-utilization=0.5",
            "seed=-1",
            "kv_cache_tokens=1024"
        ]
    );
    assert!(args.no_wait);
    assert_eq!(args.endpoint.endpoint, "http://h:1");
    assert_eq!(args.source.model_name.as_deref(), Some("smollm2-instruct"));
    // Xinference's spellings of known flags stay flags.
    let args = launch_args(&["xinf", "launch", "-n", "m", "--replica_config", "[]", "-en", "native"]);
    assert!(args.is_ok_and(|a| a.source.engine_option.is_empty() && a.source.replica_config.is_some()));
}

#[test]
fn other_command_lines_are_left_as_they_are() {
    let cli = Cli::command();
    let line: Vec<OsString> = ["xinf", "list", "--max_model_len", "4"].iter().map(Into::into).collect();
    assert_eq!(extra_engine_options(line.clone(), &cli), line);
    let line: Vec<OsString> = ["xinf", "launch", "-n", "m", "--", "--x"].iter().map(Into::into).collect();
    assert_eq!(extra_engine_options(line.clone(), &cli), line);
    let help: Vec<OsString> = ["xinf", "launch", "--help"].iter().map(Into::into).collect();
    assert_eq!(extra_engine_options(help.clone(), &cli), help);
}

#[test]
fn other_engines_names_are_read_as_xinfs() {
    let en = Catalog::new("en");
    let given = [
        "max-model-len=8192".to_owned(),
        "max_num_batched_tokens=256".to_owned(),
        "block_size=32".to_owned(),
    ];
    let native = engine_options(&given, true, &en);
    let Ok((options, renamed)) = native else { panic!("{native:?}") };
    assert_eq!(
        Value::Object(options),
        json!({"context_length": 8192, "max_batch_tokens": 256, "block_size": 32})
    );
    assert_eq!(
        renamed,
        [
            ("max_model_len".to_owned(), "context_length"),
            ("max_num_batched_tokens".to_owned(), "max_batch_tokens")
        ]
    );
    // vLLM and SGLang replicas take max_num_batched_tokens by its own name.
    let vllm = engine_options(&given, false, &en).map(|(o, _)| Value::Object(o));
    assert_eq!(vllm, Ok(json!({"context_length": 8192, "max_num_batched_tokens": 256, "block_size": 32})));
    assert!(engine_options(&["oops".to_owned()], true, &en).is_err());
    let hint = en.text("cli-engine-option-alias", &[("given", "max_model_len"), ("key", "context_length")]);
    assert!(hint.contains("max_model_len") && hint.contains("context_length"), "{hint}");
}

#[test]
fn the_launch_body_carries_the_extra_options() {
    let en = Catalog::new("en");
    let line = [
        "xinf",
        "launch",
        "-n",
        "smollm2-instruct",
        "-u",
        "chat",
        "--max_model_len",
        "2048",
        "--max_num_batched_tokens",
        "128",
        "--kv_cache_tokens",
        "4096",
    ];
    let args = launch_args(&line);
    let Ok(args) = args else { panic!("{args:?}") };
    let request = args.source.request(&en);
    let body = request.and_then(|r| serde_json::to_value(&r).map_err(|e| e.to_string()));
    let Ok(body) = body else { panic!("{body:?}") };
    assert_eq!(body["model_name"], "smollm2-instruct");
    assert_eq!(body["model_uid"], "chat");
    assert_eq!(
        body["engine_config"],
        json!({"context_length": 2048, "max_batch_tokens": 128, "kv_cache_tokens": 4096})
    );
    // A native option the engine does not know is refused before anything is sent.
    let args = launch_args(&["xinf", "launch", "-n", "smollm2-instruct", "--no_such_option", "1"]);
    assert!(args.is_ok_and(|a| a.source.request(&en).is_err()));
}

/// The launch request body a command line sends.
fn body_of(line: &[&str]) -> Value {
    let args = launch_args(line);
    let Ok(args) = args else { panic!("{args:?}") };
    let body = args
        .source
        .request(&Catalog::new("en"))
        .and_then(|r| serde_json::to_value(&r).map_err(|e| e.to_string()));
    let Ok(body) = body else { panic!("{body:?}") };
    body
}

#[test]
fn launch_keys_go_to_the_top_of_the_body_in_either_spelling() {
    let line = [
        "xinf",
        "launch",
        "-n",
        "qwen3",
        "--reasoning_content",
        "--enable-thinking",
        "false",
        "--request_limits",
        "8",
    ];
    let body = body_of(&line);
    assert_eq!(
        (&body["reasoning_content"], &body["enable_thinking"], &body["request_limits"]),
        (&json!(true), &json!(false), &json!(8))
    );
    assert!(body.get("engine_config").is_none_or(Value::is_null), "{body}");
    let args = launch_args(&["xinf", "launch", "-n", "qwen3", "--reasoning-content", "false"]);
    assert!(args.is_ok_and(|a| a.source.reasoning_content == Some(false)));
    assert!(launch_args(&["xinf", "launch", "-n", "qwen3", "--request-limits", "many"]).is_err());
}

/// The start of a P/D launch's command line.
const PD_LAUNCH: [&str; 6] = [
    "xinf",
    "launch",
    "-n",
    "smollm2-instruct",
    "--replica-config",
    r#"[{"role":"prefill"},{"role":"decode"}]"#,
];

/// Launch keywords that have no flag of their own (P/D ones), given as options, are the
/// launch's: at the top of the body, not in `engine_config`.
#[test]
fn launch_keywords_given_as_options_go_to_the_top_of_the_body() {
    let options = [
        "--max_local_prefill_tokens",
        "256",
        "--engine-option",
        "prefill_fallback=true",
        "--kv_cache_tokens",
        "4096",
    ];
    let body = body_of(&[&PD_LAUNCH[..], &options].concat());
    assert_eq!((&body["max_local_prefill_tokens"], &body["prefill_fallback"]), (&json!(256), &json!(true)));
    assert_eq!(body["engine_config"], json!({"kv_cache_tokens": 4096}), "{body}");
}

#[test]
fn a_key_given_twice_is_refused_naming_it() {
    let en = Catalog::new("en");
    let twice = |line: &[&str]| {
        let args = launch_args(line);
        let Ok(args) = args else { panic!("{args:?}") };
        args.source.request(&en).err().unwrap_or_default()
    };
    let line = [
        &PD_LAUNCH[..],
        &["--engine-option", "max_local_prefill_tokens=100", "--max_local_prefill_tokens", "50"],
    ];
    assert_eq!(twice(&line.concat()), "`max_local_prefill_tokens` is given twice; give it once");
    // Under another engine's name too (`max_model_len` is the native engine's `context_length`).
    let line = [&PD_LAUNCH[..], &["--max_model_len", "4096", "--context_length", "2048"]];
    assert_eq!(twice(&line.concat()), "`context_length` is given twice; give it once");
    // A launch key's own flag and the same key as an option.
    let line = [&PD_LAUNCH[..], &["--request-limits", "8", "--engine-option", "request_limits=9"]];
    assert_eq!(twice(&line.concat()), "`request_limits` is given twice; give it once");
}

#[test]
fn a_launch_without_waiting_says_it_is_loading() {
    for lang in xinf_i18n::languages() {
        let cat = Catalog::new(lang);
        let accepted = cat.text("cli-launch-accepted", &[("uid", "chat")]);
        assert!(accepted.contains("chat"), "{lang}: {accepted}");
        assert_ne!(accepted, cat.text("cli-launch-done", &[("uid", "chat"), ("secs", "1.0")]), "{lang}");
        assert!(cat.text("cli-model-context", &[("tokens", "8192")]).contains("8192"), "{lang}");
    }
}
