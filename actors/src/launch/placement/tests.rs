//! One test per placement message, and the device a placed replica computes on.

use super::*;
use crate::launch::tests::*;
use crate::launch::validate;
use serde_json::{Value, json};

// ---- replica uids ----

#[test]
fn duplicate_replica_uids_are_refused() {
    let e = place_err(
        json!({"model_name": "smollm2-instruct", "replica_config": [
            {"replica_uid": "a", "devices": device("w:1")}, {"replica_uid": "a", "devices": device("w:1")}
        ]}),
        &view(vec![worker("w:1", &[])]),
    );
    assert_rule(&e, LaunchRule::DuplicateReplicaUid, "Duplicate replica_uid 'a'");
    // An explicit uid that collides with another replica's default uid.
    let e = place_err(
        json!({"model_name": "smollm2-instruct", "replica_config": [
            {"devices": device("w:1")}, {"replica_uid": "m-0", "devices": device("w:1")}
        ]}),
        &view(vec![worker("w:1", &[])]),
    );
    assert_rule(&e, LaunchRule::DuplicateReplicaUid, "Duplicate replica_uid 'm-0'");
    // A uid another model uses.
    let mut v = view(vec![worker("w:1", &[])]);
    v.replica_uids.insert("shared".into(), "other".into());
    let e = place_err(
        json!({"model_name": "smollm2-instruct", "replica_config": [{"replica_uid": "shared", "devices": device("w:1")}]}),
        &v,
    );
    assert_rule(&e, LaunchRule::DuplicateReplicaUid, "model 'other' already has a replica with this uid");
}

// ---- cluster state ----

#[test]
fn unknown_worker_ip_is_refused_in_cluster_mode() {
    let e = place_err(
        json!({"model_name": "smollm2-instruct", "replica_config": [{"devices": device("10.0.0.9:7")}]}),
        &view(vec![worker("10.0.0.1:5", &[]), worker("10.0.0.2:5", &[])]),
    );
    assert_rule(
        &e,
        LaunchRule::UnknownWorker,
        "replica_config[0].worker_ip '10.0.0.9:7' is not in the cluster. Registered workers: [10.0.0.1:5, 10.0.0.2:5]",
    );
    let e = place_err(
        json!({"model_name": "smollm2-instruct", "worker_ip": "10.0.0.9"}),
        &view(vec![worker("10.0.0.1:5", &[])]),
    );
    assert_rule(&e, LaunchRule::UnknownWorker, "worker_ip '10.0.0.9' is not in the cluster.");
    // A host with several workers names none of them.
    let e = place_err(
        json!({"model_name": "smollm2-instruct", "worker_ip": "10.0.0.1"}),
        &view(vec![worker("10.0.0.1:5", &[]), worker("10.0.0.1:6", &[])]),
    );
    assert_rule(
        &e,
        LaunchRule::UnknownWorker,
        "worker_ip '10.0.0.1' matches 2 workers (10.0.0.1:5, 10.0.0.1:6); name one by its id",
    );
}

#[test]
fn local_mode_names_its_worker_by_id_or_loopback_and_refuses_other_addresses() {
    let v = view(vec![worker("local", &[])]);
    let local = |ip: &str| {
        let req = json!({"model_name": "smollm2-instruct", "replica_config": [{"devices": device(ip)}]});
        place(&validate(&parse(req), true, &engines()).expect("valid"), "m", &v)
    };
    for ip in ["local", "127.0.0.1", "localhost"] {
        let (placed, _) = local(ip).expect("placed");
        assert_eq!(placed[0].worker_id, "local", "{ip}");
    }
    // An address that is not this machine's worker is refused, as in a cluster, not placed
    // here anyway.
    let e = local("10.0.0.9:7").expect_err("refused");
    assert_rule(
        &e,
        LaunchRule::UnknownWorker,
        "replica_config[0].worker_ip '10.0.0.9:7' is not in the cluster. Registered workers: [local (127.0.0.1)]",
    );
}

#[test]
fn a_bare_host_names_its_only_worker() {
    let spec = validate(
        &parse(
            json!({"model_name": "smollm2-instruct", "replica_config": [{"devices": device("10.0.0.2")}]}),
        ),
        false,
        &engines(),
    )
    .expect("valid");
    let (placed, _) =
        place(&spec, "m", &view(vec![worker("10.0.0.1:5", &[]), worker("10.0.0.2:5", &[])])).expect("placed");
    assert_eq!(placed[0].worker_id, "10.0.0.2:5");
}

#[test]
fn gpu_idx_must_be_visible() {
    let dev = json!([{"worker_ip": "w:1", "gpu_idx": [3]}]);
    let e = place_err(
        json!({"model_name": "smollm2-instruct", "replica_config": [{"devices": dev}]}),
        &view(vec![worker("w:1", &[0, 1])]),
    );
    assert_rule(&e, LaunchRule::GpuNotVisible, "gpu_idx 3 is not visible on worker w:1");
}

#[test]
fn n_gpu_takes_free_gpus_or_is_refused() {
    let mut w = worker("w:1", &[0, 1, 2]);
    w.occupied.insert(0, vec![tenant("other", "other-0", None)]);
    let spec = validate(
        &parse(json!({"model_name": "smollm2-instruct", "n_gpu": 1, "replica": 2})),
        false,
        &engines(),
    )
    .expect("valid");
    let (placed, _) = place(&spec, "m", &view(vec![w.clone()])).expect("placed");
    assert_eq!(placed[0].gpus, vec![1]);
    assert_eq!(placed[1].gpus, vec![2]);
    let spec = validate(&parse(json!({"model_name": "smollm2-instruct", "n_gpu": 3})), false, &engines())
        .expect("valid");
    let e = place(&spec, "m", &view(vec![w])).expect_err("not enough");
    assert_rule(&e, LaunchRule::NotEnoughGpus, "worker w:1 has 2 free GPUs, and n_gpu asks for 3");
}

#[test]
fn auto_uses_a_free_gpu_or_the_cpu() {
    let spec = validate(&parse(json!({"model_name": "smollm2-instruct", "replica": 3})), false, &engines())
        .expect("valid");
    let (placed, _) = place(&spec, "m", &view(vec![worker("w:1", &[0, 1])])).expect("placed");
    let gpus: Vec<Vec<u32>> = placed.iter().map(|p| p.gpus.clone()).collect();
    assert_eq!(gpus, vec![vec![0], vec![1], vec![]]);
}

#[test]
fn an_engine_that_needs_a_gpu_is_never_placed_on_the_cpu() {
    let engines = xinf_engine::Engines::new(vec![
        std::sync::Arc::new(xinf_engine_mock::MockLoader::named("native")),
        std::sync::Arc::new(xinf_engine_mock::MockLoader::named("vllm").gpu_only()),
    ]);
    let req = json!({"model_name": "m", "model_path": "/m", "model_engine": "vLLM", "replica": 2});
    let spec = validate(&parse(req), false, &engines).expect("valid");
    let (placed, _) = place(&spec, "m", &view(vec![worker("w:1", &[0, 1])])).expect("two GPUs");
    assert_eq!(placed.iter().map(|p| p.gpus.clone()).collect::<Vec<_>>(), vec![vec![0], vec![1]]);
    let e = place(&spec, "m", &view(vec![worker("w:1", &[0])])).expect_err("one GPU for two");
    assert_rule(
        &e,
        LaunchRule::NotEnoughGpus,
        "replica 'm-1' runs model_engine vllm, which computes on a GPU",
    );
}

#[test]
fn no_workers_no_placement() {
    let e = place_err(json!({"model_name": "smollm2-instruct"}), &view(vec![]));
    assert_rule(&e, LaunchRule::NoWorkers, "no worker is registered");
    assert_eq!(e.class(), xinf_engine::ErrorClass::Unavailable);
}

#[test]
fn placement_round_robins_over_workers() {
    let spec = validate(&parse(json!({"model_name": "smollm2-instruct", "replica": 3})), false, &engines())
        .expect("valid");
    let mut v = view(vec![worker("a:1", &[]), worker("b:1", &[])]);
    v.round_robin = 1;
    let (placed, next) = place(&spec, "m", &v).expect("placed");
    let on: Vec<&str> = placed.iter().map(|p| p.worker_id.as_str()).collect();
    assert_eq!(on, ["b:1", "a:1", "b:1"]);
    assert_eq!(next, 2, "after b:1");
    let uids: Vec<&str> = placed.iter().map(|p| p.replica_uid.as_str()).collect();
    assert_eq!(uids, ["m-0", "m-1", "m-2"]);
}

#[test]
fn placement_spreads_by_load_and_skips_draining_and_full_workers() {
    let on = |v: Value, view: &ClusterView| -> Vec<String> {
        placed(v, view).into_iter().map(|p| p.worker_id).collect()
    };
    // b:1 holds two replicas already: the new ones go to a:1 and c:1 until they hold two each.
    let loaded = WorkerSlot { replicas: 2, ..worker("b:1", &[]) };
    let v = view(vec![worker("a:1", &[]), loaded, worker("c:1", &[])]);
    assert_eq!(on(json!({"model_name": "smollm2-instruct", "replica": 4}), &v), ["a:1", "c:1", "a:1", "c:1"]);
    // A draining worker gets nothing, even when it is the least loaded.
    let draining = WorkerSlot { draining: true, ..worker("a:1", &[]) };
    let v = view(vec![draining, WorkerSlot { replicas: 5, ..worker("b:1", &[]) }]);
    assert_eq!(on(json!({"model_name": "smollm2-instruct", "replica": 2}), &v), ["b:1", "b:1"]);
    // A worker whose GPUs cannot take a replica that needs one is passed over.
    let mut v = view(vec![worker("a:1", &[0]), worker("b:1", &[0])]);
    v.workers[0].occupied.insert(0, vec![tenant("other", "o-0", None)]);
    assert_eq!(on(json!({"model_name": "smollm2-instruct", "n_gpu": 1}), &v), ["b:1"]);
    // With no worker left to take one, the best worker's refusal is the answer.
    v.workers[1].occupied.insert(0, vec![tenant("third", "t-0", None)]);
    let e = place_err(json!({"model_name": "smollm2-instruct", "n_gpu": 1}), &v);
    assert_rule(&e, LaunchRule::NotEnoughGpus, "worker a:1 has 0 free GPUs");
}

#[test]
fn a_launch_on_a_draining_worker_is_refused_as_try_later() {
    let draining = WorkerSlot { draining: true, ..worker("10.0.0.1:5", &[]) };
    let v = view(vec![draining.clone(), worker("10.0.0.2:5", &[])]);
    let e = place_err(
        json!({"model_name": "smollm2-instruct", "replica_config": [{"devices": device("10.0.0.1:5")}]}),
        &v,
    );
    assert_rule(
        &e,
        LaunchRule::WorkerDraining,
        "replica_config[0].worker_ip '10.0.0.1:5' is stopping (draining) and takes no new replicas",
    );
    assert_eq!(
        (e.launch_field(), e.class()),
        (Some("replica_config[0].worker_ip"), crate::ErrorClass::Unavailable)
    );
    let e = place_err(json!({"model_name": "smollm2-instruct"}), &view(vec![draining]));
    assert_rule(&e, LaunchRule::NoWorkers, "every registered worker is stopping (draining): [10.0.0.1:5]");
    assert_eq!(e.class(), crate::ErrorClass::Unavailable);
}

// ---- placement → device ----

#[test]
fn a_replica_placed_on_a_gpu_computes_on_it() {
    let w = || view(vec![worker("w:1", &[0, 1, 2])]);
    // auto: one free GPU each, then the CPU once they are taken.
    let p =
        placed(json!({"model_name": "smollm2-instruct", "replica": 4}), &view(vec![worker("w:1", &[0, 1])]));
    let devices: Vec<Option<String>> = p.iter().map(device_of).collect();
    assert_eq!(devices, [Some("cuda:0".into()), Some("cuda:1".into()), None, None]);
    // gpu_idx, and the other options are kept.
    let p = placed(json!({"model_name": "smollm2-instruct", "gpu_idx": 2, "kv_cache_tokens": 1024}), &w());
    let config: Value = json_of(&p[0].engine_config);
    assert_eq!(config, json!({"device": "cuda:2", "kv_cache_tokens": 1024}));
    // n_gpu: the first of its GPUs (no tensor parallelism).
    let p = placed(json!({"model_name": "smollm2-instruct", "n_gpu": 2}), &w());
    assert_eq!((p[0].gpus.clone(), device_of(&p[0])), (vec![0, 1], Some("cuda:0".into())));
    // replica_config devices.
    let p = placed(
        json!({"model_name": "smollm2-instruct", "replica_config": [
            {"devices": [{"worker_ip": "w:1", "gpu_idx": [1]}]},
            {"devices": [{"worker_ip": "w:1", "n_gpu": 0}]},
        ]}),
        &w(),
    );
    assert_eq!(p.iter().map(device_of).collect::<Vec<_>>(), [Some("cuda:1".into()), None]);
    // A worker without GPUs: the CPU, as before.
    let p = placed(json!({"model_name": "smollm2-instruct"}), &view(vec![worker("w:1", &[])]));
    assert_eq!((p[0].gpus.clone(), device_of(&p[0])), (vec![], None));
}

#[test]
fn an_explicit_device_wins() {
    let w = || view(vec![worker("w:1", &[0, 1])]);
    // With auto placement, it also says which GPU the replica occupies.
    let p = placed(json!({"model_name": "smollm2-instruct", "device": "cuda:1"}), &w());
    assert_eq!((p[0].gpus.clone(), device_of(&p[0])), (vec![1], Some("cuda:1".into())));
    let p = placed(json!({"model_name": "smollm2-instruct", "device": "cpu"}), &w());
    assert_eq!((p[0].gpus.clone(), device_of(&p[0])), (vec![], Some("cpu".into())));
    // With explicit placement it is left as it is.
    let p = placed(json!({"model_name": "smollm2-instruct", "gpu_idx": 0, "device": "cuda:1"}), &w());
    assert_eq!((p[0].gpus.clone(), device_of(&p[0])), (vec![0], Some("cuda:1".into())));
    // A GPU the worker does not have is refused, naming the option.
    let e = place_err(json!({"model_name": "smollm2-instruct", "device": "cuda:7"}), &w());
    assert_rule(
        &e,
        LaunchRule::GpuNotVisible,
        "engine_config.device cuda:7 of replica 'm-0': GPU 7 is not visible on worker w:1. Visible GPUs: [0, 1]",
    );
    let e = place_err(
        json!({"model_name": "smollm2-instruct", "device": "cuda"}),
        &view(vec![worker("w:1", &[])]),
    );
    assert_rule(&e, LaunchRule::GpuNotVisible, "engine_config.device cuda:0");
}

#[test]
fn with_device_only_fills_in_a_missing_device() {
    let config = |v: Value| {
        engines().get("native").expect("registered").check_config(v.as_object().expect("map")).expect("valid")
    };
    assert_eq!(json_of(&with_device(&config(json!({})), &[3, 4])), json!({"device": "cuda:3"}));
    let some = config(json!({"kv_cache_tokens": 1024}));
    assert_eq!(json_of(&with_device(&some, &[])), json!({"kv_cache_tokens": 1024}));
    let explicit = config(json!({"device": "cpu"}));
    assert_eq!(with_device(&explicit, &[0]), explicit);
}
