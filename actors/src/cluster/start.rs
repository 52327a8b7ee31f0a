//! Starting a cluster node: local mode, a supervisor, or a worker that joins one.

use super::{Cluster, ClusterOptions, Inner};
use crate::error::ActorError;
use crate::node;
use crate::node::Namespace;
use crate::protocol::{SupervisorMsg, WorkerMsg};
use crate::supervisor::{ModelTable, Supervisor};
use crate::view::{WorkerInfo, WorkerStatus};
use crate::wire::call;
use crate::worker::Worker;
use ractor::{Actor, ActorRef};
use ractor_cluster::NodeServerMessage;
use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

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
        instances: Arc::default(),
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
) -> Result<(ActorRef<WorkerMsg>, tokio::task::JoinHandle<()>), ActorError> {
    let name = ns.worker_name(&info.worker_id);
    let worker =
        Worker { ns: ns.clone(), info, times: options.worker_times(), engines: options.engines.clone() };
    Actor::spawn(Some(name), worker, ())
        .await
        .map_err(|e| ActorError::Node(format!("starting the worker: {e}")))
}

/// Asks the supervisor for its workers until `check` decides, at most the join timeout: `check`
/// sees the list and whether the time is up, and must decide then.
async fn poll_workers<T>(
    supervisor: &ActorRef<SupervisorMsg>,
    options: &ClusterOptions,
    mut check: impl FnMut(&[WorkerStatus], bool) -> Option<Result<T, ActorError>>,
) -> Result<T, ActorError> {
    let deadline = tokio::time::Instant::now() + options.join_timeout;
    loop {
        let workers = call(supervisor, "supervisor", options.call_timeout, |reply| {
            SupervisorMsg::ListWorkers { reply }
        })
        .await?;
        if let Some(decided) = check(&workers, tokio::time::Instant::now() >= deadline) {
            return decided;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Polls the supervisor until it lists `worker_id` alive, from this process (`instance`).
async fn wait_registered(
    supervisor: &ActorRef<SupervisorMsg>,
    worker_id: &str,
    instance: u64,
    options: &ClusterOptions,
) -> Result<(), ActorError> {
    poll_workers(supervisor, options, |workers, late| {
        if workers.iter().any(|w| w.info.worker_id == worker_id && w.alive && w.info.instance == instance) {
            return Some(Ok(()));
        }
        late.then(|| {
            Err(ActorError::Timeout {
                what: format!("registration of worker {worker_id}"),
                after_ms: options.join_timeout.as_millis() as u64,
            })
        })
    })
    .await
}

/// Waits until the supervisor counts no worker of id `worker_id` alive, at most the join
/// timeout: a worker restarted under its id finds its earlier process counted alive until the
/// supervisor notices it gone (at once for a closed connection, within the heartbeat timeout
/// for a silent one). A worker of that id that stays alive is another process using it.
async fn wait_id_free(
    supervisor: &ActorRef<SupervisorMsg>,
    worker_id: &str,
    supervisor_addr: &str,
    options: &ClusterOptions,
) -> Result<(), ActorError> {
    poll_workers(supervisor, options, |workers, late| {
        let Some(other) = workers.iter().find(|w| w.info.worker_id == worker_id && w.alive) else {
            return Some(Ok(()));
        };
        late.then(|| {
            Err(ActorError::Join {
                addr: supervisor_addr.to_owned(),
                reason: format!(
                    "a worker with id `{worker_id}` (on {}) is connected to the supervisor already; give \
                     this one another `--worker-id`, or stop that one",
                    other.info.host
                ),
            })
        })
    })
    .await
}

impl Cluster {
    /// Runs a supervisor and one worker in this process (`xinf local`), without any network
    /// listener, offering `engines`. Call from within a tokio multi-thread runtime.
    pub async fn start_local(engines: xinf_engine::Engines) -> Result<Self, ActorError> {
        Self::start_local_with(ClusterOptions { engines, ..ClusterOptions::default() }).await
    }

    /// [`start_local`](Self::start_local) with explicit options.
    pub async fn start_local_with(options: ClusterOptions) -> Result<Self, ActorError> {
        // One process: a key of its own (engine servers it starts are given it).
        xinf_transfer::transport::set_process_key(xinf_transfer::transport::PageKey::random());
        let ns = Namespace::local();
        let models = Arc::new(ModelTable::default());
        let supervisor = spawn_supervisor(&ns, true, models.clone(), &options).await?;
        let info = WorkerInfo::from_env("local".into(), "127.0.0.1".into())?;
        let instance = info.instance;
        let worker = match spawn_worker(&ns, info, &options).await {
            Ok((w, _)) => w,
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
        if let Err(e) =
            wait_registered(&cluster.inner.supervisor, "local", instance, &cluster.inner.options).await
        {
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
        node::check_secret(secret)?;
        page_key(secret);
        let ip = node::listen_ip(host)?;
        let port = if cluster_port == 0 { node::free_port(ip)? } else { cluster_port };
        let ns = Namespace::from_secret(secret);
        let node = node::start_node("xinf-supervisor", ip, port, secret).await?;
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
        node::check_secret(secret)?;
        page_key(secret);
        let ip = node::listen_ip(host)?;
        let port = match options.worker_port {
            0 => node::free_port(ip)?,
            port => port,
        };
        let worker_id = match &options.worker_id {
            Some(id) => node::check_worker_id(id)?.to_owned(),
            None => SocketAddr::new(ip, port).to_string(),
        };
        let ns = Namespace::from_secret(secret);
        let info = WorkerInfo::from_env(worker_id.clone(), ip.to_string())?;
        // The node's name is this process's own: a second process under a running worker's id
        // is another node to the supervisor's, which would otherwise drop one of the two
        // sessions for the other, over and over, as both reconnect.
        let instance = info.instance;
        let node_name = format!("xinf-worker-{worker_id}-{instance:016x}");
        let node = node::start_node(&node_name, ip, port, secret).await?;
        let joined = async {
            node::connect(&node, supervisor_addr, options.join_timeout).await?;
            tracing::debug!(%supervisor_addr, "connected to the supervisor node");
            let sup = node::wait_for_member(&ns.supervisor_group(), options.join_timeout).await.ok_or_else(
                || ActorError::Join {
                    addr: supervisor_addr.to_owned(),
                    reason: format!(
                        "the node there took the secret, but no supervisor of this cluster showed within {} ms",
                        options.join_timeout.as_millis()
                    ),
                },
            )?;
            let sup: ActorRef<SupervisorMsg> = sup.into();
            tracing::debug!(remote = !sup.get_id().is_local(), "found the supervisor");
            wait_id_free(&sup, &worker_id, supervisor_addr, &options).await?;
            let worker = spawn_worker(&ns, info, &options).await?;
            if let Err(e) = wait_registered(&sup, &worker_id, instance, &options).await {
                worker.0.stop(None);
                return Err(e);
            }
            Ok(worker)
        }
        .await;
        match joined {
            Ok((worker, done)) => {
                let rejoin = tokio::spawn(stay_joined(
                    node.clone(),
                    supervisor_addr.to_owned(),
                    ns.clone(),
                    options.heartbeat_interval,
                ));
                Ok(WorkerNode {
                    worker,
                    done: Some(done),
                    node,
                    worker_id,
                    supervisor_group: ns.supervisor_group(),
                    times: WorkerNodeTimes {
                        stop: options.stop_timeout,
                        call: options.call_timeout,
                        drain: options.drain_timeout,
                    },
                    rejoin,
                })
            }
            Err(e) => {
                node.stop(None);
                Err(e)
            }
        }
    }
}

/// A worker running in this process, joined to a supervisor.
pub struct WorkerNode {
    worker: ActorRef<WorkerMsg>,
    /// Ends when the worker actor stops.
    done: Option<tokio::task::JoinHandle<()>>,
    node: ActorRef<NodeServerMessage>,
    worker_id: String,
    supervisor_group: String,
    times: WorkerNodeTimes,
    /// The task that reconnects to the supervisor when it goes out of sight.
    rejoin: tokio::task::JoinHandle<()>,
}

#[derive(Debug, Clone, Copy)]
struct WorkerNodeTimes {
    stop: Duration,
    call: Duration,
    drain: Duration,
}

/// How often a draining worker asks how many requests are left.
const DRAIN_POLL: Duration = Duration::from_millis(200);

/// The first wait before reconnecting to a supervisor out of sight; it doubles up to
/// [`MAX_REJOIN_WAIT`] while the supervisor stays away.
const FIRST_REJOIN_WAIT: Duration = Duration::from_millis(250);
const MAX_REJOIN_WAIT: Duration = Duration::from_secs(8);

/// Keeps a worker's node connected to the supervisor's: when the supervisor leaves sight (it
/// restarted, or the network dropped the connection), connects again with growing waits. The
/// worker's heartbeats then reach the supervisor, with the replicas it holds, which a restarted
/// supervisor adopts.
///
/// A new connection is opened only while the node holds no session with the supervisor's: a
/// second session of one node is refused by the supervisor, or replaces the first.
async fn stay_joined(node: ActorRef<NodeServerMessage>, addr: String, ns: Namespace, interval: Duration) {
    let mut wait = FIRST_REJOIN_WAIT;
    loop {
        tokio::time::sleep(interval).await;
        if !ractor::pg::get_members(&ns.supervisor_group()).is_empty() {
            wait = FIRST_REJOIN_WAIT;
            continue;
        }
        if node::has_outbound_session(&node).await {
            // Connected; the supervisor's group list has not arrived yet.
            continue;
        }
        tracing::warn!(supervisor = %addr, "the supervisor is out of sight; reconnecting");
        let mut last_error = String::new();
        while !node::has_outbound_session(&node).await {
            match node::connect(&node, &addr, MAX_REJOIN_WAIT).await {
                Ok(()) => {
                    tracing::info!(supervisor = %addr, "reconnected to the supervisor");
                    break;
                }
                Err(e) => {
                    // Said once while it stays the same: a supervisor restarted with another
                    // secret is worth a line, not one every eight seconds.
                    let error = e.to_string();
                    if error != last_error {
                        tracing::warn!(supervisor = %addr, %error, "reconnecting failed; trying again");
                    } else {
                        tracing::debug!(supervisor = %addr, %error, ?wait, "reconnecting failed");
                    }
                    last_error = error;
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(MAX_REJOIN_WAIT);
                }
            }
        }
        // The supervisor's group arrives over the new connection shortly after.
        node::wait_for_member(&ns.supervisor_group(), MAX_REJOIN_WAIT).await;
    }
}

impl fmt::Debug for WorkerNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkerNode").field("worker_id", &self.worker_id).finish_non_exhaustive()
    }
}

impl Drop for WorkerNode {
    fn drop(&mut self) {
        self.rejoin.abort();
    }
}

impl WorkerNode {
    /// The worker's id in the cluster (`ip:port`), which `replica_config[i].devices[0].worker_ip`
    /// names.
    pub fn worker_id(&self) -> &str {
        &self.worker_id
    }

    /// Resolves when the worker stops on its own: another process took over its id while this
    /// one was out of sight (frozen, cut off), and the supervisor told it to stop. Its replicas
    /// are stopped then; the process has nothing left to do.
    pub async fn stopped(&mut self) {
        if let Some(done) = self.done.as_mut() {
            let _ = done.await;
            self.done = None;
        }
    }

    /// Lets the requests running on this worker's replicas finish before a
    /// [`shutdown`](Self::shutdown): the supervisor routes nothing new to them and places
    /// nothing here, and this waits until no request uses them, at most the drain timeout
    /// ([`ClusterOptions::drain_timeout`]). Returns the number of requests still running (0
    /// when drained; the count it last heard when the time ran out or the supervisor could
    /// not be asked).
    pub async fn drain(&self) -> u64 {
        let deadline = tokio::time::Instant::now() + self.times.drain;
        let mut told = None;
        loop {
            // Without a supervisor nothing routes requests here.
            let Some(sup) = ractor::pg::get_members(&self.supervisor_group).into_iter().next() else {
                return 0;
            };
            let sup: ActorRef<SupervisorMsg> = sup.into();
            let worker_id = self.worker_id.clone();
            let asked = call(&sup, "supervisor", self.times.call, |reply| SupervisorMsg::DrainWorker {
                worker_id,
                reply,
            })
            .await;
            let running = match asked {
                Ok(0) => return 0,
                Ok(n) => n,
                Err(e) => {
                    tracing::warn!(error = %e, "the supervisor could not be asked to drain this worker");
                    return told.unwrap_or_default();
                }
            };
            if told != Some(running) {
                tracing::info!(running, "waiting for the requests running on this worker's replicas");
                told = Some(running);
            }
            let now = tokio::time::Instant::now();
            if now >= deadline {
                tracing::warn!(running, drain_timeout = ?self.times.drain, "requests still run after the drain timeout");
                let after_ms = u64::try_from(self.times.drain.as_millis()).unwrap_or(u64::MAX);
                let worker_id = self.worker_id.clone();
                let told = call(&sup, "supervisor", self.times.call, |reply| SupervisorMsg::DrainTimedOut {
                    worker_id,
                    after_ms,
                    reply,
                })
                .await;
                if let Err(e) = told {
                    tracing::debug!(error = %e, "the supervisor did not hear that the drain time ran out");
                }
                return running;
            }
            tokio::time::sleep(DRAIN_POLL.min(deadline - now)).await;
        }
    }

    /// Stops the worker (and its replicas, with the requests they run: [`drain`](Self::drain)
    /// first lets those finish) and leaves the cluster.
    pub async fn shutdown(self) {
        if let Err(e) = self.worker.stop_and_wait(Some("shutdown".into()), Some(self.times.stop)).await {
            tracing::warn!(error = %e, "the worker did not stop in time");
        }
        self.node.stop(Some("shutdown".into()));
    }
}

/// Sets this process's page-plane key from the cluster's secret: every process of the cluster
/// then serves and fetches pages with the others, and with no one else. A process serves one
/// cluster's page plane: a second cluster of another secret in it is warned about.
fn page_key(secret: &str) {
    use xinf_transfer::transport::{PageKey, set_process_key};
    if !set_process_key(PageKey::from_secret(secret)) {
        tracing::warn!(
            "this process already serves another cluster's page plane: page fetches with this cluster's \
             other processes will be refused"
        );
    }
}
