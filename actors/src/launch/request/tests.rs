//! The request schema: strict types, unknown keys refused.

use super::*;
use crate::launch::tests::*;
use serde_json::json;

// ---- schema and strict types ----

#[test]
fn unknown_replica_config_keys_are_refused() {
    let r: Result<LaunchRequest, _> = serde_json::from_value(json!({
        "model_name": "smollm2-instruct", "replica_config": [{"replica_uid": "a", "colour": "red"}]
    }));
    assert!(r.expect_err("unknown field").to_string().contains("colour"));
    let r: Result<LaunchRequest, _> = serde_json::from_value(json!({
        "model_name": "smollm2-instruct",
        "replica_config": [{"devices": [{"worker_ip": "a:1", "gpus": 2}]}]
    }));
    assert!(r.is_err());
}

#[test]
fn strict_types() {
    for bad in [
        json!({"model_name": "x", "replica": "2"}),
        json!({"model_name": "x", "replica": -1}),
        json!({"model_name": "x", "replica": true}),
        json!({"model_name": "x", "n_gpu": "2"}),
        json!({"model_name": "x", "n_gpu": -1}),
        json!({"model_name": "x", "n_gpu": true}),
        json!({"model_name": "x", "model_size_in_billions": true}),
        json!({"model_name": "x", "replica_config": [{"role": "both"}]}),
        json!({"model_name": "x", "replica_config": [{"devices": [{"worker_ip": "a", "gpu_idx": [-1]}]}]}),
    ] {
        assert!(serde_json::from_value::<LaunchRequest>(bad.clone()).is_err(), "{bad} must not parse");
    }
    let ok = parse(json!({"model_name": "x", "n_gpu": "auto", "model_size_in_billions": 0.5, "gpu_idx": 1}));
    assert_eq!(ok.n_gpu, Some(GpuCount::Auto));
    assert_eq!(ok.model_size_in_billions, Some(ModelSize("0.5".into())));
    assert_eq!(ok.gpu_idx, Some(GpuIdx(vec![1])));
    let ok =
        parse(json!({"model_name": "x", "n_gpu": 2, "model_size_in_billions": "0_5", "gpu_idx": [0, 1]}));
    assert_eq!(ok.n_gpu, Some(GpuCount::Count(2)));
    assert_eq!(ok.gpu_idx, Some(GpuIdx(vec![0, 1])));
}
