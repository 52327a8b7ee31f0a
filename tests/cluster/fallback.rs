//! `prefill_fallback`: a P/D model whose prefill worker is killed keeps serving, its decode
//! replica computing whole requests (the one whose prefill was on the lost worker too), and
//! hands prompts off again once a prefill replica is back.

use super::garbage::answer;
use super::{SECRET, served, supervisor, worker_with_env};
use crate::util::http;
use crate::util::procs::poll;
use serde_json::json;
use std::time::Duration;

fn status(addr: std::net::SocketAddr) -> String {
    let res = http::get(addr, "/v1/models/pd");
    res.json()["xinf"]["status"].as_str().unwrap_or_default().to_owned()
}

/// A replica's prompt tokens, as the model's stats list it.
fn prompt_tokens(stats: &serde_json::Value, replica_uid: &str) -> u64 {
    let replicas = stats["replicas"].as_array().cloned().unwrap_or_default();
    let replica = replicas.iter().find(|r| r["replica_uid"] == replica_uid);
    replica.and_then(|r| r["prompt_tokens"].as_u64()).unwrap_or_default()
}

fn pages_moved(addr: std::net::SocketAddr) -> u64 {
    let res = http::get(addr, "/v1/models/pd/stats");
    res.json()["handoff"]["pages_transferred"].as_u64().unwrap_or_default()
}

#[test]
fn a_model_with_prefill_fallback_serves_through_its_decode_replica_while_no_prefill_one_is_alive() {
    let _ = crate::util::smollm2();
    let (sup, addr, cluster) = supervisor();
    let (mut p, prefill) = worker_with_env(&cluster, SECRET, &[("XINF_WORKER_ID", "prefill-box")]);
    let (_d, decode) = worker_with_env(&cluster, SECRET, &[("XINF_WORKER_ID", "decode-box")]);
    let body = json!({"model_name": "smollm2-instruct", "model_uid": "pd", "prefill_fallback": true, "replica_config": [
        {"role": "prefill", "replica_uid": "pd-p", "devices": [{"worker_ip": prefill, "n_gpu": 0}]},
        {"role": "decode", "replica_uid": "pd-d", "devices": [{"worker_ip": decode, "n_gpu": 0}]}]});
    let res = http::post(addr, "/v1/models", &body);
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(http::get(addr, "/v1/models/pd").json()["xinf"]["prefill_fallback"], true);
    let want = answer(addr);
    let moved = pages_moved(addr);
    assert!(moved > 0, "the first answer went through a handoff");
    let prefill_prompts = prompt_tokens(&http::get(addr, "/v1/models/pd/stats").json(), "pd-p");
    assert!(prefill_prompts > 0);

    // The prefill worker freezes with a request's prefill on it, then is killed: that request
    // runs whole on the decode replica and answers as before.
    p.signal("-STOP");
    let during = std::thread::spawn(move || answer(addr));
    std::thread::sleep(Duration::from_millis(500));
    p.kill();
    assert_eq!(during.join().expect("the request's thread"), want, "the request whose prefill was lost");
    // Whichever came first, the prefill leg's failure or the news of the replica's loss.
    assert!(sup.log().contains("the decode replica computes the request"), "{}", sup.log());
    // The model is degraded, not unavailable, and its decode replica answers alone, as before,
    // without a handoff.
    poll(Duration::from_secs(5), "the model to be degraded", || status(addr) == "degraded");
    let before = served(addr, "pd");
    assert_eq!(answer(addr), want, "the decode replica computes the prompt itself");
    let chat = json!({"model": "pd", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "stream": true});
    let res = http::post(addr, "/v1/chat/completions", &chat);
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(res.events().last().map(String::as_str), Some("[DONE]"), "{}", res.text());
    let after = served(addr, "pd");
    assert_eq!(after, [("pd-d".to_owned(), before[0].1 + 2)], "{before:?} → {after:?}");
    assert_eq!(pages_moved(addr), moved, "no handoff while no prefill replica is alive");
    let stats = http::get(addr, "/v1/models/pd/stats").json();
    assert_eq!(stats["handoff"]["decode_prompts"], 3, "{stats}");
    // The prompt tokens the lost prefill replica computed stay in the model's total: its
    // counters never fall.
    let decode_prompts = prompt_tokens(&stats, "pd-d");
    assert_eq!(stats["prompt_tokens"], prefill_prompts + decode_prompts, "{stats}");

    // Back under its id, the worker gets a replacement prefill replica: handoffs again.
    let (_p, _) = worker_with_env(&cluster, SECRET, &[("XINF_WORKER_ID", "prefill-box")]);
    poll(Duration::from_secs(60), "a replacement prefill replica", || status(addr) == "ready");
    assert_eq!(answer(addr), want);
    assert!(pages_moved(addr) > moved, "the prompt was handed off again");
}
