//! What the supervisor tells a worker about a replica to start: its model, role, engine and
//! handoff settings.

pub(crate) use crate::launch::Role;
use serde::{Deserialize, Serialize};
use xinf_engine::{EngineConfig, ModelSource};

/// Everything a worker needs to start a replica; sent by the supervisor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct ReplicaSpec {
    pub(crate) model_uid: String,
    pub(crate) replica_uid: String,
    pub(crate) role: Role,
    pub(crate) source: ModelSource,
    /// The engine, by its registered name.
    pub(crate) engine: String,
    /// Its options, checked at launch.
    pub(crate) engine_config: EngineConfig,
    /// GPU indexes on the worker; empty means the CPU.
    pub(crate) gpus: Vec<u32>,
    /// The launch's handoff settings.
    pub(crate) handoff: ModelHandoff,
}

/// A model's handoff settings from its launch, carried to every replica.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct ModelHandoff {
    /// Pages travel through NIXL (`transfer_backend_type: "nixl"`).
    pub(crate) nixl: bool,
    /// Snapshot cache of a prefill replica (`xavier_cache_bytes`); the node's default when
    /// not given.
    pub(crate) snapshot_cache_bytes: Option<u64>,
}
