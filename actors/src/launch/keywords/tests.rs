//! The launch keywords: transfer backends and Xavier budgets.

use super::*;
use crate::launch::tests::*;
use crate::launch::validate;
use serde_json::{Value, json};

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

#[test]
fn max_local_prefill_tokens_needs_pd_roles_and_decode_replicas_that_compute_prompts() {
    let e = validate_err(json!({"model_name": "smollm2-instruct", "max_local_prefill_tokens": 256}), true);
    assert_rule(
        &e,
        LaunchRule::InvalidField,
        "max_local_prefill_tokens requires prefill and decode replica roles",
    );
    assert_eq!(e.launch_field(), Some("max_local_prefill_tokens"));
    let pd = |v: Value| {
        json!({"model_name": "smollm2-instruct", "max_local_prefill_tokens": v,
               "replica_config": [{"role": "prefill"}, {"role": "decode"}]})
    };
    for bad in [json!(-1), json!("256"), json!(1.5), json!(true), json!((1u64 << 24) + 1)] {
        let e = validate_err(pd(bad.clone()), true);
        assert_rule(
            &e,
            LaunchRule::InvalidField,
            "max_local_prefill_tokens must be an integer from 0 to 16777216",
        );
    }
    let spec = validate(&parse(pd(json!(256))), true, &engines()).expect("valid");
    assert_eq!(spec.handoff().local_prefill_tokens, 256);
    let spec = validate(&parse(pd(Value::Null)), true, &engines()).expect("valid");
    assert_eq!(spec.handoff().local_prefill_tokens, 0);

    // A decode engine that only continues handed-off prompts (SGLang's decode mode) is named.
    let engines = Engines::new(vec![
        std::sync::Arc::new(xinf_engine_mock::MockLoader::named("native")),
        std::sync::Arc::new(xinf_engine_mock::MockLoader::named("sglang").decode_imports_only()),
    ]);
    let launch = |decode_engine: &str, n: u64| {
        parse(json!({"model_name": "smollm2-instruct", "max_local_prefill_tokens": n,
            "replica_config": [{"role": "prefill", "model_engine": "sglang"},
                               {"role": "decode", "model_engine": decode_engine}]}))
    };
    let e = validate(&launch("sglang", 64), true, &engines).expect_err("refused");
    assert_rule(
        &e,
        LaunchRule::InvalidField,
        "replica_config[1] runs sglang, whose decode replicas only continue prompts a prefill replica hands them",
    );
    // An SGLang prefill replica is fine, and 0 leaves every prompt to the prefill side.
    assert!(validate(&launch("native", 64), true, &engines).is_ok());
    assert!(validate(&launch("sglang", 0), true, &engines).is_ok());
}

#[test]
fn prefill_fallback_is_a_boolean_for_pd_launches_whose_decode_replicas_compute_prompts() {
    let pd = |v: Value| {
        json!({"model_name": "smollm2-instruct", "prefill_fallback": v,
               "replica_config": [{"role": "prefill"}, {"role": "decode"}]})
    };
    let on = validate(&parse(pd(json!(true))), true, &engines()).expect("valid");
    assert!(on.front.prefill_fallback);
    for off in [json!(false), Value::Null] {
        assert!(!validate(&parse(pd(off)), true, &engines()).expect("valid").front.prefill_fallback);
    }
    for bad in [json!(1), json!("true")] {
        let e = validate_err(pd(bad), true);
        assert_rule(&e, LaunchRule::InvalidField, "prefill_fallback must be a boolean");
    }
    let e = validate_err(json!({"model_name": "smollm2-instruct", "prefill_fallback": true}), true);
    assert_rule(&e, LaunchRule::InvalidField, "prefill_fallback requires prefill and decode replica roles");
    // Off is as good as absent, P/D or not.
    for off in [json!({"prefill_fallback": false}), json!({"max_local_prefill_tokens": 0})] {
        let mut launch = json!({"model_name": "smollm2-instruct"});
        launch.as_object_mut().expect("an object").extend(off.as_object().cloned().unwrap_or_default());
        assert!(validate(&parse(launch), true, &engines()).is_ok(), "{off}");
    }
    let engines = Engines::new(vec![
        std::sync::Arc::new(xinf_engine_mock::MockLoader::named("native")),
        std::sync::Arc::new(xinf_engine_mock::MockLoader::named("sglang").decode_imports_only()),
    ]);
    let launch = parse(json!({"model_name": "smollm2-instruct", "prefill_fallback": true,
        "replica_config": [{"role": "prefill"}, {"role": "decode", "model_engine": "sglang"}]}));
    let e = validate(&launch, true, &engines).expect_err("refused");
    assert_rule(
        &e,
        LaunchRule::InvalidField,
        "prefill_fallback needs decode replicas that can compute a prompt; replica_config[1] runs sglang",
    );
}

// ---- the split and the types ----

#[test]
fn the_list_of_launch_keywords_is_the_structs() {
    let extra: Map<String, Value> = LAUNCH_KEYWORDS.iter().map(|k| ((*k).to_owned(), Value::Null)).collect();
    let (_, engine) = LaunchKeywords::take(&extra).expect("split");
    assert!(engine.is_empty(), "not launch keywords: {engine:?}");
    let (_, engine) =
        LaunchKeywords::take(&json!({"not_a_keyword": 1}).as_object().cloned().unwrap_or_default())
            .expect("split");
    assert_eq!(engine.len(), 1);
}

#[test]
fn launch_keywords_are_taken_out_of_the_engine_keywords() {
    let extra = json!({"enable_xavier": true, "transfer_backend_type": "Xavier", "kv_cache_tokens": 1024});
    let (keywords, engine) = LaunchKeywords::take(extra.as_object().expect("object")).expect("split");
    assert_eq!(Value::Object(engine), json!({"kv_cache_tokens": 1024}));
    assert!(keywords.enable_xavier().expect("a boolean"));
    assert_eq!(keywords.transfer().expect("a backend"), Some(TransferBackend::Xavier));
    assert_eq!(keywords.gpu_cache_bytes().expect("absent"), None);
    assert_eq!(keywords.cache_bytes().expect("absent"), None);
    // null is as good as absent.
    let extra = json!({"enable_xavier": null, "xavier_cache_bytes": null});
    let (keywords, engine) = LaunchKeywords::take(extra.as_object().expect("object")).expect("split");
    assert!(engine.is_empty());
    assert!(!keywords.enable_xavier().expect("absent"));
    assert_eq!(keywords.cache_bytes().expect("absent"), None);
}

#[test]
fn enable_xavier_must_be_a_boolean() {
    for bad in [json!(1), json!("true")] {
        let e = validate_err(json!({"model_name": "smollm2-instruct", "enable_xavier": bad}), true);
        assert_rule(&e, LaunchRule::InvalidField, "enable_xavier must be a boolean");
    }
}

#[test]
fn both_backend_names_must_agree_as_given() {
    // null against a name, and two spellings of one name, disagree.
    for (a, b) in [(json!(null), json!("nixl")), (json!("NIXL"), json!("nixl"))] {
        let e = validate_err(
            json!({"model_name": "smollm2-instruct", "transfer_backend_type": a, "vllm_transfer_backend_type": b,
                   "replica_config": [{"role": "prefill"}, {"role": "decode"}]}),
            true,
        );
        assert_rule(
            &e,
            LaunchRule::UnknownTransferBackend,
            "transfer_backend_type and vllm_transfer_backend_type disagree; give one of them",
        );
    }
    let spec = validate(
        &parse(json!({"model_name": "smollm2-instruct", "transfer_backend_type": "nixl",
            "vllm_transfer_backend_type": "nixl", "replica_config": [{"role": "prefill"}, {"role": "decode"}]})),
        true,
        &engines(),
    )
    .expect("valid");
    assert_eq!(spec.transfer, Some(TransferBackend::Nixl));
}
