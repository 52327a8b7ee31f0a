//! What a cluster node is started with: the engines it offers and its time limits.

use crate::replica::PullTimes;
use crate::replica::handoff::HandoffTimes;
use crate::replica::rooms::Leases;
use crate::supervisor::SupervisorTimes;
use crate::worker::WorkerTimes;
use std::time::Duration;

/// The engines and time limits of a cluster node. The time defaults suit real deployments;
/// tests shorten them. The default offers no engine: the binary registers the ones it ships.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ClusterOptions {
    /// How often a worker sends a heartbeat.
    pub heartbeat_interval: Duration,
    /// A worker not heard from for this long is lost: its replicas are marked dead.
    pub heartbeat_timeout: Duration,
    /// Time limit of an ordinary call to another actor.
    pub call_timeout: Duration,
    /// Time limit of loading one replica (resolving, maybe downloading, and loading weights).
    pub load_timeout: Duration,
    /// Time limit of stopping an actor.
    pub stop_timeout: Duration,
    /// How long a pull waits for the next token before answering with an empty batch.
    pub long_poll: Duration,
    /// A request nobody pulls for this long is aborted on its replica.
    pub idle_abort: Duration,
    /// How long a worker tries to join its supervisor.
    pub join_timeout: Duration,
    /// How long a stopping worker ([`WorkerNode::drain`](crate::WorkerNode::drain)) waits for
    /// the requests running on its replicas.
    pub drain_timeout: Duration,
    /// Time limit of a P/D request's prefill leg (the prompt's computation).
    pub prefill_timeout: Duration,
    /// Time limit of fetching one handoff's pages.
    pub transfer_timeout: Duration,
    /// A handoff room nobody fetches from is freed after this.
    pub handoff_lease: Duration,
    /// A claimed room without progress for this long is freed.
    pub handoff_idle_lease: Duration,
    /// How pages may travel: in process where possible (default), or always TCP.
    pub transport: xinf_transfer::transport::TransportPolicy,
    /// Bytes of each prefill replica's CPU snapshot cache of complete prompt pages; 0 keeps
    /// none.
    pub snapshot_cache_bytes: usize,
    /// The engines launches may name; the first is the default.
    pub engines: xinf_engine::Engines,
    /// A worker's port for its node; 0 picks a free one. A fixed port keeps the worker's
    /// default id (`host:port`) across restarts.
    pub worker_port: u16,
    /// A worker's id; default `host:port`. A worker that comes back under the id of a lost one
    /// takes its place in the supervisor's table instead of joining as a new worker.
    pub worker_id: Option<String>,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        Self {
            heartbeat_interval: Duration::from_secs(1),
            heartbeat_timeout: Duration::from_secs(5),
            call_timeout: Duration::from_secs(10),
            load_timeout: Duration::from_secs(600),
            stop_timeout: Duration::from_secs(10),
            long_poll: Duration::from_secs(1),
            idle_abort: Duration::from_secs(10),
            join_timeout: Duration::from_secs(10),
            drain_timeout: Duration::from_secs(30),
            prefill_timeout: Duration::from_secs(300),
            transfer_timeout: Duration::from_secs(30),
            handoff_lease: Duration::from_secs(30),
            handoff_idle_lease: Duration::from_secs(10),
            transport: xinf_transfer::transport::TransportPolicy::Auto,
            snapshot_cache_bytes: 512 << 20,
            engines: xinf_engine::Engines::default(),
            worker_port: 0,
            worker_id: None,
        }
    }
}

impl ClusterOptions {
    /// The supervisor's time settings.
    pub(crate) fn supervisor_times(&self) -> SupervisorTimes {
        SupervisorTimes {
            heartbeat_check: (self.heartbeat_timeout / 4).max(Duration::from_millis(50)),
            heartbeat_timeout: self.heartbeat_timeout,
            call: self.call_timeout,
            load: self.load_timeout,
            stop: self.stop_timeout,
        }
    }

    /// A worker's time settings.
    pub(crate) fn worker_times(&self) -> WorkerTimes {
        WorkerTimes {
            heartbeat_interval: self.heartbeat_interval,
            stop_timeout: self.stop_timeout,
            pull: PullTimes { long_poll: self.long_poll, idle_abort: self.idle_abort },
            handoff: HandoffTimes {
                leases: Leases { unclaimed: self.handoff_lease, claimed_idle: self.handoff_idle_lease },
                transfer: self.transfer_timeout,
                policy: self.transport,
                snapshot_budget: self.snapshot_cache_bytes,
                local_prefill_tokens: 0,
            },
        }
    }
}
