//! One test per validation message of a request on its own.

use super::*;
use crate::launch::tests::*;
use serde_json::json;

// ---- names and counts ----

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
fn replica_is_at_most_a_launchs_limit() {
    let e = validate_err(json!({"model_name": "smollm2-instruct", "replica": 4_294_967_295u32}), true);
    assert_rule(&e, LaunchRule::InvalidField, "replica must be at most 64, got 4294967295");
    assert!(
        validate(&parse(json!({"model_name": "smollm2-instruct", "replica": 64})), true, &engines()).is_ok()
    );
    let many: Vec<Value> = (0..65).map(|_| json!({})).collect();
    let e = validate_err(json!({"model_name": "smollm2-instruct", "replica_config": many}), true);
    assert_rule(&e, LaunchRule::InvalidField, "replica_config must have at most 64 entries, got 65");
}

#[test]
fn uids_too_long_or_with_control_characters_are_refused() {
    let long = "a".repeat(257);
    let e = validate_err(json!({"model_name": "smollm2-instruct", "model_uid": long}), true);
    assert_rule(&e, LaunchRule::InvalidField, "model_uid must be at most 256 bytes, got 257");
    assert!(
        validate(
            &parse(json!({"model_name": "smollm2-instruct", "model_uid": "a".repeat(256)})),
            true,
            &engines()
        )
        .is_ok()
    );
    let e = validate_err(json!({"model_name": "smollm2-instruct", "model_uid": "\u{202e}\u{0}x"}), true);
    assert_rule(
        &e,
        LaunchRule::InvalidField,
        "model_uid '\\u{202e}\\0x' must not contain '/', whitespace or control characters",
    );
    let e = validate_err(
        json!({"model_name": "smollm2-instruct", "replica_config": [{"role": "prefill", "replica_uid": "p\u{7}"}, {"role": "decode"}]}),
        true,
    );
    assert_rule(
        &e,
        LaunchRule::InvalidField,
        "replica_uid 'p\\u{7}' must not contain '/', whitespace or control characters",
    );
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
fn pd_replicas_of_an_engine_without_pd_are_refused() {
    let engines = xinf_engine::Engines::new(vec![
        std::sync::Arc::new(xinf_engine_mock::MockLoader::named("native")),
        std::sync::Arc::new(xinf_engine_mock::MockLoader::named("vllm").ordinary_only()),
    ]);
    let req = json!({"model_name": "m", "model_path": "/m", "replica_config": [
        {"role": "prefill", "model_engine": "vLLM", "devices": device("w:1")},
        {"role": "decode", "devices": device("w:1")}]});
    let e = validate(&parse(req), false, &engines).expect_err("vllm serves no P/D here");
    assert_rule(&e, LaunchRule::PdEngine, "PD separation requires model_type=LLM and model_engine=native");
    let ordinary = json!({"model_name": "m", "model_path": "/m", "model_engine": "vllm", "replica": 2});
    validate(&parse(ordinary), false, &engines).expect("ordinary replicas of it are fine");
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
}

#[test]
fn request_limits_is_a_positive_count_kept_for_the_model() {
    let spec =
        validate(&parse(json!({"model_name": "smollm2-instruct", "request_limits": 4})), true, &engines())
            .expect("valid");
    assert_eq!(spec.front.request_limit, Some(4));
    assert_eq!(json_of(&spec.replicas[0].engine_config), json!({}));
    for bad in [json!(0), json!(-2), json!("4"), json!(2.5), json!(1u64 << 33)] {
        let e = validate_err(json!({"model_name": "smollm2-instruct", "request_limits": bad}), true);
        assert_rule(&e, LaunchRule::InvalidField, "request_limits must be a positive integer");
    }
}

#[test]
fn null_xinference_keys_are_dropped_and_set_ones_refused() {
    // What Xinference's client sends for every launch.
    let spec = validate(
        &parse(json!({
            "model_name": "smollm2-instruct", "peft_model_config": null, "request_limits": null,
            "enable_thinking": null, "enable_virtual_env": null, "virtual_env_packages": null,
            "virtual_env_find_links": null, "envs": null,
        })),
        true,
        &engines(),
    )
    .expect("valid");
    assert_eq!(json_of(&spec.replicas[0].engine_config), json!({}));
    let e = validate_err(json!({"model_name": "smollm2-instruct", "envs": {"A": "1"}}), true);
    assert_rule(&e, LaunchRule::InvalidField, "`envs` is not a supported launch key");
    assert_eq!(
        spec.front.chat,
        crate::ChatDefaults { model_name: "smollm2-instruct".into(), ..Default::default() }
    );
}

#[test]
fn chat_keys_are_booleans_kept_for_the_model() {
    let spec = validate(
        &parse(
            json!({"model_name": "smollm2-instruct", "reasoning_content": true, "enable_thinking": false}),
        ),
        true,
        &engines(),
    )
    .expect("valid");
    let want = crate::ChatDefaults {
        model_name: "smollm2-instruct".into(),
        reasoning_content: true,
        enable_thinking: Some(false),
    };
    assert_eq!(spec.front.chat, want);
    // Neither reaches the engine's options.
    assert_eq!(json_of(&spec.replicas[0].engine_config), json!({}));
    for key in ["reasoning_content", "enable_thinking"] {
        let e = validate_err(json!({"model_name": "smollm2-instruct", key: "yes"}), true);
        assert_rule(&e, LaunchRule::InvalidField, &format!("{key} must be a boolean"));
    }
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

// ---- the field each refusal blames (the API's `param`) ----

#[test]
fn refusals_name_their_field() {
    let cases = [
        (json!({"model_name": "smollm2-instruct", "replica": 0}), "replica"),
        (json!({"model_name": "smollm2-instruct", "model_uid": "a b"}), "model_uid"),
        (json!({"model_name": ""}), "model_name"),
        (
            json!({"model_name": "smollm2-instruct", "replica": 3, "replica_config": [{}, {}]}),
            "replica_config",
        ),
        (
            json!({"model_name": "smollm2-instruct", "replica_config": [{}, {"replica_uid": " "}]}),
            "replica_config[1].replica_uid",
        ),
        (json!({"model_name": "smollm2-instruct", "kv_cache_tokens": 1}), "engine_config.kv_cache_tokens"),
        (json!({"model_name": "smollm2-instruct", "colour": "red"}), "engine_config.colour"),
        (json!({"model_name": "smollm2-instruct", "request_limits": 0}), "request_limits"),
        (json!({"model_name": "smollm2-instruct", "n_worker": 0}), "n_worker"),
        (json!({"model_name": "smollm2-instruct", "n_worker": 2}), "n_worker"),
        (json!({"model_name": "smollm2-instruct", "gpu_idx": [0, 0]}), "gpu_idx"),
        (
            json!({"model_name": "smollm2-instruct", "transfer_backend_type": "carrier-pigeon"}),
            "transfer_backend_type",
        ),
        (json!({"model_name": "smollm2-instruct", "enable_xavier": "yes"}), "enable_xavier"),
        (json!({"model_name": "no-such-model"}), "model_name"),
        // An option a replica set itself is named as that replica's; one it inherited, as the
        // launch's.
        (
            json!({"model_name": "smollm2-instruct", "replica_config": [
                {"role": "prefill"}, {"role": "decode", "engine_config": {"kv_cache_tokens": "a"}}]}),
            "replica_config[1].engine_config.kv_cache_tokens",
        ),
        (
            json!({"model_name": "smollm2-instruct", "engine_config": {"kv_cache_tokens": "a"},
                   "replica_config": [{"role": "prefill"}, {"role": "decode", "engine_config": {"max_num_seqs": 4}}]}),
            "engine_config.kv_cache_tokens",
        ),
    ];
    for (body, field) in cases {
        let e = validate_err(body.clone(), true);
        assert_eq!(e.launch_field(), Some(field), "{body} → {e}");
    }
}
