use super::*;
use crate::launch::{LaunchRequest, validate};
use serde_json::json;

fn spec(v: serde_json::Value) -> LaunchSpec {
    let req: LaunchRequest = serde_json::from_value(v).expect("request");
    validate(&req, false, &crate::testing::engines()).expect("valid")
}

#[test]
fn the_request_is_strict() {
    let r: ScaleRequest = serde_json::from_value(json!({"role": "decode", "count": 2})).expect("parses");
    assert_eq!((r.role, r.count), (Some(Role::Decode), Some(2)));
    assert!(serde_json::from_value::<ScaleRequest>(json!({"count": "2"})).is_err());
    assert!(serde_json::from_value::<ScaleRequest>(json!({"role": "both"})).is_err());
    assert!(serde_json::from_value::<ScaleRequest>(json!({"engine_config": {}})).is_err());
    assert!(refused_key("engine_config").is_some_and(|why| why.contains("per-replica engine settings")));
    assert!(refused_key("model_engine").is_some());
    assert_eq!(refused_key("count"), None);
}

#[test]
fn new_replicas_copy_the_template_and_take_free_uids() {
    let s = spec(json!({"model_name": "smollm2-instruct", "replica_config": [
        {"role": "prefill", "devices": [{"worker_ip": "a:1"}]},
        {"role": "decode", "devices": [{"worker_ip": "a:1"}], "engine_config": {"max_num_seqs": 7}}
    ]}));
    let taken: BTreeMap<String, String> = [("m-0", "m"), ("m-1", "m"), ("m-3", "other")]
        .into_iter()
        .map(|(a, b)| (a.into(), b.into()))
        .collect();
    let req = ScaleRequest { role: Some(Role::Decode), count: Some(2), ..ScaleRequest::default() };
    let out = scale_spec(&s, "m", &req, &taken).expect("spec");
    let uids: Vec<Option<&str>> = out.replicas.iter().map(|r| r.replica_uid.as_deref()).collect();
    assert_eq!(uids, [Some("m-2"), Some("m-4")]);
    // A number given up (m-1 lost or removed) is not taken again.
    let gap: BTreeMap<String, String> =
        [("m-0", "m"), ("m-2", "m")].into_iter().map(|(a, b)| (a.into(), b.into())).collect();
    let one = ScaleRequest { role: Some(Role::Decode), ..ScaleRequest::default() };
    let out = scale_spec(&s, "m", &one, &gap).expect("spec");
    assert_eq!(out.replicas[0].replica_uid.as_deref(), Some("m-3"));
    assert!(
        out.replicas.iter().all(|r| r.role == Role::Decode && r.engine_config == s.replicas[1].engine_config)
    );
    assert!(out.pd && out.model_uid.as_deref() == Some("m"));
    let there = ScaleRequest { gpu_idx: Some(vec![1]), worker_ip: Some("b:1".into()), ..req };
    let out = scale_spec(&s, "m", &there, &taken).expect("spec");
    assert_eq!(out.replicas[0].device.gpu_idx, Some(vec![1]));
    assert_eq!(out.replicas[0].device.n_gpu, GpuCount::Count(1));
    assert_eq!(out.replicas[0].device.worker_ip.as_deref(), Some("b:1"));
}

#[test]
fn a_copied_replicas_worker_that_is_gone_is_named_as_the_copy_s() {
    let s = spec(json!({"model_name": "smollm2-instruct", "replica_config": [
        {"role": "prefill", "devices": [{"worker_ip": "a:1"}]},
        {"role": "decode", "devices": [{"worker_ip": "b:1"}]}
    ]}));
    let req = ScaleRequest { role: Some(Role::Decode), ..ScaleRequest::default() };
    let out = scale_spec(&s, "m", &req, &BTreeMap::new()).expect("spec");
    let view = crate::launch::ClusterView {
        workers: vec![crate::launch::tests::worker("a:1", &[])],
        ..Default::default()
    };
    let e = crate::launch::place(&out, "m", &view).expect_err("b:1 is gone");
    assert_eq!(e.launch_field(), Some("worker_ip"));
    assert!(e.to_string().starts_with("the copied replica's worker_ip 'b:1' is not in the cluster"), "{e}");
}
