use super::*;

fn base() -> serde_json::Value {
    serde_json::json!({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 100, "rms_norm_eps": 1e-6,
        "max_position_embeddings": 512, "hidden_act": "silu", "eos_token_id": [1, 2]
    })
}

fn parse(v: serde_json::Value) -> Result<ModelConfig, ModelError> {
    ModelConfig::from_hf_json(&v.to_string(), "config.json")
}

#[test]
fn llama_defaults() {
    let c = parse(base()).expect("valid");
    assert_eq!(c.architecture, Architecture::Llama);
    assert_eq!(c.head_dim, 16);
    assert!(!c.tie_word_embeddings && !c.qkv_bias && !c.qk_norm);
    assert_eq!(c.eos_token_ids, vec![1, 2]);
}

fn field_of(e: ModelError) -> String {
    match e {
        ModelError::Unsupported { field, .. } => field,
        other => panic!("unexpected error {other}"),
    }
}

#[test]
fn unsupported_things_name_their_field() {
    let mut v = base();
    v["model_type"] = "mamba".into();
    v["architectures"] = serde_json::json!(["MambaForCausalLM"]);
    assert_eq!(field_of(parse(v).expect_err("refused")), "model_type");

    let mut v = base();
    v["rope_scaling"] = serde_json::json!({"rope_type": "yarn", "factor": 4.0});
    assert_eq!(field_of(parse(v).expect_err("refused")), "rope_scaling.rope_type");

    let mut v = base();
    v["sliding_window"] = 4096.into();
    assert_eq!(field_of(parse(v).expect_err("refused")), "sliding_window");

    let mut v = base();
    v["vision_config"] = serde_json::json!({});
    assert_eq!(field_of(parse(v).expect_err("refused")), "vision_config");

    let mut v = base();
    v["layer_types"] = serde_json::json!(["full_attention", "linear_attention"]);
    assert_eq!(field_of(parse(v).expect_err("refused")), "layer_types");

    let mut v = base();
    v["num_key_value_heads"] = 3.into();
    assert_eq!(field_of(parse(v).expect_err("refused")), "num_key_value_heads");
}

#[test]
fn corrupt_json_names_the_file() {
    let e = ModelConfig::from_hf_json("{not json", "config.json").expect_err("refused");
    assert!(matches!(e, ModelError::Corrupt { ref file, .. } if file == "config.json"), "{e}");
}
