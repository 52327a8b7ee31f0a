//! The views the actor layer hands out: models, replicas, workers, GPUs and load figures. They
//! cross nodes and reach REST and the CLI as they are, so they are plain serializable data.

mod serving;

use crate::spec::Role;
use serde::{Deserialize, Serialize};
use std::fmt;

pub use serving::{FinishCounts, REQUEST_LATENCY_BOUNDS, RequestHistogram, ServingStats};

/// The lifecycle of a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ModelStatus {
    /// Replicas are loading; requests get [`ActorError::NotReady`].
    Launching,
    /// Serving, every replica alive.
    Ready,
    /// Serving, though some replicas were lost or drain: every role still has an alive one.
    Degraded,
    /// A role the model needs has no alive replica (their workers were lost): requests are
    /// refused as "try later" until a replica of that role serves again.
    Unavailable,
    /// Being torn down.
    Terminating,
}

impl ModelStatus {
    /// Whether the model takes requests (ready, or degraded with every role still served).
    pub fn serves(self) -> bool {
        matches!(self, Self::Ready | Self::Degraded)
    }

    /// Whether the model is launched and not being torn down: serving, or waiting for a role to
    /// have a replica again. Only such a model changes status with its replicas, scales up or
    /// is terminated.
    pub fn launched(self) -> bool {
        matches!(self, Self::Ready | Self::Degraded | Self::Unavailable)
    }
}

impl fmt::Display for ModelStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Launching => "launching",
            Self::Ready => "ready",
            Self::Degraded => "degraded",
            Self::Unavailable => "unavailable",
            Self::Terminating => "terminating",
        })
    }
}

/// The lifecycle of a replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReplicaStatus {
    /// Its engine is loading.
    Loading,
    /// Serving.
    Alive,
    /// Its worker is stopping: it finishes the requests it runs and takes no new ones, and a
    /// replacement is placed on another worker where one has room.
    Draining,
    /// Its worker was lost or its actor stopped; it takes no requests.
    Dead,
}

/// One replica of a model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ReplicaInfo {
    /// The replica's uid.
    pub replica_uid: String,
    /// Its role.
    pub role: Role,
    /// The worker it runs on.
    pub worker_id: String,
    /// GPU indexes on that worker; empty means the CPU.
    pub gpus: Vec<u32>,
    /// The engine it runs (`native`, `vllm`, `sglang`); empty from a server that did not say.
    #[serde(default)]
    pub engine: String,
    /// The share of its GPU's memory it may take (`engine_config.gpu_memory_utilization`),
    /// which lets replicas share a GPU.
    pub gpu_memory_utilization: Option<f64>,
    /// Its status.
    pub status: ReplicaStatus,
    /// Its KV cache's layout (`paged-kv-first/NHD/B=16`); empty from a server that did not say.
    #[serde(default)]
    pub kv_layout: String,
}

/// A model and its replicas.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ModelInfo {
    /// The model's uid.
    pub model_uid: String,
    /// The name it was launched by.
    pub model_name: String,
    /// Its status.
    pub status: ModelStatus,
    /// Whether its replicas have prefill/decode roles.
    pub pd: bool,
    /// P/D: while no prefill replica is alive, its decode replicas compute whole requests
    /// (`prefill_fallback`), and the model is degraded rather than unavailable.
    #[serde(default)]
    pub prefill_fallback: bool,
    /// P/D: a prompt of at most this many tokens is computed by its decode replica, without a
    /// handoff (`max_local_prefill_tokens`; 0: every prompt is handed off).
    #[serde(default)]
    pub max_local_prefill_tokens: u32,
    /// Its replicas.
    pub replicas: Vec<ReplicaInfo>,
    /// When its launch began, in seconds since the Unix epoch.
    pub created: u64,
    /// The weights as the launch named them (registry name, size, format, quantization, or a
    /// path).
    #[serde(default)]
    pub source: xinf_engine::ModelSource,
}

/// One GPU of a worker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct GpuInfo {
    /// Its index on the worker (the CUDA ordinal the replica placed on it computes on).
    pub index: u32,
    /// Its name, when the driver told (`NVIDIA H200`).
    pub name: Option<String>,
    /// Its total memory in bytes, when the driver told.
    pub total_memory: Option<u64>,
}

impl GpuInfo {
    /// A GPU known by its index only (`XINF_GPUS`, `CUDA_VISIBLE_DEVICES`).
    pub(crate) fn index_only(index: u32) -> Self {
        Self { index, name: None, total_memory: None }
    }
}

/// What a worker reports about itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct WorkerInfo {
    /// The worker's id: its cluster address `ip:port` (`local` in local mode).
    pub worker_id: String,
    /// The address it listens on.
    pub host: String,
    /// GPU indexes it may use: `XINF_GPUS`, else the NVIDIA driver's count (builds with the
    /// `cuda` feature), else `CUDA_VISIBLE_DEVICES`.
    pub gpus: Vec<u32>,
    /// The same GPUs, with their names and memory where the driver told.
    pub gpu_details: Vec<GpuInfo>,
    /// Whether several replicas may share one GPU (`XINF_ALLOW_MULTI_REPLICA_PER_GPU`).
    pub allow_gpu_sharing: bool,
    /// Host memory for the replicas that compute on its CPU, in bytes: `XINF_WORKER_MEMORY`
    /// (bytes, or with a `K`/`M`/`G` or `KiB`/`MiB`/`GiB` suffix), else what the system had
    /// available when the worker started; `None` where the system does not say (then nothing
    /// is checked).
    #[serde(default)]
    pub memory: Option<u64>,
    /// A random number drawn when the worker's process started: a second process under the
    /// id of a worker that runs is told apart, and refused.
    #[serde(default)]
    pub instance: u64,
}

/// What runs on one GPU of a worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct GpuUsage {
    /// The GPU's index on the worker.
    pub index: u32,
    /// Replicas (not dead) placed on it.
    pub replicas: Vec<String>,
    /// The sum of their `gpu_memory_utilization` (replicas without one count 0).
    pub memory_fraction: f64,
}

/// A worker as the supervisor sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct WorkerStatus {
    /// What the worker reported.
    pub info: WorkerInfo,
    /// `false` once it missed its heartbeats or its node disconnected.
    pub alive: bool,
    /// It is stopping and lets its replicas finish their requests: no new requests or
    /// replicas go to it.
    #[serde(default)]
    pub draining: bool,
    /// Milliseconds since its last heartbeat.
    pub last_heartbeat_ms: u64,
    /// Replicas (not dead) placed on it.
    pub replicas: Vec<String>,
    /// Each of its GPUs: the replicas on it and the share of its memory they hold. The share
    /// is freed when a replica dies or its model terminates.
    pub gpu_usage: Vec<GpuUsage>,
}

/// Load figures of one replica.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ReplicaStats {
    /// The replica.
    pub replica_uid: String,
    /// Its worker.
    pub worker_id: String,
    /// Its role (`hybrid` from a server that did not say).
    #[serde(default)]
    pub role: Role,
    /// Requests being computed.
    pub running: u64,
    /// Requests waiting for admission.
    pub queued: u64,
    /// Requests accepted since the replica started.
    pub requests_served: u64,
    /// Prompt tokens computed since start.
    pub prompt_tokens: u64,
    /// Prompt tokens taken from the prefix cache instead of computed, since start.
    #[serde(default)]
    pub cached_prompt_tokens: u64,
    /// Tokens generated since start.
    pub generated_tokens: u64,
    /// KV blocks held pinned for handoffs.
    pub pinned_blocks: u64,
    /// Handoff figures (P/D replicas).
    pub handoff: HandoffStats,
    /// Per-request latencies and finish reasons (empty from a server that did not record them).
    #[serde(default)]
    pub serving: ServingStats,
    /// Out of rotation: its worker is stopping, and it only finishes the requests it runs.
    #[serde(default)]
    pub draining: bool,
}

/// Upper bounds, in seconds, of the handoff latency histogram's buckets (the last bucket,
/// `+Inf`, is implied by the count).
pub const HANDOFF_LATENCY_BOUNDS: [f64; 12] =
    [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5];

/// A histogram of page-fetch times (a decode replica's wait from asking for a handoff's pages
/// to holding them), in Prometheus' cumulative form.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LatencyHistogram {
    /// Fetches that took at most `HANDOFF_LATENCY_BOUNDS[i]` seconds.
    pub buckets: [u64; 12],
    /// Fetches in all.
    pub count: u64,
    /// Their total time, in microseconds.
    pub sum_us: u64,
}

impl LatencyHistogram {
    /// Counts one fetch of `secs` seconds.
    pub fn observe(&mut self, secs: f64) {
        count_in(&mut self.buckets, &HANDOFF_LATENCY_BOUNDS, secs);
        self.count += 1;
        self.sum_us += (secs.max(0.0) * 1e6) as u64;
    }

    /// Bucket-wise sum.
    pub fn add(&mut self, o: &Self) {
        add_buckets(&mut self.buckets, &o.buckets);
        self.count += o.count;
        self.sum_us += o.sum_us;
    }
}

/// Counts an observation of `secs` seconds in the cumulative `buckets` of `bounds` (every
/// bucket whose bound it does not exceed), as Prometheus histograms count.
pub(crate) fn count_in(buckets: &mut [u64], bounds: &[f64], secs: f64) {
    for (b, bound) in buckets.iter_mut().zip(bounds) {
        if secs <= *bound {
            *b += 1;
        }
    }
}

/// Adds `other`'s bucket counts to `buckets`.
pub(crate) fn add_buckets(buckets: &mut [u64], other: &[u64]) {
    for (a, b) in buckets.iter_mut().zip(other) {
        *a += b;
    }
}

/// Handoff figures of one replica (a prefill replica counts rooms, a decode replica counts the
/// pages it received).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct HandoffStats {
    /// Rooms published and not yet released.
    pub active_rooms: u64,
    /// Pages moved (counted by the decode side).
    pub pages_transferred: u64,
    /// Bytes moved (counted by the decode side).
    pub bytes_transferred: u64,
    /// Fetches that went over TCP.
    pub tcp_transfers: u64,
    /// Fetches served in process.
    pub in_process_transfers: u64,
    /// Fetches whose bytes moved through NIXL (host memory).
    pub nixl_transfers: u64,
    /// Fetches that moved GPU to GPU inside one process.
    pub gpu_in_process_transfers: u64,
    /// Fetches that moved GPU to GPU through CUDA IPC.
    pub cuda_ipc_transfers: u64,
    /// Fetches that moved GPU to GPU through NIXL (VRAM).
    pub nixl_vram_transfers: u64,
    /// Bytes that moved GPU to GPU without touching host memory (part of `bytes_transferred`).
    pub gpu_bytes_transferred: u64,
    /// GPU-to-GPU fetches refused by the platform (CUDA IPC) that went through host memory.
    pub gpu_fallbacks: u64,
    /// Handoffs that failed (prefill, fetch or import).
    pub failed: u64,
    /// Rooms freed because their lease ran out.
    pub expired_leases: u64,
    /// Prompts short enough to leave to the decode replica (`max_local_prefill_tokens`),
    /// counted by the prefill replica that left them.
    #[serde(default)]
    pub local_prefills: u64,
    /// Prompts a decode replica computed itself, without a handoff: the short ones left to it
    /// and, with `prefill_fallback`, whole requests (counted by the decode replica).
    #[serde(default)]
    pub decode_prompts: u64,
    /// Prompt pages reused from a snapshot cache instead of computed (counted by the prefill
    /// replica that reused them).
    pub snapshot_hits: u64,
    /// Of those, pages fetched from another replica's snapshot cache.
    pub snapshot_remote_hits: u64,
    /// Pages held in this replica's snapshot cache.
    pub snapshot_pages: u64,
    /// Bytes held in this replica's snapshot cache.
    pub snapshot_bytes: u64,
    /// Pages evicted from the snapshot cache to make room.
    pub snapshot_evictions: u64,
    /// How long page fetches took (counted by the decode side).
    pub latency: LatencyHistogram,
}

impl HandoffStats {
    /// The counters alone: the gauges (rooms and snapshot pages held now) at zero, for the
    /// counts of a replica that no longer answers.
    pub fn counters(&self) -> Self {
        Self { active_rooms: 0, snapshot_pages: 0, snapshot_bytes: 0, ..*self }
    }

    /// Field-wise sum, for a model's total over its replicas.
    pub fn add(&mut self, o: &Self) {
        self.active_rooms += o.active_rooms;
        self.pages_transferred += o.pages_transferred;
        self.bytes_transferred += o.bytes_transferred;
        self.tcp_transfers += o.tcp_transfers;
        self.in_process_transfers += o.in_process_transfers;
        self.nixl_transfers += o.nixl_transfers;
        self.gpu_in_process_transfers += o.gpu_in_process_transfers;
        self.cuda_ipc_transfers += o.cuda_ipc_transfers;
        self.nixl_vram_transfers += o.nixl_vram_transfers;
        self.gpu_bytes_transferred += o.gpu_bytes_transferred;
        self.gpu_fallbacks += o.gpu_fallbacks;
        self.failed += o.failed;
        self.expired_leases += o.expired_leases;
        self.local_prefills += o.local_prefills;
        self.decode_prompts += o.decode_prompts;
        self.snapshot_hits += o.snapshot_hits;
        self.snapshot_remote_hits += o.snapshot_remote_hits;
        self.snapshot_pages += o.snapshot_pages;
        self.snapshot_bytes += o.snapshot_bytes;
        self.snapshot_evictions += o.snapshot_evictions;
        self.latency.add(&o.latency);
    }
}
