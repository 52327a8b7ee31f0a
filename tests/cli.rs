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

/// `xinf local --mps` with a stand-in for `nvidia-cuda-mps-control` (`XINF_MPS_CONTROL`; the
/// real one needs a GPU): the daemon is started before the server serves, with its log where
/// `CUDA_MPS_LOG_DIRECTORY` says, and told to quit when xinf stops; one already running is used
/// and left running; a daemon that cannot start stops xinf with the program's own words.
#[test]
fn local_runs_under_mps_and_stops_only_the_daemon_it_started() {
    let dir = util::scratch().join(format!("mps-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch folder");
    let control = dir.join("mps-control");
    std::fs::write(
        &control,
        "#!/bin/sh\n\
         d=$CUDA_MPS_PIPE_DIRECTORY\n\
         if [ \"$1\" = -d ]; then\n\
           echo \"start log=$CUDA_MPS_LOG_DIRECTORY\" >> \"$d/calls\"\n\
           if [ -n \"$FAKE_MPS_FAIL\" ]; then echo 'cannot start: no GPU here' >&2; exit 1; fi\n\
           touch \"$d/control\"; exit 0\n\
         fi\n\
         read cmd; echo \"$cmd\" >> \"$d/calls\"\n\
         [ -e \"$d/control\" ] || { echo 'Cannot find MPS control daemon process' >&2; exit 1; }\n\
         [ \"$cmd\" = quit ] && rm -f \"$d/control\"\n\
         exit 0\n",
    )
    .expect("write the stand-in");
    let ok = Command::new("chmod").arg("+x").arg(&control).status().is_ok_and(|s| s.success());
    assert!(ok, "chmod");
    let pipes = dir.join("pipe");
    std::fs::create_dir_all(&pipes).expect("pipe folder");
    let calls = || std::fs::read_to_string(pipes.join("calls")).unwrap_or_default();
    let local = |mps: &[&str], env: &[(&str, &str)]| {
        let mut cmd = util::procs::xinf();
        cmd.args(["local", "--port", "0"])
            .args(mps)
            .env("XINF_MPS_CONTROL", &control)
            .env("CUDA_MPS_PIPE_DIRECTORY", &pipes)
            .env("CUDA_MPS_LOG_DIRECTORY", dir.join("log"))
            .envs(env.iter().copied());
        cmd
    };

    // Started, then stopped with xinf.
    let mut p = util::procs::Proc::spawn(local(&["--mps"], &[]));
    p.wait_for("REST API at http://");
    assert!(p.log().contains("MPS control daemon started"), "{}", p.log());
    assert!(calls().starts_with(&format!("start log={}\n", dir.join("log").display())), "{}", calls());
    assert!(pipes.join("control").exists());
    p.signal("-TERM");
    assert!(p.wait(std::time::Duration::from_secs(60)).is_some(), "xinf did not stop:\n{}", p.log());
    assert!(calls().ends_with("quit\n"), "{}", calls());
    assert!(!pipes.join("control").exists(), "the daemon xinf started was left running");

    // Already running (XINF_MPS=1 asks for it): used, and left running.
    std::fs::write(pipes.join("control"), "").expect("control socket");
    std::fs::write(pipes.join("calls"), "").expect("reset calls");
    let mut p = util::procs::Proc::spawn(local(&[], &[("XINF_MPS", "1")]));
    p.wait_for("REST API at http://");
    assert!(p.log().contains("already running"), "{}", p.log());
    p.signal("-TERM");
    assert!(p.wait(std::time::Duration::from_secs(60)).is_some(), "xinf did not stop:\n{}", p.log());
    assert_eq!(calls(), "get_server_list\n", "only asked, never started or stopped");
    assert!(pipes.join("control").exists());

    // XINF_MPS=0 is off: the control program is not run at all.
    std::fs::write(pipes.join("calls"), "").expect("reset calls");
    let mut p = util::procs::Proc::spawn(local(&[], &[("XINF_MPS", "0")]));
    p.wait_for("REST API at http://");
    p.kill();
    assert_eq!(calls(), "");

    // A daemon that cannot start: xinf stops before serving, saying why in the program's words.
    std::fs::remove_file(pipes.join("control")).expect("no daemon");
    let out = local(&["--mps"], &[("FAKE_MPS_FAIL", "1")]).output().expect("run xinf");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("MPS") && err.contains("cannot start: no GPU here"), "{err}");
    assert!(!err.contains("REST API at"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
