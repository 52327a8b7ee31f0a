//! The supervisor: one per cluster. A thin actor around [`state::SupervisorState`].
//!
//! Launches and terminations take seconds (engines load, workers answer over the network), so
//! the actor only validates and reserves in its state, then hands the slow part to a task that
//! reports back with `LaunchDone`/`TerminateDone`. The mailbox stays free for heartbeats, so a
//! long model load never makes a worker look lost.
//!
//! Heartbeats carry the replicas each worker holds. After a restart the supervisor rebuilds its
//! models from them (`AdoptDone` reports back); replicas lost with their worker are replaced
//! where the cluster has room, at each `Tick`.

mod draining;
mod instances;
pub(crate) mod state;
mod tasks;

use crate::block_tracker::BlockTrackerMsg;
use crate::error::ActorError;
use crate::launch::{self, LaunchRequest};
use crate::node::Namespace;
pub(crate) use crate::protocol::SupervisorMsg;
use crate::protocol::WorkerMsg;
use crate::router::RouterMsg;
use crate::spec::{HeldReplica, ReplicaSpec, Role};
use crate::wire::{Wire, answer, call};
use instances::WorkerInstances;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use state::{LostReplica, Reconciled, SupervisorState};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tasks::{TaskCtx, rollback, run_adopt, run_launch, run_rejoin, run_scale, stop_orphans, teardown};
use xinf_engine::Engines;
use xinf_transfer::sync::lock;

/// The local actors of a serving model. They live on the supervisor node and never cross
/// nodes, so they are kept here rather than in messages.
#[derive(Clone)]
pub(crate) struct ModelActors {
    pub(crate) router: ActorRef<RouterMsg>,
    pub(crate) tracker: ActorRef<BlockTrackerMsg>,
    /// The launch's chat settings, which every chat answer reads.
    pub(crate) chat: crate::ChatDefaults,
    /// The launch's `request_limits`, counted for every request.
    pub(crate) limit: Option<std::sync::Arc<crate::limit::RequestLimit>>,
    /// The launch's `prefill_fallback`: a P/D request whose prefill replica fails runs whole
    /// on its decode replica.
    pub(crate) prefill_fallback: bool,
}

/// Serving models' local actors, shared by the supervisor and the [`crate::Cluster`] handle
/// (which routes requests without a round trip through the supervisor).
#[derive(Default)]
pub(crate) struct ModelTable(Mutex<HashMap<String, ModelActors>>);

impl ModelTable {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, ModelActors>> {
        lock(&self.0)
    }

    pub(crate) fn get(&self, uid: &str) -> Option<ModelActors> {
        self.lock().get(uid).cloned()
    }

    fn insert(&self, uid: &str, actors: ModelActors) {
        self.lock().insert(uid.to_owned(), actors);
    }

    fn remove(&self, uid: &str) -> Option<ModelActors> {
        self.lock().remove(uid)
    }
}

/// Time settings of the supervisor.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SupervisorTimes {
    pub(crate) heartbeat_check: Duration,
    pub(crate) heartbeat_timeout: Duration,
    pub(crate) call: Duration,
    pub(crate) load: Duration,
    pub(crate) stop: Duration,
}

/// The supervisor actor.
pub(crate) struct Supervisor {
    pub(crate) ns: Namespace,
    pub(crate) local_mode: bool,
    pub(crate) models: Arc<ModelTable>,
    pub(crate) instances: Arc<WorkerInstances>,
    pub(crate) times: SupervisorTimes,
    /// The engines launches may name (checked here, loaded by workers).
    pub(crate) engines: Engines,
}

impl Supervisor {
    fn task_ctx(&self, myself: &ActorRef<SupervisorMsg>) -> TaskCtx {
        TaskCtx {
            ns: self.ns.clone(),
            models: self.models.clone(),
            instances: self.instances.clone(),
            times: self.times,
            sup: myself.clone(),
        }
    }

    /// Takes lost replicas out of their routers and block trackers.
    fn drop_replicas(&self, lost: Vec<LostReplica>, reason: &str) {
        for l in lost {
            tracing::warn!(model_uid = %l.model_uid, replica_uid = %l.replica_uid, %reason, "replica lost");
            if let Some(actors) = self.models.get(&l.model_uid) {
                let why =
                    format!("replica `{}` of model `{}` was lost: {reason}", l.replica_uid, l.model_uid);
                if actors
                    .router
                    .cast(RouterMsg::RemoveReplica { replica_uid: l.replica_uid.clone(), reason: why })
                    .is_err()
                {
                    tracing::debug!("the router is gone");
                }
                if actors
                    .tracker
                    .cast(BlockTrackerMsg::UnregisterReplica { replica_uid: l.replica_uid })
                    .is_err()
                {
                    tracing::debug!("the block tracker is gone");
                }
            }
        }
    }

    /// A launch task finished. A launch whose model was terminated meanwhile is told so: its
    /// task rolls back what it built and its caller hears why.
    fn launch_done(
        &self,
        state: &mut SupervisorState,
        model_uid: String,
        outcome: Result<(), ActorError>,
    ) -> Wire<()> {
        let cancelled = state.is_terminating(&model_uid);
        match outcome {
            Ok(()) if !cancelled => {
                let dead = state.finish_launch(&model_uid);
                self.drop_replicas(dead, "it died while the model launched");
                tracing::info!(%model_uid, "model ready");
            }
            Ok(()) => state.abort_launch(&model_uid),
            Err(e) => {
                state.abort_launch(&model_uid);
                if !cancelled {
                    tracing::warn!(%model_uid, error = %e, "launch failed and was rolled back");
                }
            }
        }
        if cancelled {
            tracing::info!(%model_uid, "the launch was cancelled: the model was terminated while it loaded");
            return Wire(Err(ActorError::LaunchCancelled(model_uid)));
        }
        Wire::ok(())
    }

    /// A worker's heartbeat: it registers (or comes back), and what it holds is reconciled
    /// with the models. Another process reporting under the id of an alive worker is ignored.
    fn heartbeat(
        &self,
        myself: &ActorRef<SupervisorMsg>,
        state: &mut SupervisorState,
        info: crate::view::WorkerInfo,
        held: &[HeldReplica],
    ) {
        if let Some(first) = state.other_instance(&info) {
            if first {
                tracing::warn!(worker_id = %info.worker_id, host = %info.host, "another process reports under the id of a running worker; it is told to stop");
            }
            for cell in
                ractor::pg::get_members(&self.ns.worker_instance_group(&info.worker_id, info.instance))
            {
                if ActorRef::<WorkerMsg>::from(cell).cast(WorkerMsg::Superseded).is_err() {
                    tracing::debug!("a superseded worker is gone");
                }
            }
            return;
        }
        let id = info.worker_id.clone();
        self.instances.set(&id, info.instance);
        if state.heartbeat(info, Instant::now()) {
            tracing::info!(worker_id = %id, "worker registered");
        }
        self.reconcile(myself, state, &id, held);
    }

    /// Workers whose process group emptied (their node disconnected) are lost.
    /// Validates and reserves a launch in the state, then builds it in a task that reports
    /// back with `LaunchDone`; the reply comes once it serves (or at once, detached).
    fn launch(
        &self,
        myself: &ActorRef<SupervisorMsg>,
        state: &mut SupervisorState,
        request: Result<Box<LaunchRequest>, ActorError>,
        detach: bool,
        reply: RpcReplyPort<Wire<String>>,
    ) {
        let started = request.and_then(|req| {
            let spec = launch::validate(&req, self.local_mode, &self.engines)?;
            let (uid, placements) =
                state.begin_launch(&spec, &req.model_name, || format!("{:08x}", rand::random::<u32>()))?;
            Ok((uid, placements, spec.common()))
        });
        match started {
            Err(e) => answer(reply, Wire(Err(e))),
            Ok((uid, placements, common)) => {
                tracing::info!(model_uid = %uid, replicas = placements.len(), "launching");
                let ctx = self.task_ctx(myself);
                let reply = if detach {
                    answer(reply, Wire::ok(uid.clone()));
                    None
                } else {
                    Some(reply)
                };
                tokio::spawn(async move {
                    let outcome = run_launch(&ctx, &uid, &common, &placements).await;
                    let recorded =
                        call(&ctx.sup, "supervisor", ctx.times.call, |reply| SupervisorMsg::LaunchDone {
                            model_uid: uid.clone(),
                            outcome: Wire(outcome.clone()),
                            reply,
                        })
                        .await;
                    if outcome.is_ok() && recorded.is_err() {
                        rollback(&ctx, &uid, &placements).await;
                    }
                    let result = match (outcome, recorded) {
                        // Terminated while it loaded: that, not the load it cut short, is why.
                        (_, Err(e @ ActorError::LaunchCancelled(_))) => Err(e),
                        (outcome, recorded) => outcome.and(recorded),
                    };
                    let result = result.map(|()| uid);
                    match reply {
                        Some(reply) => answer(reply, Wire(result)),
                        // A cancelled launch was logged when it was cancelled.
                        None => match result {
                            Ok(_) | Err(ActorError::LaunchCancelled(_)) => {}
                            Err(e) => tracing::error!(error = %e, "a detached launch failed"),
                        },
                    }
                });
            }
        }
    }

    /// Validates and places a scale-up, then starts its replicas in a task that reports back
    /// with `ScaleDone`; the reply names them once they serve.
    fn scale(
        &self,
        myself: &ActorRef<SupervisorMsg>,
        state: &mut SupervisorState,
        model_uid: String,
        request: Result<crate::launch::ScaleRequest, ActorError>,
        reply: RpcReplyPort<Wire<Vec<String>>>,
    ) {
        let plan = match request.and_then(|r| state.begin_scale(&model_uid, &r)) {
            Ok(plan) => plan,
            Err(e) => return answer(reply, Wire(Err(e))),
        };
        tracing::info!(%model_uid, replicas = plan.placements.len(), "scaling up");
        self.start_scale(myself, model_uid, plan, Some(reply));
    }

    /// Starts a placed scale-up (or replacement) in a task that reports back with `ScaleDone`,
    /// and answers `reply`, when given, once the new replicas serve.
    fn start_scale(
        &self,
        myself: &ActorRef<SupervisorMsg>,
        model_uid: String,
        plan: state::ScalePlan,
        reply: Option<RpcReplyPort<Wire<Vec<String>>>>,
    ) {
        let ctx = self.task_ctx(myself);
        let actors = self.models.get(&model_uid);
        tokio::spawn(async move {
            let uids: Vec<String> = plan.placements.iter().map(|p| p.replica_uid.clone()).collect();
            let outcome = run_scale(&ctx, &model_uid, actors, &plan).await;
            let recorded = call(&ctx.sup, "supervisor", ctx.times.call, |reply| SupervisorMsg::ScaleDone {
                model_uid: model_uid.clone(),
                replicas: Wire::ok(uids.clone()),
                outcome: Wire(outcome.clone()),
                reply,
            })
            .await;
            if let Some(reply) = reply {
                answer(reply, Wire(outcome.and(recorded).map(|()| uids)));
            }
        });
    }

    /// Starts terminating a model; a task tears it down and reports back with `TerminateDone`,
    /// then answers. A model still launching is cancelled instead: the answer comes once its
    /// loads are told to stop, and it is gone when its launch task reports. A model already
    /// terminating is answered at once.
    fn terminate(
        &self,
        myself: &ActorRef<SupervisorMsg>,
        state: &mut SupervisorState,
        model_uid: String,
        reply: RpcReplyPort<Wire<()>>,
    ) {
        if state.is_terminating(&model_uid) {
            // Asked twice: the first call's teardown runs; the model is gone when it ends.
            return answer(reply, Wire::ok(()));
        }
        if let Some(replicas) = state.cancel_launch(&model_uid) {
            // Stopping a replica that loads cancels it, and the launch task, whose loads then
            // fail (or which is told so when it reports), rolls the rest back.
            tracing::info!(%model_uid, "terminating a model that is still launching");
            let ctx = self.task_ctx(myself);
            tokio::spawn(async move {
                teardown(&ctx, None, &replicas).await;
                answer(reply, Wire::ok(()));
            });
            return;
        }
        let replicas = match state.begin_terminate(&model_uid) {
            Ok(replicas) => replicas,
            Err(e) => return answer(reply, Wire(Err(e))),
        };
        let actors = self.models.remove(&model_uid);
        let ctx = self.task_ctx(myself);
        tokio::spawn(async move {
            teardown(&ctx, actors, &replicas).await;
            let done = call(&ctx.sup, "supervisor", ctx.times.call, |reply| SupervisorMsg::TerminateDone {
                model_uid: model_uid.clone(),
                reply,
            })
            .await;
            tracing::info!(%model_uid, "model terminated");
            answer(reply, Wire(done));
        });
    }

    /// Records how an adoption ended.
    fn adopt_done(
        &self,
        state: &mut SupervisorState,
        model_uid: &str,
        replicas: Vec<String>,
        outcome: Result<(), ActorError>,
    ) {
        let dead = state.finish_adopt(model_uid, &replicas, outcome.is_ok());
        self.drop_replicas(dead, "it died while it was adopted");
        match outcome {
            Ok(()) => tracing::info!(%model_uid, ?replicas, "replicas adopted"),
            Err(e) => {
                tracing::warn!(%model_uid, error = %e, "adopting replicas failed; retried at the next heartbeat")
            }
        }
    }

    /// Acts on what a worker's heartbeat says it holds: replicas gone leave their routers,
    /// ended ones are stopped, and serving ones the supervisor does not count are adopted.
    fn reconcile(
        &self,
        myself: &ActorRef<SupervisorMsg>,
        state: &mut SupervisorState,
        worker_id: &str,
        held: &[HeldReplica],
    ) {
        let Reconciled { gone, unknown_models, rejoined, stop } = state.reconcile(worker_id, held);
        self.drop_replicas(gone, &format!("worker {worker_id} no longer holds it"));
        let ctx = self.task_ctx(myself);
        if !stop.is_empty() {
            tracing::info!(%worker_id, replicas = ?stop, "stopping replicas of ended models");
            let (ctx, worker_id) = (ctx.clone(), worker_id.to_owned());
            tokio::spawn(async move { stop_orphans(&ctx, &worker_id, &stop).await });
        }
        for (model_uid, replicas) in rejoined {
            tracing::info!(%model_uid, %worker_id, ?replicas, "replicas rejoin their model");
            let (ctx, actors) = (ctx.clone(), self.models.get(&model_uid));
            tokio::spawn(async move {
                let outcome = run_rejoin(&ctx, &model_uid, actors, &replicas).await;
                adopt_done(&ctx, model_uid, replicas, outcome).await;
            });
        }
        for (model_uid, specs) in unknown_models {
            let Some((adopt, front)) = self.adoption(state, worker_id, &model_uid, &specs) else { continue };
            let ctx = ctx.clone();
            tokio::spawn(async move {
                let outcome = run_adopt(&ctx, &model_uid, &adopt, front).await;
                adopt_done(&ctx, model_uid, adopt, outcome).await;
            });
        }
    }

    /// Records a model this supervisor does not know, from replicas a worker serves (the
    /// supervisor restarted): its launch request, which every replica carries, is validated
    /// again. `None` (logged) when it cannot be.
    fn adoption(
        &self,
        state: &mut SupervisorState,
        worker_id: &str,
        model_uid: &str,
        specs: &[ReplicaSpec],
    ) -> Option<(Vec<(String, Role)>, crate::spec::ModelFront)> {
        let first = specs.first()?;
        let adopted = serde_json::from_str::<LaunchRequest>(&first.launch)
            .map_err(|e| ActorError::Wire(format!("the replica's launch request does not parse: {e}")))
            .and_then(|req| {
                let spec = launch::validate(&req, self.local_mode, &self.engines)?;
                let front = spec.front.clone();
                state.begin_adopt(model_uid, &req.model_name, spec, worker_id, specs).map(|()| front)
            });
        match adopted {
            Ok(front) => {
                tracing::info!(%model_uid, %worker_id, replicas = specs.len(), "adopting a model its worker serves");
                Some((specs.iter().map(|s| (s.replica_uid.clone(), s.role)).collect(), front))
            }
            Err(e) => {
                tracing::error!(%model_uid, %worker_id, error = %e, "cannot adopt the replicas a worker serves");
                None
            }
        }
    }

    /// Records how a scale-up ended.
    fn scale_done(
        &self,
        state: &mut SupervisorState,
        model_uid: &str,
        replicas: Vec<String>,
        outcome: Result<(), ActorError>,
    ) {
        let dead = state.finish_scale(model_uid, &replicas, outcome.is_ok());
        self.drop_replicas(dead, "it died while it loaded");
        match outcome {
            Ok(()) => tracing::info!(%model_uid, ?replicas, "replicas added"),
            Err(e) => tracing::warn!(%model_uid, error = %e, "scale-up failed and was rolled back"),
        }
    }

    fn check_worker_groups(&self, state: &mut SupervisorState) {
        for id in state.alive_workers() {
            if ractor::pg::get_members(&self.instances.group(&self.ns, &id)).is_empty() {
                let lost = state.lose_worker(&id);
                self.drop_replicas(lost, &format!("worker {id} disconnected"));
            }
        }
    }
}

impl Actor for Supervisor {
    type Msg = SupervisorMsg;
    type State = SupervisorState;
    type Arguments = ();

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        _args: (),
    ) -> Result<Self::State, ActorProcessingErr> {
        ractor::pg::join(self.ns.supervisor_group(), vec![myself.get_cell()]);
        ractor::pg::monitor(self.ns.workers_group(), myself.get_cell());
        myself.send_interval(self.times.heartbeat_check, || SupervisorMsg::Tick);
        Ok(SupervisorState::new())
    }

    async fn post_stop(
        &self,
        myself: ActorRef<Self::Msg>,
        _state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        ractor::pg::demonitor(self.ns.workers_group(), myself.get_id());
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            SupervisorMsg::Launch { request, detach, reply } => {
                self.launch(&myself, state, request.0, detach, reply);
            }
            SupervisorMsg::LaunchDone { model_uid, outcome, reply } => {
                answer(reply, self.launch_done(state, model_uid, outcome.0));
            }
            SupervisorMsg::Terminate { model_uid, reply } => self.terminate(&myself, state, model_uid, reply),
            SupervisorMsg::TerminateDone { model_uid, reply } => {
                state.finish_terminate(&model_uid);
                answer(reply, Wire::ok(()));
            }
            SupervisorMsg::GetModel { model_uid, reply } => {
                let info = state.model(&model_uid).cloned().ok_or(ActorError::ModelNotFound(model_uid));
                answer(reply, Wire(info));
            }
            SupervisorMsg::ListModels { reply } => answer(reply, Wire::ok(state.models())),
            SupervisorMsg::ListWorkers { reply } => answer(reply, Wire::ok(state.workers(Instant::now()))),
            SupervisorMsg::Scale { model_uid, request, reply } => {
                self.scale(&myself, state, model_uid, request.0, reply);
            }
            SupervisorMsg::ScaleDone { model_uid, replicas, outcome, reply } => {
                self.scale_done(state, &model_uid, replicas.0.unwrap_or_default(), outcome.0);
                answer(reply, Wire::ok(()));
            }
            SupervisorMsg::Heartbeat { info, replicas } => match (info.0, replicas.0) {
                (Ok(info), Ok(held)) => self.heartbeat(&myself, state, info, &held),
                (Err(e), _) | (_, Err(e)) => tracing::warn!(error = %e, "an unreadable heartbeat"),
            },
            SupervisorMsg::AdoptDone { model_uid, replicas, outcome, reply } => {
                self.adopt_done(state, &model_uid, replicas.0.unwrap_or_default(), outcome.0);
                answer(reply, Wire::ok(()));
            }
            SupervisorMsg::DrainWorker { worker_id, reply } => self.drain_worker(state, &worker_id, reply),
            SupervisorMsg::DrainTimedOut { worker_id, after_ms, reply } => {
                let why =
                    format!("its worker {worker_id} stopped when its drain time ({after_ms} ms) ran out");
                self.cut_drained(state, &worker_id, &why);
                answer(reply, Wire::ok(()));
            }
            SupervisorMsg::RemoveReplica { model_uid, replica_uid, drain_ms, reply } => {
                let drain = Duration::from_millis(drain_ms);
                self.remove_replica(&myself, state, model_uid, replica_uid, drain, reply);
            }
            SupervisorMsg::RemoveDone { model_uid, replica_uid, reply } => {
                state.finish_remove(&model_uid, &replica_uid);
                answer(reply, Wire::ok(()));
            }
            SupervisorMsg::ReplicaDied { model_uid, replica_uid } => {
                if let Some(lost) = state.replica_dead(&model_uid, &replica_uid) {
                    self.drop_replicas(vec![lost], "its actor stopped");
                }
            }
            SupervisorMsg::Tick => {
                let lost = state.expire(Instant::now(), self.times.heartbeat_timeout);
                self.drop_replicas(lost, "its worker stopped sending heartbeats");
                for (model_uid, plan) in state.begin_replacements(Instant::now()) {
                    self.start_scale(&myself, model_uid, plan, None);
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
        match event {
            SupervisionEvent::ProcessGroupChanged(_) => self.check_worker_groups(state),
            SupervisionEvent::ActorFailed(cell, e) => {
                tracing::error!(actor = ?cell.get_name(), error = %e, "a model actor failed");
            }
            _ => {}
        }
        Ok(())
    }
}

/// Reports an adoption's outcome to the supervisor.
async fn adopt_done(
    ctx: &TaskCtx,
    model_uid: String,
    replicas: Vec<(String, Role)>,
    outcome: Result<(), ActorError>,
) {
    let replicas: Vec<String> = replicas.into_iter().map(|(r, _)| r).collect();
    let done = call(&ctx.sup, "supervisor", ctx.times.call, |reply| SupervisorMsg::AdoptDone {
        model_uid,
        replicas: Wire::ok(replicas),
        outcome: Wire(outcome),
        reply,
    })
    .await;
    if let Err(e) = done {
        tracing::warn!(error = %e, "the supervisor did not record an adoption");
    }
}
