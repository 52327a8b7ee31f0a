//! What several modules' unit tests share.

use xinf_models::ModelConfig;

/// A small Llama: 2 layers, 4 heads, 2 KV heads of 16.
pub(crate) fn small_llama() -> ModelConfig {
    ModelConfig::from_hf_json(
        &serde_json::json!({
            "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
            "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "vocab_size": 100, "rms_norm_eps": 1e-6,
            "max_position_embeddings": 512, "eos_token_id": [1, 2]
        })
        .to_string(),
        "config.json",
    )
    .expect("a valid config")
}
