//! Errors of the actor layer: classified once, where they arise, with a stable code.
//!
//! Every error can cross a node boundary (it is serde-serializable and travels inside replies),
//! so a caller on the supervisor node sees the same typed error a worker raised.

use serde::{Deserialize, Serialize};
use xinf_engine::{EngineError, ErrorClass};

#[cfg(test)]
mod tests;

/// Which launch-validation rule a request broke. Each rule has a stable code, so the REST layer
/// and tests can tell rules apart without parsing message text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub enum LaunchRule {
    /// A field has a value outside its range (`replica` 0, an empty `model_uid`, …).
    InvalidField,
    /// `replica_config length (N) must equal replica (M).`
    ReplicaCountMismatch,
    /// `Each replica_config entry must have exactly one device …`
    DeviceCount,
    /// `n_gpu (x) must equal len(gpu_idx) (y), or be 'auto'`
    GpuCountMismatch,
    /// `gpu_idx must not contain duplicate indexes`
    DuplicateGpuIdx,
    /// `replica_uid … must not be empty or whitespace-only`
    EmptyReplicaUid,
    /// `replica_uid '…' collides with a reserved internal replica/rank identifier`
    ReservedReplicaUid,
    /// `Duplicate replica_uid '…'`
    DuplicateReplicaUid,
    /// `… worker_ip '…' is not in the cluster. Registered workers: […]`
    UnknownWorker,
    /// `gpu_idx … is not visible on worker …`
    GpuNotVisible,
    /// `GPU conflict …`
    GpuConflict,
    /// A worker has fewer free GPUs than `n_gpu` asks for.
    NotEnoughGpus,
    /// No worker is registered, so nothing can be placed.
    NoWorkers,
    /// `Cannot specify worker_ip / n_gpu / gpu_idx together with replica_config.`
    LegacyPlacementConflict,
    /// `replica_config is incompatible with n_worker>1 (sharded launch).`
    ShardedLaunch,
    /// `Reserved replica engine_config keys: …`
    ReservedEngineConfigKey,
    /// `Per-replica engine settings require explicit PD roles`
    PerReplicaEngineSettings,
    /// `PD separation requires model_type=LLM and model_engine=native`
    PdEngine,
    /// `PD separation requires both prefill and decode replicas, without hybrid replicas`
    PdTopology,
    /// An engine other than `native` was asked for.
    EngineNotAvailable,
    /// A `model_type` other than LLM was asked for.
    ModelTypeNotSupported,
    /// `Unknown transfer backend: '…'; use xavier or nixl`
    UnknownTransferBackend,
    /// `NIXL requires explicit prefill and decode replica roles`
    NixlRoles,
    /// `xavier_gpu_cache_bytes` / `xavier_cache_bytes` rules.
    CacheBudget,
    /// An engine option (`engine_config` or a top-level engine keyword) is invalid.
    EngineConfig,
    /// The model name is not in the registry and no `model_path` was given.
    UnknownModel,
    /// A prefill and a decode replica loaded models whose KV means different things.
    ContractMismatch,
    /// Replicas would share a GPU and some do not state `gpu_memory_utilization`.
    GpuMemoryUtilizationRequired,
    /// The `gpu_memory_utilization` of the replicas on one GPU sum to more than 1.
    GpuMemoryOversubscribed,
    /// A worker's memory cannot hold one more replica computing on its CPU.
    NotEnoughMemory,
    /// The worker a replica names is stopping (draining).
    WorkerDraining,
}

impl LaunchRule {
    /// The request field this rule is about, where it is always the same one (the API's `param`
    /// of the refusal); rules about several fields name theirs where they are broken.
    pub fn field(self) -> Option<&'static str> {
        Some(match self {
            Self::ReplicaCountMismatch
            | Self::DeviceCount
            | Self::LegacyPlacementConflict
            | Self::PerReplicaEngineSettings
            | Self::PdTopology
            | Self::NixlRoles
            | Self::ContractMismatch => "replica_config",
            Self::GpuCountMismatch | Self::NotEnoughGpus => "n_gpu",
            Self::DuplicateGpuIdx | Self::GpuNotVisible | Self::GpuConflict => "gpu_idx",
            Self::EmptyReplicaUid | Self::ReservedReplicaUid | Self::DuplicateReplicaUid => "replica_uid",
            Self::UnknownWorker | Self::WorkerDraining => "worker_ip",
            Self::ShardedLaunch => "n_worker",
            Self::ReservedEngineConfigKey | Self::EngineConfig => "engine_config",
            Self::PdEngine | Self::EngineNotAvailable => "model_engine",
            Self::ModelTypeNotSupported => "model_type",
            Self::UnknownTransferBackend => "transfer_backend_type",
            Self::UnknownModel => "model_name",
            Self::GpuMemoryUtilizationRequired | Self::GpuMemoryOversubscribed => {
                "engine_config.gpu_memory_utilization"
            }
            Self::NotEnoughMemory => "replica",
            Self::InvalidField | Self::NoWorkers | Self::CacheBudget => return None,
        })
    }

    /// The stable code of this rule.
    pub fn code(self) -> &'static str {
        match self {
            Self::InvalidField => "invalid_launch_field",
            Self::ReplicaCountMismatch => "replica_config_length_mismatch",
            Self::DeviceCount => "replica_device_count",
            Self::GpuCountMismatch => "n_gpu_gpu_idx_mismatch",
            Self::DuplicateGpuIdx => "duplicate_gpu_idx",
            Self::EmptyReplicaUid => "empty_replica_uid",
            Self::ReservedReplicaUid => "reserved_replica_uid",
            Self::DuplicateReplicaUid => "duplicate_replica_uid",
            Self::UnknownWorker => "unknown_worker",
            Self::GpuNotVisible => "gpu_not_visible",
            Self::GpuConflict => "gpu_conflict",
            Self::NotEnoughGpus => "not_enough_gpus",
            Self::NoWorkers => "no_workers",
            Self::LegacyPlacementConflict => "replica_config_with_legacy_placement",
            Self::ShardedLaunch => "sharded_launch",
            Self::ReservedEngineConfigKey => "reserved_engine_config_key",
            Self::PerReplicaEngineSettings => "per_replica_engine_settings_need_pd_roles",
            Self::PdEngine => "pd_engine",
            Self::PdTopology => "pd_topology",
            Self::EngineNotAvailable => "engine_not_available",
            Self::ModelTypeNotSupported => "model_type_not_supported",
            Self::UnknownTransferBackend => "unknown_transfer_backend",
            Self::NixlRoles => "nixl_requires_pd_roles",
            Self::CacheBudget => "cache_budget",
            Self::EngineConfig => "invalid_engine_config",
            Self::UnknownModel => "unknown_model",
            Self::ContractMismatch => "pd_contract_mismatch",
            Self::GpuMemoryUtilizationRequired => "gpu_memory_utilization_required",
            Self::GpuMemoryOversubscribed => "gpu_memory_oversubscribed",
            Self::NotEnoughMemory => "not_enough_memory",
            Self::WorkerDraining => "worker_draining",
        }
    }
}

/// Why an actor-level operation failed.
///
/// The variants say what the caller can do about it: fix the request (`InvalidLaunch`), wait
/// (`NotReady`), retry elsewhere (`NoReplica`, `Unreachable`), or report a bug (`Internal`).
#[derive(Debug, Clone, PartialEq, thiserror::Error, Serialize, Deserialize)]
#[non_exhaustive]
pub enum ActorError {
    /// A launch request broke a validation rule; nothing was created.
    #[error("{message}")]
    InvalidLaunch {
        /// The rule.
        rule: LaunchRule,
        /// The reference text, with the offending values filled in.
        message: String,
        /// The request field at fault as the API names it (`worker_ip`,
        /// `engine_config.kv_cache_tokens`), where one is.
        field: Option<String>,
    },
    /// No model with this uid.
    #[error("model `{0}` is not running")]
    ModelNotFound(String),
    /// A model with this uid exists already.
    #[error("model `{0}` is already running; terminate it first or choose another model_uid")]
    ModelExists(String),
    /// The model has no replica with this uid.
    #[error("model `{model_uid}` has no replica `{replica_uid}`")]
    ReplicaNotFound {
        /// The model.
        model_uid: String,
        /// The replica asked for.
        replica_uid: String,
    },
    /// A replica cannot be removed now (the model's last of its role, loading, already going).
    #[error("replica `{replica_uid}` cannot be removed: {reason}")]
    ReplicaNotRemovable {
        /// The replica.
        replica_uid: String,
        /// Why, and what to do instead.
        reason: String,
    },
    /// A model with this uid is being terminated; its uid is free once it is gone.
    #[error("model `{0}` is being terminated; launch it again once it is gone")]
    Terminating(String),
    /// The model was terminated while it launched (and so a replica's load was cut short).
    #[error("the launch of model `{0}` was cancelled: the model was terminated while it loaded")]
    LaunchCancelled(String),
    /// The model exists but cannot serve yet (launching, terminating).
    #[error("model `{model_uid}` is not ready ({status})")]
    NotReady {
        /// The model.
        model_uid: String,
        /// Its status, in words.
        status: String,
    },
    /// The model has no alive replica to route to (of the role a request needs first).
    #[error("model `{model_uid}` has no alive {}replica; retry once one serves again", role_words(*role))]
    NoReplica {
        /// The model.
        model_uid: String,
        /// The role without a replica, for a P/D model.
        role: Option<crate::spec::Role>,
    },
    /// A request with this id is running already.
    #[error("Request {0} is already running")]
    DuplicateRequest(String),
    /// The model runs as many requests as its launch's `request_limits` allows (Xinference's
    /// words).
    #[error("Rate limit reached for the model. Request limit {limit} for the model: {model_uid}")]
    RateLimited {
        /// The model.
        model_uid: String,
        /// Its `request_limits`.
        limit: u32,
    },
    /// The launch asks for the NIXL transfer backend and a worker cannot load NIXL.
    #[error("{0}; or use transfer_backend_type \"xavier\" (pages move in process or over TCP)")]
    NixlNotAvailable(String),
    /// The engine refused or failed.
    #[error(transparent)]
    Engine(EngineError),
    /// A peer did not answer in time.
    #[error("{what} did not answer within {after_ms} ms")]
    Timeout {
        /// The peer (`worker 10.0.0.2:4000`, `replica m-0`).
        what: String,
        /// The time limit.
        after_ms: u64,
    },
    /// A peer is gone (stopped, or its node disconnected).
    #[error("{what} is unreachable: {reason}")]
    Unreachable {
        /// The peer.
        what: String,
        /// Why.
        reason: String,
    },
    /// A cluster setting is unusable.
    #[error("invalid cluster setting `{field}`: {reason}")]
    InvalidConfig {
        /// The setting (`host`, `secret`, `supervisor_addr`).
        field: String,
        /// What is wrong.
        reason: String,
    },
    /// A node could not be started (address in use, …).
    #[error("cannot start the cluster node: {0}")]
    Node(String),
    /// A worker could not join the cluster.
    #[error("cannot join the cluster at {addr}: {reason}")]
    Join {
        /// The supervisor address.
        addr: String,
        /// Why.
        reason: String,
    },
    /// Moving a handoff's KV pages failed (connection cut, NIXL error, prefill side gone).
    #[error("the KV handoff failed: {0}")]
    Transfer(String),
    /// A message could not be encoded or decoded (version skew between nodes?).
    #[error("cluster message encoding failed: {0}")]
    Wire(String),
    /// The cluster is shutting down.
    #[error("the cluster is shutting down")]
    ShuttingDown,
    /// A bug or an unexpected fault.
    #[error("internal actor error: {0}")]
    Internal(String),
}

impl ActorError {
    /// Shorthand for [`ActorError::InvalidLaunch`].
    /// The field is the rule's own ([`LaunchRule::field`]) until [`at`](Self::at) names another.
    pub fn launch(rule: LaunchRule, message: impl Into<String>) -> Self {
        Self::InvalidLaunch { rule, message: message.into(), field: rule.field().map(str::to_owned) }
    }

    /// This launch refusal, blamed on `at` (a field of the request, as the API names it).
    #[must_use]
    pub fn at(self, at: impl Into<String>) -> Self {
        match self {
            Self::InvalidLaunch { rule, message, .. } => {
                Self::InvalidLaunch { rule, message, field: Some(at.into()) }
            }
            other => other,
        }
    }

    /// The request field a launch refusal blames, where it names one.
    pub fn launch_field(&self) -> Option<&str> {
        match self {
            Self::InvalidLaunch { field, .. } => field.as_deref(),
            _ => None,
        }
    }

    /// The launch rule, for [`ActorError::InvalidLaunch`].
    pub fn launch_rule(&self) -> Option<LaunchRule> {
        match self {
            Self::InvalidLaunch { rule, .. } => Some(*rule),
            _ => None,
        }
    }

    /// The class of this error; the REST layer maps it to an HTTP status.
    pub fn class(&self) -> ErrorClass {
        match self {
            Self::InvalidLaunch { rule: LaunchRule::NoWorkers | LaunchRule::WorkerDraining, .. } => {
                ErrorClass::Unavailable
            }
            Self::InvalidLaunch { .. } | Self::InvalidConfig { .. } => ErrorClass::InvalidInput,
            Self::ModelNotFound(_) | Self::ReplicaNotFound { .. } => ErrorClass::NotFound,
            Self::ModelExists(_)
            | Self::DuplicateRequest(_)
            | Self::LaunchCancelled(_)
            | Self::ReplicaNotRemovable { .. } => ErrorClass::Conflict,
            Self::RateLimited { .. } => ErrorClass::Overloaded,
            Self::NixlNotAvailable(_) => ErrorClass::InvalidInput,
            Self::NotReady { .. }
            | Self::NoReplica { .. }
            | Self::Timeout { .. }
            | Self::Unreachable { .. }
            | Self::Join { .. }
            | Self::Transfer(_)
            | Self::Terminating(_)
            | Self::ShuttingDown => ErrorClass::Unavailable,
            Self::Engine(e) => e.class(),
            Self::Node(_) | Self::Wire(_) | Self::Internal(_) => ErrorClass::Internal,
        }
    }

    /// A stable, machine-readable reason code.
    pub fn code(&self) -> &'static str {
        match self {
            Self::InvalidLaunch { rule, .. } => rule.code(),
            Self::ModelNotFound(_) => "model_not_found",
            Self::ModelExists(_) => "model_exists",
            Self::Terminating(_) => "model_terminating",
            Self::ReplicaNotFound { .. } => "replica_not_found",
            Self::ReplicaNotRemovable { .. } => "replica_not_removable",
            Self::LaunchCancelled(_) => "launch_cancelled",
            Self::NotReady { .. } => "model_not_ready",
            Self::NoReplica { .. } => "no_replica",
            Self::DuplicateRequest(_) => "duplicate_request_id",
            Self::RateLimited { .. } => "rate_limited",
            Self::NixlNotAvailable(_) => "nixl_not_available",
            Self::Engine(e) => e.code(),
            Self::Timeout { .. } => "timeout",
            Self::Unreachable { .. } => "unreachable",
            Self::InvalidConfig { .. } => "invalid_cluster_config",
            Self::Node(_) => "node_start_failed",
            Self::Join { .. } => "cluster_join_failed",
            Self::Wire(_) => "wire_error",
            Self::Transfer(_) => "kv_transfer_failed",
            Self::ShuttingDown => "shutting_down",
            Self::Internal(_) => "internal_error",
        }
    }

    /// The error to put on a token stream: streams carry [`EngineError`]s, of the same class
    /// (an unreachable replica is "try later", not the request's fault).
    pub(crate) fn into_engine_error(self) -> EngineError {
        match self {
            Self::Engine(e) => e,
            other => match other.class() {
                ErrorClass::InvalidInput => EngineError::Rejected(other.to_string()),
                ErrorClass::Cancelled => EngineError::Aborted,
                ErrorClass::Internal => EngineError::Internal(other.to_string()),
                _ => EngineError::Process(other.to_string()),
            },
        }
    }
}

impl From<EngineError> for ActorError {
    fn from(e: EngineError) -> Self {
        Self::Engine(e)
    }
}

/// `prefill ` for a role a P/D request needs, nothing for any replica.
fn role_words(role: Option<crate::spec::Role>) -> String {
    role.map_or_else(String::new, |r| format!("{} ", r.as_str()))
}
