//! What validation gives placement: a launch request normalised into one draft per replica,
//! with the engine options already checked by the engine.

use super::keywords::TransferBackend;
use super::request::{GpuCount, Role};
use xinf_engine::{EngineConfig, ModelSource};

/// Where a replica's worker was named, for the messages about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum WorkerNamed {
    /// The request's own `worker_ip`.
    Request,
    /// Its `replica_config` entry's `devices`.
    ReplicaConfig,
    /// The replica a scale-up or a replacement copies.
    CopiedReplica,
}

/// A placement request for one replica.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct DeviceRequest {
    /// The worker asked for, and where it was named.
    pub(super) worker_ip: Option<String>,
    pub(super) named: WorkerNamed,
    pub(super) n_gpu: GpuCount,
    pub(super) gpu_idx: Option<Vec<u32>>,
}

/// One replica of a validated launch.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct ReplicaDraft {
    /// The explicit uid, if any.
    pub(super) replica_uid: Option<String>,
    pub(super) role: Role,
    /// The engine's name, as registered.
    pub(super) engine: String,
    /// The merged, checked engine options. `device` in them, when given, wins over the device
    /// placement would choose; `gpu_memory_utilization` is the replica's share of its GPU.
    pub(super) engine_config: EngineConfig,
    pub(super) device: DeviceRequest,
    /// The engine computes only on a GPU: placing it on none is refused.
    pub(super) needs_gpu: bool,
}

/// A launch request that passed every check that does not depend on the cluster's state.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct LaunchSpec {
    pub(crate) model_uid: Option<String>,
    pub(crate) source: ModelSource,
    pub(super) replicas: Vec<ReplicaDraft>,
    /// Whether the replicas have prefill/decode roles.
    pub(crate) pd: bool,
    /// The P/D transfer backend.
    pub(super) transfer: Option<TransferBackend>,
    /// `xavier_cache_bytes`: the snapshot cache of each prefill replica.
    pub(super) snapshot_cache_bytes: Option<u64>,
    /// `max_local_prefill_tokens`: prompts this short are computed by the decode replica.
    pub(super) local_prefill_tokens: u32,
    /// `reasoning_content`, `enable_thinking` and `request_limits`.
    pub(crate) front: crate::spec::ModelFront,
    /// The launch request as JSON, which every replica carries (see
    /// [`ReplicaSpec::launch`](crate::spec::ReplicaSpec)).
    pub(crate) launch: String,
}

impl LaunchSpec {
    /// The handoff settings every replica of this launch gets.
    pub(crate) fn handoff(&self) -> crate::spec::ModelHandoff {
        crate::spec::ModelHandoff {
            nixl: self.transfer == Some(TransferBackend::Nixl),
            snapshot_cache_bytes: self.snapshot_cache_bytes,
            local_prefill_tokens: self.local_prefill_tokens,
        }
    }

    /// What every replica of this launch is started with.
    pub(crate) fn common(&self) -> crate::spec::ModelCommon {
        crate::spec::ModelCommon {
            source: self.source.clone(),
            handoff: self.handoff(),
            front: self.front.clone(),
            launch: self.launch.clone(),
        }
    }
}
