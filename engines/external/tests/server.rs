//! Engine-server management against a real child process: `fake_engine.py` stands in for vLLM
//! and SGLang (started the same way, speaking the same streamed endpoints), so starting,
//! health, proxying, abort, a crash, a failed start and terminate are all exercised without a
//! GPU.

use futures::StreamExt;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::time::Duration;
use xinf_engine::{
    Engine, EngineError, EngineLoader, FinishReason, GenerateRequest, KvRole, ModelSource, Prompt,
    SamplingParams, TokenEvent,
};
use xinf_engine_external::{Flavor, ServerEngine, ServerLoader};

#[path = "server/logprobs.rs"]
mod logprobs;

fn fake_engine() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fake_engine.py").display().to_string()
}

/// A Hugging Face folder with what xinf reads itself (config, tokenizer; the weights are only
/// hashed, never parsed, by a server engine's loader).
fn model_dir(dir: &Path) -> PathBuf {
    let words = ["<unk>", "<eos>", "hello", "world", "the", "cat", "sat", "on", "mat"];
    let vocab: serde_json::Map<String, Value> =
        words.iter().enumerate().map(|(i, w)| ((*w).to_owned(), json!(i))).collect();
    let tokenizer = json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null,
        "decoder": null, "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}
    });
    let config = json!({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 64, "rms_norm_eps": 1e-6,
        "max_position_embeddings": 256, "hidden_act": "silu", "eos_token_id": 1, "torch_dtype": "float16"
    });
    let out = dir.join("tiny");
    std::fs::create_dir_all(&out).expect("model dir");
    std::fs::write(out.join("tokenizer.json"), tokenizer.to_string()).expect("tokenizer");
    std::fs::write(
        out.join("tokenizer_config.json"),
        json!({"eos_token": "<eos>", "chat_template": "{% for m in messages %}{{ m['content'] }} {% endfor %}"})
            .to_string(),
    )
    .expect("tokenizer config");
    std::fs::write(out.join("config.json"), config.to_string()).expect("config");
    std::fs::write(out.join("model.safetensors"), b"weights are only hashed here").expect("weights");
    out
}

struct Fixture {
    _scratch: tempfile::TempDir,
    model: ModelSource,
}

fn fixture() -> Fixture {
    let scratch = xinf_test_util::scratch_dir();
    let dir = model_dir(scratch.path());
    Fixture {
        model: ModelSource {
            model_name: "tiny".into(),
            model_path: Some(dir.display().to_string()),
            ..Default::default()
        },
        _scratch: scratch,
    }
}

fn config(extra: Value) -> serde_json::Map<String, Value> {
    let mut m = json!({"python": fake_engine(), "device": "cuda:0", "launch_timeout_s": 30})
        .as_object()
        .cloned()
        .unwrap_or_default();
    if let Value::Object(e) = extra {
        m.extend(e);
    }
    m
}

fn load(f: &Fixture, flavor: Flavor, extra: Value) -> Result<ServerEngine, EngineError> {
    start(f, flavor, extra, None)
}

/// [`load`] as one side of P/D handoffs.
fn load_as(f: &Fixture, flavor: Flavor, extra: Value, role: KvRole) -> Result<ServerEngine, EngineError> {
    start(f, flavor, extra, Some(role))
}

fn start(
    f: &Fixture,
    flavor: Flavor,
    extra: Value,
    role: Option<KvRole>,
) -> Result<ServerEngine, EngineError> {
    let loader = ServerLoader::new(flavor);
    let mut typed = loader.check_config(&config(extra))?;
    if let Some(role) = role {
        typed.set_kv_role(role);
    }
    loader.load_server(&f.model, &typed)
}

fn request(id: &str, text: &str, max_tokens: usize) -> GenerateRequest {
    GenerateRequest {
        request_id: id.into(),
        prompt: Prompt::Text(text.into()),
        sampling: SamplingParams::greedy(max_tokens),
    }
}

/// The fake's output for a prompt of these ids.
fn expected(prompt: &[u32], n: usize) -> Vec<u32> {
    let sum: u32 = prompt.iter().sum();
    (0..n as u32).map(|i| (sum + 7 * i) % 40 + 3).collect()
}

async fn collect(engine: &dyn Engine, req: GenerateRequest) -> (Vec<u32>, String, Option<FinishReason>) {
    let mut stream = engine.submit(req).expect("submit");
    let (mut ids, mut text, mut reason) = (Vec::new(), String::new(), None);
    while let Some(event) = stream.next().await {
        match event.expect("event") {
            TokenEvent::Delta { token_id, text: t, .. } => {
                ids.push(token_id);
                text.push_str(&t);
            }
            TokenEvent::Finished { reason: r, usage } => {
                assert_eq!(usage.completion_tokens, ids.len());
                reason = Some(r);
            }
            TokenEvent::Prompt(_) => {}
        }
    }
    (ids, text, reason)
}

fn log_of(engine: &ServerEngine) -> String {
    std::fs::read_to_string(engine.log_path()).unwrap_or_default()
}

/// Whether the server's log shows a prompt-scoring call for request `id` (its id there is an
/// attempt of `id`, `<id>.<n>-prompt`).
fn scoring_call(log: &str, id: &str) -> bool {
    log.lines().any(|l| l.starts_with(&format!("request {id}.")) && l.contains("-prompt "))
}

/// A client that drops a request and sends it again under its id is served at once, though
/// the server still holds the first attempt's id for a while after its abort and refuses a
/// request under an id it holds (as vLLM does): each attempt reaches the server under an id of
/// its own, xinf's id and a number.
#[test]
fn a_request_sent_again_under_its_id_after_an_abort_reaches_the_server_as_a_new_one() {
    let rt = xinf_test_util::runtime();
    let _in_runtime = rt.enter();
    let f = fixture();
    for flavor in Flavor::ALL {
        let env = json!({"env": {"FAKE_STEP_MS": "5", "FAKE_ID_LINGER_MS": "30000"}});
        let engine = load(&f, flavor, env).expect("load");
        let ids = engine.prompt_token_ids(&Prompt::Text("the mat".into())).expect("ids");
        let stream = engine.submit(request("again", "the mat", 200)).expect("submit");
        rt.block_on(async {
            let mut stream = stream;
            let first = stream.next().await.expect("first").expect("event");
            assert!(matches!(first, TokenEvent::Delta { .. }));
            assert!(engine.abort("again"));
            while stream.next().await.is_some() {}
        });
        xinf_test_util::poll(Duration::from_secs(10), "the abort reaching the server", || {
            log_of(&engine).contains("client disconnected again.")
        });
        let (out, _, reason) = rt.block_on(collect(&engine, request("again", "the mat", 3)));
        assert_eq!((out, reason), (expected(&ids, 3), Some(FinishReason::Length)), "{flavor}");
        let log = log_of(&engine);
        let sent: Vec<&str> = log
            .lines()
            .filter_map(|l| l.strip_prefix("request again."))
            .map(|l| l.split(' ').next().unwrap_or_default())
            .collect();
        assert!(
            sent.len() == 2 && sent[0] != sent[1],
            "{flavor}: two attempts under ids of their own:\n{log}"
        );
        assert!(!log.contains("refused"), "{flavor}:\n{log}");
        engine.shutdown();
    }
}

#[test]
fn both_engines_serve_through_their_servers_and_stop_with_the_replica() {
    let rt = xinf_test_util::runtime();
    let _in_runtime = rt.enter();
    let f = fixture();
    for flavor in Flavor::ALL {
        let engine = load(&f, flavor, json!({"env": {"FAKE_STEP_MS": "5"}})).expect("load");
        assert_eq!(engine.contract().architecture, "llama");
        assert_eq!(engine.contract().context_length, 256);
        let ids = engine.prompt_token_ids(&Prompt::Text("hello world the cat".into())).expect("ids");
        assert_eq!(ids, vec![2, 3, 4, 5]);
        let (out, text, reason) = rt.block_on(collect(&engine, request("a", "hello world the cat", 6)));
        assert_eq!(out, expected(&ids, 6), "{flavor}: the server's tokens, in order");
        assert_eq!(text, out.iter().map(|t| format!("t{t} ")).collect::<String>());
        assert_eq!(reason, Some(FinishReason::Length));
        assert_eq!(engine.stats().generated_tokens, 6);

        // A refusal of the server reaches the caller as the request's error, with its message.
        let mut big = request("b", "hello", 1);
        big.sampling.max_tokens = Some(200_000);
        let err = engine.submit(big).err().expect("context check");
        assert!(matches!(err, EngineError::ContextLength { .. }), "{err}");

        // Abort: the caller sees Finished(abort) and the server sees its client go away.
        let stream = engine.submit(request("c", "the mat", 200)).expect("submit");
        rt.block_on(async {
            let mut stream = stream;
            let first = stream.next().await.expect("first").expect("event");
            assert!(matches!(first, TokenEvent::Delta { .. }));
            assert!(engine.abort("c"));
            let mut last = None;
            while let Some(e) = stream.next().await {
                last = Some(e.expect("event"));
            }
            assert!(
                matches!(last, Some(TokenEvent::Finished { reason: FinishReason::Abort, .. })),
                "{last:?}"
            );
        });
        xinf_test_util::poll(Duration::from_secs(10), "the abort reaching the server", || {
            log_of(&engine).contains("client disconnected c")
        });
        if flavor == Flavor::Sglang {
            xinf_test_util::poll(Duration::from_secs(10), "SGLang's abort_request", || {
                log_of(&engine).contains("abort_request c")
            });
        }
        // Terminate: the process group goes (shutdown returns once it has), and an exit that
        // was asked for is no death of the engine.
        let exited = engine.exited();
        engine.shutdown();
        let death = rt.block_on(async { tokio::time::timeout(Duration::from_millis(500), exited).await });
        assert!(death.is_err(), "terminate reported as a death: {death:?}");
        let err = engine.submit(request("d", "hello", 2)).err().expect("a stopped server takes no requests");
        assert!(err.to_string().contains("exited"), "{err}");
        let log = log_of(&engine);
        assert!(log.contains("CUDA_VISIBLE_DEVICES=0"), "the GPU goes by CUDA_VISIBLE_DEVICES:\n{log}");
        assert_eq!(log.contains("--incremental-streaming-output"), flavor == Flavor::Sglang, "{log}");
    }
}

/// A worker that `CUDA_VISIBLE_DEVICES` limits to some of the host's GPUs numbers them from 0;
/// its server is given the host's name of its GPU. The loader runs in a child process of this
/// test binary, the one way to give it that variable without changing it under other tests.
#[test]
fn a_server_is_given_its_gpu_as_the_host_names_it() {
    if std::env::var("XINF_TEST_CHILD").as_deref() == Ok("host-gpu") {
        let rt = xinf_test_util::runtime();
        let _in_runtime = rt.enter();
        let f = fixture();
        let engine = load(&f, Flavor::Vllm, json!({"device": "cuda:1"})).expect("load");
        let log = log_of(&engine);
        engine.shutdown();
        assert!(log.contains("CUDA_VISIBLE_DEVICES=7"), "the worker's GPU 1 is the host's 7:\n{log}");
        let err = load(&f, Flavor::Vllm, json!({"device": "cuda:2"})).err().expect("a GPU it does not see");
        assert!(err.to_string().contains("CUDA_VISIBLE_DEVICES=5,7"), "{err}");
        return;
    }
    let name = "a_server_is_given_its_gpu_as_the_host_names_it";
    let out = std::process::Command::new(std::env::current_exe().expect("the test binary"))
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env("XINF_TEST_CHILD", "host-gpu")
        .env("CUDA_VISIBLE_DEVICES", "5,7")
        .output()
        .expect("the child");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && text.contains("1 passed"), "{text}");
}

/// The interpreter is asked for the engine's release before a server starts: none is refused
/// at once, another is refused for a P/D replica (xinf's connector uses the engine's
/// internals) and allowed for an ordinary one.
#[test]
fn the_interpreter_s_engine_release_is_checked_before_the_server_starts() {
    let rt = xinf_test_util::runtime();
    let _in_runtime = rt.enter();
    let f = fixture();
    let err = load(&f, Flavor::Vllm, json!({"env": {"FAKE_ENGINE_VERSION": ""}})).err().expect("no vLLM");
    let text = err.to_string();
    assert!(text.contains("has no vllm package") && text.contains("engine_config.python"), "{text}");
    let err =
        load(&f, Flavor::Sglang, json!({"python": "/nonexistent/python3"})).err().expect("no interpreter");
    assert!(err.to_string().contains("could not be started"), "{err}");
    let newer = json!({"env": {"FAKE_ENGINE_VERSION": "0.27.1"}});
    let err = load_as(&f, Flavor::Vllm, newer.clone(), KvRole::Producer)
        .err()
        .expect("a P/D replica on another release");
    let text = err.to_string();
    assert!(text.contains("vllm 0.27.1") && text.contains("vLLM 0.26.0"), "{text}");
    let engine = load(&f, Flavor::Vllm, newer).expect("an ordinary replica on another release starts");
    engine.shutdown();
    // A local label is the same release.
    let labelled = json!({"env": {"FAKE_ENGINE_VERSION": "0.26.0+cu130"}});
    load(&f, Flavor::Vllm, labelled.clone()).expect("0.26.0+cu130").shutdown();
    load_as(&f, Flavor::Vllm, labelled, KvRole::Consumer).expect("a P/D replica on 0.26.0+cu130").shutdown();
}

#[test]
fn a_server_that_fails_to_start_names_why_with_its_log() {
    let f = fixture();
    let err =
        load(&f, Flavor::Vllm, json!({"env": {"FAKE_ENGINE_MODE": "exit-at-start"}})).err().expect("fails");
    let text = err.to_string();
    assert!(text.contains("exited") && text.contains("CUDA out of memory (fake)"), "{text}");

    let err = load(
        &f,
        Flavor::Sglang,
        json!({"env": {"FAKE_ENGINE_MODE": "never-healthy"}, "launch_timeout_s": 2}),
    )
    .err()
    .expect("times out");
    let text = err.to_string();
    assert!(text.contains("launch_timeout_s") && text.contains("Last lines of"), "{text}");
}

#[test]
fn a_server_that_dies_fails_its_requests_and_ends_the_engine() {
    let rt = xinf_test_util::runtime();
    let _in_runtime = rt.enter();
    let f = fixture();
    let engine =
        load(&f, Flavor::Vllm, json!({"env": {"FAKE_ENGINE_MODE": "die-mid-stream", "FAKE_STEP_MS": "20"}}))
            .expect("load");
    let exited = engine.exited();
    let stream = engine.submit(request("x", "hello", 50)).expect("submit");
    let events: Vec<_> = rt.block_on(stream.collect());
    assert!(events.last().is_some_and(|e| e.is_err()), "the request fails: {events:?}");
    let why = rt
        .block_on(async { tokio::time::timeout(Duration::from_secs(10), exited).await })
        .expect("exit seen");
    let text = why.to_string();
    assert!(text.contains("exited") && text.contains("dies mid-stream"), "{text}");
    engine.shutdown();
}

#[test]
fn a_server_that_hangs_is_stopped_and_its_engine_ends_with_the_reason() {
    let rt = xinf_test_util::runtime();
    let _in_runtime = rt.enter();
    let f = fixture();
    let extra = json!({"env": {"FAKE_ENGINE_MODE": "hang"}, "health_timeout_s": 1});
    let engine = load(&f, Flavor::Vllm, extra).expect("load");
    // Healthy: the watch reports nothing while the server answers.
    let exited = engine.exited();
    let early = rt.block_on(tokio::time::timeout(Duration::from_millis(1500), engine.exited()));
    assert!(early.is_err(), "a healthy server was reported hung: {early:?}");
    // The first generation hangs the whole server: the request gets no token, the health
    // checks no answer, and within the timeout (and a check) the engine ends, killed.
    let stream = engine.submit(request("stuck", "hello world", 4)).expect("submit");
    let started = std::time::Instant::now();
    let why = rt.block_on(async {
        let _stream = stream;
        tokio::time::timeout(Duration::from_secs(10), exited).await.expect("reported within 10 s")
    });
    let text = why.to_string();
    assert!(started.elapsed() >= Duration::from_secs(1), "{:?}", started.elapsed());
    assert!(text.contains("stopped answering") && text.contains("health_timeout_s"), "{text}");
    assert!(text.contains("hung: POST"), "the log's end is in the reason: {text}");
    // The access log's lines of the health checks, which came last, are left out of it.
    assert!(!text.contains("\"GET /health HTTP/1.1\" 200"), "{text}");
    assert!(log_of(&engine).contains("\"GET /health HTTP/1.1\" 200"), "the server logged them");
    // Killed: the process is gone (its exit is seen), so the GPU it held is free.
    let gone = rt.block_on(tokio::time::timeout(Duration::from_secs(5), engine.exited())).expect("exited");
    assert!(gone.to_string().contains("exited (signal: 9"), "{gone}");
    engine.shutdown();
}

#[test]
fn an_abort_during_a_prefill_leg_ends_it_at_once_and_the_server_sees_the_disconnect() {
    let rt = xinf_test_util::runtime();
    let _in_runtime = rt.enter();
    let f = fixture();
    let engine = load_as(&f, Flavor::Vllm, json!({"env": {"FAKE_PREFILL_MS": "300"}}), KvRole::Producer)
        .expect("load");

    // Unhindered, the leg answers with the room the server published.
    let pinned = rt.block_on(engine.prefill_pinned(request("whole", "hello world", 8))).expect("prefill");
    assert_eq!(pinned.first_token, expected(&pinned.prompt_ids, 1)[0]);
    assert!(pinned.remote.is_some());
    assert_eq!(engine.stats().pinned_blocks, 1, "the room is held until released");
    assert!(engine.release_pinned("whole"));

    // Asked for log-probabilities, the leg reports the first token's from the server's answer
    // (the fake scores step 0 at -1/4, its alternatives 1 less likely each).
    let mut scored = request("scored", "hello world", 8);
    scored.sampling.logprobs = Some(2);
    let pinned = rt.block_on(engine.prefill_pinned(scored)).expect("prefill");
    let l = pinned.first_logprobs.as_deref().expect("the first token's log-probabilities");
    assert_eq!((l.chosen.token_id, l.chosen.logprob), (pinned.first_token, -0.25));
    let top: Vec<(u32, f32)> = l.top.iter().map(|t| (t.token_id, t.logprob)).collect();
    assert_eq!(top, vec![(pinned.first_token, -0.25), (pinned.first_token + 1, -1.25)]);
    assert!(engine.release_pinned("scored"));

    // Asked for the prompt's log-probabilities, the same leg's answer carries them (no call of
    // their own): prompt token j has -j/8 - 1 and rank 2 + j, as the fake scores them.
    let mut scored = request("prompt-scored", "hello world the cat", 8);
    scored.sampling.prompt_logprobs = Some(2);
    let pinned = rt.block_on(engine.prefill_pinned(scored)).expect("prefill");
    let report = pinned.prompt.as_deref().expect("the prompt's report");
    assert_eq!(report.token_ids, pinned.prompt_ids);
    let lp = report.logprobs.as_ref().expect("prompt log-probabilities");
    assert_eq!(lp.rest.len(), pinned.prompt_ids.len() - 1);
    for (j, t) in (1..).zip(&lp.rest) {
        assert_eq!((t.chosen.token_id, t.chosen.logprob), (pinned.prompt_ids[j], -(j as f32) / 8.0 - 1.0));
        assert_eq!(t.rank, Some(2 + j as u32));
        assert_eq!(
            t.top.iter().map(|l| (l.token_id, l.logprob)).collect::<Vec<_>>(),
            [(1000, -0.1), (1001, -0.2)]
        );
    }
    assert!(!scoring_call(&log_of(&engine), "prompt-scored"), "no scoring call of its own");
    assert!(engine.release_pinned("prompt-scored"));

    // Aborted while the server computes: the abort knows the request, the leg ends with
    // `Aborted` long before the server would have answered, and the server sees its client go.
    let leg = engine.prefill_pinned(request("cut", "the cat sat", 8));
    let started = std::time::Instant::now();
    let outcome = rt.block_on(async {
        let leg = tokio::spawn(leg);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(engine.abort("cut"), "the abort finds the prefill leg");
        leg.await.expect("join")
    });
    assert!(matches!(outcome, Err(EngineError::Aborted)), "{outcome:?}");
    assert!(started.elapsed() < Duration::from_millis(250), "{:?}", started.elapsed());
    let mut log = String::new();
    for _ in 0..100 {
        log = log_of(&engine);
        if log.contains("client disconnected cut") {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(log.contains("client disconnected cut") && !log.contains("finished cut"), "{log}");
    assert!(!engine.abort("cut"), "nothing of it is left to abort");
    assert_eq!(engine.stats().pinned_blocks, 0);
    engine.shutdown();
}

#[test]
fn engine_config_is_checked_against_the_engines_flags() {
    let vllm = ServerLoader::new(Flavor::Vllm);
    let sglang = ServerLoader::new(Flavor::Sglang);
    let map = |v: Value| v.as_object().cloned().unwrap_or_default();
    let ok = vllm
        .check_config(&map(json!({"max_num_seqs": 8, "enforce-eager": true, "enable_prefix_caching": false})))
        .expect("vLLM flags");
    assert_eq!(
        ok.to_json(),
        json!({"max_num_seqs": 8, "enforce-eager": true, "enable_prefix_caching": false})
    );
    let field = |r: Result<xinf_engine::EngineConfig, EngineError>| match r {
        Err(EngineError::InvalidRequest { field, reason }) => format!("{field}: {reason}"),
        other => panic!("expected a refusal, got {other:?}"),
    };
    let e = field(vllm.check_config(&map(json!({"max_num_seq": 8}))));
    assert!(e.starts_with("engine_config.max_num_seq:") && e.contains("no flag --max-num-seq"), "{e}");
    let e = field(vllm.check_config(&map(json!({"tensor_parallel_size": 2}))));
    assert!(e.contains("one GPU"), "{e}");
    let e = field(vllm.check_config(&map(json!({"max_model_len": 100}))));
    assert!(e.contains("engine_config.context_length"), "{e}");
    let e = field(vllm.check_config(&map(json!({"enforce_eager": "yes"}))));
    assert!(e.contains("true or false"), "{e}");
    let e = field(sglang.check_config(&map(json!({"mem_fraction_static": 0.5}))));
    assert!(e.contains("gpu_memory_utilization"), "{e}");
    let e = field(sglang.check_config(&map(json!({"disaggregation_mode": "prefill"}))));
    assert!(e.contains("prefill/decode"), "{e}");
    let e = field(sglang.check_config(&map(json!({"device": "cpu"}))));
    assert!(e.contains("GPU"), "{e}");
    let e = field(sglang.check_config(&map(json!({"env": {"CUDA_VISIBLE_DEVICES": "3"}}))));
    assert!(e.contains("placement"), "{e}");
    // The health watch's limit: whole seconds, 0 turning it off; kept through the config's JSON.
    for bad in [json!(-1), json!(1.5), json!("60")] {
        let e = field(vllm.check_config(&map(json!({"health_timeout_s": bad}))));
        assert!(e.starts_with("engine_config.health_timeout_s:") && e.contains("whole number"), "{e}");
    }
    for good in [0, 120] {
        let c = sglang.check_config(&map(json!({"health_timeout_s": good}))).expect("a limit");
        assert_eq!(c.to_json(), json!({"health_timeout_s": good}));
    }
    sglang
        .check_config(&map(
            json!({"attention_backend": "triton", "disable_radix_cache": true, "cuda_graph_max_bs": null}),
        ))
        .expect("SGLang flags; nulls are absent options");
}

#[test]
fn models_the_servers_do_not_serve_are_refused_before_anything_starts() {
    let loader = ServerLoader::new(Flavor::Vllm);
    let src = |path: &str, format: Option<&str>, quant: Option<&str>| ModelSource {
        model_name: "m".into(),
        model_path: Some(path.into()),
        model_format: format.map(Into::into),
        quantization: quant.map(Into::into),
        ..Default::default()
    };
    assert!(loader.check_model(&src("/m/model.Q4_1.gguf", None, None)).is_err());
    assert!(loader.check_model(&src("/m", Some("ggufv2"), None)).is_err());
    assert!(loader.check_model(&src("/m", None, Some("Q4_1"))).is_err());
    loader.check_model(&src("/m", Some("pytorch"), Some("none"))).expect("an FP16 folder");
    let unknown = ModelSource { model_name: "no-such-model".into(), ..Default::default() };
    assert!(matches!(loader.check_model(&unknown), Err(EngineError::UnknownModel { .. })));
}
