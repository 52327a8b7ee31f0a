//! Cluster faults with real processes and real weights, each timed: the supervisor stopped and
//! started again on its ports (the workers reconnect and their replicas are adopted, nothing
//! reloads), the decode worker frozen mid-stream, thawed, killed mid-stream and started again
//! under its id (a replacement loads there), the prefill worker frozen with a request on it,
//! thawed, killed and started again; a worker stopped by a signal, which lets its running
//! request finish, as `xinf local` does, while its replica is replaced elsewhere; a second
//! worker under a running one's id, refused; and
//! a launch larger than the worker's memory, refused before it can take the node down.

use super::garbage::answer;
use super::{SECRET, supervisor_on, worker_with_env};
use crate::util::http;
use crate::util::procs::poll;
use serde_json::{Value, json};
use std::io::Read;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port()
}

/// The P/D model's status (`ready`, `unavailable`, ...; empty when it is unknown).
fn status(addr: SocketAddr) -> String {
    let res = http::get(addr, "/v1/models/pd");
    if res.status != 200 {
        return String::new();
    }
    res.json()["xinf"]["status"].as_str().unwrap_or_default().to_owned()
}

/// The P/D model's replicas: uid, role, worker, status; by uid.
fn replicas(addr: SocketAddr) -> Vec<(String, String, String, String)> {
    let info = http::get(addr, "/v1/models/pd").json();
    let field = |r: &Value, k: &str| r[k].as_str().unwrap_or_default().to_owned();
    let mut out: Vec<_> = info["xinf"]["replica_details"]
        .as_array()
        .map(|rs| {
            rs.iter()
                .map(|r| {
                    (field(r, "replica_uid"), field(r, "role"), field(r, "worker_id"), field(r, "status"))
                })
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

/// Starts a long greedy stream from the P/D model; returns once a token has arrived.
fn streaming(addr: SocketAddr) -> TcpStream {
    streaming_from(addr, "pd", 4000)
}

/// Starts a greedy stream of `max_tokens` tokens (with usage) from `model`; returns once a
/// token has arrived.
pub(super) fn streaming_from(addr: SocketAddr, model: &str, max_tokens: u32) -> TcpStream {
    let body = json!({"model": model, "prompt": "Tell me a long story.", "max_tokens": max_tokens,
        "temperature": 0, "ignore_eos": true, "stream": true, "stream_options": {"include_usage": true}});
    let mut conn = http::send(addr, "POST", "/v1/completions", &[], body.to_string().as_bytes());
    conn.set_read_timeout(Some(Duration::from_secs(60))).expect("a read timeout");
    let (mut seen, mut buf) = (Vec::new(), [0u8; 4096]);
    let has_token = |raw: &[u8]| {
        http::sse_data(&String::from_utf8_lossy(raw)).iter().any(|e| {
            serde_json::from_str::<Value>(e)
                .is_ok_and(|v| v["choices"][0]["text"].as_str().is_some_and(|t| !t.is_empty()))
        })
    };
    while !has_token(&seen) {
        let n = conn.read(&mut buf).expect("read the stream");
        assert!(n > 0, "the stream ended early: {}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&buf[..n]);
    }
    conn
}

/// Reads a stream to its end: how long that took, and the last of what arrived.
pub(super) fn until_end(mut conn: TcpStream) -> (Duration, String) {
    let started = Instant::now();
    let mut rest = Vec::new();
    let _ = conn.read_to_end(&mut rest);
    let text = String::from_utf8_lossy(&rest).into_owned();
    (started.elapsed(), text[text.len().saturating_sub(800)..].to_owned())
}

#[test]
fn the_cluster_recovers_from_supervisor_and_worker_faults() {
    let _ = crate::util::smollm2();
    let (rest_port, cluster_port) = (free_port(), free_port());
    let (mut sup, addr, cluster) = supervisor_on(rest_port, cluster_port);
    let (mut p, prefill) = worker_with_env(&cluster, SECRET, &[("XINF_WORKER_ID", "prefill-box")]);
    let (mut d, decode) = worker_with_env(&cluster, SECRET, &[("XINF_WORKER_ID", "decode-box")]);
    let body = json!({"model_name": "smollm2-instruct", "model_uid": "pd", "replica_config": [
        {"role": "prefill", "replica_uid": "pd-p", "devices": [{"worker_ip": prefill, "n_gpu": 0}]},
        {"role": "decode", "replica_uid": "pd-d", "devices": [{"worker_ip": decode, "n_gpu": 0}]}]});
    let res = http::post(addr, "/v1/models", &body);
    assert_eq!(res.status, 200, "{}", res.text());
    let want = answer(addr);
    let placed = replicas(addr);

    // The supervisor is stopped by a signal, as a service manager restarts it, and started
    // again on its ports: the workers kept the model, reconnect, and the new supervisor
    // rebuilds it from the replicas they report (a killed supervisor is the same to them).
    sup.signal("-TERM");
    let stopped = sup.wait(Duration::from_secs(30));
    assert!(stopped.is_some_and(|s| s.success()), "the supervisor did not stop on SIGTERM: {stopped:?}");
    let restarted = Instant::now();
    let (_sup, addr, _) = supervisor_on(rest_port, cluster_port);
    poll(Duration::from_secs(60), "the model to be adopted", || status(addr) == "ready");
    eprintln!(
        "supervisor restart: the P/D model is ready {:?} after the new process started",
        restarted.elapsed()
    );
    assert_eq!(replicas(addr), placed, "the same replicas, on the same workers, alive");
    assert_eq!(answer(addr), want, "the adopted model answers as before");
    let workers = http::get(addr, "/v1/workers").json();
    let alive = workers.as_array().expect("workers").iter().filter(|w| w["alive"] == true).count();
    assert_eq!(alive, 2, "{workers}");

    // The decode worker freezes mid-stream: the client hears at the heartbeat deadline (5 s,
    // checked every 1.25 s), and the model says why it cannot serve.
    let conn = streaming(addr);
    d.signal("-STOP");
    let (waited, tail) = until_end(conn);
    assert!(tail.contains("\"error\""), "the client got no error from a frozen decode worker: {tail}");
    assert!(waited < Duration::from_secs(10), "the client waited {waited:?}");
    eprintln!("decode worker frozen: the stream failed after {waited:?}");
    poll(Duration::from_secs(15), "the model to be unavailable", || status(addr) == "unavailable");
    let refused =
        http::post(addr, "/v1/completions", &json!({"model": "pd", "prompt": "Hi", "max_tokens": 2}));
    assert_eq!(refused.status, 503, "{}", refused.text());
    assert!(refused.text().contains("no alive decode replica"), "{}", refused.text());
    // Thawed, it brings its replica back: no reload.
    d.signal("-CONT");
    let thawed = Instant::now();
    poll(Duration::from_secs(30), "the decode replica to rejoin", || status(addr) == "ready");
    eprintln!("decode worker thawed: the model is ready again after {:?}", thawed.elapsed());
    assert_eq!(replicas(addr), placed);
    assert_eq!(answer(addr), want);

    // The decode worker is killed mid-stream: the client hears at once; started again under its
    // id, the worker gets a replacement decode replica.
    let conn = streaming(addr);
    d.kill();
    let (waited, tail) = until_end(conn);
    assert!(tail.contains("\"error\""), "the client got no error from a killed decode worker: {tail}");
    assert!(waited < Duration::from_secs(5), "the client waited {waited:?}");
    eprintln!("decode worker killed: the stream failed after {waited:?}");
    let (_d, again) = worker_with_env(&cluster, SECRET, &[("XINF_WORKER_ID", "decode-box")]);
    assert_eq!(again, decode);
    let back = Instant::now();
    poll(Duration::from_secs(60), "a replacement decode replica", || status(addr) == "ready");
    eprintln!("decode worker restarted: the model is ready again after {:?}", back.elapsed());
    let now = replicas(addr);
    assert_eq!(now.len(), 2, "{now:?}");
    let d_now = now.iter().find(|r| r.1 == "decode").expect("a decode replica");
    assert!(d_now.0 != "pd-d" && d_now.2 == decode && d_now.3 == "alive", "{now:?}");
    assert_eq!(answer(addr), want, "the replacement answers as before");

    // The prefill worker freezes: a request whose prefill it holds fails at the heartbeat
    // deadline, and thawed, the worker serves again.
    p.signal("-STOP");
    let sent = Instant::now();
    let body =
        json!({"model": "pd", "prompt": "The capital of France is", "max_tokens": 6, "temperature": 0});
    let res = http::post(addr, "/v1/completions", &body);
    let waited = sent.elapsed();
    assert_eq!(res.status, 503, "{}", res.text());
    assert!(waited < Duration::from_secs(10), "the client waited {waited:?}");
    eprintln!("prefill worker frozen: the request failed after {waited:?}");
    p.signal("-CONT");
    poll(Duration::from_secs(30), "the prefill replica to rejoin", || status(addr) == "ready");
    assert_eq!(answer(addr), want);
    // Killed, it is noticed at once: requests are refused naming the role, then served by a
    // replacement once it is back under its id.
    p.kill();
    poll(Duration::from_secs(5), "the model to be unavailable", || status(addr) == "unavailable");
    let refused = http::post(addr, "/v1/completions", &body);
    assert_eq!(refused.status, 503, "{}", refused.text());
    assert!(refused.text().contains("no alive prefill replica"), "{}", refused.text());
    let (_p, _) = worker_with_env(&cluster, SECRET, &[("XINF_WORKER_ID", "prefill-box")]);
    let back = Instant::now();
    poll(Duration::from_secs(60), "a replacement prefill replica", || status(addr) == "ready");
    eprintln!("prefill worker restarted: the model is ready again after {:?}", back.elapsed());
    assert_eq!(answer(addr), want);
}

/// A launch of more replicas than the worker's memory holds (`XINF_WORKER_MEMORY`, 1,500 MiB
/// here; SmolLM2 on the CPU takes 0.55 GiB: its Q4_1 projections as stored, the embedding in
/// f32 and a Q8_0 copy for the tied head, and an 8,192-token f32 KV cache) is refused naming
/// `replica`, nothing is left behind, and a launch that fits serves.
#[test]
fn a_launch_larger_than_the_workers_memory_is_refused() {
    let _ = crate::util::smollm2();
    let (_server, addr) = crate::util::procs::bare_local(&[("XINF_WORKER_MEMORY", "1500M")]);
    let res = http::post(
        addr,
        "/v1/models",
        &json!({"model_name": "smollm2-instruct", "model_uid": "m", "replica": 3}),
    );
    assert_eq!(res.status, 400, "{}", res.text());
    let err = res.json();
    assert_eq!(
        (err["error"]["code"].as_str(), err["error"]["param"].as_str()),
        (Some("not_enough_memory"), Some("replica")),
        "{err}"
    );
    assert!(err["error"]["message"].as_str().is_some_and(|m| m.contains("host memory")), "{err}");
    assert_eq!(http::get(addr, "/v1/models").json()["data"].as_array().map(Vec::len), Some(0));
    // Two fit (1.1 GiB), counted by what they hold: at f32 weights they came to 1.7 GiB.
    let two = json!({"model_name": "smollm2-instruct", "model_uid": "m", "replica": 2});
    let res = http::post(addr, "/v1/models", &two);
    assert_eq!(res.status, 200, "{}", res.text());
    let body = json!({"model": "m", "prompt": "The capital of France is", "max_tokens": 4, "temperature": 0});
    assert_eq!(http::post(addr, "/v1/completions", &body).status, 200);
}

/// A launch whose worker freezes fails once the worker's heartbeats stop, not at the load's
/// ten-minute deadline, and leaves no model behind. The worker is frozen just before the
/// launch, inside its heartbeat deadline, so it is still counted alive when placed on.
#[test]
fn a_launch_on_a_frozen_worker_fails_at_the_heartbeat_deadline() {
    let _ = crate::util::smollm2();
    let (_sup, addr, cluster) = supervisor_on(free_port(), free_port());
    let (w, worker) = worker_with_env(&cluster, SECRET, &[]);
    let body = json!({"model_name": "smollm2-instruct", "model_uid": "frozen",
        "replica_config": [{"devices": [{"worker_ip": worker, "n_gpu": 0}]}]});
    w.signal("-STOP");
    let started = Instant::now();
    let res = http::post(addr, "/v1/models", &body);
    let waited = started.elapsed();
    w.signal("-CONT");
    assert_eq!(res.status, 503, "{}", res.text());
    assert!(res.text().contains("stopped sending heartbeats"), "{}", res.text());
    assert!(waited < Duration::from_secs(120), "the launch took {waited:?}");
    eprintln!("launch on a frozen worker: refused after {waited:?}");
    assert_eq!(http::get(addr, "/v1/models/frozen").status, 404);
}

/// A worker stopped by SIGTERM drains: the request it runs ends with every token asked for,
/// new requests are refused meanwhile (503: no replica takes them) and the worker shows as
/// draining; then it exits.
#[test]
fn a_worker_stopped_by_a_signal_lets_its_running_request_finish() {
    let _ = crate::util::smollm2();
    let (_sup, addr, cluster) = supervisor_on(free_port(), free_port());
    let (mut w, worker) = worker_with_env(&cluster, SECRET, &[]);
    let body = json!({"model_name": "smollm2-instruct", "model_uid": "drained",
        "replica_config": [{"devices": [{"worker_ip": worker, "n_gpu": 0}]}]});
    let res = http::post(addr, "/v1/models", &body);
    assert_eq!(res.status, 200, "{}", res.text());
    let conn = streaming_from(addr, "drained", 96);
    w.signal("-TERM");
    poll(Duration::from_secs(10), "the worker showing as draining", || {
        let workers = http::get(addr, "/v1/workers").json();
        workers.as_array().is_some_and(|ws| ws.iter().any(|w| w["draining"] == true))
    });
    let late = json!({"model": "drained", "prompt": "Hello", "max_tokens": 2});
    let res = http::post(addr, "/v1/completions", &late);
    assert_eq!(res.status, 503, "{}", res.text());
    // The model says why, and the replica's figures still show the request it finishes.
    let info = http::get(addr, "/v1/models/drained").json();
    assert_eq!(info["xinf"]["status"], "unavailable", "{info}");
    assert_eq!(info["xinf"]["replica_details"][0]["status"], "draining", "{info}");
    let stats = http::get(addr, "/v1/models/drained/stats").json()["replicas"].clone();
    assert_eq!(
        (stats[0]["draining"].clone(), stats[0]["running"].clone()),
        (json!(true), json!(1)),
        "{stats}"
    );
    let metrics = http::get(addr, "/metrics").text();
    let sample =
        "xinf_model_replicas{model_uid=\"drained\",model_name=\"smollm2-instruct\",status=\"draining\"} 1";
    assert!(metrics.lines().any(|l| l == sample), "{metrics}");
    // The worker it is pinned to stops: a launch naming it is refused as "try later".
    let pinned = json!({"model_name": "smollm2-instruct", "model_uid": "late",
        "replica_config": [{"devices": [{"worker_ip": worker, "n_gpu": 0}]}]});
    let res = http::post(addr, "/v1/models", &pinned);
    assert_eq!(res.status, 503, "{}", res.text());
    assert!(res.text().contains("is stopping (draining)"), "{}", res.text());
    let (took, tail) = until_end(conn);
    assert!(tail.contains("\"completion_tokens\":96"), "the stream did not end with its 96 tokens: {tail}");
    assert!(tail.contains("[DONE]"), "{tail}");
    let exited = w.wait(Duration::from_secs(30));
    assert!(exited.is_some_and(|s| s.success()), "the worker did not exit after draining: {exited:?}");
    eprintln!("drained: the running stream ended {took:?} after the signal's first checks");
}

/// A worker whose drain time runs out ends the streams its replicas still run with that reason
/// (not a lost connection's), then exits.
#[test]
fn a_worker_whose_drain_time_runs_out_says_so_to_its_streams() {
    let _ = crate::util::smollm2();
    let (_sup, addr, cluster) = supervisor_on(free_port(), free_port());
    let (mut w, worker) = worker_with_env(&cluster, SECRET, &[("XINF_DRAIN_TIMEOUT", "1")]);
    let body = json!({"model_name": "smollm2-instruct", "model_uid": "cut",
        "replica_config": [{"devices": [{"worker_ip": worker, "n_gpu": 0}]}]});
    assert_eq!(http::post(addr, "/v1/models", &body).status, 200);
    let conn = streaming_from(addr, "cut", 4000);
    w.signal("-TERM");
    let (took, tail) = until_end(conn);
    assert!(tail.contains("stopped when its drain time (1000 ms) ran out"), "{tail}");
    assert!(tail.contains("\"code\":\"replica_lost\""), "{tail}");
    assert!(took < Duration::from_secs(20), "the cut stream lingered {took:?}");
    let exited = w.wait(Duration::from_secs(30));
    assert!(exited.is_some_and(|s| s.success()), "{exited:?}");
}

/// A worker stopped by a signal while it holds an unpinned model's only replica: a replacement
/// loads on the other worker while the running stream goes on, and the model serves from it
/// before the first worker is gone; the worker exits once its last request ends.
#[test]
fn a_draining_workers_replica_is_replaced_on_another_worker() {
    let _ = crate::util::smollm2();
    let (_sup, addr, cluster) = supervisor_on(free_port(), free_port());
    let env = [("XINF_DRAIN_TIMEOUT", "300")];
    let (a, a_id) = worker_with_env(&cluster, SECRET, &env);
    let (b, b_id) = worker_with_env(&cluster, SECRET, &env);
    let body = json!({"model_name": "smollm2-instruct", "model_uid": "moved"});
    let res = http::post(addr, "/v1/models", &body);
    assert_eq!(res.status, 200, "{}", res.text());
    let placed =
        http::get(addr, "/v1/models/moved").json()["xinf"]["replica_details"][0]["worker_id"].clone();
    let ((mut stopping, _kept), other) =
        if placed == a_id.as_str() { ((a, b), b_id) } else { ((b, a), a_id) };
    let conn = streaming_from(addr, "moved", 4000);
    stopping.signal("-TERM");
    poll(Duration::from_secs(60), "the replacement serving on the other worker", || {
        let info = http::get(addr, "/v1/models/moved").json();
        info["xinf"]["status"] == "ready"
            && info["xinf"]["replica_details"].as_array().is_some_and(|rs| {
                rs.len() == 1 && rs[0]["worker_id"] == other.as_str() && rs[0]["status"] == "alive"
            })
    });
    let ask =
        json!({"model": "moved", "prompt": "The capital of France is", "max_tokens": 4, "temperature": 0});
    let res = http::post(addr, "/v1/completions", &ask);
    assert_eq!(res.status, 200, "{}", res.text());
    // The stream still runs on the stopping worker, which the model no longer lists.
    let stats = http::get(addr, "/v1/models/moved/stats").json()["replicas"].clone();
    let draining: Vec<&Value> =
        stats.as_array().map(|s| s.iter().filter(|r| r["draining"] == true).collect()).unwrap_or_default();
    assert!(draining.len() == 1 && draining[0]["running"] == 1, "{stats}");
    assert_eq!(stopping.wait(Duration::from_secs(1)), None, "it exited with a request running");
    drop(conn);
    let exited = stopping.wait(Duration::from_secs(30));
    assert!(
        exited.is_some_and(|s| s.success()),
        "the worker did not exit once its request ended: {exited:?}"
    );
    let res = http::post(addr, "/v1/completions", &ask);
    assert_eq!(res.status, 200, "{}", res.text());
}

/// `xinf local` stopped by SIGTERM lets the stream it serves finish before it exits.
#[test]
fn a_local_server_stopped_by_a_signal_lets_its_running_request_finish() {
    let _ = crate::util::smollm2();
    let (mut p, addr) = crate::util::procs::local("drained", &[]);
    let conn = streaming_from(addr, "drained", 96);
    p.signal("-TERM");
    let (_, tail) = until_end(conn);
    assert!(tail.contains("\"completion_tokens\":96"), "the stream did not end with its 96 tokens: {tail}");
    let exited = p.wait(Duration::from_secs(30));
    assert!(exited.is_some_and(|s| s.success()), "xinf local did not exit after draining: {exited:?}");
    assert!(p.log().contains("at most 30 s"), "{}", p.log());
}

/// A second worker started under the id of a running one is refused, naming the id, and the
/// first keeps its session: the two are different nodes to the supervisor's, which would
/// otherwise drop one's connection for the other's, over and over.
#[test]
fn a_second_worker_under_a_running_workers_id_is_refused() {
    let (_sup, addr, cluster) = supervisor_on(free_port(), free_port());
    let (_first, id) = worker_with_env(&cluster, SECRET, &[("XINF_WORKER_ID", "twin")]);
    assert_eq!(id, "twin");
    let out = crate::util::procs::xinf()
        .args(["worker", "--supervisor", &cluster, "--worker-id", "twin"])
        .env("XINF_CLUSTER_SECRET", SECRET)
        .output()
        .expect("run the second worker");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("a worker with id `twin`") && err.contains("--worker-id"), "{err}");
    let workers = http::get(addr, "/v1/workers").json();
    let alive: Vec<&Value> =
        workers.as_array().map(|w| w.iter().filter(|w| w["alive"] == true).collect()).unwrap_or_default();
    assert_eq!(alive.len(), 1, "{workers}");
    assert!(
        alive[0]["last_heartbeat_ms"].as_u64().is_some_and(|ms| ms < 2_000),
        "the first worker's heartbeats stopped: {workers}"
    );
}

/// A worker frozen until it was counted lost, replaced by a new process under its id, then
/// thawed, is told to stop: it exits naming the id, and the model keeps serving from the new
/// process (replicas were placed on the stale one, and the model flapped, before).
#[test]
fn a_thawed_worker_whose_id_was_taken_over_stops() {
    let _ = crate::util::smollm2();
    let (_sup, addr, cluster) = supervisor_on(free_port(), free_port());
    let (mut old, id) = worker_with_env(&cluster, SECRET, &[("XINF_WORKER_ID", "same")]);
    let body = json!({"model_name": "smollm2-instruct", "model_uid": "t",
        "replica_config": [{"devices": [{"worker_ip": id, "n_gpu": 0}]}]});
    assert_eq!(http::post(addr, "/v1/models", &body).status, 200);
    old.signal("-STOP");
    poll(Duration::from_secs(30), "the frozen worker counted lost", || {
        http::get(addr, "/v1/workers").json()[0]["alive"] == false
    });
    let (_new, _) = worker_with_env(&cluster, SECRET, &[("XINF_WORKER_ID", "same")]);
    poll(Duration::from_secs(60), "the model serving from the new process", || {
        http::get(addr, "/v1/models/t").json()["xinf"]["status"] == "ready"
    });
    old.signal("-CONT");
    let exited = old.wait(Duration::from_secs(30));
    assert!(exited.is_some_and(|s| !s.success()), "the thawed worker kept running: {exited:?}");
    assert!(old.log().contains("another worker process took over its id"), "{}", old.log());
    let ask = json!({"model": "t", "prompt": "The capital of France is", "max_tokens": 4, "temperature": 0});
    for _ in 0..3 {
        let res = http::post(addr, "/v1/completions", &ask);
        assert_eq!(res.status, 200, "{}", res.text());
        std::thread::sleep(Duration::from_secs(1));
    }
    assert_eq!(http::get(addr, "/v1/models/t").json()["xinf"]["status"], "ready");
}
