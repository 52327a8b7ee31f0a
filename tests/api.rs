//! The OpenAI-compatible REST API over real sockets, with the real default model: chat and
//! completions (streaming or not), sampling fields, strict request checking, limits, the API
//! key, client disconnects, the official `openai` Python client, Xinference's own client and
//! `xinf serve`.

mod bodies;
mod choices;
mod completions;
mod corpus;
mod logit_bias;
mod logprobs;
mod reasoning;
mod structured;
mod tools;
mod web_ui;
mod xinference_client;

use crate::util::{self, http};
use serde_json::{Value, json};
use std::io::{BufRead, Read};
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use xinf::api::{self, ApiConfig, LocalService, ServerHandle};
use xinf::engine::Engine;

const UID: &str = "smollm2";
const QUESTION: &str = "What is the capital of France?";

/// A server on 127.0.0.1 with its own runtime.
struct Server {
    rt: tokio::runtime::Runtime,
    handle: ServerHandle,
}

impl Server {
    fn start(engine: Arc<dyn Engine>, config: ApiConfig) -> Self {
        let rt = util::rt();
        let service = LocalService::new().with_model(UID, "smollm2-instruct", engine);
        let config = ApiConfig { port: 0, workers: Some(2), ..config };
        let handle = rt.block_on(api::serve(config, Arc::new(service))).expect("serve");
        Self { rt, handle }
    }

    fn addr(&self) -> SocketAddr {
        self.handle.local_addr()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.rt.block_on(self.handle.stop(false));
    }
}

/// The server most tests share: the shared engine, a 1 MiB body limit.
fn shared() -> &'static Server {
    static S: OnceLock<Server> = OnceLock::new();
    S.get_or_init(|| {
        let engine: Arc<dyn Engine> = util::shared_smollm2();
        Server::start(engine, ApiConfig { max_body_bytes: 1 << 20, ..ApiConfig::default() })
    })
}

fn merged(mut base: Value, extra: Value) -> Value {
    if let (Some(b), Value::Object(e)) = (base.as_object_mut(), extra) {
        b.extend(e);
    }
    base
}

fn chat(extra: Value) -> Value {
    merged(json!({"model": UID, "messages": [{"role": "user", "content": QUESTION}]}), extra)
}

fn completion(extra: Value) -> Value {
    merged(json!({"model": UID, "prompt": "The capital of France is"}), extra)
}

/// Asserts an OpenAI error response: status, `param`, and a message containing `needle`.
fn assert_error(res: &http::Response, status: u16, param: Option<&str>, needle: &str) {
    assert_eq!(res.status, status, "{}", res.text());
    let body = res.json();
    let err = &body["error"];
    assert!(err["message"].as_str().is_some_and(|m| m.contains(needle)), "wanted {needle:?} in {body}");
    assert!(err["type"].is_string() && err["code"].is_string(), "{body}");
    if let Some(p) = param {
        assert_eq!(err["param"], p, "{body}");
    }
}

/// The JSON chunks of an event stream, checking that it ends with `[DONE]`.
fn chunks(res: &http::Response) -> Vec<Value> {
    assert_eq!(res.status, 200, "{}", res.text());
    assert!(res.header("content-type").is_some_and(|c| c.starts_with("text/event-stream")), "{res:?}");
    let mut events = res.events();
    assert_eq!(events.pop().as_deref(), Some("[DONE]"), "{}", res.text());
    events.iter().map(|e| serde_json::from_str(e).unwrap_or_else(|_| panic!("bad chunk {e}"))).collect()
}

fn usage_ok(usage: &Value) {
    let p = usage["prompt_tokens"].as_u64().expect("prompt_tokens");
    let c = usage["completion_tokens"].as_u64().expect("completion_tokens");
    assert!(p > 0 && c > 0, "{usage}");
    assert_eq!(usage["total_tokens"].as_u64(), Some(p + c), "{usage}");
}

#[test]
fn chat_answers_and_streams_the_same_tokens() {
    let s = shared();
    let res =
        http::post(s.addr(), "/v1/chat/completions", &chat(json!({"temperature": 0, "max_tokens": 40})));
    assert_eq!(res.status, 200, "{}", res.text());
    let body = res.json();
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["model"], UID);
    let id = body["id"].as_str().expect("id");
    assert!(id.starts_with("chatcmpl-") && id.len() > 20, "{id}");
    assert_eq!(res.header("x-request-id"), Some(id));
    let choice = &body["choices"][0];
    assert_eq!(choice["message"]["role"], "assistant");
    let content = choice["message"]["content"].as_str().expect("content").to_owned();
    assert!(content.contains("Paris"), "{content}");
    let finish = choice["finish_reason"].as_str().expect("finish_reason").to_owned();
    assert!(finish == "stop" || finish == "length", "{finish}");
    usage_ok(&body["usage"]);
    assert!(body["usage"]["completion_tokens"].as_u64() <= Some(40));

    let req = chat(json!({"temperature": 0, "max_tokens": 40, "stream": true,
        "stream_options": {"include_usage": true}}));
    let events = chunks(&http::post(s.addr(), "/v1/chat/completions", &req));
    assert!(events.len() >= 4, "{events:?}");
    let id = events[0]["id"].as_str().expect("id");
    assert!(events.iter().all(|c| c["id"] == id && c["object"] == "chat.completion.chunk"), "{events:?}");
    assert_eq!(events[0]["choices"][0]["delta"]["role"], "assistant");
    let (usage_chunk, rest) = events.split_last().expect("usage chunk");
    assert_eq!(usage_chunk["choices"], json!([]));
    assert_eq!(usage_chunk["usage"], body["usage"]);
    let (last, middle) = rest.split_last().expect("final chunk");
    assert_eq!(last["choices"][0]["finish_reason"], finish.as_str());
    let mut streamed = String::new();
    for c in &middle[1..] {
        assert!(c["choices"][0]["finish_reason"].is_null(), "{c}");
        let delta = c["choices"][0]["delta"]["content"].as_str().expect("content delta");
        assert!(!delta.is_empty(), "empty delta sent: {c}");
        streamed.push_str(delta);
    }
    assert_eq!(streamed, content);
}

#[test]
fn max_tokens_stop_and_seed() {
    let s = shared();
    let post_to = |path: &str, body: Value| {
        let res = http::post(s.addr(), path, &body);
        assert_eq!(res.status, 200, "{}", res.text());
        res.json()
    };
    let post = |body: Value| post_to("/v1/chat/completions", body);
    let r = post(chat(json!({"temperature": 0, "max_completion_tokens": 5, "ignore_eos": true})));
    assert_eq!(r["usage"]["completion_tokens"], 5);
    assert_eq!(r["choices"][0]["finish_reason"], "length");

    let full = post(chat(json!({"temperature": 0, "max_tokens": 40})));
    let full = full["choices"][0]["message"]["content"].as_str().expect("content").to_owned();
    let cut = full.find("Paris").expect("Paris in the answer");
    for stop in [json!("Paris"), json!(["zzzz", "Paris"])] {
        let r = post(chat(json!({"temperature": 0, "max_tokens": 40, "stop": stop})));
        assert_eq!(r["choices"][0]["message"]["content"], &full[..cut], "{r}");
        assert_eq!(r["choices"][0]["finish_reason"], "stop");
    }

    let sampled = json!({"temperature": 1.0, "top_p": 0.95, "top_k": 40, "seed": 1234, "max_tokens": 16,
        "presence_penalty": 0.5, "frequency_penalty": 0.2, "repetition_penalty": 1.1, "min_p": 0.01});
    let a = post(chat(sampled.clone()));
    let b = post(chat(sampled));
    assert_eq!(a["choices"][0]["message"], b["choices"][0]["message"]);
    let a = post_to("/v1/completions", completion(json!({"temperature": 1.0, "seed": 99, "max_tokens": 12})));
    let b = post_to("/v1/completions", completion(json!({"temperature": 1.0, "seed": 99, "max_tokens": 12})));
    assert_eq!(a["choices"][0]["text"], b["choices"][0]["text"]);
}

#[test]
fn bad_requests_are_refused_naming_the_field() {
    let s = shared();
    let a = s.addr();
    let cases = [
        ("/v1/chat/completions", chat(json!({"foo": 1})), Some("foo"), "foo"),
        ("/v1/chat/completions", chat(json!({"temperature": "hot"})), Some("temperature"), "temperature"),
        ("/v1/chat/completions", chat(json!({"top_p": 0})), Some("top_p"), "top_p"),
        ("/v1/chat/completions", chat(json!({"temperature": 3})), Some("temperature"), "temperature"),
        ("/v1/chat/completions", chat(json!({"n": 17})), Some("n"), "between 1 and 16"),
        ("/v1/completions", completion(json!({"n": 2, "best_of": 3})), Some("best_of"), "`n`"),
        (
            "/v1/chat/completions",
            chat(json!({"response_format": {"type": "grammar"}})),
            Some("response_format"),
            "`json_schema`",
        ),
        ("/v1/chat/completions", chat(json!({"stop": 5})), Some("stop"), "stop"),
        ("/v1/chat/completions", chat(json!({"top_k": -5})), Some("top_k"), "top_k"),
        ("/v1/chat/completions", chat(json!({"max_tokens": 1_000_000})), Some("max_tokens"), "context"),
        (
            "/v1/chat/completions",
            chat(json!({"tools": [{"type": "function"}]})),
            Some("tools[0].function"),
            "missing",
        ),
        ("/v1/chat/completions", chat(json!({"tool_choice": "auto"})), Some("tool_choice"), "`tools`"),
        (
            "/v1/chat/completions",
            json!({"model": UID, "messages": [{"role": "user"}]}),
            Some("messages[0].content"),
            "is required",
        ),
        (
            "/v1/chat/completions",
            json!({"model": UID, "messages": [{"role": "user", "content": null}]}),
            Some("messages[0].content"),
            "is required",
        ),
        (
            "/v1/chat/completions",
            json!({"model": UID, "messages": [
                {"role": "user", "content": "x"},
                {"role": "function", "content": "42", "name": "f"}]}),
            Some("messages[1].role"),
            "tools",
        ),
        (
            "/v1/chat/completions",
            json!({"model": UID, "messages": [{"role": "user", "content": [
                {"type": "text", "text": "What is this?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]}),
            Some("messages[0].content"),
            "multimodal input is not supported",
        ),
        ("/v1/chat/completions", json!({"model": UID, "messages": []}), Some("messages"), "messages"),
        (
            "/v1/chat/completions",
            json!({"model": UID, "messages": [{"role": "user", "content": "x", "extra": 1}]}),
            Some("messages[0].extra"),
            "extra",
        ),
        (
            "/v1/chat/completions",
            json!({"model": UID, "messages": [{"role": "robot", "content": "x"}]}),
            Some("messages[0].role"),
            "robot",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}]}),
            Some("model"),
            "model",
        ),
        (
            "/v1/completions",
            completion(json!({"prompt_logprobs": 2, "stream": true})),
            Some("prompt_logprobs"),
            "stream",
        ),
        ("/v1/completions", completion(json!({"suffix": "end"})), Some("suffix"), "suffix"),
        ("/v1/completions", json!({"model": UID, "prompt": vec!["a"; 129]}), Some("prompt"), "129 prompts"),
        (
            "/v1/completions",
            json!({"model": UID, "prompt": vec!["a"; 65], "n": 2}),
            Some("prompt"),
            "at most 128",
        ),
        ("/v1/completions", json!({"model": UID, "prompt": ["a", 5]}), Some("prompt"), "prompt"),
        ("/v1/completions", json!({"model": UID, "prompt": [[1, 2], []]}), Some("prompt"), "empty"),
        (
            "/v1/completions",
            json!({"model": UID, "prompt": [[1, 2], [999_999_999]]}),
            Some("prompt"),
            "vocabulary",
        ),
        ("/v1/completions", json!({"model": UID, "prompt": {"text": "x"}}), Some("prompt"), "prompt"),
        ("/v1/completions", json!({"model": UID, "prompt": [999_999_999]}), Some("prompt"), "vocabulary"),
    ];
    for (path, body, param, needle) in cases {
        let res = http::post(a, path, &body);
        assert_error(&res, 400, param, needle);
    }

    let res = http::request(a, "POST", "/v1/chat/completions", &[], br#"{"model": "smollm2", "messages": "#);
    assert_error(&res, 400, None, "JSON");
    assert_eq!(res.json()["error"]["code"], "invalid_json");
    let trailing = format!("{} trailing", chat(json!({})));
    let res = http::request(a, "POST", "/v1/chat/completions", &[], trailing.as_bytes());
    assert_error(&res, 400, None, "JSON");
    for body in [&b"[1, 2]"[..], b"null", b" 3", b"\"text\"", b"true"] {
        let res = http::request(a, "POST", "/v1/completions", &[], body);
        assert_error(&res, 400, Some("body"), "JSON object");
        assert!(!res.text().contains("Request"), "{}", res.text());
    }

    let res = http::post(a, "/v1/chat/completions", &merged(chat(json!({})), json!({"model": "nope-model"})));
    assert_error(&res, 404, Some("model"), "nope-model");
    assert_eq!(res.json()["error"]["code"], "model_not_found");
    // A huge unknown name is shown back clipped, not whole (twice).
    let huge = "n".repeat(100_000);
    let res = http::post(a, "/v1/chat/completions", &merged(chat(json!({})), json!({"model": huge})));
    assert_error(&res, 404, Some("model"), &format!("{}…", "n".repeat(256)));
    assert!(res.body.len() < 4096, "{} bytes", res.body.len());
    let res = http::get(a, &format!("/v1/models/{}", "m".repeat(60_000)));
    assert_eq!(res.status, 404);
    assert!(res.body.len() < 4096, "{} bytes", res.body.len());
    let res =
        http::post(a, "/v1/completions", &merged(completion(json!({})), json!({"model": "nope-model"})));
    assert_error(&res, 404, Some("model"), "nope-model");
    let res = http::request(
        a,
        "POST",
        "/v1/chat/completions",
        &[("Accept-Language", "zh-CN,zh;q=0.9")],
        merged(chat(json!({})), json!({"model": "nope-model"})).to_string().as_bytes(),
    );
    assert_error(&res, 404, Some("model"), "模型");
    assert_error(&http::get(a, "/v1/nowhere"), 404, None, "/v1/nowhere");
    assert_error(&http::get(a, "/v1/chat/completions"), 405, None, "GET");
    assert_error(&http::request(a, "DELETE", "/health", &[], b""), 405, None, "DELETE");

    // Client-supplied ids: a duplicate of a running request is a conflict; a bad one is refused.
    let res = http::request(
        a,
        "POST",
        "/v1/chat/completions",
        &[("X-Request-Id", "has space")],
        chat(json!({})).to_string().as_bytes(),
    );
    assert_error(&res, 400, None, "256");

    // Still serving after all that.
    let res = http::post(a, "/v1/chat/completions", &chat(json!({"max_tokens": 2})));
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(http::get(a, "/health").status, 200);
}

#[test]
fn models_stats_health_metrics_and_abort() {
    let s = shared();
    let a = s.addr();
    assert_eq!(http::get(a, "/health").json(), json!({"status": "ok"}));
    let list = http::get(a, "/v1/models").json();
    assert_eq!(list["object"], "list");
    let m = &list["data"][0];
    assert_eq!(m["id"], UID);
    assert_eq!(m["object"], "model");
    assert_eq!(m["owned_by"], "xinf");
    assert_eq!(m["xinf"]["model_name"], "smollm2-instruct");
    assert_eq!(m["xinf"]["status"], "ready");
    assert_eq!(http::get(a, &format!("/v1/models/{UID}")).json()["id"], UID);
    assert_error(&http::get(a, "/v1/models/nope"), 404, Some("model"), "nope");
    let stats = http::get(a, &format!("/v1/models/{UID}/stats")).json();
    assert!(stats["running"].is_u64() && stats["generated_tokens"].is_u64(), "{stats}");
    assert_error(&http::get(a, "/v1/models/nope/stats"), 404, Some("model"), "nope");

    let res = http::post(a, "/v1/chat/completions", &chat(json!({"max_tokens": 2})));
    assert_eq!(res.status, 200, "{}", res.text());
    let metrics = http::get(a, "/metrics");
    assert_eq!(metrics.status, 200);
    assert!(metrics.header("content-type").is_some_and(|c| c.starts_with("text/plain")));
    let text = metrics.text();
    let labels = format!("{{model_uid=\"{UID}\",model_name=\"smollm2-instruct\"}}");
    for family in ["xinf_requests_running", "xinf_requests_queued", "xinf_model_ready"] {
        assert!(text.contains(&format!("{family}{labels} ")), "{family} missing:\n{text}");
    }
    let generated = text
        .lines()
        .find_map(|l| l.strip_prefix(&format!("xinf_generation_tokens_total{labels} ")))
        .and_then(|v| v.parse::<f64>().ok())
        .expect("generation counter");
    assert!(generated >= 2.0, "{text}");
    assert!(text.contains("# TYPE xinf_prompt_tokens_total counter"), "{text}");

    let abort = http::request(a, "POST", &format!("/v1/models/{UID}/requests/nothing-here/abort"), &[], b"");
    assert_eq!(abort.json(), json!({"msg": "NOT_FOUND"}));
    let abort = http::request(a, "POST", "/v1/models/nope/requests/x/abort", &[], b"");
    assert_error(&abort, 404, Some("model"), "nope");
}

/// Reads a streaming response until `n` events have arrived; returns the bytes read.
fn read_events(stream: &mut std::net::TcpStream, n: usize) -> Vec<u8> {
    let mut raw = Vec::new();
    let mut buf = [0u8; 4096];
    let count = |raw: &[u8]| String::from_utf8_lossy(raw).matches("data: {").count();
    while count(&raw) < n {
        let got = stream.read(&mut buf).expect("read stream");
        assert!(got > 0, "stream ended early: {}", String::from_utf8_lossy(&raw));
        raw.extend_from_slice(&buf[..got]);
    }
    raw
}

#[test]
fn abort_route_ends_a_stream_with_finish_reason_abort() {
    let s = shared();
    let rid = format!("abort-me-{}", std::process::id());
    let body = chat(json!({"max_tokens": 2000, "ignore_eos": true, "stream": true, "request_id": rid}));
    let mut stream = http::send(s.addr(), "POST", "/v1/chat/completions", &[], body.to_string().as_bytes());
    let mut raw = read_events(&mut stream, 3);
    let abort = http::request(s.addr(), "POST", &format!("/v1/models/{UID}/requests/{rid}/abort"), &[], b"");
    assert_eq!(abort.json(), json!({"msg": "DONE"}));
    stream.read_to_end(&mut raw).expect("read the rest");
    let events = chunks(&http::parse(&raw));
    assert!(events.iter().all(|c| c["id"] == rid.as_str()), "{events:?}");
    let last = events.last().expect("chunks");
    assert_eq!(last["choices"][0]["finish_reason"], "abort", "{events:?}");
}

#[test]
fn client_disconnect_aborts_the_request() {
    let engine = util::engine(&util::smollm2(), json!({"kv_cache_tokens": 2048}));
    let server = Server::start(engine.clone(), ApiConfig::default());
    let body = chat(json!({"max_tokens": 1500, "ignore_eos": true, "stream": true}));
    let mut stream =
        http::send(server.addr(), "POST", "/v1/chat/completions", &[], body.to_string().as_bytes());
    read_events(&mut stream, 3);
    assert_eq!(engine.stats().running, 1, "{:?}", engine.stats());
    drop(stream);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let st = engine.stats();
        if st.running == 0 && st.queued == 0 {
            assert!(st.generated_tokens < 1000, "the request ran on: {st:?}");
            break;
        }
        assert!(Instant::now() < deadline, "request still running 20 s after the disconnect: {st:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_non_streamed_request_whose_client_goes_away_is_aborted() {
    let engine = util::engine(&util::smollm2(), json!({"kv_cache_tokens": 2048}));
    let server = Server::start(engine.clone(), ApiConfig::default());
    for (path, body) in [
        ("/v1/chat/completions", chat(json!({"max_tokens": 1500, "ignore_eos": true}))),
        ("/v1/completions", completion(json!({"max_tokens": 1500, "ignore_eos": true}))),
    ] {
        let before = engine.stats().generated_tokens;
        let stream = http::send(server.addr(), "POST", path, &[], body.to_string().as_bytes());
        let deadline = Instant::now() + Duration::from_secs(20);
        while engine.stats().running == 0 {
            assert!(Instant::now() < deadline, "{path}: the request never started");
            std::thread::sleep(Duration::from_millis(10));
        }
        std::thread::sleep(Duration::from_millis(200));
        drop(stream);
        let gone = Instant::now();
        loop {
            let st = engine.stats();
            if st.running == 0 && st.queued == 0 {
                assert!(st.generated_tokens - before < 1000, "{path}: the request ran on: {st:?}");
                eprintln!("{path}: aborted {:?} after the client went away", gone.elapsed());
                break;
            }
            assert!(Instant::now() < deadline, "{path}: still running 20 s after the disconnect: {st:?}");
            std::thread::sleep(Duration::from_millis(5));
        }
        // The server goes on answering.
        let res = http::post(server.addr(), "/v1/completions", &completion(json!({"max_tokens": 2})));
        assert_eq!(res.status, 200, "{}", res.text());
    }
}

#[test]
fn api_key_guards_v1_routes() {
    let engine: Arc<dyn Engine> = util::shared_smollm2();
    let server = Server::start(engine, ApiConfig { api_key: Some("sekret".into()), ..ApiConfig::default() });
    let a = server.addr();
    let res = http::get(a, "/v1/models");
    assert_error(&res, 401, None, "API key");
    assert_eq!(res.json()["error"]["type"], "authentication_error");
    assert_error(
        &http::request(a, "GET", "/v1/models", &[("Authorization", "Bearer wrong")], b""),
        401,
        None,
        "Bearer",
    );
    assert_error(
        &http::post(a, "/v1/chat/completions", &chat(json!({"max_tokens": 2}))),
        401,
        None,
        "API key",
    );
    let ok = http::request(a, "GET", "/v1/models", &[("Authorization", "Bearer sekret")], b"");
    assert_eq!(ok.status, 200, "{}", ok.text());
    assert_eq!(ok.json()["data"][0]["id"], UID);
    let ok = http::request(
        a,
        "POST",
        "/v1/chat/completions",
        &[("Authorization", "Bearer sekret")],
        chat(json!({"max_tokens": 2})).to_string().as_bytes(),
    );
    assert_eq!(ok.status, 200, "{}", ok.text());
    assert_eq!(http::get(a, "/health").status, 200);
    assert_eq!(http::get(a, "/metrics").status, 200);
}

#[test]
fn official_openai_python_client_works() {
    let s = shared();
    let base = format!("http://{}/v1", s.addr());
    let out = util::client_script(&["tests/api/openai_client.py", "--base-url", &base, "--model", UID]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "openai client failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("openai client: ok"), "{stdout}\n{stderr}");
}

#[test]
fn serve_command_serves_a_model() {
    let _ = util::smollm2(); // fetched once for all tests
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_xinf"))
        .args(["serve", "--model-name", "smollm2-instruct", "--model-uid", "cli-model", "--port", "0"])
        .args(["--http-workers", "1"])
        .env("LANG", "C")
        .env_remove("XINF_API_KEY")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run xinf serve");
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut seen = Vec::new();
    let addr: SocketAddr = loop {
        let line = rx.recv_timeout(Duration::from_secs(300)).unwrap_or_else(|e| {
            let _ = child.kill();
            panic!("no serving line from xinf serve ({e}):\n{}", seen.join("\n"))
        });
        if let Some(rest) = line.split("http://").nth(1) {
            break rest.trim_end_matches("/v1").parse().expect("address");
        }
        seen.push(line);
    };
    let models = http::get(addr, "/v1/models");
    let res = http::post(
        addr,
        "/v1/chat/completions",
        &json!({"model": "cli-model", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}),
    );
    // SIGTERM stops the server gracefully and the command exits with success.
    let term = std::process::Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for xinf serve") {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(term.is_ok_and(|s| s.success()), "kill -TERM failed");
    assert!(status.is_some_and(|s| s.success()), "xinf serve did not stop on SIGTERM: {status:?}");
    assert_eq!(models.json()["data"][0]["id"], "cli-model");
    assert_eq!(res.status, 200, "{}", res.text());
    usage_ok(&res.json()["usage"]);
}

#[test]
fn chat_template_kwargs_reach_the_template_and_are_checked() {
    let a = shared().addr();
    let greedy = json!({"temperature": 0, "max_tokens": 6});
    let plain = http::post(a, "/v1/chat/completions", &chat(greedy.clone())).json();
    // SmolLM2's template reads no such variable: the same prompt, the same answer.
    let with = chat(merged(greedy.clone(), json!({"chat_template_kwargs": {"enable_thinking": false}})));
    let res = http::post(a, "/v1/chat/completions", &with);
    assert_eq!(res.status, 200, "{}", res.text());
    let got = res.json();
    assert_eq!(got["choices"][0]["message"], plain["choices"][0]["message"], "{got}");
    assert_eq!(got["usage"], plain["usage"], "{got}");
    for bad in [json!([1]), json!("x"), json!({"k": "x".repeat(17 * 1024)})] {
        let res = http::post(a, "/v1/chat/completions", &chat(json!({"chat_template_kwargs": bad})));
        assert_error(&res, 400, Some("chat_template_kwargs"), "template");
    }
}
