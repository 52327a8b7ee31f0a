//! One test per validation message, on pure functions (no actors).

use super::*;
use serde_json::json;

/// The launch rules are engine-neutral: the mock engine stands in under the default engine's
/// name, so the messages read as users see them.
fn engines() -> Engines {
    crate::testing::engines()
}

/// A replica's options as the JSON a launch would give.
fn json_of(config: &EngineConfig) -> Value {
    config.to_json()
}

fn parse(v: Value) -> LaunchRequest {
    serde_json::from_value(v).expect("a well-formed launch request")
}

fn validate_err(v: Value, local: bool) -> ActorError {
    validate(&parse(v), local, &engines()).expect_err("the request must be refused")
}

fn assert_rule(e: &ActorError, rule: LaunchRule, text: &str) {
    assert_eq!(e.launch_rule(), Some(rule), "{e}");
    assert!(e.to_string().contains(text), "`{e}` should contain `{text}`");
}

fn device(worker: &str) -> Value {
    json!([{"worker_ip": worker, "n_gpu": "auto"}])
}

fn worker(id: &str, gpus: &[u32]) -> WorkerSlot {
    WorkerSlot {
        worker_id: id.into(),
        gpus: gpus.to_vec(),
        allow_gpu_sharing: false,
        occupied: BTreeMap::new(),
    }
}

fn tenant(model: &str, replica: &str, fraction: Option<f64>) -> GpuTenant {
    GpuTenant { model_uid: model.into(), replica_uid: replica.into(), fraction }
}

fn view(workers: Vec<WorkerSlot>) -> ClusterView {
    ClusterView { local_mode: false, workers, replica_uids: BTreeMap::new(), round_robin: 0 }
}

fn place_err(v: Value, view: &ClusterView) -> ActorError {
    let spec = validate(&parse(v), view.local_mode, &engines()).expect("valid on its own");
    place(&spec, "m", view).expect_err("placement must be refused")
}

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

#[test]
fn a_plain_request_is_valid() {
    let spec = validate(
        &parse(json!({"model_name": "smollm2-instruct", "replica": 2, "kv_cache_tokens": 1024})),
        true,
        &engines(),
    )
    .expect("valid");
    assert_eq!(spec.replicas.len(), 2);
    assert!(!spec.pd);
    let config: Value = json_of(&spec.replicas[0].engine_config);
    assert_eq!(config, json!({"kv_cache_tokens": 1024}));
}

#[test]
fn replica_must_be_positive() {
    let e = validate_err(json!({"model_name": "smollm2-instruct", "replica": 0}), true);
    assert_rule(&e, LaunchRule::InvalidField, "replica must be an integer ≥ 1");
}

#[test]
fn empty_uid_and_name_are_refused() {
    let e = validate_err(json!({"model_name": "smollm2-instruct", "model_uid": "  "}), true);
    assert_rule(&e, LaunchRule::InvalidField, "model_uid must not be empty or whitespace-only");
    let e = validate_err(json!({"model_name": ""}), true);
    assert_rule(&e, LaunchRule::InvalidField, "model_name must not be empty");
}

// ---- structure ----

#[test]
fn replica_config_length_must_equal_replica() {
    let e = validate_err(
        json!({"model_name": "smollm2-instruct", "replica": 3, "replica_config": [{}, {}]}),
        true,
    );
    assert_rule(&e, LaunchRule::ReplicaCountMismatch, "replica_config length (2) must equal replica (3).");
}

#[test]
fn replica_count_is_inferred_from_replica_config() {
    let spec = validate(
        &parse(json!({"model_name": "smollm2-instruct", "replica_config": [{}, {}, {}]})),
        true,
        &engines(),
    )
    .expect("valid");
    assert_eq!(spec.replicas.len(), 3);
}

#[test]
fn replica_config_must_not_be_empty() {
    let e = validate_err(json!({"model_name": "smollm2-instruct", "replica_config": []}), true);
    assert_rule(&e, LaunchRule::InvalidField, "replica_config must be a non-empty array");
}

#[test]
fn each_entry_needs_exactly_one_device() {
    let two = json!([{"worker_ip": "a:1"}, {"worker_ip": "b:1"}]);
    let e =
        validate_err(json!({"model_name": "smollm2-instruct", "replica_config": [{"devices": two}]}), true);
    assert_rule(&e, LaunchRule::DeviceCount, "Each replica_config entry must have exactly one device");
    assert!(e.to_string().contains("Cross-worker sharding per replica is not supported yet."));
    let e =
        validate_err(json!({"model_name": "smollm2-instruct", "replica_config": [{"devices": []}]}), true);
    assert_rule(&e, LaunchRule::DeviceCount, "(replica_config[0] has 0)");
    // Cluster mode needs devices; local mode may leave them out.
    let e = validate_err(json!({"model_name": "smollm2-instruct", "replica_config": [{}]}), false);
    assert_rule(&e, LaunchRule::DeviceCount, "exactly one device");
    assert!(
        validate(&parse(json!({"model_name": "smollm2-instruct", "replica_config": [{}]})), true, &engines())
            .is_ok()
    );
}

#[test]
fn n_gpu_must_match_gpu_idx() {
    let dev = json!([{"worker_ip": "a:1", "n_gpu": 2, "gpu_idx": [0]}]);
    let e =
        validate_err(json!({"model_name": "smollm2-instruct", "replica_config": [{"devices": dev}]}), false);
    assert_rule(&e, LaunchRule::GpuCountMismatch, "n_gpu (2) must equal len(gpu_idx) (1), or be 'auto'");
    let e = validate_err(json!({"model_name": "smollm2-instruct", "n_gpu": 1, "gpu_idx": [0, 1]}), false);
    assert_rule(&e, LaunchRule::GpuCountMismatch, "n_gpu (1) must equal len(gpu_idx) (2), or be 'auto'");
    let dev = json!([{"worker_ip": "a:1", "n_gpu": "auto", "gpu_idx": [0, 1]}]);
    assert!(
        validate(
            &parse(json!({"model_name": "smollm2-instruct", "replica_config": [{"devices": dev}]})),
            false,
            &engines()
        )
        .is_ok()
    );
}

#[test]
fn gpu_idx_must_not_repeat() {
    let dev = json!([{"worker_ip": "a:1", "gpu_idx": [1, 1]}]);
    let e =
        validate_err(json!({"model_name": "smollm2-instruct", "replica_config": [{"devices": dev}]}), false);
    assert_rule(&e, LaunchRule::DuplicateGpuIdx, "gpu_idx must not contain duplicate indexes");
    let e = validate_err(json!({"model_name": "smollm2-instruct", "gpu_idx": [0, 0]}), false);
    assert_rule(&e, LaunchRule::DuplicateGpuIdx, "gpu_idx must not contain duplicate indexes");
}

#[test]
fn replica_uid_must_not_be_blank() {
    let e = validate_err(
        json!({"model_name": "smollm2-instruct", "replica_config": [{"replica_uid": " \t"}]}),
        true,
    );
    assert_rule(&e, LaunchRule::EmptyReplicaUid, "must not be empty or whitespace-only");
}

#[test]
fn reserved_replica_uids_are_refused() {
    for uid in ["m-rep0", "m-rep12", "m-rank0"] {
        let e = validate_err(
            json!({"model_name": "smollm2-instruct", "replica_config": [{"replica_uid": uid}]}),
            true,
        );
        assert_rule(
            &e,
            LaunchRule::ReservedReplicaUid,
            &format!("replica_uid '{uid}' collides with a reserved internal replica/rank identifier"),
        );
    }
    for uid in ["m-rep", "m-repx", "representative", "m-rank1"] {
        assert!(!is_reserved_replica_uid(uid), "{uid}");
    }
}

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
}

#[test]
fn unknown_worker_ip_only_warns_in_local_mode() {
    let mut v = view(vec![worker("local", &[])]);
    v.local_mode = true;
    let spec = validate(
        &parse(
            json!({"model_name": "smollm2-instruct", "replica_config": [{"devices": device("10.0.0.9:7")}]}),
        ),
        true,
        &engines(),
    )
    .expect("valid");
    let (placed, _) = place(&spec, "m", &v).expect("placed");
    assert_eq!(placed[0].worker_id, "local");
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
    assert_eq!(next, 4);
    let uids: Vec<&str> = placed.iter().map(|p| p.replica_uid.as_str()).collect();
    assert_eq!(uids, ["m-0", "m-1", "m-2"]);
}

// ---- global conflicts ----

#[test]
fn legacy_placement_conflicts_with_replica_config() {
    for extra in [json!({"worker_ip": "a:1"}), json!({"n_gpu": 1}), json!({"gpu_idx": [0]})] {
        let mut req = json!({"model_name": "smollm2-instruct", "replica_config": [{}]});
        for (k, v) in extra.as_object().expect("object") {
            req[k] = v.clone();
        }
        let e = validate_err(req, true);
        assert_rule(
            &e,
            LaunchRule::LegacyPlacementConflict,
            "Cannot specify worker_ip / n_gpu / gpu_idx together with replica_config.",
        );
    }
    // n_gpu "auto" is the clients' default and does not conflict.
    assert!(
        validate(
            &parse(json!({"model_name": "smollm2-instruct", "n_gpu": "auto", "replica_config": [{}]})),
            true,
            &engines()
        )
        .is_ok()
    );
}

#[test]
fn replica_config_is_incompatible_with_sharding() {
    let e =
        validate_err(json!({"model_name": "smollm2-instruct", "n_worker": 2, "replica_config": [{}]}), true);
    assert_rule(
        &e,
        LaunchRule::ShardedLaunch,
        "replica_config is incompatible with n_worker>1 (sharded launch).",
    );
    let e = validate_err(json!({"model_name": "smollm2-instruct", "n_worker": 2}), true);
    assert_rule(&e, LaunchRule::ShardedLaunch, "sharded launch");
}

// ---- topology ----

#[test]
fn reserved_engine_config_keys_are_refused() {
    let e = validate_err(
        json!({"model_name": "smollm2-instruct", "replica_config": [
            {"role": "prefill", "engine_config": {"model_path": "/x", "_secret": 1, "virtual_env_packages": [], "kv_cache_tokens": 64}},
            {"role": "decode"}
        ]}),
        true,
    );
    assert_rule(
        &e,
        LaunchRule::ReservedEngineConfigKey,
        "Reserved replica engine_config keys: _secret, model_path, virtual_env_packages",
    );
}

#[test]
fn per_replica_engine_settings_need_pd_roles() {
    let e = validate_err(
        json!({"model_name": "smollm2-instruct", "replica_config": [{"engine_config": {"kv_cache_tokens": 64}}]}),
        true,
    );
    assert_rule(
        &e,
        LaunchRule::PerReplicaEngineSettings,
        "Per-replica engine settings require explicit PD roles",
    );
    let e = validate_err(
        json!({"model_name": "smollm2-instruct", "replica_config": [{"model_engine": "native"}]}),
        true,
    );
    assert_rule(
        &e,
        LaunchRule::PerReplicaEngineSettings,
        "Per-replica engine settings require explicit PD roles",
    );
}

#[test]
fn pd_needs_llm_and_the_native_engine() {
    let pd = json!([{"role": "prefill"}, {"role": "decode"}]);
    let e = validate_err(
        json!({"model_name": "smollm2-instruct", "model_engine": "vLLM", "replica_config": pd}),
        true,
    );
    assert_rule(&e, LaunchRule::PdEngine, "PD separation requires model_type=LLM and model_engine=native");
    let e = validate_err(
        json!({"model_name": "smollm2-instruct", "model_type": "embedding", "replica_config": pd}),
        true,
    );
    assert_rule(&e, LaunchRule::PdEngine, "PD separation requires model_type=LLM and model_engine=native");
    // A cross-engine (or MLX) mix maps to "native only for now".
    let e = validate_err(
        json!({"model_name": "smollm2-instruct", "replica_config": [{"role": "prefill", "model_engine": "MLX"}, {"role": "decode"}]}),
        true,
    );
    assert_rule(&e, LaunchRule::EngineNotAvailable, "model_engine must be native for now");
}

#[test]
fn pd_needs_both_roles_and_no_hybrid() {
    for roles in [
        json!([{"role": "prefill"}]),
        json!([{"role": "decode"}, {"role": "decode"}]),
        json!([{"role": "prefill"}, {"role": "decode"}, {"role": "hybrid"}]),
    ] {
        let e = validate_err(json!({"model_name": "smollm2-instruct", "replica_config": roles}), true);
        assert_rule(
            &e,
            LaunchRule::PdTopology,
            "PD separation requires both prefill and decode replicas, without hybrid replicas",
        );
    }
}

#[test]
fn a_pd_request_is_valid_with_per_replica_settings() {
    let spec = validate(
        &parse(json!({"model_name": "smollm2-instruct", "kv_cache_tokens": 1024, "replica_config": [
            {"role": "prefill", "engine_config": {"kv_layout": "token-pool"}},
            {"role": "decode", "model_engine": "native"}
        ]})),
        true,
        &engines(),
    )
    .expect("valid");
    assert!(spec.pd);
    let first: Value = json_of(&spec.replicas[0].engine_config);
    assert_eq!(first, json!({"kv_cache_tokens": 1024, "kv_layout": "token-pool"}));
    let second: Value = json_of(&spec.replicas[1].engine_config);
    assert_eq!(second, json!({"kv_cache_tokens": 1024}));
}

#[test]
fn other_engines_and_model_types_are_not_available() {
    let e = validate_err(json!({"model_name": "smollm2-instruct", "model_engine": "sglang"}), true);
    assert_rule(
        &e,
        LaunchRule::EngineNotAvailable,
        "model_engine 'sglang' is not available yet; model_engine must be native for now",
    );
    let e = validate_err(json!({"model_name": "smollm2-instruct", "model_type": "image"}), true);
    assert_rule(&e, LaunchRule::ModelTypeNotSupported, "model_type 'image' is not supported");
    assert!(
        validate(
            &parse(json!({"model_name": "smollm2-instruct", "model_engine": "Native", "model_type": "LLM"})),
            true,
            &engines()
        )
        .is_ok()
    );
}

// ---- transport and budgets ----

#[test]
fn unknown_transfer_backends_are_refused() {
    let e = validate_err(json!({"model_name": "smollm2-instruct", "transfer_backend_type": "gloo"}), true);
    assert_rule(
        &e,
        LaunchRule::UnknownTransferBackend,
        "Unknown transfer backend: 'gloo'; use xavier or nixl",
    );
    let e = validate_err(json!({"model_name": "smollm2-instruct", "vllm_transfer_backend_type": 3}), true);
    assert_rule(&e, LaunchRule::UnknownTransferBackend, "Unknown transfer backend: '3'");
}

#[test]
fn nixl_needs_pd_roles() {
    let e = validate_err(json!({"model_name": "smollm2-instruct", "transfer_backend_type": "nixl"}), true);
    assert_rule(&e, LaunchRule::NixlRoles, "NIXL requires explicit prefill and decode replica roles");
    let spec = validate(
        &parse(json!({"model_name": "smollm2-instruct", "transfer_backend_type": "NIXL",
            "replica_config": [{"role": "prefill"}, {"role": "decode"}]})),
        true,
        &engines(),
    )
    .expect("valid");
    assert_eq!(spec.transfer, Some(TransferBackend::Nixl));
}

#[test]
fn xavier_gpu_cache_bytes_must_be_a_non_negative_integer() {
    for bad in [json!(true), json!(-1), json!(1.5), json!("256")] {
        let e = validate_err(json!({"model_name": "smollm2-instruct", "xavier_gpu_cache_bytes": bad}), true);
        assert_rule(&e, LaunchRule::CacheBudget, "xavier_gpu_cache_bytes must be a non-negative integer");
    }
}

#[test]
fn xavier_gpu_cache_bytes_needs_xavier_with_several_replicas() {
    let e = validate_err(json!({"model_name": "smollm2-instruct", "xavier_gpu_cache_bytes": 1024}), true);
    assert_rule(&e, LaunchRule::CacheBudget, "xavier_gpu_cache_bytes requires Xavier with multiple replicas");
    let e = validate_err(
        json!({"model_name": "smollm2-instruct", "enable_xavier": true, "xavier_gpu_cache_bytes": 1024}),
        true,
    );
    assert_rule(&e, LaunchRule::CacheBudget, "requires Xavier with multiple replicas");
    // 0 turns history off and is always allowed; Xavier with two replicas may have a budget.
    assert!(
        validate(
            &parse(json!({"model_name": "smollm2-instruct", "xavier_gpu_cache_bytes": 0})),
            true,
            &engines()
        )
        .is_ok()
    );
    assert!(
        validate(&parse(json!({"model_name": "smollm2-instruct", "enable_xavier": true, "replica": 2, "xavier_gpu_cache_bytes": 1024})),
            true, &engines())
        .is_ok()
    );
}

#[test]
fn xavier_cache_bytes_sizes_the_prefill_snapshot_cache() {
    let e = validate_err(json!({"model_name": "smollm2-instruct", "xavier_cache_bytes": 1024}), true);
    assert_rule(&e, LaunchRule::CacheBudget, "xavier_cache_bytes requires prefill and decode replica roles");
    let pd = |v: Value| {
        json!({"model_name": "smollm2-instruct", "xavier_cache_bytes": v,
               "replica_config": [{"role": "prefill"}, {"role": "decode"}]})
    };
    for bad in [json!(0), json!(-1), json!("1024"), json!(1.5)] {
        let e = validate_err(pd(bad.clone()), true);
        assert_rule(&e, LaunchRule::CacheBudget, "xavier_cache_bytes must be a positive integer");
    }
    let spec = validate(&parse(pd(json!(1 << 20))), true, &engines()).expect("valid");
    assert_eq!(spec.snapshot_cache_bytes, Some(1 << 20));
    assert_eq!(spec.handoff().snapshot_cache_bytes, Some(1 << 20));
}

// ---- engine options and the model ----

#[test]
fn engine_options_are_checked_before_launch() {
    let e = validate_err(json!({"model_name": "smollm2-instruct", "kv_cache_tokens": 1}), true);
    assert_rule(&e, LaunchRule::EngineConfig, "engine_config.kv_cache_tokens");
    let e = validate_err(json!({"model_name": "smollm2-instruct", "colour": "red"}), true);
    assert_rule(&e, LaunchRule::EngineConfig, "engine_config.colour");
    let e = validate_err(
        json!({"model_name": "smollm2-instruct", "max_num_seqs": 2, "engine_config": {"max_num_seqs": 4}}),
        true,
    );
    assert_rule(&e, LaunchRule::EngineConfig, "given both at the top level and in engine_config");
    let e = validate_err(json!({"model_name": "smollm2-instruct", "request_limits": 4}), true);
    assert_rule(&e, LaunchRule::InvalidField, "`request_limits` is not a supported launch key");
}

#[test]
fn unknown_models_are_refused_unless_a_path_is_given() {
    let e = validate_err(json!({"model_name": "no-such-model"}), true);
    assert_rule(&e, LaunchRule::UnknownModel, "unknown model `no-such-model`; known models:");
    assert!(
        validate(&parse(json!({"model_name": "mine", "model_path": "/models/mine.gguf"})), true, &engines())
            .is_ok()
    );
}

#[test]
fn every_rule_has_a_distinct_code() {
    let rules = [
        LaunchRule::InvalidField,
        LaunchRule::ReplicaCountMismatch,
        LaunchRule::DeviceCount,
        LaunchRule::GpuCountMismatch,
        LaunchRule::DuplicateGpuIdx,
        LaunchRule::EmptyReplicaUid,
        LaunchRule::ReservedReplicaUid,
        LaunchRule::DuplicateReplicaUid,
        LaunchRule::UnknownWorker,
        LaunchRule::GpuNotVisible,
        LaunchRule::GpuConflict,
        LaunchRule::NotEnoughGpus,
        LaunchRule::NoWorkers,
        LaunchRule::LegacyPlacementConflict,
        LaunchRule::ShardedLaunch,
        LaunchRule::ReservedEngineConfigKey,
        LaunchRule::PerReplicaEngineSettings,
        LaunchRule::PdEngine,
        LaunchRule::PdTopology,
        LaunchRule::EngineNotAvailable,
        LaunchRule::ModelTypeNotSupported,
        LaunchRule::UnknownTransferBackend,
        LaunchRule::NixlRoles,
        LaunchRule::CacheBudget,
        LaunchRule::EngineConfig,
        LaunchRule::UnknownModel,
        LaunchRule::ContractMismatch,
        LaunchRule::GpuMemoryUtilizationRequired,
        LaunchRule::GpuMemoryOversubscribed,
    ];
    let codes: BTreeSet<&str> = rules.iter().map(|r| r.code()).collect();
    assert_eq!(codes.len(), rules.len());
}

// ---- placement → device, GPU memory shares ----

fn placed(v: Value, view: &ClusterView) -> Vec<Placement> {
    let spec = validate(&parse(v), view.local_mode, &engines()).expect("valid on its own");
    place(&spec, "m", view).expect("placed").0
}

fn device_of(p: &Placement) -> Option<String> {
    let config: Value = json_of(&p.engine_config);
    config.get("device").and_then(Value::as_str).map(str::to_owned)
}

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
fn a_gpu_conflict_says_how_to_share() {
    let dev = json!([{"worker_ip": "w:1", "gpu_idx": [0]}]);
    let e = place_err(
        json!({"model_name": "smollm2-instruct", "replica_config": [{"devices": dev}, {"devices": dev}]}),
        &view(vec![worker("w:1", &[0])]),
    );
    assert_rule(&e, LaunchRule::GpuConflict, "when each sets engine_config.gpu_memory_utilization");
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
