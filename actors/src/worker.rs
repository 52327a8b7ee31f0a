//! The worker: one per node. It owns the node's devices, starts and stops replicas, and
//! heartbeats to the supervisor (which finds it, and it the supervisor, through process
//! groups, the only registry ractor_cluster shares between nodes).

use crate::error::ActorError;
use crate::node::Namespace;
use crate::protocol::{SupervisorMsg, WorkerMsg};
use crate::replica::{PullTimes, Replica, ReplicaArgs, ReplicaMsg};
use crate::spec::{HeldReplica, ReplicaSpec};
use crate::view::{GpuInfo, WorkerInfo};
use crate::wire::{Wire, answer};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort, SpawnErr, SupervisionEvent};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use xinf_transfer::sync::lock;

mod memory;
#[cfg(test)]
mod tests;

/// A replica slot on the worker, with the spec it was started from (which heartbeats report)
/// and the host memory reserved for it (see [`memory`]).
enum Slot {
    /// Its engine is loading; `cancelled` when a stop arrived meanwhile.
    Loading { cancelled: bool, spec: Box<ReplicaSpec>, host_bytes: u64 },
    /// It serves.
    Running { actor: ActorRef<ReplicaMsg>, spec: Box<ReplicaSpec>, host_bytes: u64 },
}

impl Slot {
    fn host_bytes(&self) -> u64 {
        match self {
            Self::Loading { host_bytes, .. } | Self::Running { host_bytes, .. } => *host_bytes,
        }
    }

    fn held(&self) -> HeldReplica {
        match self {
            Self::Loading { spec, .. } => HeldReplica { spec: (**spec).clone(), serving: false },
            Self::Running { spec, .. } => HeldReplica { spec: (**spec).clone(), serving: true },
        }
    }
}

type Slots = Arc<Mutex<HashMap<String, Slot>>>;

/// Time settings of a worker.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WorkerTimes {
    pub(crate) heartbeat_interval: Duration,
    pub(crate) stop_timeout: Duration,
    pub(crate) pull: PullTimes,
    pub(crate) handoff: crate::replica::handoff::HandoffTimes,
}

/// The worker actor.
pub(crate) struct Worker {
    pub(crate) ns: Namespace,
    pub(crate) info: WorkerInfo,
    pub(crate) times: WorkerTimes,
    /// The engines this node offers.
    pub(crate) engines: xinf_engine::Engines,
}

/// The worker's state: its replica slots (shared with the tasks that load replicas).
pub(crate) struct WorkerState {
    slots: Slots,
}

/// The supervisor, found through its process group.
fn supervisor(ns: &Namespace) -> Option<ActorRef<SupervisorMsg>> {
    ractor::pg::get_members(&ns.supervisor_group()).into_iter().next().map(Into::into)
}

/// The typed error inside a failed spawn: a replica's `pre_start` fails with an [`ActorError`].
fn spawn_error(e: SpawnErr) -> ActorError {
    match e {
        SpawnErr::StartupFailed(inner) => match inner.downcast_ref::<ActorError>() {
            Some(e) => e.clone(),
            None => ActorError::Internal(format!("the replica failed to start: {inner}")),
        },
        other => ActorError::Internal(format!("the replica failed to start: {other}")),
    }
}

impl Actor for Worker {
    type Msg = WorkerMsg;
    type State = WorkerState;
    type Arguments = ();

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        _args: (),
    ) -> Result<Self::State, ActorProcessingErr> {
        for group in self.groups() {
            ractor::pg::join(group, vec![myself.get_cell()]);
        }
        myself.send_interval(self.times.heartbeat_interval, || WorkerMsg::Tick);
        Ok(WorkerState { slots: Arc::new(Mutex::new(HashMap::new())) })
    }

    async fn post_start(
        &self,
        myself: ActorRef<Self::Msg>,
        _state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        // Register at once rather than after the first interval.
        if myself.cast(WorkerMsg::Tick).is_err() {
            tracing::debug!("the worker stopped before its first heartbeat");
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let running: Vec<ActorRef<ReplicaMsg>> = lock(&state.slots)
            .drain()
            .filter_map(|(_, s)| match s {
                Slot::Running { actor, .. } => Some(actor),
                Slot::Loading { .. } => None,
            })
            .collect();
        for actor in running {
            if let Err(e) =
                actor.stop_and_wait(Some("worker stopped".into()), Some(self.times.stop_timeout)).await
            {
                tracing::warn!(error = %e, "a replica did not stop in time");
            }
        }
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            WorkerMsg::Tick => match supervisor(&self.ns) {
                Some(sup) => {
                    let replicas: Vec<HeldReplica> = lock(&state.slots).values().map(Slot::held).collect();
                    let beat = SupervisorMsg::Heartbeat {
                        info: Wire::ok(self.info.clone()),
                        replicas: Wire::ok(replicas),
                    };
                    if sup.cast(beat).is_err() {
                        tracing::debug!("the supervisor did not take a heartbeat");
                    }
                }
                None => tracing::debug!("no supervisor in sight for the heartbeat"),
            },
            WorkerMsg::Superseded => {
                tracing::error!(
                    worker_id = %self.info.worker_id,
                    "another worker process took over this worker's id while this one was out of sight; stopping"
                );
                for group in self.groups() {
                    ractor::pg::leave(group, vec![myself.get_cell()]);
                }
                myself.stop(Some("superseded by another process under its id".into()));
            }
            WorkerMsg::SpawnReplica { spec, reply } => match spec.0 {
                Err(e) => answer(reply, Wire(Err(e))),
                Ok(spec) => self.spawn_replica(&myself, state, *spec, reply),
            },
            WorkerMsg::StopReplica { replica_uid, reply } => {
                let mut slots = lock(&state.slots);
                match slots.get_mut(&replica_uid) {
                    None => answer(reply, Wire::ok(false)),
                    Some(Slot::Loading { cancelled, .. }) => {
                        // The loading task stops it when its engine is up.
                        *cancelled = true;
                        answer(reply, Wire::ok(true));
                    }
                    Some(Slot::Running { .. }) => {
                        if let Some(Slot::Running { actor, .. }) = slots.remove(&replica_uid) {
                            let timeout = self.times.stop_timeout;
                            tokio::spawn(async move {
                                if let Err(e) = actor
                                    .stop_and_wait(Some("stopped by the supervisor".into()), Some(timeout))
                                    .await
                                {
                                    tracing::warn!(%replica_uid, error = %e, "a replica did not stop in time");
                                }
                                answer(reply, Wire::ok(true));
                            });
                        }
                    }
                }
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        _myself: ActorRef<Self::Msg>,
        event: SupervisionEvent,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let (cell, why) = match &event {
            SupervisionEvent::ActorTerminated(cell, _, reason) => (cell, reason.clone().unwrap_or_default()),
            SupervisionEvent::ActorFailed(cell, e) => (cell, e.to_string()),
            _ => return Ok(()),
        };
        // A replica stopped without being asked to: tell the supervisor.
        let id = cell.get_id();
        let dead = {
            let mut slots = lock(&state.slots);
            let uid = slots.iter().find_map(|(uid, s)| match s {
                Slot::Running { actor, .. } if actor.get_id() == id => Some(uid.clone()),
                _ => None,
            });
            uid.and_then(|uid| match slots.remove(&uid) {
                Some(Slot::Running { spec, .. }) => Some((spec.model_uid, uid)),
                _ => None,
            })
        };
        if let Some((model_uid, replica_uid)) = dead {
            tracing::warn!(%model_uid, %replica_uid, reason = %why, "a replica stopped unexpectedly");
            if let Some(sup) = supervisor(&self.ns)
                && sup.cast(SupervisorMsg::ReplicaDied { model_uid, replica_uid }).is_err()
            {
                tracing::warn!("could not report a dead replica to the supervisor");
            }
        }
        Ok(())
    }
}

impl Worker {
    /// The process groups the worker is found through: its id's, every worker's, and its
    /// process's own.
    fn groups(&self) -> [String; 3] {
        [
            self.ns.worker_group(&self.info.worker_id),
            self.ns.workers_group(),
            self.ns.worker_instance_group(&self.info.worker_id, self.info.instance),
        ]
    }

    fn spawn_replica(
        &self,
        myself: &ActorRef<WorkerMsg>,
        state: &mut WorkerState,
        spec: ReplicaSpec,
        reply: RpcReplyPort<Wire<()>>,
    ) {
        let uid = spec.replica_uid.clone();
        {
            let mut slots = lock(&state.slots);
            if slots.contains_key(&uid) {
                answer(
                    reply,
                    Wire(Err(ActorError::Internal(format!(
                        "replica `{uid}` already exists on worker {}",
                        self.info.worker_id
                    )))),
                );
                return;
            }
            let loading = Slot::Loading { cancelled: false, spec: Box::new(spec.clone()), host_bytes: 0 };
            slots.insert(uid.clone(), loading);
        }
        let slots = state.slots.clone();
        let cell = myself.get_cell();
        let name = self.ns.replica_name(&uid);
        let args = ReplicaArgs {
            group: self.ns.replica_group(&uid),
            tracker_group: self.ns.tracker_group(&spec.model_uid),
            worker_id: self.info.worker_id.clone(),
            times: self.times.pull,
            ip: self.info.host.parse().unwrap_or(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST)),
            handoff: self.times.handoff,
            engines: self.engines.clone(),
            spec,
        };
        let stop_timeout = self.times.stop_timeout;
        let (memory, worker_id) = (self.info.memory, self.info.worker_id.clone());
        let model_uid = args.spec.model_uid.clone();
        // Load off the mailbox: heartbeats must keep flowing while a model loads.
        tokio::spawn(async move {
            if let Err(e) = reserve_memory(&slots, &args, memory, &worker_id).await {
                lock(&slots).remove(&uid);
                return answer(reply, Wire(Err(e)));
            }
            // Stopped before its weights load: nothing to load.
            if drop_if_cancelled(&slots, &uid) {
                return answer(reply, Wire(Err(ActorError::LaunchCancelled(model_uid))));
            }
            let outcome = match Actor::spawn_linked(Some(name), Replica, args, cell).await {
                Ok((actor, _)) => {
                    if start_running(&slots, &uid, &actor) {
                        Ok(())
                    } else {
                        if let Err(e) = actor
                            .stop_and_wait(Some("cancelled while loading".into()), Some(stop_timeout))
                            .await
                        {
                            tracing::warn!(replica_uid = %uid, error = %e, "a cancelled replica did not stop in time");
                        }
                        Err(ActorError::LaunchCancelled(model_uid))
                    }
                }
                Err(e) => {
                    lock(&slots).remove(&uid);
                    Err(spawn_error(e))
                }
            };
            answer(reply, Wire(outcome));
        });
    }
}

/// Whether replica `uid` was stopped while it waited to load; its slot is then removed.
fn drop_if_cancelled(slots: &Slots, uid: &str) -> bool {
    let mut slots = lock(slots);
    let cancelled = matches!(slots.get(uid), Some(Slot::Loading { cancelled: true, .. }));
    if cancelled {
        slots.remove(uid);
    }
    cancelled
}

/// Turns replica `uid`'s slot from loading to running with its actor; `false` when it was
/// stopped while it loaded (the slot is gone then, and the actor must be stopped).
fn start_running(slots: &Slots, uid: &str, actor: &ActorRef<ReplicaMsg>) -> bool {
    let mut slots = lock(slots);
    match slots.remove(uid) {
        Some(Slot::Loading { cancelled: false, spec, host_bytes }) => {
            slots.insert(uid.to_owned(), Slot::Running { actor: actor.clone(), spec, host_bytes });
            true
        }
        _ => false,
    }
}

/// Reserves in the replica's slot the host memory it needs, if the worker's memory holds it
/// beside the other replicas' reservations (see [`memory`]).
async fn reserve_memory(
    slots: &Slots,
    args: &ReplicaArgs,
    memory: Option<u64>,
    worker_id: &str,
) -> Result<(), ActorError> {
    let (engines, spec) = (args.engines.clone(), args.spec.clone());
    let need = tokio::task::spawn_blocking(move || memory::need(&engines, &spec))
        .await
        .map_err(|e| ActorError::Internal(format!("sizing the replica's memory: {e}")))??;
    let mut slots = lock(slots);
    let uid = &args.spec.replica_uid;
    let held: u64 = slots.iter().filter(|(u, _)| *u != uid).map(|(_, s)| s.host_bytes()).sum();
    memory::admit(memory, held, need, uid, worker_id)?;
    if let Some(Slot::Loading { host_bytes, .. }) = slots.get_mut(uid) {
        *host_bytes = need;
    }
    Ok(())
}

impl WorkerInfo {
    /// A worker's description from the process environment and the GPU driver.
    pub(crate) fn from_env(worker_id: String, host: String) -> Result<Self, ActorError> {
        let var = |name: &str| std::env::var(name).ok();
        let gpu_details = detect_gpus(var("XINF_GPUS").as_deref(), var("CUDA_VISIBLE_DEVICES").as_deref())?;
        Ok(Self {
            worker_id,
            host,
            gpus: gpu_details.iter().map(|g| g.index).collect(),
            gpu_details,
            allow_gpu_sharing: allow_gpu_sharing(var("XINF_ALLOW_MULTI_REPLICA_PER_GPU").as_deref()),
            memory: memory::worker_memory(var("XINF_WORKER_MEMORY").as_deref())?,
            instance: rand::random::<u64>().max(1),
        })
    }
}

/// The GPU indexes a worker may use, from the first source that says: `XINF_GPUS` (a comma
/// list of indexes, or `none`: explicit, and what tests use to pretend a CPU machine has GPUs),
/// else the number of GPUs the NVIDIA driver sees (`driver_count`, in builds with the `cuda`
/// feature where the driver loads; the driver already applies `CUDA_VISIBLE_DEVICES`), else as
/// many as `CUDA_VISIBLE_DEVICES` lists (which renumbers them from 0), else none.
pub(crate) fn visible_gpus(
    xinf_gpus: Option<&str>,
    driver_count: Option<u32>,
    cuda_visible: Option<&str>,
) -> Result<Vec<u32>, ActorError> {
    if let Some(list) = xinf_gpus.map(str::trim).filter(|s| !s.is_empty()) {
        if list.eq_ignore_ascii_case("none") || list == "-1" {
            return Ok(Vec::new());
        }
        let mut out = Vec::new();
        for part in list.split(',').map(str::trim) {
            let idx: u32 = part.parse().map_err(|_| ActorError::InvalidConfig {
                field: "XINF_GPUS".into(),
                reason: format!("`{part}` is not a GPU index (expected a comma list such as 0,1, or none)"),
            })?;
            if out.contains(&idx) {
                return Err(ActorError::InvalidConfig {
                    field: "XINF_GPUS".into(),
                    reason: format!("GPU {idx} is listed twice"),
                });
            }
            out.push(idx);
        }
        return Ok(out);
    }
    if let Some(n) = driver_count {
        return Ok((0..n).collect());
    }
    match cuda_visible.map(str::trim) {
        None | Some("") => Ok(Vec::new()),
        Some(list) if list.starts_with("-1") => Ok(Vec::new()),
        Some(list) => Ok((0..list.split(',').filter(|s| !s.trim().is_empty()).count() as u32).collect()),
    }
}

/// The GPUs `indexes` with their names and memory where the driver described them.
pub(crate) fn describe_gpus(indexes: &[u32], driver: &[GpuInfo]) -> Vec<GpuInfo> {
    indexes
        .iter()
        .map(|&i| driver.iter().find(|g| g.index == i).cloned().unwrap_or_else(|| GpuInfo::index_only(i)))
        .collect()
}

/// The GPUs this worker may use (see [`visible_gpus`] for the order of the sources), with the
/// driver's description of each where it has one.
pub(crate) fn detect_gpus(
    xinf_gpus: Option<&str>,
    cuda_visible: Option<&str>,
) -> Result<Vec<GpuInfo>, ActorError> {
    let driver = driver_gpus();
    let indexes = visible_gpus(xinf_gpus, driver.as_ref().map(|d| d.len() as u32), cuda_visible)?;
    let driver = driver.unwrap_or_default();
    for i in indexes.iter().filter(|i| !driver.is_empty() && !driver.iter().any(|g| g.index == **i)) {
        tracing::warn!(
            gpu = i,
            driver_gpus = driver.len(),
            "XINF_GPUS lists a GPU the NVIDIA driver does not see"
        );
    }
    let gpus = describe_gpus(&indexes, &driver);
    tracing::info!(gpus = ?gpus.iter().map(|g| g.index).collect::<Vec<_>>(), "worker GPUs");
    Ok(gpus)
}

/// The GPUs the NVIDIA driver sees; `None` without a driver (logged, never a panic: the
/// driver is probed before any call into it).
#[cfg(feature = "cuda")]
fn driver_gpus() -> Option<Vec<GpuInfo>> {
    match xinf_transfer::gpu::devices() {
        Ok(devices) => Some(
            devices
                .into_iter()
                .map(|d| GpuInfo { index: d.ordinal, name: Some(d.name), total_memory: Some(d.total_memory) })
                .collect(),
        ),
        Err(xinf_transfer::gpu::GpuError::NoDriver) => {
            tracing::info!("no NVIDIA driver (libcuda.so could not be loaded): no GPUs from the driver");
            None
        }
        Err(e) => {
            tracing::info!(error = %e, "the NVIDIA driver did not list its GPUs: no GPUs from the driver");
            None
        }
    }
}

/// A build without the `cuda` feature does not ask a driver.
#[cfg(not(feature = "cuda"))]
fn driver_gpus() -> Option<Vec<GpuInfo>> {
    None
}

/// Whether `XINF_ALLOW_MULTI_REPLICA_PER_GPU` allows several replicas on one GPU.
pub(crate) fn allow_gpu_sharing(value: Option<&str>) -> bool {
    value.is_some_and(|v| ["1", "true", "yes"].iter().any(|t| v.trim().eq_ignore_ascii_case(t)))
}
