use super::*;
use serde_json::json;

fn device(v: Value) -> Result<ComputeDevice, EngineError> {
    EngineOptions::from_engine_config(&json!({ "device": v })).map(|o| o.device)
}

#[test]
fn the_device_defaults_to_the_cpu() {
    assert_eq!(EngineOptions::default().device, ComputeDevice::Cpu);
    assert_eq!(EngineOptions::from_engine_config(&json!({})).expect("options").device, ComputeDevice::Cpu);
}

#[test]
fn devices_parse_and_print_back() {
    assert_eq!(device(json!("cpu")).expect("cpu"), ComputeDevice::Cpu);
    assert_eq!(device(json!("cuda")).expect("cuda"), ComputeDevice::Cuda(0));
    assert_eq!(device(json!("cuda:3")).expect("cuda:3"), ComputeDevice::Cuda(3));
    for d in [ComputeDevice::Cpu, ComputeDevice::Cuda(0), ComputeDevice::Cuda(5)] {
        assert_eq!(d.to_string().parse::<ComputeDevice>(), Ok(d));
    }
}

#[test]
fn a_bad_device_names_the_field() {
    for bad in [json!("tpu"), json!("cuda:"), json!("cuda:-1"), json!("cuda:x"), json!(0)] {
        match device(bad.clone()) {
            Err(EngineError::InvalidRequest { field, .. }) => {
                assert_eq!(field, "engine_config.device", "{bad}")
            }
            other => panic!("{bad}: {other:?}"),
        }
    }
}

fn fraction(v: Value) -> Result<Option<f64>, EngineError> {
    EngineOptions::from_engine_config(&json!({ "gpu_memory_utilization": v }))
        .map(|o| o.gpu_memory_utilization)
}

#[test]
fn gpu_memory_utilization_is_a_fraction_in_0_1() {
    assert_eq!(EngineOptions::default().gpu_memory_utilization, None);
    assert_eq!(fraction(json!(0.4)).expect("0.4"), Some(0.4));
    assert_eq!(fraction(json!(1)).expect("1"), Some(1.0));
    assert_eq!(fraction(Value::Null).expect("null"), None);
    for bad in [json!(0), json!(0.0), json!(-0.2), json!(1.01), json!(2), json!("0.5"), json!(true)] {
        match fraction(bad.clone()) {
            Err(EngineError::InvalidRequest { field, .. }) => {
                assert_eq!(field, "engine_config.gpu_memory_utilization", "{bad}")
            }
            other => panic!("{bad}: {other:?}"),
        }
    }
}

#[test]
fn cuda_graphs_default_on_and_take_a_boolean() {
    let graphs =
        |v: Value| EngineOptions::from_engine_config(&json!({ "cuda_graphs": v })).map(|o| o.cuda_graphs);
    assert!(EngineOptions::default().cuda_graphs);
    assert!(!graphs(json!(false)).expect("false"));
    assert!(graphs(json!(true)).expect("true"));
    for bad in [json!("no"), json!(0), json!([])] {
        match graphs(bad.clone()) {
            Err(EngineError::InvalidRequest { field, .. }) => {
                assert_eq!(field, "engine_config.cuda_graphs", "{bad}")
            }
            other => panic!("{bad}: {other:?}"),
        }
    }
}

#[test]
fn gpu_memory_utilization_is_refused_on_an_explicit_cpu() {
    let e = EngineOptions::from_engine_config(&json!({"device": "cpu", "gpu_memory_utilization": 0.5}))
        .expect_err("a CPU has no GPU memory");
    assert!(
        matches!(&e, EngineError::InvalidRequest { field, .. } if field == "engine_config.gpu_memory_utilization"),
        "{e:?}"
    );
    // On a GPU, or where the cluster decides the device, it is accepted.
    for device in [json!("cuda:1"), Value::Null] {
        let o = EngineOptions::from_engine_config(&json!({"device": device, "gpu_memory_utilization": 0.5}))
            .expect("valid");
        assert_eq!(o.gpu_memory_utilization, Some(0.5));
    }
}

#[test]
fn kv_cache_tokens_remembers_whether_it_was_given() {
    assert!(!EngineOptions::from_engine_config(&json!({})).expect("valid").kv_cache_tokens_explicit);
    let o = EngineOptions::from_engine_config(&json!({"kv_cache_tokens": 4096})).expect("valid");
    assert!(o.kv_cache_tokens_explicit);
    assert_eq!(o.kv_cache_tokens, 4096);
}

#[test]
fn prompts_are_chunked_larger_on_a_gpu_unless_told() {
    let mbt = |v: Value| EngineOptions::from_engine_config(&v).expect("options").max_batch_tokens;
    assert_eq!(mbt(json!({})), 512);
    assert_eq!(mbt(json!({"device": "cpu"})), 512);
    assert_eq!(mbt(json!({"device": "cuda:1"})), GPU_MAX_BATCH_TOKENS);
    assert_eq!(mbt(json!({"device": "cuda", "max_batch_tokens": 256})), 256);
}
