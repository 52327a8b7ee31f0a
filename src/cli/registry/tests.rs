use super::*;
use crate::cli::Cli;
use clap::Parser;
use serde_json::json;

#[test]
fn registrations_parse_with_or_without_an_endpoint() {
    let cli = Cli::try_parse_from(["xinf", "registrations"]).map(|c| format!("{c:?}"));
    assert!(cli.as_deref().is_ok_and(|c| c.contains("model_type: \"LLM\"")), "{cli:?}");
    let cli = Cli::try_parse_from(["xinf", "registrations", "-t", "LLM", "-e", "http://h:1", "--json"]);
    let cli = cli.map(|c| format!("{c:?}"));
    assert!(cli.as_deref().is_ok_and(|c| c.contains("Some(\"http://h:1\")") && c.contains("json: true")));
    assert_eq!(registrations_path("LLM"), "/v1/model_registrations/LLM?detailed=true");
}

#[test]
fn the_local_registry_has_the_servers_shape() {
    let list: Vec<Registration> = serde_json::from_value(local_registry("LLM")).unwrap_or_default();
    let smollm = list.iter().find(|r| r.model_name == "smollm2-instruct");
    assert!(smollm.is_some_and(|r| r.context_length.is_some() && !r.model_specs.is_empty()));
    assert_eq!(local_registry("embedding"), json!([]));
}

#[test]
fn registration_rows_from_the_api_answer() {
    let answer = json!([{"version": 2, "model_type": "LLM", "model_name": "qwen2.5-instruct",
        "model_ability": ["generate", "chat"], "model_description": "Qwen2.5 chat",
        "context_length": 32768, "is_builtin": true, "model_specs": [
            {"model_format": "pytorch", "model_size_in_billions": "0_5", "quantization": "none", "model_src": "hf:a"},
            {"model_format": "ggufv2", "model_size_in_billions": "0_5", "quantization": "Q4_1", "model_src": "hf:b"},
            {"model_format": "pytorch", "model_size_in_billions": 7, "quantization": "none", "model_src": "hf:c"}]}]);
    let list: Vec<Registration> = serde_json::from_value(answer).unwrap_or_default();
    let rows = registration_rows(&list, &Catalog::new("en"));
    assert_eq!(rows[0], ["NAME", "CONTEXT", "FORMATS", "SIZES", "QUANTIZATIONS", "DESCRIPTION"]);
    assert_eq!(
        rows[1],
        ["qwen2.5-instruct", "32768", "pytorch, ggufv2", "0_5, 7", "none, Q4_1", "Qwen2.5 chat"]
    );
}

#[test]
fn engine_rows_from_the_api_answer_with_filters() {
    let parse = |extra: &[&str]| {
        let mut line = vec!["xinf", "engine", "-n", "qwen2.5-instruct"];
        line.extend_from_slice(extra);
        match Cli::try_parse_from(super::super::expand_short_flags(line.into_iter().map(Into::into))) {
            Ok(Cli { command: crate::cli::Command::Engine(args) }) => Some(args),
            _ => None,
        }
    };
    let answer = json!({
        "native": [{"model_name": "qwen2.5-instruct", "model_format": "pytorch", "model_size_in_billions": "0_5",
                    "quantizations": ["none"]},
                   {"model_name": "qwen2.5-instruct", "model_format": "ggufv2", "model_size_in_billions": "0_5",
                    "quantizations": ["Q4_1", "Q8_0"]}],
        "vllm": [{"model_name": "qwen2.5-instruct", "model_format": "pytorch", "model_size_in_billions": 7,
                  "quantizations": ["none"]}]});
    let answer: BTreeMap<String, Vec<EngineParams>> = serde_json::from_value(answer).unwrap_or_default();
    let en = Catalog::new("en");
    let Some(all) = parse(&[]) else { panic!("engine -n did not parse") };
    assert_eq!(engines_path(&all.model_name), "/v1/engines/LLM/qwen2.5-instruct");
    let rows = engine_rows(&answer, &all, &en);
    assert_eq!(rows[0], ["NAME", "ENGINE", "FORMAT", "SIZE", "QUANTIZATIONS"]);
    assert_eq!(rows[2], ["qwen2.5-instruct", "native", "ggufv2", "0_5", "Q4_1, Q8_0"]);
    assert_eq!(rows[3], ["qwen2.5-instruct", "vllm", "pytorch", "7", "none"]);
    assert_eq!(rows.len(), 4);
    let Some(some) = parse(&["-en", "native", "-f", "ggufv2", "-q", "q8_0"]) else { panic!("filters") };
    let rows = engine_rows(&answer, &some, &en);
    assert_eq!(rows[1..], [["qwen2.5-instruct", "native", "ggufv2", "0_5", "Q8_0"]]);
    assert!(parse(&["-s", "7"]).is_some_and(|a| engine_rows(&answer, &a, &en).len() == 2));
    assert!(Cli::try_parse_from(["xinf", "engine"]).is_err(), "-n is required");
}
