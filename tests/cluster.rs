//! The cluster as users run it: `xinf supervisor` and `xinf worker` processes on 127.0.0.1,
//! models launched over REST and with `xinf launch`, requests routed across processes, a
//! worker killed mid-stream, a node with the wrong secret, and `xinf local`.

mod cancel;
mod chat;
mod corpus;
mod fallback;
mod faults;
mod garbage;
mod limits;
mod nodes;
mod reasoning;
mod replicas;

pub(crate) use nodes::{supervisor, supervisor_on, worker, worker_with_env};

use crate::util::procs::{local, poll, xinf, xinf_chat};
use crate::util::{self, http};
use serde_json::{Value, json};
use std::io::Read;
use std::net::SocketAddr;
use std::process::Stdio;
use std::time::{Duration, Instant};

pub(crate) const SECRET: &str = "test-cluster-secret";
const QUESTION: &str = "What is the capital of France?";

fn chat_body(model: &str, stream: bool, max_tokens: usize) -> Value {
    json!({
        "model": model,
        "messages": [{"role": "user", "content": QUESTION}],
        "temperature": 0,
        "max_tokens": max_tokens,
        "stream": stream,
    })
}

/// Requests served so far per replica uid.
fn served(addr: SocketAddr, model: &str) -> Vec<(String, u64)> {
    let res = http::get(addr, &format!("/v1/models/{model}/stats"));
    assert_eq!(res.status, 200, "{}", res.text());
    let mut out: Vec<(String, u64)> = res.json()["replicas"]
        .as_array()
        .expect("replicas")
        .iter()
        .map(|r| {
            (r["replica_uid"].as_str().unwrap_or("").to_owned(), r["requests_served"].as_u64().unwrap_or(0))
        })
        .collect();
    out.sort();
    out
}

/// The replica whose served count went up between two snapshots.
fn grew(before: &[(String, u64)], after: &[(String, u64)]) -> String {
    let grown: Vec<&String> = after
        .iter()
        .filter(|(uid, n)| before.iter().any(|(b, m)| b == uid && n > m))
        .map(|(u, _)| u)
        .collect();
    assert_eq!(grown.len(), 1, "exactly one replica serves each request: {before:?} → {after:?}");
    grown[0].clone()
}

fn replica_status(addr: SocketAddr, model: &str, replica: &str) -> String {
    let info = http::get(addr, &format!("/v1/models/{model}")).json();
    info["xinf"]["replica_details"]
        .as_array()
        .expect("replica details")
        .iter()
        .find(|r| r["replica_uid"] == replica)
        .map(|r| r["status"].as_str().unwrap_or("").to_owned())
        .unwrap_or_default()
}

/// Supervisor + two worker processes; one replica per worker through `replica_config`;
/// requests alternate between them, streaming or not; a worker killed mid-stream fails its
/// client within seconds, its replica is listed dead, and the other worker keeps serving.
#[test]
fn two_workers_alternate_and_survive_a_killed_worker() {
    let _ = util::smollm2(); // fetched once for all tests
    let (mut sup, addr, cluster) = supervisor();
    let (mut w1, id1) = worker(&cluster, SECRET);
    let (mut w2, id2) = worker(&cluster, SECRET);

    // A node with another secret is refused, promptly, and never listed.
    let started = Instant::now();
    let out = xinf()
        .args(["worker", "--supervisor", &cluster])
        .env("XINF_CLUSTER_SECRET", "another-secret")
        .output()
        .expect("run xinf worker");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a worker with the wrong secret joined: {err}");
    assert!(err.contains("secret"), "{err}");
    eprintln!("wrong secret refused in {:?}", started.elapsed());

    let workers = http::get(addr, "/v1/workers").json();
    let mut ids: Vec<&str> =
        workers.as_array().expect("workers").iter().filter_map(|w| w["info"]["worker_id"].as_str()).collect();
    ids.sort_unstable();
    let mut expected = vec![id1.as_str(), id2.as_str()];
    expected.sort_unstable();
    assert_eq!(ids, expected, "{workers}");

    // Launch with the CLI: one replica on each worker.
    let rc = json!([
        {"replica_uid": "a", "devices": [{"worker_ip": id1, "n_gpu": 0}]},
        {"replica_uid": "b", "devices": [{"worker_ip": id2, "n_gpu": 0}]},
    ]);
    let endpoint = format!("http://{addr}");
    let out = xinf()
        .args([
            "launch",
            "-e",
            &endpoint,
            "-n",
            "smollm2-instruct",
            "-u",
            "m",
            "--replica-config",
            &rc.to_string(),
        ])
        .output()
        .expect("run xinf launch");
    assert!(out.status.success(), "{}\n{}", String::from_utf8_lossy(&out.stderr), sup.log());
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "m");
    let info = http::get(addr, "/v1/models/m").json();
    let placed: Vec<(&str, &str)> = info["xinf"]["replica_details"]
        .as_array()
        .expect("replicas")
        .iter()
        .map(|r| (r["replica_uid"].as_str().unwrap_or(""), r["worker_id"].as_str().unwrap_or("")))
        .collect();
    assert_eq!(placed, vec![("a", id1.as_str()), ("b", id2.as_str())], "{info}");

    // Round robin: each request lands on the other replica, streaming or not.
    let mut order = Vec::new();
    let mut before = served(addr, "m");
    for i in 0..6 {
        let stream = i % 2 == 1;
        let res = http::post(addr, "/v1/chat/completions", &chat_body("m", stream, 24));
        assert_eq!(res.status, 200, "{}", res.text());
        let text = if stream {
            let events = res.events();
            assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "{events:?}");
            events
                .iter()
                .filter_map(|e| serde_json::from_str::<Value>(e).ok())
                .filter_map(|e| e["choices"][0]["delta"]["content"].as_str().map(str::to_owned))
                .collect::<String>()
        } else {
            res.json()["choices"][0]["message"]["content"].as_str().unwrap_or("").to_owned()
        };
        assert!(text.contains("Paris"), "{text}");
        let after = served(addr, "m");
        order.push(grew(&before, &after));
        before = after;
    }
    assert!(order.windows(2).all(|w| w[0] != w[1]), "requests did not alternate: {order:?}");

    // A long stream; kill the worker that runs it once tokens flow.
    let before = served(addr, "m");
    let mut body = chat_body("m", true, 2000);
    body["ignore_eos"] = true.into();
    let mut conn = http::send(addr, "POST", "/v1/chat/completions", &[], body.to_string().as_bytes());
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    let has_token = |raw: &[u8]| {
        http::sse_data(&String::from_utf8_lossy(raw)).iter().any(|e| {
            serde_json::from_str::<Value>(e)
                .is_ok_and(|v| v["choices"][0]["delta"]["content"].as_str().is_some_and(|c| !c.is_empty()))
        })
    };
    while !has_token(&seen) {
        let n = conn.read(&mut buf).expect("read the stream");
        assert!(n > 0, "the stream ended early: {}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&buf[..n]);
    }
    // The replica whose served count went up runs it.
    let busy = grew(&before, &served(addr, "m"));
    let (victim, other) = if busy == "a" { (&mut w1, "b") } else { (&mut w2, "a") };
    let killed = Instant::now();
    victim.kill();
    conn.read_to_end(&mut seen).expect("read the rest of the stream");
    let failed_after = killed.elapsed();
    let text = String::from_utf8_lossy(&seen).into_owned();
    let events = http::sse_data(&text);
    assert!(
        events.iter().any(|e| e.contains("\"error\"")),
        "the client got no error after its worker died: {}",
        &text[text.len().saturating_sub(600)..]
    );
    assert!(failed_after < Duration::from_secs(15), "the client waited {failed_after:?}");
    eprintln!("client saw the error {failed_after:?} after the kill");

    poll(Duration::from_secs(15), "the replica being marked dead", || {
        replica_status(addr, "m", &busy) == "dead"
    });
    let workers = http::get(addr, "/v1/workers").json();
    let lost = workers.as_array().expect("workers").iter().filter(|w| w["alive"] == false).count();
    assert_eq!(lost, 1, "{workers}");
    let listed = xinf().args(["list", "-e", &endpoint]).output().expect("run xinf list");
    let listed = String::from_utf8_lossy(&listed.stdout);
    assert!(listed.contains(&format!("{busy}(hybrid dead")), "{listed}");
    // The registry variant the launch picked (SmolLM2's default: the Q4_1 GGUF file) and the
    // replicas' KV layout (the native engine's default).
    for column in ["ggufv2", "0_135", "Q4_1", "native", "paged-kv-first/NHD/B=16"] {
        assert!(listed.contains(column), "{column} missing: {listed}");
    }

    // The other worker serves everything now.
    let before = served(addr, "m");
    for _ in 0..3 {
        let res = http::post(addr, "/v1/chat/completions", &chat_body("m", false, 8));
        assert_eq!(res.status, 200, "{}", res.text());
    }
    let after = served(addr, "m");
    assert_eq!(after.len(), 1, "only the alive replica reports: {after:?}");
    assert_eq!(after[0].0, other);
    assert_eq!(after[0].1, before.iter().find(|(u, _)| u == other).map_or(0, |(_, n)| *n) + 3);
    assert_eq!(replica_status(addr, "m", other), "alive");

    // Terminate over REST; the model is gone.
    let res = http::request(addr, "DELETE", "/v1/models/m", &[], b"");
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(res.json()["deleted"], true);
    assert_eq!(http::get(addr, "/v1/models/m").status, 404);
    sup.kill();
}

/// `xinf local` with a model launched at start, the management routes, launch validation over
/// REST (the reference messages), "not ready" while a model loads, and the CLI's own checks.
#[test]
fn local_cluster_manages_models_over_rest() {
    let _ = util::smollm2();
    let (mut p, addr) = local("first", &["-r", "2"]);
    // The "try it" command xinf prints answers, greedy and bounded.
    let printed = p.wait_for("-d '");
    let sample: Value =
        serde_json::from_str(printed.trim().trim_end_matches('\'')).expect("the printed body");
    assert_eq!(
        (sample["temperature"].clone(), sample["max_tokens"].clone()),
        (json!(0), json!(64)),
        "{sample}"
    );
    let res = http::post(addr, "/v1/chat/completions", &sample);
    assert!(
        res.json()["choices"][0]["message"]["content"].as_str().unwrap_or("").contains("Paris"),
        "{}",
        res.text()
    );

    // `xinf chat` asks for the model before reading anything; then chats until `exit`.
    let endpoint = format!("http://{addr}");
    let out = xinf_chat(&endpoint, "firts", "What is the capital of France?\n");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("`firts`") && err.contains("first"), "{err}");
    assert!(out.stdout.is_empty(), "nothing was sent: {}", String::from_utf8_lossy(&out.stdout));
    let out = xinf_chat(&endpoint, "first", "What is the capital of France?\nexit\n");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("Paris"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );

    let models = http::get(addr, "/v1/models").json();
    assert_eq!(models["data"][0]["id"], "first", "{models}");
    assert_eq!(models["data"][0]["xinf"]["replicas"], 2, "{models}");
    let res = http::post(addr, "/v1/chat/completions", &chat_body("first", false, 24));
    assert!(res.json()["choices"][0]["message"]["content"].as_str().unwrap_or("").contains("Paris"));

    // Launch validation: reference messages, 400 naming the rule; nothing is created.
    let bad = [
        (
            json!({"model_name": "smollm2-instruct", "replica": 2, "replica_config": [{}]}),
            "replica_config length (1) must equal replica (2).",
        ),
        (
            json!({"model_name": "smollm2-instruct", "replica_config": [{"replica_uid": "x"}, {"replica_uid": "x"}]}),
            "Duplicate replica_uid",
        ),
        (
            json!({"model_name": "smollm2-instruct", "worker_ip": "local", "replica_config": [{}]}),
            "Cannot specify worker_ip",
        ),
        (
            json!({"model_name": "smollm2-instruct", "replica_config": [{"role": "prefill"}]}),
            "PD separation requires both prefill and decode",
        ),
        (
            json!({"model_name": "smollm2-instruct", "replica_config": [{"role": "hybrid", "engine_config": {"kv_layout": "token-pool"}}]}),
            "Per-replica engine settings require explicit PD roles",
        ),
        (
            json!({"model_name": "smollm2-instruct", "replica_config": [{"devices": []}]}),
            "exactly one device",
        ),
        (
            json!({"model_name": "smollm2-instruct", "replica_config": [{"replica_uid": "  "}]}),
            "must not be empty or whitespace-only",
        ),
        (json!({"model_name": "smollm2-instruct", "model_uid": "first"}), "already running"),
    ];
    for (body, message) in &bad {
        let res = http::post(addr, "/v1/models", body);
        let err = res.json();
        assert!(res.status == 400 || res.status == 409, "{body} → {} {err}", res.status);
        let text = err["error"]["message"].as_str().unwrap_or("");
        assert!(text.contains(message), "{body} → {text}");
    }
    for (body, field) in [
        (json!({"model_name": 7}), "model_name"),
        (json!({"model_name": "smollm2-instruct", "replica": "two"}), "replica"),
        (
            json!({"model_name": "smollm2-instruct", "replica_config": [{"role": "leader"}]}),
            "replica_config[0].role",
        ),
        (
            json!({"model_name": "smollm2-instruct", "replica_config": [{"gpus": 1}]}),
            "replica_config[0].gpus",
        ),
        // Refusals of the launch's rules name their field too.
        (
            json!({"model_name": "smollm2-instruct", "replica_config": [
                {}, {"devices": [{"worker_ip": "10.9.9.9", "n_gpu": "auto"}]}]}),
            "replica_config[1].worker_ip",
        ),
        (json!({"model_name": "smollm2-instruct", "kv_cache_tokens": 1}), "engine_config.kv_cache_tokens"),
        (json!({"model_name": "smollm2-instruct", "replica": 0}), "replica"),
    ] {
        let res = http::post(addr, "/v1/models", &body);
        assert_eq!(res.status, 400, "{body} → {}", res.text());
        assert_eq!(res.json()["error"]["param"], field, "{body} → {}", res.text());
    }
    let res = http::request(addr, "POST", "/v1/models", &[], b"{\"model_name\": ");
    assert_eq!(res.status, 400);
    assert_eq!(res.json()["error"]["code"], "invalid_json");
    // Model files the launch names that cannot serve are the launch's mistake (400, never
    // "try later"), and the message carries no server backtrace (unit-tested with one forced:
    // `candle_errors_reach_clients_without_a_backtrace`).
    let scratch = xinf_test_util::scratch_dir();
    let bad = scratch.path().join("bad.gguf");
    std::fs::write(&bad, b"GGUF but not really a model file").expect("write");
    for path in [scratch.path().join("absent").display().to_string(), bad.display().to_string()] {
        let body = json!({"model_name": "smollm2-instruct", "model_path": path});
        let res = http::post(addr, "/v1/models", &body);
        assert_eq!(res.status, 400, "{path} → {}", res.text());
        let err = res.json();
        assert_eq!(err["error"]["code"], "model_error", "{err}");
        let text = err["error"]["message"].as_str().unwrap_or("");
        assert!(!text.contains("stack backtrace") && text.lines().count() <= 2, "{text}");
    }
    // P/D replicas whose KV would mean different things are refused once loaded, naming the
    // difference, and rolled back.
    for (decode, field) in
        [(json!({"context_length": 1024}), "context_length"), (json!({"kv_dtype": "f16"}), "dtype")]
    {
        let body = json!({"model_name": "smollm2-instruct", "replica_config": [
            {"role": "prefill", "engine_config": {}}, {"role": "decode", "engine_config": decode}]});
        let res = http::post(addr, "/v1/models", &body);
        assert_eq!(res.status, 400, "{}", res.text());
        let err = res.json();
        assert_eq!(err["error"]["code"], "pd_contract_mismatch", "{err}");
        assert!(err["error"]["message"].as_str().unwrap_or("").contains(field), "{err}");
    }
    let models = http::get(addr, "/v1/models").json();
    assert_eq!(models["data"].as_array().map(Vec::len), Some(1), "a refused launch left a model: {models}");
    let workers = http::get(addr, "/v1/workers").json();
    assert_eq!(workers[0]["replicas"].as_array().map(Vec::len), Some(2), "{workers}");

    // The query string is checked like a body: the API's error shape, the parameter named.
    for (query, param) in [("wait_ready=maybe", "wait_ready"), ("wait=false", "wait")] {
        let res =
            http::post(addr, &format!("/v1/models?{query}"), &json!({"model_name": "smollm2-instruct"}));
        assert_eq!(res.status, 400, "{query} → {}", res.text());
        assert_eq!(res.json()["error"]["param"], param, "{query} → {}", res.text());
    }
    // A launch that does not wait (as Python's clients write it): the model answers 503 "not
    // ready" until it serves.
    let res = http::post(
        addr,
        "/v1/models?wait_ready=False",
        &json!({"model_name": "smollm2-instruct", "model_uid": "second"}),
    );
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(res.json()["model_uid"], "second");
    let res = http::post(addr, "/v1/chat/completions", &chat_body("second", false, 8));
    assert_eq!(res.status, 503, "{}", res.text());
    assert_eq!(res.json()["error"]["code"], "model_not_ready");
    assert_eq!(res.header("retry-after"), Some("5"));
    poll(Duration::from_secs(120), "the second model serving", || {
        http::get(addr, "/v1/models/second").json()["xinf"]["status"] == "ready"
    });
    let res = http::post(addr, "/v1/chat/completions", &chat_body("second", false, 8));
    assert_eq!(res.status, 200, "{}", res.text());

    // Unknown models and terminated models are 404; the server keeps serving.
    assert_eq!(http::post(addr, "/v1/chat/completions", &chat_body("nope", false, 8)).status, 404);
    assert_eq!(http::request(addr, "DELETE", "/v1/models/nope", &[], b"").status, 404);
    let endpoint = format!("http://{addr}");
    let out = xinf().args(["terminate", "second", "-e", &endpoint]).output().expect("run xinf terminate");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(http::get(addr, "/v1/models/second").status, 404);
    let workers = http::get(addr, "/v1/workers").json();
    assert_eq!(workers[0]["replicas"].as_array().map(Vec::len), Some(2), "{workers}");

    // Scale-up: engine settings are refused by name, bad values name their field, and a copy
    // of the first replica joins the model and serves.
    let res = http::post(addr, "/v1/models/first/replicas", &json!({"engine_config": {"max_num_seqs": 2}}));
    assert_eq!(res.status, 400, "{}", res.text());
    assert_eq!(res.json()["error"]["param"], "engine_config", "{}", res.text());
    assert!(res.text().contains("per-replica engine settings are not accepted"), "{}", res.text());
    let res = http::post(addr, "/v1/models/first/replicas", &json!({"count": "two"}));
    assert_eq!((res.status, res.json()["error"]["param"].clone()), (400, json!("count")), "{}", res.text());
    for role in [json!(5), json!(true), json!(["decode"])] {
        let res = http::post(addr, "/v1/models/first/replicas", &json!({"role": role}));
        assert_eq!(
            (res.status, res.json()["error"]["param"].clone()),
            (400, json!("role")),
            "{}",
            res.text()
        );
        assert_eq!(res.json()["error"]["code"], "invalid_type", "{}", res.text());
    }
    let res = http::post(addr, "/v1/models/first/replicas", &json!({"role": "decode"}));
    assert_eq!(res.status, 400, "{}", res.text());
    assert!(res.text().contains("has no decode replica to copy"), "{}", res.text());
    assert_eq!(res.json()["error"]["param"], "role", "{}", res.text());
    assert_eq!(http::post(addr, "/v1/models/nope/replicas", &json!({})).status, 404);
    let res = http::post(addr, "/v1/models/first/replicas", &json!({}));
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(res.json(), json!({"model_uid": "first", "replicas": ["first-2"]}));
    let replicas = http::get(addr, "/v1/models/first/replicas").json();
    let listed: Vec<(&str, &str)> = replicas
        .as_array()
        .map(|a| {
            a.iter()
                .map(|r| (r["replica_uid"].as_str().unwrap_or(""), r["status"].as_str().unwrap_or("")))
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(listed, [("first-0", "alive"), ("first-1", "alive"), ("first-2", "alive")], "{replicas}");
    let before = served(addr, "first");
    for _ in 0..3 {
        assert_eq!(http::post(addr, "/v1/chat/completions", &chat_body("first", false, 4)).status, 200);
    }
    let after = served(addr, "first");
    assert!(after.iter().any(|(uid, n)| uid == "first-2" && *n > 0), "{before:?} → {after:?}");

    // `xinf chat` streams answers and keeps the conversation.
    let mut chat = xinf()
        .args(["chat", "-u", "first", "-e", &endpoint, "--temperature", "0", "--max-tokens", "24"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run xinf chat");
    {
        use std::io::Write;
        let mut stdin = chat.stdin.take().expect("stdin");
        writeln!(stdin, "{QUESTION}").expect("write");
        writeln!(stdin, "exit").expect("write");
    }
    let out = chat.wait_with_output().expect("chat output");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("Paris"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    drop(p);
}

/// `xinf launch` refuses a bad --replica-config before sending anything, with the reference
/// CLI's messages.
#[test]
fn launch_checks_replica_config_client_side() {
    // Nothing listens on this endpoint: every case must fail before connecting.
    let endpoint = "http://127.0.0.1:9";
    for (args, message) in [
        (vec!["--replica-config", "{"], "must be valid JSON"),
        (vec!["--replica-config", "{}"], "must be a JSON array"),
        (vec!["--replica-config", "[]"], "must be a non-empty JSON array"),
        (
            vec!["--replica-config", "[{}, {}]", "-r", "3"],
            "must match the number of entries in --replica-config",
        ),
        (
            vec!["--replica-config", "[{}]", "--worker-ip", "10.0.0.1:1"],
            "cannot be used together with --worker-ip",
        ),
        (vec!["--replica-config", "[{\"role\": \"leader\"}]"], "--replica-config[0].role"),
        (vec!["--replica-config", "[{\"roles\": \"prefill\"}]"], "roles"),
        (
            vec!["--replica-config", "[{\"role\": \"prefill\"}]"],
            "PD separation requires both prefill and decode",
        ),
        (vec!["--n-gpu", "many"], "--n-gpu"),
    ] {
        let out = xinf()
            .args(["launch", "-e", endpoint, "-n", "smollm2-instruct"])
            .args(&args)
            .output()
            .expect("run xinf launch");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} was accepted");
        assert!(err.contains(message), "{args:?} → {err}");
        assert!(!err.contains("cannot reach"), "{args:?} was sent: {err}");
    }
    // -en (Xinference's short flag) reaches the request checks: vLLM loads Hugging Face
    // folders, not GGUF files.
    let out = xinf()
        .args(["launch", "-e", endpoint, "-n", "smollm2-instruct", "-en", "vllm", "-f", "ggufv2"])
        .output()
        .expect("run");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("vllm replicas load Hugging Face folders"), "{err}");
    assert!(!err.contains("cannot reach"), "was sent: {err}");
}
