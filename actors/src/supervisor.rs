//! The supervisor: one per cluster. A thin actor around [`state::SupervisorState`].
//!
//! Launches and terminations take seconds (engines load, workers answer over the network), so
//! the actor only validates and reserves in its state, then hands the slow part to a task that
//! reports back with `LaunchDone`/`TerminateDone`. The mailbox stays free for heartbeats, so a
//! long model load never makes a worker look lost.

pub(crate) mod state;

use crate::block_tracker::{BlockTracker, BlockTrackerMsg};
use crate::error::ActorError;
use crate::launch::{self, LaunchRequest, Placement};
use crate::node::{Namespace, wait_for_member};
pub(crate) use crate::protocol::SupervisorMsg;
use crate::protocol::WorkerMsg;
use crate::replica::ReplicaMsg;
use crate::router::{Router, RouterArgs, RouterMsg};
use crate::spec::{ModelHandoff, ReplicaSpec};
use crate::wire::{Wire, answer, call, call_local};
use ractor::{Actor, ActorCell, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use state::{LostReplica, ScalePlan, SupervisorState};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use xinf_engine::{Engines, ModelSource};
use xinf_transfer::sync::lock;

/// The local actors of a serving model. They live on the supervisor node and never cross
/// nodes, so they are kept here rather than in messages.
#[derive(Clone)]
pub(crate) struct ModelActors {
    pub(crate) router: ActorRef<RouterMsg>,
    pub(crate) tracker: ActorRef<BlockTrackerMsg>,
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
    pub(crate) times: SupervisorTimes,
    /// The engines launches may name (checked here, loaded by workers).
    pub(crate) engines: Engines,
}

/// Everything a launch or terminate task needs.
#[derive(Clone)]
struct TaskCtx {
    ns: Namespace,
    models: Arc<ModelTable>,
    times: SupervisorTimes,
    sup: ActorRef<SupervisorMsg>,
}

/// A worker, found through its process group.
fn worker_ref(ns: &Namespace, worker_id: &str) -> Option<ActorRef<WorkerMsg>> {
    ractor::pg::get_members(&ns.worker_group(worker_id)).into_iter().next().map(Into::into)
}

impl Supervisor {
    fn task_ctx(&self, myself: &ActorRef<SupervisorMsg>) -> TaskCtx {
        TaskCtx { ns: self.ns.clone(), models: self.models.clone(), times: self.times, sup: myself.clone() }
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
            Ok((uid, placements, (spec.source.clone(), spec.handoff())))
        });
        match started {
            Err(e) => answer(reply, Wire(Err(e))),
            Ok((uid, placements, source)) => {
                tracing::info!(model_uid = %uid, replicas = placements.len(), "launching");
                let ctx = self.task_ctx(myself);
                let reply = if detach {
                    answer(reply, Wire::ok(uid.clone()));
                    None
                } else {
                    Some(reply)
                };
                tokio::spawn(async move {
                    let outcome = run_launch(&ctx, &uid, &source.0, &source.1, &placements).await;
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
                    let result = outcome.and(recorded).map(|()| uid);
                    match reply {
                        Some(reply) => answer(reply, Wire(result)),
                        None => {
                            if let Err(e) = result {
                                tracing::error!(error = %e, "a detached launch failed");
                            }
                        }
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
            answer(reply, Wire(outcome.and(recorded).map(|()| uids)));
        });
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
            if ractor::pg::get_members(&self.ns.worker_group(&id)).is_empty() {
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
                match outcome.0 {
                    Ok(()) => {
                        let dead = state.finish_launch(&model_uid);
                        self.drop_replicas(dead, "it died while the model launched");
                        tracing::info!(%model_uid, "model ready");
                    }
                    Err(e) => {
                        state.abort_launch(&model_uid);
                        tracing::warn!(%model_uid, error = %e, "launch failed and was rolled back");
                    }
                }
                answer(reply, Wire::ok(()));
            }
            SupervisorMsg::Terminate { model_uid, reply } => match state.begin_terminate(&model_uid) {
                Err(e) => answer(reply, Wire(Err(e))),
                Ok(replicas) => {
                    let actors = self.models.remove(&model_uid);
                    let ctx = self.task_ctx(&myself);
                    tokio::spawn(async move {
                        teardown(&ctx, actors, &replicas).await;
                        let done = call(&ctx.sup, "supervisor", ctx.times.call, |reply| {
                            SupervisorMsg::TerminateDone { model_uid: model_uid.clone(), reply }
                        })
                        .await;
                        tracing::info!(%model_uid, "model terminated");
                        answer(reply, Wire(done));
                    });
                }
            },
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
            SupervisorMsg::Heartbeat { info } => match info.0 {
                Ok(info) => {
                    let id = info.worker_id.clone();
                    if state.heartbeat(info, Instant::now()) {
                        tracing::info!(worker_id = %id, "worker registered");
                    }
                }
                Err(e) => tracing::warn!(error = %e, "an unreadable heartbeat"),
            },
            SupervisorMsg::ReplicaDied { model_uid, replica_uid } => {
                if let Some(lost) = state.replica_dead(&model_uid, &replica_uid) {
                    self.drop_replicas(vec![lost], "its actor stopped");
                }
            }
            SupervisorMsg::Tick => {
                let lost = state.expire(Instant::now(), self.times.heartbeat_timeout);
                self.drop_replicas(lost, "its worker stopped sending heartbeats");
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

/// Creates a model's actors in the reference order (block tracker, replicas in parallel,
/// router last: the model is ready once its router exists). On any failure everything created
/// so far is destroyed before the error is returned.
async fn run_launch(
    ctx: &TaskCtx,
    uid: &str,
    source: &ModelSource,
    handoff: &ModelHandoff,
    placements: &[Placement],
) -> Result<(), ActorError> {
    let result = build(ctx, uid, source, handoff, placements).await;
    if result.is_err() {
        rollback(ctx, uid, placements).await;
    }
    result
}

fn spawn_failed(what: &str, e: ractor::SpawnErr) -> ActorError {
    ActorError::Internal(format!("starting the {what}: {e}"))
}

async fn build(
    ctx: &TaskCtx,
    uid: &str,
    source: &ModelSource,
    handoff: &ModelHandoff,
    placements: &[Placement],
) -> Result<(), ActorError> {
    let sup: ActorCell = ctx.sup.get_cell();
    let (tracker, _) = Actor::spawn_linked(
        Some(ctx.ns.tracker_name(uid)),
        BlockTracker,
        ctx.ns.tracker_group(uid),
        sup.clone(),
    )
    .await
    .map_err(|e| spawn_failed("block tracker", e))?;
    let starts = placements.iter().map(|p| start_replica(ctx, uid, source, handoff, p));
    let results = futures::future::join_all(starts).await;
    let mut replicas = Vec::with_capacity(placements.len());
    let mut failure = None;
    for (p, r) in placements.iter().zip(results) {
        match r {
            Ok(actor) => replicas.push((p.replica_uid.clone(), p.role, actor)),
            Err(e) => {
                tracing::warn!(model_uid = %uid, replica_uid = %p.replica_uid, error = %e, "replica failed to start");
                failure.get_or_insert(e);
            }
        }
    }
    let stop_tracker = |tracker: ActorRef<BlockTrackerMsg>| async move {
        if let Err(e) = tracker.stop_and_wait(Some("launch failed".into()), Some(ctx.times.stop)).await {
            tracing::warn!(error = %e, "the block tracker did not stop in time");
        }
    };
    if failure.is_none() {
        failure = check_contracts(ctx, &replicas).await.err();
    }
    if let Some(e) = failure {
        stop_tracker(tracker).await;
        return Err(e);
    }
    let router = Router { model_uid: uid.to_owned(), call_timeout: ctx.times.call };
    match Actor::spawn_linked(Some(ctx.ns.router_name(uid)), router, RouterArgs { replicas }, sup).await {
        Ok((router, _)) => {
            ctx.models.insert(uid, ModelActors { router, tracker });
            Ok(())
        }
        Err(e) => {
            stop_tracker(tracker).await;
            Err(spawn_failed("router", e))
        }
    }
}

/// Starts a scale-up's replicas, checks their contracts against the model's other replicas and
/// adds them to the router; on any failure the new replicas are stopped and the model is as it
/// was.
async fn run_scale(
    ctx: &TaskCtx,
    uid: &str,
    actors: Option<ModelActors>,
    plan: &ScalePlan,
) -> Result<(), ActorError> {
    let result = async {
        let actors = actors.ok_or_else(|| ActorError::ModelNotFound(uid.to_owned()))?;
        let starts = plan.placements.iter().map(|p| start_replica(ctx, uid, &plan.source, &plan.handoff, p));
        let mut added = Vec::with_capacity(plan.placements.len());
        for (p, r) in plan.placements.iter().zip(futures::future::join_all(starts).await) {
            added.push((p.replica_uid.clone(), p.role, r?));
        }
        let running =
            call_local(&actors.router, "router", ctx.times.call, |reply| RouterMsg::Replicas { reply })
                .await?;
        let mut all: Vec<_> = running
            .into_iter()
            .filter_map(|(uid, r)| {
                plan.others.iter().find(|(o, _)| *o == uid).map(|(_, role)| (uid, *role, r))
            })
            .collect();
        all.extend(added.iter().cloned());
        check_contracts(ctx, &all).await?;
        for (replica_uid, role, replica) in added {
            actors
                .router
                .cast(RouterMsg::AddReplica { replica_uid, role, replica })
                .map_err(|e| ActorError::Internal(format!("the router is gone: {e}")))?;
        }
        Ok(())
    }
    .await;
    if result.is_err() {
        let replicas: Vec<(String, String)> =
            plan.placements.iter().map(|p| (p.worker_id.clone(), p.replica_uid.clone())).collect();
        teardown(ctx, None, &replicas).await;
    }
    result
}

/// In a P/D deployment, every decode replica must read the prefill replicas' KV as its own:
/// same weights, tokenizer, architecture, KV dtype, shapes, RoPE and context. The first
/// difference is named.
async fn check_contracts(
    ctx: &TaskCtx,
    replicas: &[(String, crate::spec::Role, ActorRef<ReplicaMsg>)],
) -> Result<(), ActorError> {
    use crate::spec::Role;
    if !replicas.iter().any(|(_, role, _)| *role != Role::Hybrid) {
        return Ok(());
    }
    let mut contracts = Vec::with_capacity(replicas.len());
    for (uid, role, replica) in replicas {
        let what = format!("replica `{uid}`");
        let c = call(replica, &what, ctx.times.call, |reply| ReplicaMsg::Contract { reply }).await?;
        contracts.push((uid, *role, c));
    }
    for (p_uid, _, p) in contracts.iter().filter(|(_, r, _)| *r == Role::Prefill) {
        for (d_uid, _, d) in contracts.iter().filter(|(_, r, _)| *r == Role::Decode) {
            if let Some(field) = p.first_difference(d) {
                return Err(ActorError::launch(
                    crate::LaunchRule::ContractMismatch,
                    format!(
                        "prefill replica '{p_uid}' and decode replica '{d_uid}' differ in {field}; \
                         their KV caches are not interchangeable"
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// Has a worker start one replica and finds the replica through its process group.
async fn start_replica(
    ctx: &TaskCtx,
    uid: &str,
    source: &ModelSource,
    handoff: &ModelHandoff,
    p: &Placement,
) -> Result<ActorRef<ReplicaMsg>, ActorError> {
    let what = format!("worker {}", p.worker_id);
    let worker = worker_ref(&ctx.ns, &p.worker_id).ok_or_else(|| ActorError::Unreachable {
        what: what.clone(),
        reason: "it left the cluster".into(),
    })?;
    let spec = ReplicaSpec {
        model_uid: uid.to_owned(),
        replica_uid: p.replica_uid.clone(),
        role: p.role,
        source: source.clone(),
        engine: p.engine.clone(),
        engine_config: p.engine_config.clone(),
        gpus: p.gpus.clone(),
        handoff: handoff.clone(),
    };
    call(&worker, &what, ctx.times.load, |reply| WorkerMsg::SpawnReplica {
        spec: Wire::ok(Box::new(spec)),
        reply,
    })
    .await?;
    // The group membership of a remote replica arrives over the node connection shortly after.
    wait_for_member(&ctx.ns.replica_group(&p.replica_uid), ctx.times.call).await.map(Into::into).ok_or_else(
        || ActorError::Unreachable {
            what: format!("replica `{}`", p.replica_uid),
            reason: "it started but never appeared in its process group".into(),
        },
    )
}

/// Destroys whatever a failed launch created: its local actors and every replica placed.
async fn rollback(ctx: &TaskCtx, uid: &str, placements: &[Placement]) {
    let actors = ctx.models.remove(uid);
    let replicas: Vec<(String, String)> =
        placements.iter().map(|p| (p.worker_id.clone(), p.replica_uid.clone())).collect();
    teardown(ctx, actors, &replicas).await;
}

/// Stops a model's router and tracker, then its replicas, each within the stop time.
async fn teardown(ctx: &TaskCtx, actors: Option<ModelActors>, replicas: &[(String, String)]) {
    if let Some(actors) = actors {
        for cell in [actors.router.get_cell(), actors.tracker.get_cell()] {
            if let Err(e) = cell.stop_and_wait(Some("model terminated".into()), Some(ctx.times.stop)).await {
                tracing::warn!(error = %e, "a model actor did not stop in time");
            }
        }
    }
    let stops = replicas.iter().map(|(worker_id, replica_uid)| async move {
        let Some(worker) = worker_ref(&ctx.ns, worker_id) else { return };
        let stopped =
            call(&worker, &format!("worker {worker_id}"), ctx.times.call + ctx.times.stop, |reply| {
                WorkerMsg::StopReplica { replica_uid: replica_uid.clone(), reply }
            })
            .await;
        if let Err(e) = stopped {
            tracing::warn!(%replica_uid, error = %e, "could not stop a replica");
        }
    });
    futures::future::join_all(stops).await;
}
