//! The `xinf` command as a user runs it.

use crate::util;
use std::process::Command;

fn xinf() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_xinf"));
    c.env("LANG", "C");
    c
}

#[test]
fn generate_answers_paris() {
    let _ = util::smollm2(); // fetched once for all tests
    let out = xinf()
        .args(["generate", "--model-name", "smollm2-instruct", "--chat", "What is the capital of France?"])
        .args(["--temperature", "0", "--max-tokens", "40"])
        .output()
        .expect("run xinf");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("Paris"), "{stdout}");
}

#[test]
fn generate_reports_errors_in_the_users_language() {
    let out = xinf()
        .args(["generate", "--model-path", "/nonexistent/model.gguf", "--prompt", "hi"])
        .output()
        .expect("run xinf");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/nonexistent/model.gguf"), "{err}");
    let out = xinf()
        .env("LANG", "zh_CN.UTF-8")
        .args(["generate", "--model-path", "/nonexistent/model.gguf", "--prompt", "hi"])
        .output()
        .expect("run xinf");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("错误"), "{err}");
    let out = xinf().args(["generate", "--prompt", "hi", "--kv-layout", "ring"]).output().expect("run xinf");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("kv_layout"), "{err}");
}

/// `xinf random-checkpoint` writes a Hugging Face folder for a config that loads and
/// generates (with a warning that its weights are random); a bad config is refused clearly.
#[test]
fn random_checkpoint_writes_a_loadable_folder() {
    let _ = util::smollm2();
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("config.json");
    let tiny = serde_json::json!({
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 49152, "tie_word_embeddings": true,
        "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "torch_dtype": "bfloat16", "eos_token_id": 2
    });
    std::fs::write(&config, tiny.to_string()).expect("write config");
    let out = dir.path().join("ckpt");
    let run = xinf()
        .args(["random-checkpoint", "--config"])
        .arg(&config)
        .arg("--out")
        .arg(&out)
        .args(["--seed", "3"])
        .output()
        .expect("run xinf");
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stderr}");
    // 49152·64 embedding + 2 layers: 3,155,200 + 2·(norms, q/k/v/o with bias, MLP) + norm.
    assert!(stderr.contains("parameters") && stderr.contains("bf16"), "{stderr}");
    for f in ["model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json", "README.md"] {
        assert!(out.join(f).exists(), "{f} missing");
    }
    let written: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("config.json")).expect("config"))
            .expect("json");
    assert_eq!(written["xinf_random_weights"], true);

    let generated = xinf()
        .args(["generate", "--model-name", "tiny-random", "--model-path"])
        .arg(&out)
        .args(["--prompt", "Hello", "--max-tokens", "4", "--temperature", "0"])
        .output()
        .expect("run xinf");
    let stderr = String::from_utf8_lossy(&generated.stderr);
    assert!(generated.status.success(), "{stderr}");
    assert!(stderr.contains("random weights"), "no warning: {stderr}");

    // Into a folder that is not empty, and with an unknown dtype: refused, naming why.
    let again = xinf().args(["random-checkpoint", "--config"]).arg(&config).arg("--out").arg(&out).output();
    let again = again.expect("run xinf");
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("not empty"));
    let bad = xinf()
        .args(["random-checkpoint", "--dtype", "int3", "--config"])
        .arg(&config)
        .arg("--out")
        .arg(dir.path().join("other"))
        .output()
        .expect("run xinf");
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--dtype `int3`"));
}
