//! The bad-input corpus of the launch route: malformed launches, each refused with a 4xx in the
//! API's error shape naming the field at fault, before anything starts (no model appears), while
//! the model already serving keeps answering the same greedy text.

use crate::util::http;
use crate::util::procs::local;
use serde_json::{Value, json};
use std::net::SocketAddr;

/// A launch of the default model with `extra` merged in.
fn launch(extra: Value) -> Value {
    let mut body = json!({"model_name": "smollm2-instruct"});
    if let (Some(b), Value::Object(e)) = (body.as_object_mut(), extra) {
        b.extend(e);
    }
    body
}

/// `(body, param)`: the launch and the field its refusal must name (a prefix of `param`).
fn cases() -> Vec<(Value, &'static str)> {
    let mut cases = Vec::new();
    let mut each = |field: &'static str, values: Vec<Value>| {
        for v in values {
            cases.push((launch(json!({ field: v })), field));
        }
    };
    each("model_name", vec![json!(5), json!([]), json!({}), json!(""), json!(null), json!("no-such-model")]);
    each("model_uid", vec![json!(5), json!(""), json!("  "), json!("a b"), json!("a/b"), json!(["u"])]);
    each("replica", vec![json!(0), json!(-1), json!("two"), json!(1.5), json!(true), json!([1])]);
    each("n_gpu", vec![json!(-1), json!(1.5), json!("many"), json!([1]), json!(true)]);
    each("gpu_idx", vec![json!("0"), json!([-1]), json!([0, 0]), json!([1.5]), json!({"0": 1}), json!(7)]);
    each("worker_ip", vec![json!(5), json!(""), json!("10.9.9.9"), json!(["local"])]);
    each("n_worker", vec![json!(0), json!(2), json!("x"), json!(-1)]);
    each("model_engine", vec![json!(5), json!("tensorrt"), json!(["native"])]);
    each("model_type", vec![json!("embedding"), json!("image"), json!(5)]);
    each("model_path", vec![json!(5), json!(["/tmp"]), json!("/nonexistent/model/folder")]);
    each("model_format", vec![json!(5), json!(["gguf"])]);
    each("quantization", vec![json!(5), json!({})]);
    each("model_size_in_billions", vec![json!([]), json!({}), json!(true)]);
    each("transfer_backend_type", vec![json!("carrier-pigeon"), json!(5)]);
    each("reasoning_content", vec![json!("yes"), json!(1), json!(true)]);
    each("enable_thinking", vec![json!("no"), json!(0), json!([true])]);
    each("enable_xavier", vec![json!("yes"), json!(1)]);
    each("xavier_cache_bytes", vec![json!(-1), json!(0), json!("x"), json!(1.5)]);
    each("xavier_gpu_cache_bytes", vec![json!(-1), json!("x")]);
    each("request_limits", vec![json!(0), json!(-4), json!("4"), json!(1.5)]);
    each("engine_config", vec![json!("x"), json!(5), json!([1])]);
    let engine_configs = [
        json!({"colour": "red"}),
        json!({"kv_cache_tokens": -1}),
        json!({"kv_cache_tokens": "x"}),
        json!({"kv_cache_tokens": 1}),
        json!({"kv_cache_tokens": 4_611_686_018_427_387_904_u64}),
        json!({"gpu_memory_utilization": 2}),
        json!({"gpu_memory_utilization": -0.5}),
        json!({"gpu_memory_utilization": 0.5}),
        json!({"context_length": -5}),
        json!({"context_length": "long"}),
        json!({"device": "tpu"}),
        json!({"max_num_seqs": 0}),
        json!({"max_num_seqs": "x"}),
        json!({"kv_layout": "sideways"}),
        json!({"block_size": 7}),
        json!({"kv_dtype": "int3"}),
    ];
    for config in engine_configs {
        cases.push((launch(json!({"engine_config": config})), "engine_config"));
    }
    // Top-level keys that are neither launch keys nor engine options are engine options that
    // the engine does not know.
    cases.push((launch(json!({"colour": "red"})), "engine_config.colour"));
    cases.push((launch(json!({"max_num_seqs": 2, "engine_config": {"max_num_seqs": 4}})), "max_num_seqs"));
    let replica_configs = [
        (json!("x"), "replica_config"),
        (json!({}), "replica_config"),
        (json!([]), "replica_config"),
        (json!([5]), "replica_config[0]"),
        (json!([{"role": "leader"}]), "replica_config[0].role"),
        (json!([{"gpus": 1}]), "replica_config[0].gpus"),
        (json!([{"devices": "x"}]), "replica_config[0].devices"),
        (json!([{"devices": []}]), "replica_config[0].devices"),
        (json!([{"devices": [{"worker_ip": "local"}, {"worker_ip": "local"}]}]), "replica_config[0].devices"),
        (json!([{"devices": [{"worker_ip": 5}]}]), "replica_config[0].devices[0].worker_ip"),
        (
            json!([{}, {"devices": [{"worker_ip": "10.9.9.9", "n_gpu": "auto"}]}]),
            "replica_config[1].worker_ip",
        ),
        (json!([{"replica_uid": ""}]), "replica_config[0].replica_uid"),
        (json!([{"replica_uid": "a b"}]), "replica_config[0].replica_uid"),
        (json!([{"replica_uid": "a"}, {"replica_uid": "a"}]), "replica_uid"),
        (json!([{"role": "prefill"}]), "replica_config"),
        (json!([{"role": "decode"}, {"role": "decode"}]), "replica_config"),
        (json!([{"role": "prefill"}, {"role": "decode"}, {}]), "replica_config"),
        (json!([{"model_engine": "native"}]), "replica_config"),
        (json!([{"engine_config": {"kv_cache_tokens": 4096}}]), "replica_config"),
        (
            json!([{"role": "prefill", "engine_config": "x"}, {"role": "decode"}]),
            "replica_config[0].engine_config",
        ),
        (
            json!([{"role": "prefill", "engine_config": {"colour": "red"}}, {"role": "decode"}]),
            "replica_config[0].engine_config.colour",
        ),
        (json!([{"role": "prefill", "model_engine": "tensorrt"}, {"role": "decode"}]), "replica_config"),
    ];
    for (config, param) in replica_configs {
        cases.push((launch(json!({"replica_config": config})), param));
    }
    cases.push((launch(json!({"replica": 3, "replica_config": [{}, {}]})), "replica_config"));
    cases.push((launch(json!({"worker_ip": "local", "replica_config": [{}]})), "replica_config"));
    cases.push((launch(json!({"n_gpu": 2, "gpu_idx": [0]})), "n_gpu"));
    cases
}

/// The greedy answer of the serving model, the reference every check compares with.
fn answer(addr: SocketAddr, uid: &str) -> String {
    let body = json!({"model": uid, "prompt": "The capital of France is", "max_tokens": 6, "temperature": 0});
    let res = http::post(addr, "/v1/completions", &body);
    assert_eq!(res.status, 200, "{}", res.text());
    res.json()["choices"][0]["text"].as_str().unwrap_or_default().to_owned()
}

#[test]
fn the_launch_corpus_is_refused_naming_each_field_before_anything_starts() {
    let (_server, addr) = local("corpus", &[]);
    let want = answer(addr, "corpus");
    let cases = cases();
    assert!(cases.len() >= 100, "{} cases", cases.len());
    let mut failures = Vec::new();
    for (i, (body, param)) in cases.iter().enumerate() {
        let res = http::post(addr, "/v1/models", body);
        let parsed: Option<Value> = serde_json::from_slice(&res.body).ok();
        let err = parsed.as_ref().map(|b| b["error"].clone()).unwrap_or_default();
        let shaped = err["message"].as_str().is_some_and(|m| !m.is_empty() && !m.contains("stack backtrace"))
            && err["type"].is_string()
            && err["code"].is_string();
        let named = err["param"].as_str().is_some_and(|p| p.starts_with(param));
        if !(400..500).contains(&res.status) || !shaped || !named {
            failures.push(format!("{body} → {} {} (wanted param {param})", res.status, res.text()));
        }
        if i % 25 == 24 {
            assert_eq!(answer(addr, "corpus"), want, "after case {i}");
        }
    }
    // Nothing was started: the serving model is the only one, and it still answers.
    let models = http::get(addr, "/v1/models").json();
    let uids: Vec<&str> =
        models["data"].as_array().into_iter().flatten().filter_map(|m| m["id"].as_str()).collect();
    assert_eq!(uids, ["corpus"], "{models}");
    assert_eq!(answer(addr, "corpus"), want);
    assert!(failures.is_empty(), "{} of {} cases:\n{}", failures.len(), cases.len(), failures.join("\n"));
}
