//! GPU admission, through placement: conflicts and memory shares.

use super::*;
use crate::launch::tests::*;
use crate::launch::{place, validate};
use serde_json::json;

// ---- conflicts ----

#[test]
fn a_gpu_requested_twice_is_a_conflict() {
    let dev = json!([{"worker_ip": "w:1", "gpu_idx": [0]}]);
    let e = place_err(
        json!({"model_name": "smollm2-instruct", "replica_config": [{"devices": dev}, {"devices": dev}]}),
        &view(vec![worker("w:1", &[0, 1])]),
    );
    assert_rule(
        &e,
        LaunchRule::GpuConflict,
        "GPU conflict: GPU 0 on worker w:1 is requested by more than one replica, and this worker disallows sharing a GPU",
    );
}

#[test]
fn an_occupied_gpu_is_a_conflict_unless_sharing_is_allowed() {
    let mut w = worker("w:1", &[0, 1]);
    w.occupied.insert(1, vec![tenant("other", "other-0", None)]);
    let dev = json!([{"worker_ip": "w:1", "gpu_idx": [1]}]);
    let req = json!({"model_name": "smollm2-instruct", "replica_config": [{"devices": dev}]});
    let e = place_err(req.clone(), &view(vec![w.clone()]));
    assert_rule(
        &e,
        LaunchRule::GpuConflict,
        "GPU conflict: GPU 1 on worker w:1 is already occupied by model 'other', and this worker disallows sharing a GPU",
    );
    w.allow_gpu_sharing = true;
    let spec = validate(&parse(req), false, &engines()).expect("valid");
    let (placed, _) = place(&spec, "m", &view(vec![w])).expect("sharing allowed");
    assert_eq!(placed[0].gpus, vec![1]);
}

#[test]
fn a_gpu_conflict_says_how_to_share() {
    let dev = json!([{"worker_ip": "w:1", "gpu_idx": [0]}]);
    let e = place_err(
        json!({"model_name": "smollm2-instruct", "replica_config": [{"devices": dev}, {"devices": dev}]}),
        &view(vec![worker("w:1", &[0])]),
    );
    assert_rule(&e, LaunchRule::GpuConflict, "when each sets engine_config.gpu_memory_utilization");
}

// ---- GPU memory shares ----

#[test]
fn replicas_share_a_gpu_on_memory_shares_that_fit() {
    let w = || view(vec![worker("w:1", &[0])]);
    let shared = |f: f64| json!({"model_name": "smollm2-instruct", "replica": 2, "gpu_idx": 0, "gpu_memory_utilization": f});
    // 0.4 + 0.4 fit, without XINF_ALLOW_MULTI_REPLICA_PER_GPU.
    let p = placed(shared(0.4), &w());
    assert_eq!(p.iter().map(|p| p.gpus.clone()).collect::<Vec<_>>(), [vec![0], vec![0]]);
    assert_eq!(p.iter().map(|p| p.gpu_memory_utilization).collect::<Vec<_>>(), [Some(0.4), Some(0.4)]);
    assert_eq!(p.iter().map(device_of).collect::<Vec<_>>(), [Some("cuda:0".into()), Some("cuda:0".into())]);
    // 0.5 + 0.5 fit exactly; 0.6 + 0.6 do not.
    placed(shared(0.5), &w());
    let e = place_err(shared(0.6), &w());
    assert_rule(
        &e,
        LaunchRule::GpuMemoryOversubscribed,
        "engine_config.gpu_memory_utilization of the replicas on GPU 0 of worker w:1 sums to 1.2, more than \
         1.0: 'm-0' (0.6), 'm-1' (0.6)",
    );
    assert_eq!(e.code(), "gpu_memory_oversubscribed");
    // Even a worker that allows sharing keeps shares within the GPU.
    let mut sharing = worker("w:1", &[0]);
    sharing.allow_gpu_sharing = true;
    let e = place_err(shared(0.6), &view(vec![sharing]));
    assert_eq!(e.launch_rule(), Some(LaunchRule::GpuMemoryOversubscribed));
}

#[test]
fn shares_count_the_replicas_of_running_models() {
    let mut w = worker("w:1", &[0]);
    w.occupied.insert(0, vec![tenant("other", "other-0", Some(0.7))]);
    let one = |f: f64| json!({"model_name": "smollm2-instruct", "gpu_idx": [0], "gpu_memory_utilization": f});
    let p = placed(one(0.3), &view(vec![w.clone()]));
    assert_eq!(p[0].gpus, vec![0]);
    let e = place_err(one(0.31), &view(vec![w.clone()]));
    assert_rule(&e, LaunchRule::GpuMemoryOversubscribed, "'other-0' of model 'other' (0.7), 'm-0' (0.31)");
    // auto and n_gpu share a GPU where the share fits, and fall back to the CPU (auto) or refuse
    // (n_gpu) where it does not.
    let auto = |f: f64| json!({"model_name": "smollm2-instruct", "gpu_memory_utilization": f});
    assert_eq!(placed(auto(0.2), &view(vec![w.clone()]))[0].gpus, vec![0]);
    let e = place_err(auto(0.5), &view(vec![w.clone()]));
    assert_rule(
        &e,
        LaunchRule::EngineConfig,
        "engine_config.gpu_memory_utilization is a share of a GPU's memory",
    );
    let e = place_err(
        json!({"model_name": "smollm2-instruct", "n_gpu": 1, "gpu_memory_utilization": 0.5}),
        &view(vec![w]),
    );
    assert_eq!(e.launch_rule(), Some(LaunchRule::NotEnoughGpus), "{e}");
}

#[test]
fn every_replica_sharing_a_gpu_states_its_share() {
    // This launch: one replica with a share, one without (P/D roles allow per-replica options).
    let w = || view(vec![worker("w:1", &[0])]);
    let e = place_err(
        json!({"model_name": "smollm2-instruct", "replica_config": [
            {"role": "prefill", "engine_config": {"gpu_memory_utilization": 0.5},
             "devices": [{"worker_ip": "w:1", "gpu_idx": [0]}]},
            {"role": "decode", "devices": [{"worker_ip": "w:1", "gpu_idx": [0]}]},
        ]}),
        &w(),
    );
    assert_rule(
        &e,
        LaunchRule::GpuMemoryUtilizationRequired,
        "GPU 0 on worker w:1 would be shared by replicas 'm-0' (0.5), 'm-1' (no gpu_memory_utilization): \
         every replica sharing a GPU must set engine_config.gpu_memory_utilization",
    );
    assert_eq!(e.code(), "gpu_memory_utilization_required");
    // Both with shares: placed on one GPU, each with its own.
    let p = placed(
        json!({"model_name": "smollm2-instruct", "replica_config": [
            {"role": "prefill", "engine_config": {"gpu_memory_utilization": 0.3},
             "devices": [{"worker_ip": "w:1", "gpu_idx": [0]}]},
            {"role": "decode", "engine_config": {"gpu_memory_utilization": 0.6},
             "devices": [{"worker_ip": "w:1", "gpu_idx": [0]}]},
        ]}),
        &w(),
    );
    assert_eq!(p.iter().map(|p| p.gpu_memory_utilization).collect::<Vec<_>>(), [Some(0.3), Some(0.6)]);
    // A running model without a share: a newcomer with one may not join it, even where sharing
    // is allowed.
    let mut busy = worker("w:1", &[0]);
    busy.allow_gpu_sharing = true;
    busy.occupied.insert(0, vec![tenant("other", "other-0", None)]);
    let e = place_err(
        json!({"model_name": "smollm2-instruct", "gpu_idx": 0, "gpu_memory_utilization": 0.2}),
        &view(vec![busy.clone()]),
    );
    assert_rule(
        &e,
        LaunchRule::GpuMemoryUtilizationRequired,
        "'other-0' of model 'other' (no gpu_memory_utilization)",
    );
    // Without any share, the worker's switch decides, as before.
    assert_eq!(
        placed(json!({"model_name": "smollm2-instruct", "gpu_idx": 0}), &view(vec![busy]))[0].gpus,
        vec![0]
    );
}

#[test]
fn a_share_needs_a_gpu() {
    let e = place_err(
        json!({"model_name": "smollm2-instruct", "n_gpu": 0, "gpu_memory_utilization": 0.5}),
        &view(vec![worker("w:1", &[0])]),
    );
    assert_rule(&e, LaunchRule::EngineConfig, "replica 'm-0' runs on the CPU of worker w:1");
    let e = validate_err(json!({"model_name": "smollm2-instruct", "gpu_memory_utilization": 1.5}), true);
    assert_rule(&e, LaunchRule::EngineConfig, "engine_config.gpu_memory_utilization");
    let e = validate_err(
        json!({"model_name": "smollm2-instruct", "device": "cpu", "gpu_memory_utilization": 0.5}),
        true,
    );
    assert_rule(&e, LaunchRule::EngineConfig, "engine_config.gpu_memory_utilization");
}
