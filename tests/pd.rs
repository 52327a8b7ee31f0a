//! Prefill/decode separation end to end, with real `xinf` processes: greedy output through a
//! P/D deployment equals the ordinary replica's for prompts around every page boundary, across
//! engine KV layouts in both directions, streaming and not; counters prove the pages moved,
//! in process (`xinf local`) and over TCP between worker processes.

use crate::cluster::{SECRET, supervisor, worker};
use crate::util::procs::{local, poll};
use crate::util::{self, http};
use serde_json::{Value, json};
use std::net::SocketAddr;

/// Prompt lengths around the 64-token page boundaries, and a long one.
const LENGTHS: &[usize] = &[2, 63, 64, 65, 66, 127, 128, 129, 130, 191, 192, 193, 194, 700];
const NEW_TOKENS: usize = 4;

/// A deterministic prompt of `n` token ids (ordinary vocabulary, no special tokens).
fn prompt(n: usize) -> Vec<u32> {
    (0..n).map(|i| 100 + ((i as u64 * 7919 + n as u64 * 104_729) % 40_000) as u32).collect()
}

/// Greedy completion text of `ids` on `model`, streaming or not.
fn complete(addr: SocketAddr, model: &str, ids: &[u32], stream: bool) -> String {
    let body = json!({
        "model": model,
        "prompt": ids,
        "max_tokens": NEW_TOKENS,
        "temperature": 0,
        "ignore_eos": true,
        "stream": stream,
    });
    let res = http::post(addr, "/v1/completions", &body);
    assert_eq!(res.status, 200, "{model}, {} tokens: {}", ids.len(), res.text());
    if !stream {
        return res.json()["choices"][0]["text"].as_str().unwrap_or_default().to_owned();
    }
    let events = res.events();
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "{events:?}");
    let mut text = String::new();
    for e in &events[..events.len() - 1] {
        let v: Value = serde_json::from_str(e).unwrap_or_else(|err| panic!("{err}: {e}"));
        assert!(v.get("error").is_none(), "{model}, {} tokens: {v}", ids.len());
        text.push_str(v["choices"][0]["text"].as_str().unwrap_or_default());
    }
    text
}

fn launch(addr: SocketAddr, body: Value) {
    let res = http::post(addr, "/v1/models", &body);
    assert_eq!(res.status, 200, "{body} → {}", res.text());
}

fn stats(addr: SocketAddr, model: &str) -> Value {
    let res = http::get(addr, &format!("/v1/models/{model}/stats"));
    assert_eq!(res.status, 200, "{}", res.text());
    res.json()
}

/// The pages a set of prompts moves: `ceil(P / 64)` each, or `ceil((P - 1) / 64)` when the
/// decode engine recomputes the last prompt token.
fn pages(lengths: &[usize], recompute: bool) -> u64 {
    lengths.iter().map(|n| (n - usize::from(recompute)).div_ceil(64) as u64).sum()
}

fn pd_replicas(prefill: Value, decode: Value) -> Value {
    json!([{"role": "prefill", "engine_config": prefill}, {"role": "decode", "engine_config": decode}])
}

/// In one `xinf local` process: an ordinary replica and three P/D deployments whose two sides
/// use different KV layouts; every prompt length gives the ordinary replica's greedy tokens.
#[test]
fn pd_matches_the_ordinary_replica_across_layouts() {
    let _ = util::smollm2();
    let (_server, addr) = local("hybrid", &[]);

    let fa_hnd_16 = json!({"kv_layout": "paged-kv-first", "kv_order": "HND", "block_size": 16});
    let pool = json!({"kv_layout": "token-pool"});
    let deployments = [
        ("fa-to-pool", pd_replicas(fa_hnd_16.clone(), pool.clone())),
        ("pool-to-fa", pd_replicas(pool.clone(), fa_hnd_16.clone())),
        (
            "fi-to-fa-recompute",
            pd_replicas(
                json!({"kv_layout": "paged-block-first", "kv_order": "NHD", "block_size": 64}),
                json!({"kv_layout": "paged-kv-first", "block_size": 32, "recompute_last_token": true}),
            ),
        ),
    ];
    for (uid, rc) in &deployments {
        launch(addr, json!({"model_name": "smollm2-instruct", "model_uid": uid, "replica_config": rc}));
    }

    for (i, &n) in LENGTHS.iter().enumerate() {
        let ids = prompt(n);
        let want = complete(addr, "hybrid", &ids, false);
        assert!(!want.is_empty(), "{n} tokens: no output");
        for (uid, _) in &deployments {
            let got = complete(addr, uid, &ids, i % 2 == 1);
            assert_eq!(got, want, "{uid}, {n}-token prompt");
        }
    }

    for (uid, _) in &deployments {
        let s = stats(addr, uid);
        let h = &s["handoff"];
        let recompute = uid.ends_with("recompute");
        assert_eq!(h["pages_transferred"], pages(LENGTHS, recompute), "{uid}: {s}");
        assert_eq!(h["in_process_transfers"], LENGTHS.len(), "{uid}: {s}");
        assert_eq!(h["tcp_transfers"], 0, "{uid}: {s}");
        assert_eq!(h["failed"], 0, "{uid}: {s}");
        assert_eq!(h["active_rooms"], 0, "{uid}: {s}");
        assert_eq!(s["pinned_blocks"], 0, "{uid}: {s}");
        assert!(h["bytes_transferred"].as_u64().unwrap_or(0) > 0, "{uid}: {s}");
        assert_eq!(h["latency"]["count"], LENGTHS.len(), "{uid}: {s}");
    }
    // A 1-token prompt cannot be decoded by an engine that recomputes the last prompt token.
    let res = http::post(
        addr,
        "/v1/completions",
        &json!({"model": "fi-to-fa-recompute", "prompt": prompt(1), "max_tokens": 2}),
    );
    assert_eq!(res.status, 400, "{}", res.text());
    assert!(res.text().contains("1-token prompt"), "{}", res.text());
    let metrics = http::get(addr, "/metrics").text();
    assert!(metrics.contains("xinf_handoff_pages_total{model_uid=\"fa-to-pool\""), "{metrics}");
    // Every fetch is in the latency histogram, once, in the +Inf bucket at least.
    let labels = "model_uid=\"fa-to-pool\",model_name=\"smollm2-instruct\"";
    let n = LENGTHS.len();
    assert!(metrics.contains(&format!("xinf_handoff_transfer_seconds_count{{{labels}}} {n}")), "{metrics}");
    assert!(
        metrics.contains(&format!("xinf_handoff_transfer_seconds_bucket{{{labels},le=\"+Inf\"}} {n}")),
        "{metrics}"
    );
}

/// Supervisor and two worker processes: prefill on one, decode on the other, so the pages move
/// over the TCP data plane; output equals the ordinary replica's. Then the decode worker is
/// killed mid-stream: the client gets an error within seconds, nothing stays pinned on the
/// prefill side, and the other worker keeps serving.
#[test]
fn pd_moves_pages_over_tcp_between_worker_processes() {
    let _ = util::smollm2();
    let (_sup, addr, cluster) = supervisor();
    let (_w1, id1) = worker(&cluster, SECRET);
    let (mut w2, id2) = worker(&cluster, SECRET);
    let device = |id: &str| json!([{"worker_ip": id, "n_gpu": 0}]);
    launch(
        addr,
        json!({"model_name": "smollm2-instruct", "model_uid": "hybrid", "replica_config": [{"devices": device(&id1)}]}),
    );
    launch(
        addr,
        json!({"model_name": "smollm2-instruct", "model_uid": "pd", "replica_config": [
            {"role": "prefill", "devices": device(&id1),
             "engine_config": {"kv_layout": "paged-kv-first", "kv_order": "HND", "block_size": 16}},
            {"role": "decode", "devices": device(&id2), "engine_config": {"kv_layout": "token-pool"}},
        ]}),
    );
    let lengths = [2, 64, 65, 129, 700];
    for (i, &n) in lengths.iter().enumerate() {
        let ids = prompt(n);
        let want = complete(addr, "hybrid", &ids, false);
        assert_eq!(complete(addr, "pd", &ids, i % 2 == 0), want, "{n}-token prompt");
    }
    let s = stats(addr, "pd");
    let h = &s["handoff"];
    assert_eq!(h["tcp_transfers"], lengths.len(), "{s}");
    assert_eq!(h["in_process_transfers"], 0, "{s}");
    assert_eq!(h["pages_transferred"], pages(&lengths, false), "{s}");
    assert_eq!(h["active_rooms"], 0, "{s}");

    // Kill the decode worker once tokens flow.
    use std::io::Read;
    let body =
        json!({"model": "pd", "prompt": prompt(100), "max_tokens": 2000, "ignore_eos": true, "stream": true});
    let mut conn = http::send(addr, "POST", "/v1/completions", &[], body.to_string().as_bytes());
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while http::sse_data(&String::from_utf8_lossy(&seen)).len() < 3 {
        let n = conn.read(&mut buf).expect("read the stream");
        assert!(n > 0, "the stream ended early: {}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&buf[..n]);
    }
    let killed = std::time::Instant::now();
    w2.kill();
    conn.read_to_end(&mut seen).expect("read the rest");
    let waited = killed.elapsed();
    let text = String::from_utf8_lossy(&seen).into_owned();
    assert!(http::sse_data(&text).iter().any(|e| e.contains("\"error\"")), "no error after the kill: {text}");
    assert!(waited < std::time::Duration::from_secs(15), "the client waited {waited:?}");
    let s = stats(addr, "pd");
    assert_eq!(s["handoff"]["active_rooms"], 0, "{s}");
    assert_eq!(s["pinned_blocks"], 0, "{s}");
    // Without a decode replica the P/D model refuses clearly; the other worker serves.
    poll(std::time::Duration::from_secs(15), "the decode replica marked dead", || {
        http::post(addr, "/v1/completions", &json!({"model": "pd", "prompt": "hi", "max_tokens": 2})).status
            == 503
    });
    assert!(!complete(addr, "hybrid", &prompt(10), false).is_empty());
}

/// A small deterministic generator for the cancellation schedule.
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n
    }
}

/// How a request is cancelled.
#[derive(Debug, Clone, Copy)]
enum Cancel {
    /// The client disconnects after a delay (before or during prefill, or during the transfer).
    Disconnect(u64),
    /// The abort route is called after a delay.
    AbortRoute(u64),
    /// The client disconnects once tokens flow (during decode).
    AfterFirstToken,
}

fn cancelled_request(addr: SocketAddr, id: &str, ids: &[u32], how: Cancel) {
    use std::io::Read;
    let body = json!({"model": "pd", "prompt": ids, "max_tokens": 16, "ignore_eos": true, "temperature": 0, "stream": true});
    let mut conn =
        http::send(addr, "POST", "/v1/completions", &[("X-Request-Id", id)], body.to_string().as_bytes());
    match how {
        Cancel::Disconnect(ms) => {
            std::thread::sleep(std::time::Duration::from_millis(ms));
            drop(conn);
        }
        Cancel::AbortRoute(ms) => {
            std::thread::sleep(std::time::Duration::from_millis(ms));
            let res = http::post(addr, &format!("/v1/models/pd/requests/{id}/abort"), &json!({}));
            assert_eq!(res.status, 200, "{}", res.text());
            // The request ends (aborted, or done, or refused): never a hang.
            let mut rest = Vec::new();
            let _ = conn.read_to_end(&mut rest);
        }
        Cancel::AfterFirstToken => {
            let mut seen = Vec::new();
            let mut buf = [0u8; 1024];
            while !String::from_utf8_lossy(&seen).contains("\"text\":\"") {
                match conn.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => seen.extend_from_slice(&buf[..n]),
                }
            }
            drop(conn);
        }
    }
}

/// 100 P/D requests cancelled at random points (before and during prefill, during the
/// transfer, during decode) leave no room open and no KV pinned; requests then succeed.
/// Replica sets of 1P+2D and 2P+1D spread requests by role round-robin.
#[test]
fn pd_cancellations_leave_nothing_behind_and_roles_round_robin() {
    let _ = util::smollm2();
    let (_server, addr) = local("hybrid", &[]);
    let rc = pd_replicas(
        json!({"kv_layout": "paged-kv-first", "block_size": 16}),
        json!({"kv_layout": "token-pool"}),
    );
    launch(addr, json!({"model_name": "smollm2-instruct", "model_uid": "pd", "replica_config": rc}));

    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            std::thread::spawn(move || {
                let mut rng = Lcg(t + 1);
                for k in 0..25 {
                    let n = 2 + rng.below(130) as usize;
                    let ids = prompt(n);
                    let how = match rng.below(3) {
                        0 => Cancel::Disconnect(rng.below(800)),
                        1 => Cancel::AbortRoute(rng.below(800)),
                        _ => Cancel::AfterFirstToken,
                    };
                    cancelled_request(addr, &format!("cancel-{t}-{k}"), &ids, how);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("a cancelling client panicked");
    }
    // Released by the cancellations themselves, well before any lease (30 s) would.
    poll(std::time::Duration::from_secs(20), "every room and pinned block freed", || {
        let s = stats(addr, "pd");
        s["handoff"]["active_rooms"] == 0 && s["pinned_blocks"] == 0 && s["running"] == 0 && s["queued"] == 0
    });
    let s = stats(addr, "pd");
    assert!(
        s["handoff"]["pages_transferred"].as_u64().unwrap_or(0) > 0,
        "no cancellation reached decode: {s}"
    );
    for n in [5, 70, 150] {
        let ids = prompt(n);
        assert_eq!(complete(addr, "pd", &ids, n == 70), complete(addr, "hybrid", &ids, false), "{n} tokens");
    }

    // 1P+2D and 2P+1D: each role takes turns.
    let roles = |p: usize, d: usize| {
        let mut rc: Vec<Value> = (0..p).map(|_| json!({"role": "prefill"})).collect();
        rc.extend((0..d).map(|_| json!({"role": "decode"})));
        Value::Array(rc)
    };
    launch(
        addr,
        json!({"model_name": "smollm2-instruct", "model_uid": "p1d2", "replica_config": roles(1, 2)}),
    );
    launch(
        addr,
        json!({"model_name": "smollm2-instruct", "model_uid": "p2d1", "replica_config": roles(2, 1)}),
    );
    let ids = prompt(20);
    for _ in 0..4 {
        complete(addr, "p1d2", &ids, false);
        complete(addr, "p2d1", &ids, true);
    }
    let per_replica = |model: &str, key: &str| -> Vec<u64> {
        let s = stats(addr, model);
        s["replicas"].as_array().expect("replicas").iter().map(|r| r[key].as_u64().unwrap_or(0)).collect()
    };
    // p1d2-0 is the prefill replica; p1d2-1 and p1d2-2 decode two requests each.
    assert_eq!(per_replica("p1d2", "requests_served"), vec![0, 2, 2]);
    // p2d1-0 and p2d1-1 prefill two prompts each; p2d1-2 decodes all four.
    assert_eq!(per_replica("p2d1", "prompt_tokens"), vec![40, 40, 0]);
    assert_eq!(per_replica("p2d1", "requests_served"), vec![0, 0, 4]);
}
