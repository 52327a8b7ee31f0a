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
