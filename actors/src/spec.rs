//! What a replica is: its role, and what the supervisor tells a worker about a replica to
//! start (its model, engine and handoff settings).

use serde::{Deserialize, Serialize};
use std::fmt;
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
    /// The model's launch request as JSON: with it, a supervisor that restarted rebuilds the
    /// model from the replicas its workers report (and can scale it again).
    pub(crate) launch: String,
}

/// A replica a worker holds, as its heartbeat reports it: the supervisor adopts serving
/// replicas it does not know (after a restart) and notices replicas it knows that are gone.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct HeldReplica {
    pub(crate) spec: ReplicaSpec,
    /// Its engine is loaded and its actor serves (otherwise it is still loading).
    pub(crate) serving: bool,
}

/// What every replica of a model is started with, whatever its role and place.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ModelCommon {
    pub(crate) source: ModelSource,
    pub(crate) handoff: ModelHandoff,
    /// What the serving node applies in front of the replicas.
    pub(crate) front: ModelFront,
    /// The launch request as JSON (see [`ReplicaSpec::launch`]).
    pub(crate) launch: String,
}

/// What the node that serves a model's requests applies in front of its replicas, from its
/// launch; the replicas never see it.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct ModelFront {
    /// How chat answers are made and read.
    pub(crate) chat: crate::ChatDefaults,
    /// `request_limits`: the most requests served at once.
    pub(crate) request_limit: Option<u32>,
    /// `prefill_fallback`: while a P/D model has no prefill replica to route to, its decode
    /// replicas compute whole requests.
    pub(crate) prefill_fallback: bool,
}

/// A model's handoff settings from its launch, carried to every replica.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct ModelHandoff {
    /// Pages travel through NIXL (`transfer_backend_type: "nixl"`).
    pub(crate) nixl: bool,
    /// Snapshot cache of a prefill replica (`xavier_cache_bytes`); the node's default when
    /// not given.
    pub(crate) snapshot_cache_bytes: Option<u64>,
    /// A prompt of at most this many tokens is computed by its decode replica, without a
    /// handoff (`max_local_prefill_tokens`; 0: every prompt is handed off).
    #[serde(default)]
    pub(crate) local_prefill_tokens: u32,
}

/// What a replica does in a deployment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Runs whole requests (the default).
    #[default]
    Hybrid,
    /// Computes prompts and hands their KV to a decode replica.
    Prefill,
    /// Generates from KV computed by a prefill replica.
    Decode,
}

impl Role {
    /// The lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Hybrid => "hybrid",
            Self::Prefill => "prefill",
            Self::Decode => "decode",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
