//! The launch tests, one per message, on pure functions (no actors): the helpers they share,
//! and the rules' codes. The tests of each part are beside it (`request/tests.rs`,
//! `keywords/tests.rs`, `validate/tests.rs`, `placement/tests.rs`, `gpu/tests.rs`).

use super::*;
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use xinf_engine::{EngineConfig, Engines};

/// The launch rules are engine-neutral: the mock engine stands in under the default engine's
/// name, so the messages read as users see them.
pub(super) fn engines() -> Engines {
    crate::testing::engines()
}

/// A replica's options as the JSON a launch would give.
pub(super) fn json_of(config: &EngineConfig) -> Value {
    config.to_json()
}

pub(super) fn parse(v: Value) -> LaunchRequest {
    serde_json::from_value(v).expect("a well-formed launch request")
}

pub(super) fn validate_err(v: Value, local: bool) -> ActorError {
    validate(&parse(v), local, &engines()).expect_err("the request must be refused")
}

pub(super) fn assert_rule(e: &ActorError, rule: LaunchRule, text: &str) {
    assert_eq!(e.launch_rule(), Some(rule), "{e}");
    assert!(e.to_string().contains(text), "`{e}` should contain `{text}`");
}

pub(super) fn device(worker: &str) -> Value {
    json!([{"worker_ip": worker, "n_gpu": "auto"}])
}

pub(super) fn worker(id: &str, gpus: &[u32]) -> WorkerSlot {
    WorkerSlot {
        worker_id: id.into(),
        host: if id == "local" {
            "127.0.0.1".into()
        } else {
            id.rsplit_once(':').map_or(id, |(h, _)| h).into()
        },
        gpus: gpus.to_vec(),
        allow_gpu_sharing: false,
        occupied: BTreeMap::new(),
        replicas: 0,
        draining: false,
    }
}

pub(super) fn tenant(model: &str, replica: &str, fraction: Option<f64>) -> GpuTenant {
    GpuTenant { model_uid: model.into(), replica_uid: replica.into(), fraction }
}

pub(super) fn view(workers: Vec<WorkerSlot>) -> ClusterView {
    ClusterView { workers, replica_uids: BTreeMap::new(), round_robin: 0 }
}

pub(super) fn place_err(v: Value, view: &ClusterView) -> ActorError {
    let spec = validate(&parse(v), false, &engines()).expect("valid on its own");
    place(&spec, "m", view).expect_err("placement must be refused")
}

pub(super) fn placed(v: Value, view: &ClusterView) -> Vec<Placement> {
    let spec = validate(&parse(v), false, &engines()).expect("valid on its own");
    place(&spec, "m", view).expect("placed").0
}

pub(super) fn device_of(p: &Placement) -> Option<String> {
    let config: Value = json_of(&p.engine_config);
    config.get("device").and_then(Value::as_str).map(str::to_owned)
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
