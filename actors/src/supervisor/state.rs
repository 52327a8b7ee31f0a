//! The supervisor's registry, as a pure state machine: workers with their devices and last
//! heartbeat, models with their replicas, placement, and what a lost worker takes down.
//!
//! Time comes in as an argument, so every transition is unit-tested without clocks or actors.

use crate::error::ActorError;
use crate::launch::{self, ClusterView, GpuTenant, LaunchSpec, Placement, ScaleRequest, WorkerSlot};
use crate::spec::{ModelCommon, Role};
use crate::view::{GpuUsage, ModelInfo, ModelStatus, ReplicaInfo, ReplicaStatus, WorkerInfo, WorkerStatus};
use recovery::{Ended, Retry};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

mod recovery;
mod removal;
#[cfg(test)]
mod tests;

pub(crate) use recovery::Reconciled;
pub(crate) use removal::Removal;

/// A replica that stopped serving.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LostReplica {
    pub(crate) model_uid: String,
    pub(crate) replica_uid: String,
}

#[derive(Debug, Clone)]
struct WorkerRecord {
    info: WorkerInfo,
    last_seen: Instant,
    alive: bool,
    /// It is stopping: nothing new is placed on it while its replicas finish their requests.
    draining: bool,
    /// The replicas it drains, as (model uid, replica uid), kept while a replacement takes one's
    /// place in its model: the worker waits for the requests of all of them.
    drained: BTreeSet<(String, String)>,
    /// The last other process whose heartbeats under this id were refused.
    refused: Option<u64>,
}

/// Workers and models of one cluster.
#[derive(Debug)]
pub(crate) struct SupervisorState {
    workers: BTreeMap<String, WorkerRecord>,
    models: BTreeMap<String, ModelInfo>,
    /// Each model's validated launch, which a scale-up copies replicas from.
    specs: BTreeMap<String, LaunchSpec>,
    /// Each placed replica's own one-replica spec, which its replacement is copied from.
    placed_from: BTreeMap<String, LaunchSpec>,
    /// Dead replicas whose replacement is loading, with the replacement's uid.
    replacing: BTreeMap<String, String>,
    /// Models whose last replacement failed, with when to try again.
    retry: BTreeMap<String, Retry>,
    /// Models being rebuilt from the replicas a worker reported (after a restart).
    adopting: BTreeSet<String>,
    /// Replicas being removed from their models (they drain, then stop): not replaced.
    removing: BTreeSet<String>,
    /// Replicas of ended models and replaced replicas: a worker that still reports one is
    /// told to stop it.
    ended: Ended,
    round_robin: usize,
}

/// What a scale-up task starts from: where the new replicas go, the model's source and handoff
/// settings, and the model's other replicas (alive) with their roles.
#[derive(Debug, Clone)]
pub(crate) struct ScalePlan {
    pub(crate) placements: Vec<Placement>,
    pub(crate) common: ModelCommon,
    pub(crate) others: Vec<(String, Role)>,
}

impl SupervisorState {
    /// An empty registry.
    pub(crate) fn new() -> Self {
        Self {
            workers: BTreeMap::new(),
            models: BTreeMap::new(),
            specs: BTreeMap::new(),
            placed_from: BTreeMap::new(),
            replacing: BTreeMap::new(),
            retry: BTreeMap::new(),
            adopting: BTreeSet::new(),
            removing: BTreeSet::new(),
            ended: Ended::default(),
            round_robin: 0,
        }
    }

    /// Records a heartbeat; `true` when the worker is new or comes back after being lost.
    pub(crate) fn heartbeat(&mut self, info: WorkerInfo, now: Instant) -> bool {
        match self.workers.get_mut(&info.worker_id) {
            Some(w) => {
                let revived = !w.alive;
                w.info = info;
                w.last_seen = now;
                w.alive = true;
                // A worker back from lost is a new process: it drains no more.
                if revived {
                    w.draining = false;
                    w.drained.clear();
                    self.retry.clear();
                }
                revived
            }
            None => {
                self.workers.insert(
                    info.worker_id.clone(),
                    WorkerRecord {
                        info,
                        last_seen: now,
                        alive: true,
                        draining: false,
                        drained: BTreeSet::new(),
                        refused: None,
                    },
                );
                // Room for replacements that waited for some: try them at once.
                self.retry.clear();
                true
            }
        }
    }

    /// Whether `info` comes from another process than the alive worker of its id: a second
    /// worker started under a running one's id, or one that froze, was counted lost and
    /// replaced under its id by a new process, and thawed. Its heartbeats are not taken.
    /// `Some(true)` the first time that process is seen (worth a warning), `Some(false)` after.
    pub(crate) fn other_instance(&mut self, info: &WorkerInfo) -> Option<bool> {
        let w =
            self.workers.get_mut(&info.worker_id).filter(|w| w.alive && w.info.instance != info.instance)?;
        Some(w.refused.replace(info.instance) != Some(info.instance))
    }

    /// Ids of the workers believed alive.
    pub(crate) fn alive_workers(&self) -> Vec<String> {
        self.workers.values().filter(|w| w.alive).map(|w| w.info.worker_id.clone()).collect()
    }

    /// Declares lost every alive worker not heard from for longer than `timeout`.
    pub(crate) fn expire(&mut self, now: Instant, timeout: Duration) -> Vec<LostReplica> {
        let late: Vec<String> = self
            .workers
            .values()
            .filter(|w| w.alive && now.saturating_duration_since(w.last_seen) > timeout)
            .map(|w| w.info.worker_id.clone())
            .collect();
        late.iter().flat_map(|id| self.lose_worker(id)).collect()
    }

    /// Marks a worker lost and every replica on it dead. A model left without an alive replica
    /// turns to `Error`; models elsewhere are untouched.
    pub(crate) fn lose_worker(&mut self, worker_id: &str) -> Vec<LostReplica> {
        match self.workers.get_mut(worker_id) {
            Some(w) if w.alive => w.alive = false,
            _ => return Vec::new(),
        }
        let mut lost = Vec::new();
        for model in self.models.values_mut() {
            for r in model.replicas.iter_mut().filter(|r| r.worker_id == worker_id) {
                if r.status != ReplicaStatus::Dead {
                    r.status = ReplicaStatus::Dead;
                    lost.push(LostReplica {
                        model_uid: model.model_uid.clone(),
                        replica_uid: r.replica_uid.clone(),
                    });
                }
            }
            settle(model);
        }
        lost
    }

    /// Marks a worker draining (it is stopping; see [`view`](Self::view)) and its serving
    /// replicas too, which [`begin_replacements`](Self::begin_replacements) then replaces on
    /// other workers while they finish their requests. Returns the replicas on it that are not
    /// dead (or were, and have been replaced since the drain began), as (model uid, replica
    /// uid), which their routers take out of rotation and count the requests of.
    pub(crate) fn drain_worker(&mut self, worker_id: &str) -> Vec<(String, String)> {
        let Some(w) = self.workers.get_mut(worker_id).filter(|w| w.alive) else { return Vec::new() };
        w.draining = true;
        for model in self.models.values_mut() {
            for r in model.replicas.iter_mut().filter(|r| r.worker_id == worker_id) {
                if r.status == ReplicaStatus::Alive {
                    r.status = ReplicaStatus::Draining;
                }
                if r.status != ReplicaStatus::Dead {
                    w.drained.insert((model.model_uid.clone(), r.replica_uid.clone()));
                }
            }
            settle(model);
        }
        w.drained.iter().cloned().collect()
    }

    /// Whether `worker_id` is alive and draining.
    fn is_draining(&self, worker_id: &str) -> bool {
        self.workers.get(worker_id).is_some_and(|w| w.alive && w.draining)
    }

    /// Marks one replica dead (its actor failed); `None` when it was not alive.
    pub(crate) fn replica_dead(&mut self, model_uid: &str, replica_uid: &str) -> Option<LostReplica> {
        let model = self.models.get_mut(model_uid)?;
        let r = model.replicas.iter_mut().find(|r| r.replica_uid == replica_uid)?;
        if r.status == ReplicaStatus::Dead {
            return None;
        }
        r.status = ReplicaStatus::Dead;
        settle(model);
        Some(LostReplica { model_uid: model_uid.to_owned(), replica_uid: replica_uid.to_owned() })
    }

    /// The replicas (not dead) on each GPU of each worker: a dead replica, or one of a model
    /// that terminated or whose launch failed, frees its GPU and its memory share at once.
    fn gpu_tenants(&self) -> BTreeMap<&str, BTreeMap<u32, Vec<GpuTenant>>> {
        let mut out: BTreeMap<&str, BTreeMap<u32, Vec<GpuTenant>>> = BTreeMap::new();
        for model in self.models.values() {
            for r in model.replicas.iter().filter(|r| r.status != ReplicaStatus::Dead) {
                let slot = out.entry(r.worker_id.as_str()).or_default();
                for g in &r.gpus {
                    slot.entry(*g).or_default().push(GpuTenant {
                        model_uid: model.model_uid.clone(),
                        replica_uid: r.replica_uid.clone(),
                        fraction: r.gpu_memory_utilization,
                    });
                }
            }
        }
        out
    }

    /// The cluster as placement sees it: the alive workers (a draining one takes nothing new).
    pub(crate) fn view(&self) -> ClusterView {
        let occupied = self.gpu_tenants();
        let mut replica_uids = BTreeMap::new();
        let mut replicas: BTreeMap<&str, usize> = BTreeMap::new();
        for model in self.models.values() {
            for r in &model.replicas {
                replica_uids.insert(r.replica_uid.clone(), model.model_uid.clone());
                if r.status != ReplicaStatus::Dead {
                    *replicas.entry(r.worker_id.as_str()).or_default() += 1;
                }
            }
        }
        let workers = self
            .workers
            .values()
            .filter(|w| w.alive)
            .map(|w| WorkerSlot {
                worker_id: w.info.worker_id.clone(),
                host: w.info.host.clone(),
                gpus: w.info.gpus.clone(),
                allow_gpu_sharing: w.info.allow_gpu_sharing,
                occupied: occupied.get(w.info.worker_id.as_str()).cloned().unwrap_or_default(),
                replicas: replicas.get(w.info.worker_id.as_str()).copied().unwrap_or_default(),
                draining: w.draining,
            })
            .collect();
        ClusterView { workers, replica_uids, round_robin: self.round_robin }
    }

    /// The replica uids a new replica of a running model may not take: those in use, and those
    /// ended (replaced, removed, or of a drained worker), which a process that was out of sight
    /// or still drains may hold yet. A reused uid would have that process taken for the new
    /// replica, or a drain meant for the old one applied to the new one.
    fn taken_uids(&self, view: &ClusterView) -> BTreeMap<String, String> {
        let mut taken = view.replica_uids.clone();
        for uid in self.ended.iter() {
            taken.entry(uid.clone()).or_default();
        }
        taken
    }

    /// Validates a launch against the cluster, places it and records the model as `Launching`,
    /// which reserves its uid, replica uids and GPUs. `suffix` makes a uid when the request
    /// gives none and the model name is taken.
    pub(crate) fn begin_launch(
        &mut self,
        spec: &LaunchSpec,
        model_name: &str,
        suffix: impl FnOnce() -> String,
    ) -> Result<(String, Vec<Placement>), ActorError> {
        let uid = match &spec.model_uid {
            Some(uid) if self.is_terminating(uid) => return Err(ActorError::Terminating(uid.clone())),
            Some(uid) if self.models.contains_key(uid) => return Err(ActorError::ModelExists(uid.clone())),
            Some(uid) => uid.clone(),
            None if self.models.contains_key(model_name) => format!("{model_name}-{}", suffix()),
            None => model_name.to_owned(),
        };
        if self.models.contains_key(&uid) {
            return Err(ActorError::ModelExists(uid));
        }
        let (placements, next) = launch::place(spec, &uid, &self.view())?;
        self.round_robin = next;
        self.remember_drafts(spec, &placements);
        let replicas = placements.iter().map(loading).collect();
        self.specs.insert(uid.clone(), spec.clone());
        self.models.insert(
            uid.clone(),
            ModelInfo {
                model_uid: uid.clone(),
                model_name: model_name.to_owned(),
                status: ModelStatus::Launching,
                pd: spec.pd,
                prefill_fallback: spec.front.prefill_fallback,
                max_local_prefill_tokens: spec.handoff().local_prefill_tokens,
                replicas,
                created: now_secs(),
                source: spec.source.clone(),
            },
        );
        Ok((uid, placements))
    }

    /// A launch finished: the model serves. Returns the replicas that died while it launched,
    /// which the router must drop.
    pub(crate) fn finish_launch(&mut self, uid: &str) -> Vec<LostReplica> {
        let Some(model) = self.models.get_mut(uid) else { return Vec::new() };
        let mut dead = Vec::new();
        for r in &mut model.replicas {
            match r.status {
                ReplicaStatus::Loading => r.status = ReplicaStatus::Alive,
                ReplicaStatus::Dead => {
                    dead.push(LostReplica { model_uid: uid.to_owned(), replica_uid: r.replica_uid.clone() })
                }
                ReplicaStatus::Alive | ReplicaStatus::Draining => {}
            }
        }
        model.status = ModelStatus::Ready;
        settle(model);
        dead
    }

    /// A launch failed and was rolled back: forget the model entirely.
    pub(crate) fn abort_launch(&mut self, uid: &str) {
        self.forget_model(uid);
    }

    /// Forgets a model whose replicas were stopped; a worker that still reports one of them is
    /// told to stop it.
    fn forget_model(&mut self, uid: &str) {
        if let Some(model) = self.models.remove(uid) {
            for r in model.replicas {
                self.placed_from.remove(&r.replica_uid);
                self.replacing.remove(&r.replica_uid);
                self.ended.add(r.replica_uid);
            }
        }
        self.specs.remove(uid);
        self.retry.remove(uid);
    }

    /// Records the spec each placed replica came from (a uid placed again, after its model
    /// ended, is a new replica).
    fn remember_drafts(&mut self, spec: &LaunchSpec, placements: &[Placement]) {
        for (i, p) in placements.iter().enumerate() {
            self.ended.remove(&p.replica_uid);
            if let Some(one) = launch::one_replica(spec, i) {
                self.placed_from.insert(p.replica_uid.clone(), one);
            }
        }
    }

    /// Starts terminating a model that is still launching: it shows as terminating until its
    /// launch task reports (and fails, or is told to roll back). Returns its replicas as
    /// `(worker, replica)` pairs; `None` when the model is not launching.
    pub(crate) fn cancel_launch(&mut self, uid: &str) -> Option<Vec<(String, String)>> {
        let model = self.models.get_mut(uid).filter(|m| m.status == ModelStatus::Launching)?;
        model.status = ModelStatus::Terminating;
        Some(model.replicas.iter().map(|r| (r.worker_id.clone(), r.replica_uid.clone())).collect())
    }

    /// Whether a model is being terminated (a launch task reporting then was cancelled).
    pub(crate) fn is_terminating(&self, uid: &str) -> bool {
        self.models.get(uid).is_some_and(|m| m.status == ModelStatus::Terminating)
    }

    /// Starts terminating a model; returns its replicas as `(worker, replica)` pairs.
    pub(crate) fn begin_terminate(&mut self, uid: &str) -> Result<Vec<(String, String)>, ActorError> {
        let model = self.models.get_mut(uid).ok_or_else(|| ActorError::ModelNotFound(uid.to_owned()))?;
        match model.status {
            // A launching model is cancelled through `cancel_launch` instead.
            ModelStatus::Launching | ModelStatus::Terminating => {
                return Err(ActorError::NotReady {
                    model_uid: uid.to_owned(),
                    status: model.status.to_string(),
                });
            }
            ModelStatus::Ready | ModelStatus::Degraded | ModelStatus::Unavailable => {}
        }
        model.status = ModelStatus::Terminating;
        Ok(model.replicas.iter().map(|r| (r.worker_id.clone(), r.replica_uid.clone())).collect())
    }

    /// A model's actors are gone: forget it.
    pub(crate) fn finish_terminate(&mut self, uid: &str) {
        self.forget_model(uid);
    }

    /// Validates and places a scale-up of a serving model and records its new replicas as
    /// loading (which reserves their uids and GPUs).
    pub(crate) fn begin_scale(&mut self, uid: &str, request: &ScaleRequest) -> Result<ScalePlan, ActorError> {
        let model = self.models.get(uid).ok_or_else(|| ActorError::ModelNotFound(uid.to_owned()))?;
        // A model that lost replicas is scaled up like any serving one: that is how it recovers.
        if !model.status.launched() {
            return Err(ActorError::NotReady { model_uid: uid.to_owned(), status: model.status.to_string() });
        }
        let others = alive_roles(model);
        let spec = self.specs.get(uid).ok_or_else(|| ActorError::ModelNotFound(uid.to_owned()))?;
        let view = self.view();
        let scaled = launch::scale_spec(spec, uid, request, &self.taken_uids(&view))?;
        let (placements, next) = launch::place(&scaled, uid, &view)?;
        self.round_robin = next;
        self.remember_drafts(&scaled, &placements);
        let plan = ScalePlan { placements, common: scaled.common(), others };
        if let Some(model) = self.models.get_mut(uid) {
            model.replicas.extend(plan.placements.iter().map(loading));
        }
        Ok(plan)
    }

    /// A scale-up finished: its replicas serve (`ok`), or were stopped and are forgotten.
    /// Returns those that died while they loaded, which the router must drop.
    pub(crate) fn finish_scale(&mut self, uid: &str, replicas: &[String], ok: bool) -> Vec<LostReplica> {
        self.settle_replacements(uid, replicas, ok);
        let Some(model) = self.models.get_mut(uid) else { return Vec::new() };
        if !ok {
            model.replicas.retain(|r| !replicas.contains(&r.replica_uid));
            for r in replicas {
                self.placed_from.remove(r);
                self.ended.add(r.clone());
            }
            return Vec::new();
        }
        let mut dead = Vec::new();
        for r in model.replicas.iter_mut().filter(|r| replicas.contains(&r.replica_uid)) {
            match r.status {
                ReplicaStatus::Loading => r.status = ReplicaStatus::Alive,
                ReplicaStatus::Dead => {
                    dead.push(LostReplica { model_uid: uid.to_owned(), replica_uid: r.replica_uid.clone() })
                }
                ReplicaStatus::Alive | ReplicaStatus::Draining => {}
            }
        }
        settle(model);
        dead
    }

    /// One model.
    pub(crate) fn model(&self, uid: &str) -> Option<&ModelInfo> {
        self.models.get(uid)
    }

    /// Every model, by uid.
    pub(crate) fn models(&self) -> Vec<ModelInfo> {
        self.models.values().cloned().collect()
    }

    /// Every worker ever registered (lost ones marked), by id.
    pub(crate) fn workers(&self, now: Instant) -> Vec<WorkerStatus> {
        let tenants = self.gpu_tenants();
        self.workers
            .values()
            .map(|w| WorkerStatus {
                gpu_usage: w
                    .info
                    .gpus
                    .iter()
                    .map(|g| {
                        let on = tenants.get(w.info.worker_id.as_str()).and_then(|t| t.get(g));
                        GpuUsage {
                            index: *g,
                            replicas: on
                                .map_or_else(Vec::new, |t| t.iter().map(|t| t.replica_uid.clone()).collect()),
                            memory_fraction: on.map_or(0.0, |t| t.iter().filter_map(|t| t.fraction).sum()),
                        }
                    })
                    .collect(),
                info: w.info.clone(),
                alive: w.alive,
                draining: w.alive && w.draining,
                last_heartbeat_ms: now.saturating_duration_since(w.last_seen).as_millis() as u64,
                replicas: self
                    .models
                    .values()
                    .flat_map(|m| &m.replicas)
                    .filter(|r| r.worker_id == w.info.worker_id && r.status != ReplicaStatus::Dead)
                    .map(|r| r.replica_uid.clone())
                    .collect(),
            })
            .collect()
    }
}

/// A model's alive replicas with their roles (those a new replica's contract is checked against).
fn alive_roles(model: &ModelInfo) -> Vec<(String, Role)> {
    model
        .replicas
        .iter()
        .filter(|r| r.status == ReplicaStatus::Alive)
        .map(|r| (r.replica_uid.clone(), r.role))
        .collect()
}

/// Seconds since the Unix epoch.
fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default()
}

/// The layout a replica's engine options give, as `xinf list` shows it.
pub(crate) fn layout_name(engine: &str, config: &xinf_engine::EngineConfig) -> String {
    config.kv_layout(engine).map(|l| l.to_string()).unwrap_or_default()
}

/// A placed replica, loading.
fn loading(p: &Placement) -> ReplicaInfo {
    ReplicaInfo {
        replica_uid: p.replica_uid.clone(),
        role: p.role,
        worker_id: p.worker_id.clone(),
        gpus: p.gpus.clone(),
        engine: p.engine.clone(),
        gpu_memory_utilization: p.gpu_memory_utilization,
        status: ReplicaStatus::Loading,
        kv_layout: layout_name(&p.engine, &p.engine_config),
    }
}

/// A serving model is ready with every replica alive, degraded when some were lost or drain,
/// and unavailable when a role it needs (hybrid, or prefill and decode) has no alive replica;
/// with `prefill_fallback`, alive decode replicas stand in for the prefill ones.
fn settle(model: &mut ModelInfo) {
    if !model.status.launched() {
        return;
    }
    let alive = |role| model.replicas.iter().any(|r| r.role == role && r.status == ReplicaStatus::Alive);
    let served =
        |role| alive(role) || (role == Role::Prefill && model.prefill_fallback && alive(Role::Decode));
    // A P/D model needs both roles, even when it knows no replica of one (a restarted
    // supervisor that heard from one worker only).
    let pd_short = model.pd && !(served(Role::Prefill) && served(Role::Decode));
    model.status = if pd_short || model.replicas.iter().any(|r| !served(r.role)) {
        ModelStatus::Unavailable
    } else if model.replicas.iter().any(|r| matches!(r.status, ReplicaStatus::Dead | ReplicaStatus::Draining))
        || (model.pd && !alive(Role::Prefill))
    {
        // Or decode replicas stand in for the prefill ones (`prefill_fallback`).
        ModelStatus::Degraded
    } else {
        ModelStatus::Ready
    };
}
