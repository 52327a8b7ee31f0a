//! The public face of the actor layer: [`Cluster`] (what the REST layer and embedders call),
//! [`WorkerNode`] (a worker process's handle) and the views they return.

use crate::block_tracker::BlockTrackerHandle;
use crate::cluster::{self, Namespace};
use crate::error::ActorError;
use crate::launch::{LaunchRequest, Role};
use crate::pull::{self, PullSettings};
use crate::replica::{PullTimes, ReplicaMsg};
use crate::router::RouterMsg;
use crate::supervisor::{ModelActors, ModelTable, Supervisor, SupervisorMsg, SupervisorTimes};
use crate::wire::{JsonWire, Wire, call, call_local};
use crate::worker::{self, Worker, WorkerMsg, WorkerTimes};
use ractor::{Actor, ActorRef};
use ractor_cluster::NodeServerMessage;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use xinf_engine::{GenerateRequest, TokenStream};

/// The lifecycle of a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ModelStatus {
    /// Replicas are loading; requests get [`ActorError::NotReady`].
    Launching,
    /// Serving.
    Ready,
    /// No replica is alive (their workers were lost).
    Error,
    /// Being torn down.
    Terminating,
}

impl fmt::Display for ModelStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Launching => "launching",
            Self::Ready => "ready",
            Self::Error => "error",
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
    /// The share of its GPU's memory it may take (`engine_config.gpu_memory_utilization`),
    /// which lets replicas share a GPU.
    pub gpu_memory_utilization: Option<f64>,
    /// Its status.
    pub status: ReplicaStatus,
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
    /// Its replicas.
    pub replicas: Vec<ReplicaInfo>,
    /// When its launch began, in seconds since the Unix epoch.
    pub created: u64,
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
}

impl WorkerInfo {
    /// A worker's description from the process environment and the GPU driver.
    fn from_env(worker_id: String, host: String) -> Result<Self, ActorError> {
        let var = |name: &str| std::env::var(name).ok();
        let gpu_details =
            worker::detect_gpus(var("XINF_GPUS").as_deref(), var("CUDA_VISIBLE_DEVICES").as_deref())?;
        Ok(Self {
            worker_id,
            host,
            gpus: gpu_details.iter().map(|g| g.index).collect(),
            gpu_details,
            allow_gpu_sharing: worker::allow_gpu_sharing(var("XINF_ALLOW_MULTI_REPLICA_PER_GPU").as_deref()),
        })
    }
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
    /// Requests being computed.
    pub running: u64,
    /// Requests waiting for admission.
    pub queued: u64,
    /// Requests accepted since the replica started.
    pub requests_served: u64,
    /// Prompt tokens computed since start.
    pub prompt_tokens: u64,
    /// Tokens generated since start.
    pub generated_tokens: u64,
    /// KV blocks held pinned for handoffs.
    pub pinned_blocks: u64,
    /// Handoff figures (P/D replicas).
    pub handoff: crate::HandoffStats,
}

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
            prefill_timeout: Duration::from_secs(300),
            transfer_timeout: Duration::from_secs(30),
            handoff_lease: Duration::from_secs(30),
            handoff_idle_lease: Duration::from_secs(10),
            transport: xinf_transfer::transport::TransportPolicy::Auto,
            snapshot_cache_bytes: 512 << 20,
            engines: xinf_engine::Engines::default(),
        }
    }
}

impl ClusterOptions {
    fn supervisor_times(&self) -> SupervisorTimes {
        SupervisorTimes {
            heartbeat_check: (self.heartbeat_timeout / 4).max(Duration::from_millis(50)),
            heartbeat_timeout: self.heartbeat_timeout,
            call: self.call_timeout,
            load: self.load_timeout,
            stop: self.stop_timeout,
        }
    }

    fn worker_times(&self) -> WorkerTimes {
        WorkerTimes {
            heartbeat_interval: self.heartbeat_interval,
            stop_timeout: self.stop_timeout,
            pull: PullTimes { long_poll: self.long_poll, idle_abort: self.idle_abort },
            handoff: crate::replica::handoff::HandoffTimes {
                leases: crate::replica::rooms::Leases {
                    unclaimed: self.handoff_lease,
                    claimed_idle: self.handoff_idle_lease,
                },
                transfer: self.transfer_timeout,
                policy: self.transport,
                snapshot_budget: self.snapshot_cache_bytes,
            },
        }
    }
}

struct Inner {
    ns: Namespace,
    supervisor: ActorRef<SupervisorMsg>,
    models: Arc<ModelTable>,
    options: ClusterOptions,
    local_worker: Option<ActorRef<WorkerMsg>>,
    node: Option<ActorRef<NodeServerMessage>>,
    address: Option<String>,
    closed: AtomicBool,
}

/// A handle on a running cluster, held on the supervisor's node. Cheap to clone; every clone
/// drives the same cluster.
#[derive(Clone)]
pub struct Cluster {
    inner: Arc<Inner>,
}

impl fmt::Debug for Cluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cluster").field("address", &self.inner.address).finish_non_exhaustive()
    }
}

/// A request id for a request that came without one.
fn new_request_id() -> String {
    format!("req-{:032x}", rand::random::<u128>())
}

async fn spawn_supervisor(
    ns: &Namespace,
    local_mode: bool,
    models: Arc<ModelTable>,
    options: &ClusterOptions,
) -> Result<ActorRef<SupervisorMsg>, ActorError> {
    let sup = Supervisor {
        ns: ns.clone(),
        local_mode,
        models,
        times: options.supervisor_times(),
        engines: options.engines.clone(),
    };
    Actor::spawn(Some(ns.supervisor_name()), sup, ())
        .await
        .map(|(actor, _)| actor)
        .map_err(|e| ActorError::Node(format!("starting the supervisor: {e}")))
}

async fn spawn_worker(
    ns: &Namespace,
    info: WorkerInfo,
    options: &ClusterOptions,
) -> Result<ActorRef<WorkerMsg>, ActorError> {
    let name = ns.worker_name(&info.worker_id);
    let worker =
        Worker { ns: ns.clone(), info, times: options.worker_times(), engines: options.engines.clone() };
    Actor::spawn(Some(name), worker, ())
        .await
        .map(|(actor, _)| actor)
        .map_err(|e| ActorError::Node(format!("starting the worker: {e}")))
}

/// Polls the supervisor until it lists `worker_id`.
async fn wait_registered(
    supervisor: &ActorRef<SupervisorMsg>,
    worker_id: &str,
    options: &ClusterOptions,
) -> Result<(), ActorError> {
    let deadline = tokio::time::Instant::now() + options.join_timeout;
    loop {
        let workers = call(supervisor, "supervisor", options.call_timeout, |reply| {
            SupervisorMsg::ListWorkers { reply }
        })
        .await?;
        if workers.iter().any(|w| w.info.worker_id == worker_id && w.alive) {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(ActorError::Timeout {
                what: format!("registration of worker {worker_id}"),
                after_ms: options.join_timeout.as_millis() as u64,
            });
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

impl Cluster {
    /// Runs a supervisor and one worker in this process (`xinf local`), without any network
    /// listener, offering `engines`. Call from within a tokio multi-thread runtime.
    pub async fn start_local(engines: xinf_engine::Engines) -> Result<Self, ActorError> {
        Self::start_local_with(ClusterOptions { engines, ..ClusterOptions::default() }).await
    }

    /// [`start_local`](Self::start_local) with explicit options.
    pub async fn start_local_with(options: ClusterOptions) -> Result<Self, ActorError> {
        let ns = Namespace::local();
        let models = Arc::new(ModelTable::default());
        let supervisor = spawn_supervisor(&ns, true, models.clone(), &options).await?;
        let info = WorkerInfo::from_env("local".into(), "127.0.0.1".into())?;
        let worker = match spawn_worker(&ns, info, &options).await {
            Ok(w) => w,
            Err(e) => {
                supervisor.stop(None);
                return Err(e);
            }
        };
        let cluster = Self {
            inner: Arc::new(Inner {
                ns,
                supervisor,
                models,
                options,
                local_worker: Some(worker),
                node: None,
                address: None,
                closed: AtomicBool::new(false),
            }),
        };
        if let Err(e) = wait_registered(&cluster.inner.supervisor, "local", &cluster.inner.options).await {
            cluster.shutdown().await;
            return Err(e);
        }
        Ok(cluster)
    }

    /// Runs the supervisor of a multi-node cluster in this process, listening for workers on
    /// `host:cluster_port` (port 0 picks a free one; see [`address`](Self::address)). Workers
    /// must present the same `secret`. `host` must be an address the workers can reach; a
    /// wildcard (`0.0.0.0`, `::`) is refused.
    /// Launches may name the `engines` given.
    pub async fn start_supervisor(
        host: &str,
        cluster_port: u16,
        secret: &str,
        engines: xinf_engine::Engines,
    ) -> Result<Self, ActorError> {
        let options = ClusterOptions { engines, ..ClusterOptions::default() };
        Self::start_supervisor_with(host, cluster_port, secret, options).await
    }

    /// [`start_supervisor`](Self::start_supervisor) with explicit options.
    pub async fn start_supervisor_with(
        host: &str,
        cluster_port: u16,
        secret: &str,
        options: ClusterOptions,
    ) -> Result<Self, ActorError> {
        cluster::check_secret(secret)?;
        let ip = cluster::listen_ip(host)?;
        let port = if cluster_port == 0 { cluster::free_port(ip)? } else { cluster_port };
        let ns = Namespace::from_secret(secret);
        let node = cluster::start_node("xinf-supervisor", ip, port, secret).await?;
        let models = Arc::new(ModelTable::default());
        let supervisor = match spawn_supervisor(&ns, false, models.clone(), &options).await {
            Ok(s) => s,
            Err(e) => {
                node.stop(None);
                return Err(e);
            }
        };
        Ok(Self {
            inner: Arc::new(Inner {
                ns,
                supervisor,
                models,
                options,
                local_worker: None,
                node: Some(node),
                address: Some(SocketAddr::new(ip, port).to_string()),
                closed: AtomicBool::new(false),
            }),
        })
    }

    /// Runs a worker in this process and joins the supervisor at `supervisor_addr`
    /// (`host:port`). The worker listens on `host` (a free port) for the supervisor's node, and
    /// loads replicas with the `engines` given.
    pub async fn start_worker(
        supervisor_addr: &str,
        host: &str,
        secret: &str,
        engines: xinf_engine::Engines,
    ) -> Result<WorkerNode, ActorError> {
        let options = ClusterOptions { engines, ..ClusterOptions::default() };
        Self::start_worker_with(supervisor_addr, host, secret, options).await
    }

    /// [`start_worker`](Self::start_worker) with explicit options.
    pub async fn start_worker_with(
        supervisor_addr: &str,
        host: &str,
        secret: &str,
        options: ClusterOptions,
    ) -> Result<WorkerNode, ActorError> {
        cluster::check_secret(secret)?;
        let ip = cluster::listen_ip(host)?;
        let port = cluster::free_port(ip)?;
        let worker_id = SocketAddr::new(ip, port).to_string();
        let ns = Namespace::from_secret(secret);
        let info = WorkerInfo::from_env(worker_id.clone(), ip.to_string())?;
        let node = cluster::start_node(&format!("xinf-worker-{worker_id}"), ip, port, secret).await?;
        let joined = async {
            cluster::connect(&node, supervisor_addr, options.join_timeout).await?;
            tracing::debug!(%supervisor_addr, "connected to the supervisor node");
            let sup = cluster::wait_for_member(&ns.supervisor_group(), options.join_timeout)
                .await
                .ok_or_else(|| ActorError::Join {
                    addr: supervisor_addr.to_owned(),
                    reason: "no supervisor answered; check that both sides use the same secret".into(),
                })?;
            let sup: ActorRef<SupervisorMsg> = sup.into();
            tracing::debug!(remote = !sup.get_id().is_local(), "found the supervisor");
            let worker = spawn_worker(&ns, info, &options).await?;
            if let Err(e) = wait_registered(&sup, &worker_id, &options).await {
                worker.stop(None);
                return Err(e);
            }
            Ok(worker)
        }
        .await;
        match joined {
            Ok(worker) => Ok(WorkerNode { worker, node, worker_id, stop_timeout: options.stop_timeout }),
            Err(e) => {
                node.stop(None);
                Err(e)
            }
        }
    }

    /// The address workers join (`ip:port`), in cluster mode.
    pub fn address(&self) -> Option<&str> {
        self.inner.address.as_deref()
    }

    fn open(&self) -> Result<(), ActorError> {
        if self.inner.closed.load(Ordering::Acquire) { Err(ActorError::ShuttingDown) } else { Ok(()) }
    }

    fn timeout(&self) -> Duration {
        self.inner.options.call_timeout
    }

    /// Validates and launches a model; returns its uid once every replica is loaded and its
    /// router exists. On any failure nothing of the model is left behind.
    pub async fn launch(&self, request: LaunchRequest) -> Result<String, ActorError> {
        self.open()?;
        let o = &self.inner.options;
        // Loading, plus creating and (on failure) destroying the other actors.
        let limit = o.load_timeout + 2 * o.call_timeout + 2 * o.stop_timeout;
        call(&self.inner.supervisor, "supervisor", limit, |reply| SupervisorMsg::Launch {
            request: JsonWire(Ok(Box::new(request))),
            detach: false,
            reply,
        })
        .await
    }

    /// Validates and places a model, starts loading it, and returns its uid without waiting
    /// for the replicas: the model is `launching` (requests get [`ActorError::NotReady`]) until
    /// it serves. A validation failure is returned as from [`launch`](Self::launch); a later
    /// failure rolls the launch back, and the model disappears from the list.
    pub async fn launch_detached(&self, request: LaunchRequest) -> Result<String, ActorError> {
        self.open()?;
        call(&self.inner.supervisor, "supervisor", self.timeout(), |reply| SupervisorMsg::Launch {
            request: JsonWire(Ok(Box::new(request))),
            detach: true,
            reply,
        })
        .await
    }

    /// Terminates a model: its router, block tracker and replicas.
    pub async fn terminate(&self, model_uid: &str) -> Result<(), ActorError> {
        let o = &self.inner.options;
        let limit = 2 * o.call_timeout + 3 * o.stop_timeout;
        call(&self.inner.supervisor, "supervisor", limit, |reply| SupervisorMsg::Terminate {
            model_uid: model_uid.to_owned(),
            reply,
        })
        .await
    }

    /// Every model.
    pub async fn list_models(&self) -> Result<Vec<ModelInfo>, ActorError> {
        call(&self.inner.supervisor, "supervisor", self.timeout(), |reply| SupervisorMsg::ListModels {
            reply,
        })
        .await
    }

    /// One model: status and replicas.
    pub async fn get_model(&self, model_uid: &str) -> Result<ModelInfo, ActorError> {
        call(&self.inner.supervisor, "supervisor", self.timeout(), |reply| SupervisorMsg::GetModel {
            model_uid: model_uid.to_owned(),
            reply,
        })
        .await
    }

    /// Every worker that ever registered.
    pub async fn list_workers(&self) -> Result<Vec<WorkerStatus>, ActorError> {
        call(&self.inner.supervisor, "supervisor", self.timeout(), |reply| SupervisorMsg::ListWorkers {
            reply,
        })
        .await
    }

    /// Changes a model's replica count. Refused for now: a P/D deployment's topology is fixed
    /// for its life, and resizing hybrid deployments is not implemented.
    pub async fn scale(&self, model_uid: &str, _replica: u32) -> Result<(), ActorError> {
        call(&self.inner.supervisor, "supervisor", self.timeout(), |reply| SupervisorMsg::Scale {
            model_uid: model_uid.to_owned(),
            reply,
        })
        .await
    }

    /// The local actors of a serving model, or why there are none.
    async fn serving(&self, model_uid: &str) -> Result<ModelActors, ActorError> {
        self.open()?;
        if let Some(actors) = self.inner.models.get(model_uid) {
            return Ok(actors);
        }
        let info = self.get_model(model_uid).await?;
        Err(match info.status {
            ModelStatus::Error => ActorError::NoReplica(model_uid.to_owned()),
            status => ActorError::NotReady { model_uid: model_uid.to_owned(), status: status.to_string() },
        })
    }

    /// Starts a request on one of the model's replicas (round-robin) and returns its events.
    /// An empty `request_id` gets a generated one; an id already running is refused.
    /// Dropping the stream aborts the request.
    pub async fn generate(
        &self,
        model_uid: &str,
        mut request: GenerateRequest,
    ) -> Result<TokenStream, ActorError> {
        let actors = self.serving(model_uid).await?;
        if request.request_id.trim().is_empty() {
            request.request_id = new_request_id();
        }
        let request_id = request.request_id.clone();
        let t = self.timeout();
        let routed = call_local(&actors.router, "router", t, |reply| RouterMsg::Route {
            request_id: request_id.clone(),
            reply,
        })
        .await?;
        let mut replicas = vec![routed.replica.clone()];
        replicas.extend(routed.prefill.as_ref().map(|(_, r)| r.clone()));
        let mut guard = RequestGuard {
            router: Some(actors.router.clone()),
            replicas,
            request_id: request_id.clone(),
            timeout: t,
        };
        let started = match routed.prefill.clone() {
            None => {
                let what = format!("replica `{}`", routed.replica_uid);
                call(&routed.replica, &what, t, |reply| ReplicaMsg::Generate {
                    request: Wire::ok(request),
                    reply,
                })
                .await
            }
            Some((prefill_uid, prefill)) => {
                self.handoff(&prefill_uid, &prefill, &routed.replica_uid, &routed.replica, request).await
            }
        };
        guard.router = None;
        guard.replicas.clear();
        if let Err(e) = started {
            if actors.router.cast(RouterMsg::Finished { request_id }).is_err() {
                tracing::debug!("the router is gone");
            }
            return Err(e);
        }
        let settings = PullSettings { long_poll: self.inner.options.long_poll, call: t };
        Ok(pull::open(routed, actors.router, settings))
    }

    /// The P/D start of a request: the prefill replica computes the prompt (one token, the
    /// request's sampling) and publishes its KV in a room; the decode replica fetches the
    /// pages, imports them and starts generating; then the room is released. Whatever fails,
    /// the prefill side is told (release), and a caller that goes away mid-way aborts the
    /// prefill (the caller's guard); a lost message is covered by the room's lease.
    async fn handoff(
        &self,
        prefill_uid: &str,
        prefill: &ActorRef<ReplicaMsg>,
        decode_uid: &str,
        decode: &ActorRef<ReplicaMsg>,
        request: GenerateRequest,
    ) -> Result<(), ActorError> {
        let o = &self.inner.options;
        let mut first = request.clone();
        first.sampling.max_tokens = Some(1);
        let what = format!("prefill replica `{prefill_uid}`");
        let handoff = call(prefill, &what, o.prefill_timeout, |reply| ReplicaMsg::Prefill {
            request: Wire::ok(first),
            reply,
        })
        .await?;
        let room = handoff.room;
        let what = format!("decode replica `{decode_uid}`");
        let limit = o.transfer_timeout + o.call_timeout;
        let started = call(decode, &what, limit, |reply| ReplicaMsg::GenerateImported {
            request: Wire::ok(request),
            handoff: Wire::ok(Box::new(handoff)),
            reply,
        })
        .await;
        // The pages were read (or will never be): free them on the prefill side, off the
        // request's path. A lost release is covered by the room's lease.
        let release = prefill.clone();
        let (t, what) = (o.call_timeout, format!("prefill replica `{prefill_uid}`"));
        tokio::spawn(async move {
            if let Err(e) = call(&release, &what, t, |reply| ReplicaMsg::Release { room, reply }).await {
                tracing::warn!(room, error = %e, "could not release a handoff room; its lease will");
            }
        });
        started
    }

    /// Aborts a request on every replica of the model; `true` when one was running it.
    pub async fn abort(&self, model_uid: &str, request_id: &str) -> Result<bool, ActorError> {
        let actors = self.serving(model_uid).await?;
        // The fan-out itself calls every replica with the call time limit.
        call_local(&actors.router, "router", 2 * self.timeout(), |reply| RouterMsg::Abort {
            request_id: request_id.to_owned(),
            reply,
        })
        .await
    }

    /// Load figures of every alive replica of the model, by replica uid.
    pub async fn stats(&self, model_uid: &str) -> Result<Vec<ReplicaStats>, ActorError> {
        let actors = self.serving(model_uid).await?;
        let t = self.timeout();
        let replicas = call_local(&actors.router, "router", t, |reply| RouterMsg::Replicas { reply }).await?;
        let calls = replicas.iter().map(|(uid, replica)| async move {
            call(replica, &format!("replica `{uid}`"), t, |reply| ReplicaMsg::Stats { reply }).await
        });
        let mut out = Vec::new();
        for result in futures::future::join_all(calls).await {
            match result {
                Ok(s) => out.push(s),
                Err(e) => tracing::warn!(error = %e, "a replica did not report its stats"),
            }
        }
        Ok(out)
    }

    /// The block tracker of a serving model.
    pub async fn block_tracker(&self, model_uid: &str) -> Result<BlockTrackerHandle, ActorError> {
        let actors = self.serving(model_uid).await?;
        Ok(BlockTrackerHandle::new(actors.tracker, self.timeout()))
    }

    /// Names of this cluster's actors alive in this process (supervisor, workers, replicas,
    /// routers, block trackers). For tests and diagnosis: a failed launch leaves none behind.
    pub fn debug_actor_names(&self) -> Vec<String> {
        let mut names: Vec<String> =
            ractor::registry::registered().into_iter().filter(|n| self.inner.ns.owns(n)).collect();
        names.sort();
        names
    }

    /// Terminates every model, then stops the supervisor, the local worker and the node
    /// listener. Later calls fail with [`ActorError::ShuttingDown`].
    pub async fn shutdown(&self) {
        if self.inner.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        if let Ok(models) = self.list_models().await {
            for m in models {
                if let Err(e) = self.terminate(&m.model_uid).await {
                    tracing::warn!(model_uid = %m.model_uid, error = %e, "could not terminate a model");
                }
            }
        }
        let stop = Some(self.inner.options.stop_timeout);
        if let Err(e) = self.inner.supervisor.stop_and_wait(Some("shutdown".into()), stop).await {
            tracing::warn!(error = %e, "the supervisor did not stop in time");
        }
        if let Some(worker) = &self.inner.local_worker {
            if let Err(e) = worker.stop_and_wait(Some("shutdown".into()), stop).await {
                tracing::warn!(error = %e, "the worker did not stop in time");
            }
        }
        if let Some(node) = &self.inner.node {
            node.stop(Some("shutdown".into()));
        }
    }
}

/// Cleans up after a request whose caller went away before it started (the client
/// disconnected while the prompt was computed or the pages moved): the router forgets it and
/// it is aborted on its replicas, which also frees any room already published for it.
struct RequestGuard {
    router: Option<ActorRef<RouterMsg>>,
    replicas: Vec<ActorRef<ReplicaMsg>>,
    request_id: String,
    timeout: Duration,
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        if let Some(router) = self.router.take()
            && router.cast(RouterMsg::Finished { request_id: self.request_id.clone() }).is_err()
        {
            tracing::debug!("the router is gone");
        }
        let (replicas, timeout) = (std::mem::take(&mut self.replicas), self.timeout);
        let Ok(rt) = tokio::runtime::Handle::try_current() else { return };
        for replica in replicas {
            let request_id = self.request_id.clone();
            rt.spawn(async move {
                let abort =
                    call(&replica, "replica", timeout, |reply| ReplicaMsg::Abort { request_id, reply });
                if let Err(e) = abort.await {
                    tracing::debug!(error = %e, "could not abort an abandoned request");
                }
            });
        }
    }
}

/// A worker running in this process, joined to a supervisor.
pub struct WorkerNode {
    worker: ActorRef<WorkerMsg>,
    node: ActorRef<NodeServerMessage>,
    worker_id: String,
    stop_timeout: Duration,
}

impl fmt::Debug for WorkerNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkerNode").field("worker_id", &self.worker_id).finish_non_exhaustive()
    }
}

impl WorkerNode {
    /// The worker's id in the cluster (`ip:port`), which `replica_config[i].devices[0].worker_ip`
    /// names.
    pub fn worker_id(&self) -> &str {
        &self.worker_id
    }

    /// Stops the worker (and its replicas) and leaves the cluster.
    pub async fn shutdown(self) {
        if let Err(e) = self.worker.stop_and_wait(Some("shutdown".into()), Some(self.stop_timeout)).await {
            tracing::warn!(error = %e, "the worker did not stop in time");
        }
        self.node.stop(Some("shutdown".into()));
    }
}
