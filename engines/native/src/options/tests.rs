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
