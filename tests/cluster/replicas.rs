//! Replicas with real processes: two sharing a GPU by their memory shares, and a replica
//! removed (a scale-down). The replica running a stream drains (new requests go to the other
//! one, the stream ends whole), then stops and leaves the model; one whose drain time runs out
//! ends its stream with an error naming the removal; the last replica, an unknown one and a bad
//! drain time are refused by name.

use super::faults::{streaming_from, until_end};
use crate::util::procs::{Proc, bare_local, poll, xinf};
use crate::util::{self, http};
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::time::Duration;

/// The uid of the model's replica that runs a request.
fn busy_replica(addr: SocketAddr, model: &str) -> String {
    let stats = http::get(addr, &format!("/v1/models/{model}/stats")).json();
    let busy = stats["replicas"].as_array().and_then(|rs| rs.iter().find(|r| r["running"] == 1).cloned());
    busy.and_then(|r| r["replica_uid"].as_str().map(str::to_owned)).unwrap_or_else(|| panic!("{stats}"))
}

/// The model's replicas as (uid, status).
fn replicas(addr: SocketAddr, model: &str) -> Vec<(String, String)> {
    let list = http::get(addr, &format!("/v1/models/{model}/replicas")).json();
    let field = |r: &Value, k: &str| r[k].as_str().unwrap_or_default().to_owned();
    list.as_array()
        .map(|rs| rs.iter().map(|r| (field(r, "replica_uid"), field(r, "status"))).collect())
        .unwrap_or_default()
}

fn delete(addr: SocketAddr, path: &str) -> http::Response {
    http::request(addr, "DELETE", path, &[], b"")
}

/// An `xinf local` serving model `uid` as two replicas, one of them streaming `tokens` tokens:
/// the server, its address, the stream and the streaming replica's uid.
fn two_replicas_one_streaming(uid: &str, tokens: u32) -> (Proc, SocketAddr, std::net::TcpStream, String) {
    let _ = util::smollm2();
    let (p, addr) = bare_local(&[]);
    let body = json!({"model_name": "smollm2-instruct", "model_uid": uid, "replica": 2});
    let res = http::post(addr, "/v1/models", &body);
    assert_eq!(res.status, 200, "{}", res.text());
    let conn = streaming_from(addr, uid, tokens);
    let busy = busy_replica(addr, uid);
    (p, addr, conn, busy)
}

#[test]
fn a_removed_replica_finishes_its_requests_then_leaves_the_model() {
    let (_p, addr, conn, busy) = two_replicas_one_streaming("s", 64);
    let path = format!("/v1/models/s/replicas/{busy}?drain_timeout=120");
    let removing = std::thread::spawn(move || delete(addr, &path));
    poll(Duration::from_secs(10), "the replica draining", || {
        replicas(addr, "s").iter().any(|(r, s)| *r == busy && s == "draining")
    });
    let ask = json!({"model": "s", "prompt": "The capital of France is", "max_tokens": 4, "temperature": 0});
    for _ in 0..3 {
        let res = http::post(addr, "/v1/completions", &ask);
        assert_eq!(res.status, 200, "{}", res.text());
    }
    let other =
        replicas(addr, "s").into_iter().map(|(r, _)| r).find(|r| *r != busy).expect("the other replica");
    let res = delete(addr, &format!("/v1/models/s/replicas/{other}"));
    assert_eq!(res.status, 409, "{}", res.text());
    let error = &res.json()["error"];
    assert_eq!(
        (error["code"].clone(), error["param"].clone()),
        (json!("replica_not_removable"), json!("replica_uid"))
    );
    assert!(res.text().contains("last alive hybrid replica"), "{}", res.text());
    let (_, tail) = until_end(conn);
    assert!(
        tail.contains("\"completion_tokens\":64") && tail.contains("[DONE]"),
        "the stream was cut: {tail}"
    );
    let res = removing.join().expect("the removal");
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(res.json(), json!({"model_uid": "s", "replica_uid": busy, "deleted": true}));
    assert_eq!(replicas(addr, "s"), [(other.clone(), "alive".to_owned())]);
    assert_eq!(http::get(addr, "/v1/models/s").json()["xinf"]["status"], "ready");
    let workers = http::get(addr, "/v1/workers").json();
    assert_eq!(workers[0]["replicas"], json!([other]), "{workers}");
    // Refusals name what is wrong.
    let res = delete(addr, &format!("/v1/models/s/replicas/{busy}"));
    assert_eq!(
        (res.status, res.json()["error"]["code"].clone()),
        (404, json!("replica_not_found")),
        "{}",
        res.text()
    );
    assert_eq!(delete(addr, "/v1/models/nope/replicas/x").status, 404);
    for (query, field) in [
        ("drain_timeout=-1", "drain_timeout"),
        ("drain_timeout=7200", "drain_timeout"),
        ("drain_timeout=1&drain_timeout=2", "drain_timeout"),
        ("wait=1", "wait"),
    ] {
        let res = delete(addr, &format!("/v1/models/s/replicas/{other}?{query}"));
        assert_eq!((res.status, res.json()["error"]["param"].clone()), (400, json!(field)), "{}", res.text());
    }
    assert_eq!(http::post(addr, "/v1/completions", &ask).status, 200);
}

#[test]
fn a_replica_whose_drain_time_runs_out_ends_its_stream_with_the_reason() {
    let (_p, addr, conn, busy) = two_replicas_one_streaming("t", 4000);
    let res = delete(addr, &format!("/v1/models/t/replicas/{busy}?drain_timeout=0"));
    assert_eq!(res.status, 200, "{}", res.text());
    let (took, tail) = until_end(conn);
    assert!(tail.contains(&format!("replica `{busy}` of model `t` was removed")), "{tail}");
    assert!(took < Duration::from_secs(30), "the cut stream lingered {took:?}");
    assert_eq!(replicas(addr, "t").len(), 1);
    let ask = json!({"model": "t", "prompt": "Hello", "max_tokens": 2});
    assert_eq!(http::post(addr, "/v1/completions", &ask).status, 200);
}

/// `xinf local` told it has one GPU (`XINF_GPUS=0`, on any machine): the worker lists it; two
/// replicas whose memory shares add up past the whole GPU are refused before anything starts,
/// naming the option; two that fit are placed on it without any sharing switch and asked to
/// compute there (`device: cuda:0`), which a build without the `cuda` feature refuses, naming
/// `device`, and rolls back, freeing the GPU's memory share.
#[test]
fn replicas_share_a_gpu_by_memory_fraction() {
    let _ = util::smollm2();
    let mut cmd = xinf();
    cmd.args(["local", "--port", "0"])
        .env("XINF_GPUS", "0")
        .env_remove("XINF_ALLOW_MULTI_REPLICA_PER_GPU")
        .env_remove("CUDA_VISIBLE_DEVICES");
    let mut p = Proc::spawn(cmd);
    let addr: SocketAddr =
        p.wait_for("REST API at http://").trim().trim_end_matches("/v1").parse().expect("REST address");

    let workers = http::get(addr, "/v1/workers").json();
    assert_eq!(workers[0]["info"]["gpus"], json!([0]), "{workers}");
    assert_eq!(workers[0]["info"]["gpu_details"][0]["index"], 0, "{workers}");
    let listed = xinf()
        .args(["list", "--workers", "-e", &format!("http://{addr}")])
        .output()
        .expect("run xinf list --workers");
    let table = String::from_utf8_lossy(&listed.stdout);
    let row = table.lines().find(|l| l.starts_with("local")).unwrap_or_default();
    assert!(row.split_whitespace().nth(2).is_some_and(|gpus| gpus.starts_with('0')), "{table}");

    let shared = |uid: &str, replicas: u32, fraction: f64| {
        json!({
            "model_name": "smollm2-instruct", "model_uid": uid, "replica": replicas, "gpu_idx": 0,
            "engine_config": {"gpu_memory_utilization": fraction},
        })
    };
    let nothing_left = |when: &str| {
        let models = http::get(addr, "/v1/models").json();
        assert_eq!(models["data"].as_array().map(Vec::len), Some(0), "{when}: {models}");
        let workers = http::get(addr, "/v1/workers").json();
        assert_eq!(workers[0]["replicas"], json!([]), "{when}: {workers}");
        assert_eq!(workers[0]["gpu_usage"][0]["memory_fraction"], 0.0, "{when}: {workers}");
    };

    // 0.6 + 0.6: refused by placement, naming the option and the sum.
    let res = http::post(addr, "/v1/models", &shared("over", 2, 0.6));
    assert_eq!(res.status, 400, "{}", res.text());
    let err = res.json();
    assert_eq!(err["error"]["code"], "gpu_memory_oversubscribed", "{err}");
    let text = err["error"]["message"].as_str().unwrap_or_default();
    assert!(text.contains("gpu_memory_utilization") && text.contains("sums to 1.2"), "{err}");
    nothing_left("after the oversubscribed launch");

    // 0.4 + 0.4: placed on GPU 0, and each replica's engine is asked for cuda:0.
    let res = http::post(addr, "/v1/models", &shared("fits", 2, 0.4));
    if cfg!(feature = "cuda") && res.status == 200 {
        // A GPU build on a GPU machine serves it: both replicas on GPU 0.
        let info = http::get(addr, "/v1/models/fits").json();
        let gpus: Vec<&Value> = info["xinf"]["replica_details"]
            .as_array()
            .expect("replica details")
            .iter()
            .map(|r| &r["gpus"])
            .collect();
        assert_eq!(gpus, [&json!([0]), &json!([0])], "{info}");
        let workers = http::get(addr, "/v1/workers").json();
        assert_eq!(workers[0]["gpu_usage"][0]["memory_fraction"], 0.8, "{workers}");
        assert_eq!(http::request(addr, "DELETE", "/v1/models/fits", &[], b"").status, 200);
    } else {
        assert_eq!(res.status, 400, "{}", res.text());
        let err = res.json();
        let text = err["error"]["message"].as_str().unwrap_or_default();
        let names_device =
            err["error"]["param"] == "engine_config.device" || text.contains("engine_config.device");
        assert!(names_device && text.contains("cuda:0"), "{err}");
        assert_ne!(err["error"]["code"], "gpu_memory_oversubscribed", "{err}");
        if cfg!(not(feature = "cuda")) {
            assert!(text.contains("cargo feature `cuda`"), "{err}");
        }
    }
    nothing_left("after the launch on GPU 0 ended");

    // The shares were freed: 0.9 alone gets past placement to the engine again.
    let res = http::post(addr, "/v1/models", &shared("alone", 1, 0.9));
    if !(cfg!(feature = "cuda") && res.status == 200) {
        let err = res.json();
        assert_ne!(err["error"]["code"], "gpu_memory_oversubscribed", "{err}");
        assert!(err["error"]["message"].as_str().unwrap_or_default().contains("cuda:0"), "{err}");
    }
    p.kill();
}
