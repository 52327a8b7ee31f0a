//! Recovery in the registry: what a worker's heartbeat says it holds against what the
//! supervisor believes (replicas gone, replicas to adopt after the supervisor restarted,
//! replicas to stop), and replacing replicas that died.
//!
//! A supervisor keeps no state on disk: after a restart its workers reconnect and report the
//! replicas they hold, each with the launch request it came from, and the models are rebuilt
//! from those reports. A replica the supervisor ended (its model terminated, or it was replaced
//! while its worker was away) is remembered for a while, so that a worker reporting it is told
//! to stop it instead of having it adopted again.

use super::{LostReplica, ScalePlan, SupervisorState, settle};
use crate::error::ActorError;
use crate::launch::{self, LaunchSpec, ScaleRequest};
use crate::spec::{HeldReplica, ReplicaSpec, Role};
use crate::view::{ModelInfo, ModelStatus, ReplicaInfo, ReplicaStatus};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

/// How many ended replica uids are remembered.
const ENDED_KEPT: usize = 4096;
/// The first wait after a replacement failed; it doubles up to [`MAX_RETRY`].
const FIRST_RETRY: Duration = Duration::from_secs(1);
const MAX_RETRY: Duration = Duration::from_secs(60);

/// Replica uids the supervisor ended, oldest first, at most [`ENDED_KEPT`].
#[derive(Debug, Default)]
pub(super) struct Ended {
    order: VecDeque<String>,
    set: BTreeSet<String>,
}

impl Ended {
    pub(super) fn add(&mut self, uid: String) {
        if self.set.insert(uid.clone()) {
            self.order.push_back(uid);
        }
        while self.order.len() > ENDED_KEPT {
            if let Some(old) = self.order.pop_front() {
                self.set.remove(&old);
            }
        }
    }

    /// A uid placed again is no longer ended.
    pub(super) fn remove(&mut self, uid: &str) {
        if self.set.remove(uid) {
            self.order.retain(|u| u != uid);
        }
    }

    fn contains(&self, uid: &str) -> bool {
        self.set.contains(uid)
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = &String> {
        self.set.iter()
    }
}

/// When a model's next replacement may be tried: `at` is set at the first tick after a
/// failure, `step` doubles with each failure.
#[derive(Debug, Clone, Copy)]
pub(super) struct Retry {
    at: Option<Instant>,
    step: Duration,
}

/// What a heartbeat's replica list asks of the supervisor.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Reconciled {
    /// Replicas believed alive on the worker that it no longer holds: dead now.
    pub(crate) gone: Vec<LostReplica>,
    /// Replicas it serves of models this supervisor does not know (it restarted), by model:
    /// each such model is rebuilt from them ([`SupervisorState::begin_adopt`]).
    pub(crate) unknown_models: BTreeMap<String, Vec<ReplicaSpec>>,
    /// Replicas it serves that a known model takes back (now recorded as loading): the model's
    /// router must have them added.
    pub(crate) rejoined: BTreeMap<String, Vec<(String, Role)>>,
    /// Replicas it must stop: their model ended, or they were replaced.
    pub(crate) stop: Vec<String>,
}

impl SupervisorState {
    /// Compares what worker `worker_id` says it holds with what this registry believes.
    pub(crate) fn reconcile(&mut self, worker_id: &str, held: &[HeldReplica]) -> Reconciled {
        let mut out = Reconciled::default();
        let held_uids: BTreeSet<&str> = held.iter().map(|h| h.spec.replica_uid.as_str()).collect();
        for model in self.models.values_mut().filter(|m| m.status.launched()) {
            let mut changed = false;
            for r in model.replicas.iter_mut().filter(|r| {
                r.worker_id == worker_id
                    && matches!(r.status, ReplicaStatus::Alive | ReplicaStatus::Draining)
                    && !held_uids.contains(r.replica_uid.as_str())
            }) {
                r.status = ReplicaStatus::Dead;
                changed = true;
                out.gone.push(LostReplica {
                    model_uid: model.model_uid.clone(),
                    replica_uid: r.replica_uid.clone(),
                });
            }
            if changed {
                settle(model);
            }
        }
        let draining = self.is_draining(worker_id);
        for spec in held.iter().filter(|h| h.serving).map(|h| &h.spec) {
            let uid = &spec.replica_uid;
            // A draining worker's replaced replicas finish their requests; it stops them itself.
            if self.ended.contains(uid) && !draining {
                out.stop.push(uid.clone());
                continue;
            }
            if draining {
                continue;
            }
            let Some(model) = self.models.get_mut(&spec.model_uid) else {
                out.unknown_models.entry(spec.model_uid.clone()).or_default().push(spec.clone());
                continue;
            };
            // Launching (or being adopted) or terminating: looked at again at the next heartbeat.
            if !model.status.launched() {
                continue;
            }
            let rejoin = match model.replicas.iter_mut().find(|r| &r.replica_uid == uid) {
                None => {
                    model.replicas.push(held_info(spec, worker_id));
                    true
                }
                // Lost with its worker, which came back: unless a replacement is on its way.
                Some(r)
                    if r.status == ReplicaStatus::Dead
                        && r.worker_id == worker_id
                        && !self.replacing.contains_key(uid) =>
                {
                    r.status = ReplicaStatus::Loading;
                    true
                }
                Some(_) => false,
            };
            if rejoin {
                out.rejoined.entry(spec.model_uid.clone()).or_default().push((uid.clone(), spec.role));
            }
        }
        out
    }

    /// Records a model rebuilt from the replicas a worker reported (`replicas`, all of model
    /// `uid`, whose launch `spec` validated again here) as launching, until
    /// [`finish_adopt`](Self::finish_adopt).
    pub(crate) fn begin_adopt(
        &mut self,
        uid: &str,
        model_name: &str,
        spec: LaunchSpec,
        worker_id: &str,
        replicas: &[ReplicaSpec],
    ) -> Result<(), ActorError> {
        if self.models.contains_key(uid) {
            return Err(ActorError::ModelExists(uid.to_owned()));
        }
        let model = ModelInfo {
            model_uid: uid.to_owned(),
            model_name: model_name.to_owned(),
            status: ModelStatus::Launching,
            pd: spec.pd,
            prefill_fallback: spec.front.prefill_fallback,
            max_local_prefill_tokens: spec.handoff().local_prefill_tokens,
            replicas: replicas.iter().map(|r| held_info(r, worker_id)).collect(),
            created: super::now_secs(),
            source: spec.source.clone(),
        };
        self.models.insert(uid.to_owned(), model);
        self.specs.insert(uid.to_owned(), spec);
        self.adopting.insert(uid.to_owned());
        Ok(())
    }

    /// An adoption finished: a rebuilt model serves (or is forgotten, its replicas left running
    /// to be adopted at the next heartbeat), or rejoined replicas serve again (or are forgotten
    /// likewise). Returns the replicas that died meanwhile, which the router must drop.
    pub(crate) fn finish_adopt(&mut self, uid: &str, replicas: &[String], ok: bool) -> Vec<LostReplica> {
        if self.adopting.remove(uid) {
            if ok {
                return self.finish_launch(uid);
            }
            self.models.remove(uid);
            self.specs.remove(uid);
            return Vec::new();
        }
        let Some(model) = self.models.get_mut(uid) else { return Vec::new() };
        if !ok {
            model.replicas.retain(|r| !replicas.contains(&r.replica_uid));
            settle(model);
            return Vec::new();
        }
        self.finish_scale(uid, replicas, true)
    }

    /// Places a replacement for each dead or draining replica of a launched model that has
    /// none loading, where the cluster has room (a replica placed on a named worker waits for
    /// that worker). A model whose replacement failed waits before the next try, or until a
    /// worker joins.
    pub(crate) fn begin_replacements(&mut self, now: Instant) -> Vec<(String, ScalePlan)> {
        let mut plans = Vec::new();
        let uids: Vec<String> = self.models.keys().cloned().collect();
        for uid in uids {
            match self.retry.get_mut(&uid) {
                Some(r) if r.at.is_none() => {
                    r.at = Some(now + r.step);
                    continue;
                }
                Some(r) if r.at.is_some_and(|at| at > now) => continue,
                _ => {}
            }
            let Some(model) = self.models.get(&uid).filter(|m| m.status.launched()) else { continue };
            let dead: Vec<(String, Role)> = model
                .replicas
                .iter()
                .filter(|r| {
                    matches!(r.status, ReplicaStatus::Dead | ReplicaStatus::Draining)
                        && !self.replacing.contains_key(&r.replica_uid)
                        && !self.is_removing(&r.replica_uid)
                })
                .map(|r| (r.replica_uid.clone(), r.role))
                .collect();
            for (dead_uid, role) in dead {
                match self.place_replacement(&uid, &dead_uid, role) {
                    Ok(plan) => plans.push((uid.clone(), plan)),
                    Err(e) => {
                        tracing::debug!(model_uid = %uid, replica_uid = %dead_uid, error = %e, "no room for a replacement yet");
                        self.failed_replacement(&uid);
                        break;
                    }
                }
            }
        }
        plans
    }

    fn place_replacement(&mut self, uid: &str, dead_uid: &str, role: Role) -> Result<ScalePlan, ActorError> {
        let template = match self.placed_from.get(dead_uid) {
            Some(one) => one,
            // Adopted after a restart: the model's first replica of the role is the template.
            None => self.specs.get(uid).ok_or_else(|| ActorError::ModelNotFound(uid.to_owned()))?,
        };
        let request = ScaleRequest { role: Some(role), count: Some(1), ..ScaleRequest::default() };
        let view = self.view();
        let scaled = launch::scale_spec(template, uid, &request, &self.taken_uids(&view))?;
        let (placements, next) = launch::place(&scaled, uid, &view)?;
        self.round_robin = next;
        self.remember_drafts(&scaled, &placements);
        let model = self.models.get_mut(uid).ok_or_else(|| ActorError::ModelNotFound(uid.to_owned()))?;
        let others = super::alive_roles(model);
        model.replicas.extend(placements.iter().map(super::loading));
        for p in &placements {
            self.replacing.insert(dead_uid.to_owned(), p.replica_uid.clone());
            tracing::info!(model_uid = %uid, lost = %dead_uid, replacement = %p.replica_uid, worker_id = %p.worker_id, "replacing a lost replica");
        }
        Ok(ScalePlan { placements, common: scaled.common(), others })
    }

    fn failed_replacement(&mut self, uid: &str) {
        let step = self.retry.get(uid).map_or(FIRST_RETRY, |r| (r.step * 2).min(MAX_RETRY));
        self.retry.insert(uid.to_owned(), Retry { at: None, step });
    }

    /// A scale-up of `replicas` ended: those that replace dead replicas take their place
    /// (`ok`: the dead records go, and their uids are ended) or leave them to be replaced later.
    pub(super) fn settle_replacements(&mut self, uid: &str, replicas: &[String], ok: bool) {
        let replaced: Vec<String> = self
            .replacing
            .iter()
            .filter(|(_, new)| replicas.contains(new))
            .map(|(dead, _)| dead.clone())
            .collect();
        if replaced.is_empty() {
            return;
        }
        for dead in &replaced {
            self.replacing.remove(dead);
        }
        if !ok {
            self.failed_replacement(uid);
            return;
        }
        self.retry.remove(uid);
        if let Some(model) = self.models.get_mut(uid) {
            model.replicas.retain(|r| !replaced.contains(&r.replica_uid));
        }
        for dead in replaced {
            self.placed_from.remove(&dead);
            self.ended.add(dead);
        }
    }
}

/// A replica a worker reported, recorded as loading until its model's router has it.
fn held_info(spec: &ReplicaSpec, worker_id: &str) -> ReplicaInfo {
    ReplicaInfo {
        replica_uid: spec.replica_uid.clone(),
        role: spec.role,
        worker_id: worker_id.to_owned(),
        gpus: spec.gpus.clone(),
        engine: spec.engine.clone(),
        gpu_memory_utilization: spec.engine_config.gpu_memory_utilization(),
        status: ReplicaStatus::Loading,
        kv_layout: super::layout_name(&spec.engine, &spec.engine_config),
    }
}
