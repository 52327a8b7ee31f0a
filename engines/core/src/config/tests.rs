use super::*;
use serde_json::json;

fn native(v: Value) -> Result<NativeConfig, EngineError> {
    NativeConfig::from_json(&v)
}

fn field_of(e: EngineError) -> String {
    match e {
        EngineError::InvalidRequest { field, .. } => field,
        other => panic!("not an invalid request: {other:?}"),
    }
}

#[test]
fn keys_are_the_fields_of_the_struct() {
    // Every field is written (as null when absent), so the JSON object has all of them.
    let every = serde_json::to_value(NativeConfig::default()).expect("json");
    let mut fields: Vec<&str> = every.as_object().expect("object").keys().map(String::as_str).collect();
    let mut keys = NativeConfig::KEYS.to_vec();
    fields.sort_unstable();
    keys.sort_unstable();
    assert_eq!(fields, keys);
    let every = serde_json::to_value(MockFaults::default()).expect("json");
    let mut fields: Vec<&str> = every.as_object().expect("object").keys().map(String::as_str).collect();
    let mut keys = MockFaults::KEYS.to_vec();
    fields.sort_unstable();
    keys.sort_unstable();
    assert_eq!(fields, keys);
}

#[test]
fn unknown_keys_name_the_key_and_the_known_ones() {
    let e = native(json!({"colour": "red"})).expect_err("unknown");
    assert!(e.to_string().contains("kv_cache_tokens"), "{e}");
    assert_eq!(field_of(e), "engine_config.colour");
    let e = MockConfig::from_map(json!({"kv_cache_tokens": 1024, "shade": 1}).as_object().expect("map"))
        .expect_err("unknown");
    assert!(e.to_string().contains("fail_after_tokens"), "{e}");
    assert_eq!(field_of(e), "engine_config.shade");
}

#[test]
fn bad_values_name_their_key() {
    for (bad, key) in [
        (json!({"kv_cache_tokens": 1}), "kv_cache_tokens"),
        (json!({"kv_cache_tokens": "many"}), "kv_cache_tokens"),
        (json!({"kv_cache_tokens": -5}), "kv_cache_tokens"),
        (json!({"max_num_seqs": 0}), "max_num_seqs"),
        (json!({"max_batch_tokens": 8}), "max_batch_tokens"),
        (json!({"kv_layout": "sideways"}), "kv_layout"),
        (json!({"kv_layout": 3}), "kv_layout"),
        (json!({"kv_order": "XYZ"}), "kv_order"),
        (json!({"kv_layout": "token-pool", "kv_order": "HND"}), "kv_order"),
        (json!({"block_size": 0}), "block_size"),
        (json!({"kv_dtype": "f8"}), "kv_dtype"),
        (json!({"recompute_last_token": "yes"}), "recompute_last_token"),
        (json!({"device": "tpu"}), "device"),
        (json!({"gpu_memory_utilization": 1.5}), "gpu_memory_utilization"),
        (json!({"gpu_memory_utilization": true}), "gpu_memory_utilization"),
        (json!({"device": "cpu", "gpu_memory_utilization": 0.5}), "gpu_memory_utilization"),
    ] {
        let e = native(bad.clone()).expect_err("refused");
        assert_eq!(field_of(e), format!("engine_config.{key}"), "{bad}");
    }
    assert_eq!(field_of(native(json!([1])).expect_err("not an object")), "engine_config");
}

#[test]
fn values_read_as_given() {
    let c = native(json!({
        "kv_layout": "token-pool", "kv_dtype": "bfloat16", "device": "cuda:2",
        "gpu_memory_utilization": 1, "kv_cache_tokens": 4096, "cuda_graphs": false
    }))
    .expect("valid");
    assert_eq!(c.kv_layout, Some(KvLayoutKind::TokenPool));
    assert_eq!(c.layout().block_size, 1);
    assert_eq!(c.kv_dtype.and_then(KvDtypeChoice::dtype), Some(KvDtype::Bf16));
    assert_eq!(c.device, Some(ComputeDevice::Cuda(2)));
    assert_eq!(c.gpu_memory_utilization, Some(1.0));
    assert_eq!(native(Value::Null).expect("null"), NativeConfig::default());
    assert_eq!(native(json!({"device": null})).expect("null value").device, None);
}

#[test]
fn typed_options_cross_bincode_and_read_back_as_json() {
    let mut config = EngineConfig::Mock(
        MockConfig::from_map(
            json!({"kv_layout": "paged-block-first", "kv_order": "HND", "fail_after_tokens": 3})
                .as_object()
                .expect("map"),
        )
        .expect("valid"),
    );
    config.set_device(ComputeDevice::Cuda(1));
    let bytes = bincode::serde::encode_to_vec(&config, bincode::config::standard()).expect("encode");
    let (back, _): (EngineConfig, _) =
        bincode::serde::decode_from_slice(&bytes, bincode::config::standard()).expect("decode");
    assert_eq!(back, config);
    assert_eq!(
        back.to_json(),
        json!({"kv_layout": "paged-block-first", "kv_order": "HND", "device": "cuda:1", "fail_after_tokens": 3})
    );
}
