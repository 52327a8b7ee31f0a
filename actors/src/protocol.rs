//! The messages between the supervisor and the workers. Both sides send them, so they live apart
//! from either actor; every one may cross nodes.

use crate::launch::{LaunchRequest, ScaleRequest};
use crate::spec::{HeldReplica, ReplicaSpec};
use crate::view::{ModelInfo, WorkerInfo, WorkerStatus};
use crate::wire::{JsonWire, Wire};
use ractor::RpcReplyPort;
use ractor_cluster::RactorClusterMessage;

/// Messages of the supervisor; every one may cross nodes (workers send heartbeats, and any
/// node may ask for the model list).
#[derive(RactorClusterMessage)]
pub(crate) enum SupervisorMsg {
    /// Validate, place and launch a model; the reply is its uid, once it serves (or, with
    /// `detach`, once it is placed and loading).
    #[rpc]
    Launch { request: JsonWire<Box<LaunchRequest>>, detach: bool, reply: RpcReplyPort<Wire<String>> },
    /// Terminate a model: router, tracker and replicas.
    #[rpc]
    Terminate { model_uid: String, reply: RpcReplyPort<Wire<()>> },
    /// One model's status and replicas.
    #[rpc]
    GetModel { model_uid: String, reply: RpcReplyPort<Wire<ModelInfo>> },
    /// Every model.
    #[rpc]
    ListModels { reply: RpcReplyPort<Wire<Vec<ModelInfo>>> },
    /// Every worker.
    #[rpc]
    ListWorkers { reply: RpcReplyPort<Wire<Vec<WorkerStatus>>> },
    /// Add replicas to a serving model; the reply names them, once they serve.
    #[rpc]
    Scale { model_uid: String, request: Wire<ScaleRequest>, reply: RpcReplyPort<Wire<Vec<String>>> },
    /// A scale-up task finished (internal).
    #[rpc]
    ScaleDone {
        model_uid: String,
        replicas: Wire<Vec<String>>,
        outcome: Wire<()>,
        reply: RpcReplyPort<Wire<()>>,
    },
    /// A worker is alive (and registers with its devices), holding these replicas.
    Heartbeat { info: Wire<WorkerInfo>, replicas: Wire<Vec<HeldReplica>> },
    /// An adoption task finished (internal): a model rebuilt, or replicas added back.
    #[rpc]
    AdoptDone {
        model_uid: String,
        replicas: Wire<Vec<String>>,
        outcome: Wire<()>,
        reply: RpcReplyPort<Wire<()>>,
    },
    /// A replica's actor stopped unexpectedly.
    ReplicaDied { model_uid: String, replica_uid: String },
    /// A worker is stopping: route nothing new to its replicas and place nothing on it. The
    /// reply counts the requests still running on its replicas; the worker asks again until
    /// none are left (or its drain time is up).
    #[rpc]
    DrainWorker { worker_id: String, reply: RpcReplyPort<Wire<u64>> },
    /// A draining worker's time ran out with requests still running: those requests end with
    /// that reason rather than a lost connection's. The worker stops once answered.
    #[rpc]
    DrainTimedOut { worker_id: String, after_ms: u64, reply: RpcReplyPort<Wire<()>> },
    /// A launch task finished (internal).
    #[rpc]
    LaunchDone { model_uid: String, outcome: Wire<()>, reply: RpcReplyPort<Wire<()>> },
    /// A terminate task finished (internal).
    #[rpc]
    TerminateDone { model_uid: String, reply: RpcReplyPort<Wire<()>> },
    /// Remove one replica of a serving model: it leaves the rotation, its running requests get
    /// up to `drain_ms` to finish, then its worker stops it. The reply comes once it is gone.
    #[rpc]
    RemoveReplica { model_uid: String, replica_uid: String, drain_ms: u64, reply: RpcReplyPort<Wire<()>> },
    /// A removal task finished (internal).
    #[rpc]
    RemoveDone { model_uid: String, replica_uid: String, reply: RpcReplyPort<Wire<()>> },
    /// Check heartbeats (sent by the supervisor to itself).
    Tick,
}

/// Messages of a worker; every one may cross nodes.
#[derive(RactorClusterMessage)]
pub(crate) enum WorkerMsg {
    /// Start a replica; the reply comes once its engine is loaded.
    #[rpc]
    SpawnReplica { spec: Wire<Box<ReplicaSpec>>, reply: RpcReplyPort<Wire<()>> },
    /// Stop a replica (also one still loading); `true` when it existed.
    #[rpc]
    StopReplica { replica_uid: String, reply: RpcReplyPort<Wire<bool>> },
    /// Send a heartbeat (sent by the worker to itself).
    Tick,
    /// Another process took over this worker's id while this one was out of sight (frozen, cut
    /// off): stop its replicas and leave, so that nothing is placed on it any more.
    Superseded,
}
