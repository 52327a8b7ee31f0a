//! The supervisor's slow work, run in tasks that report back to it: building a model's actors
//! (launch, scale-up, adoption after a restart), and tearing them down.

use super::{ModelActors, ModelTable, SupervisorMsg, SupervisorTimes, WorkerInstances};
use crate::block_tracker::{BlockTracker, BlockTrackerMsg};
use crate::error::ActorError;
use crate::launch::Placement;
use crate::node::{Namespace, wait_for_member};
use crate::protocol::WorkerMsg;
use crate::replica::ReplicaMsg;
use crate::router::{Router, RouterArgs, RouterMsg};
use crate::spec::{ModelCommon, ModelFront, Role};
use crate::supervisor::state::ScalePlan;
use crate::wire::{Wire, call, call_local};
use ractor::{Actor, ActorCell, ActorRef};
use std::sync::Arc;

/// Everything a launch or terminate task needs.
#[derive(Clone)]
pub(super) struct TaskCtx {
    pub(super) ns: Namespace,
    pub(super) models: Arc<ModelTable>,
    pub(super) instances: Arc<WorkerInstances>,
    pub(super) times: SupervisorTimes,
    pub(super) sup: ActorRef<SupervisorMsg>,
}

/// A worker, found through the process group of its registered process.
pub(super) fn worker_ref(ctx: &TaskCtx, worker_id: &str) -> Option<ActorRef<WorkerMsg>> {
    ractor::pg::get_members(&ctx.instances.group(&ctx.ns, worker_id)).into_iter().next().map(Into::into)
}

/// Creates a model's actors in the reference order (block tracker, replicas in parallel,
/// router last: the model is ready once its router exists). On any failure everything created
/// so far is destroyed before the error is returned.
pub(super) async fn run_launch(
    ctx: &TaskCtx,
    uid: &str,
    common: &ModelCommon,
    placements: &[Placement],
) -> Result<(), ActorError> {
    let replicas: Vec<(String, Role)> = placements.iter().map(|p| (p.replica_uid.clone(), p.role)).collect();
    let starts = placements.iter().map(|p| start_replica(ctx, uid, common, p));
    let result = build(ctx, uid, &replicas, starts, common.front.clone()).await;
    if result.is_err() {
        rollback(ctx, uid, placements).await;
    }
    result
}

fn spawn_failed(what: &str, e: ractor::SpawnErr) -> ActorError {
    ActorError::Internal(format!("starting the {what}: {e}"))
}

/// Rebuilds a model from replicas that already serve (a restarted supervisor adopting what its
/// workers report): its block tracker, then its router over them. A failure destroys only what
/// this created; the replicas keep running, to be adopted again.
pub(super) async fn run_adopt(
    ctx: &TaskCtx,
    uid: &str,
    replicas: &[(String, Role)],
    front: ModelFront,
) -> Result<(), ActorError> {
    let finds = replicas.iter().map(|(r, _)| find_replica(ctx, r));
    build(ctx, uid, replicas, finds, front).await
}

/// Adds replicas that already serve (a worker that came back with them, or the rest of an
/// adopted model) to their model's router.
pub(super) async fn run_rejoin(
    ctx: &TaskCtx,
    uid: &str,
    actors: Option<ModelActors>,
    replicas: &[(String, Role)],
) -> Result<(), ActorError> {
    let actors = actors.ok_or_else(|| ActorError::ModelNotFound(uid.to_owned()))?;
    for (replica_uid, role) in replicas {
        let replica = find_replica(ctx, replica_uid).await?;
        let add = RouterMsg::AddReplica { replica_uid: replica_uid.clone(), role: *role, replica };
        actors.router.cast(add).map_err(|e| ActorError::Internal(format!("the router is gone: {e}")))?;
    }
    Ok(())
}

/// Tells a worker to stop replicas the supervisor ended (best effort: a worker that keeps
/// reporting them is told again at its next heartbeat).
pub(super) async fn stop_orphans(ctx: &TaskCtx, worker_id: &str, replicas: &[String]) {
    let replicas: Vec<(String, String)> =
        replicas.iter().map(|r| (worker_id.to_owned(), r.clone())).collect();
    teardown(ctx, None, &replicas).await;
}

/// A replica that serves, found through its process group (a remote one appears shortly
/// after its node's connection does).
async fn find_replica(ctx: &TaskCtx, replica_uid: &str) -> Result<ActorRef<ReplicaMsg>, ActorError> {
    wait_for_member(&ctx.ns.replica_group(replica_uid), ctx.times.call).await.map(Into::into).ok_or_else(
        || ActorError::Unreachable {
            what: format!("replica `{replica_uid}`"),
            reason: "it never appeared in its process group".into(),
        },
    )
}

/// Creates a model's block tracker, then gets its replicas from `starts` (one future per entry
/// of `replicas`, run together), then its router.
async fn build<F>(
    ctx: &TaskCtx,
    uid: &str,
    roles: &[(String, Role)],
    starts: impl Iterator<Item = F>,
    front: ModelFront,
) -> Result<(), ActorError>
where
    F: std::future::Future<Output = Result<ActorRef<ReplicaMsg>, ActorError>>,
{
    let sup: ActorCell = ctx.sup.get_cell();
    let (tracker, _) = Actor::spawn_linked(
        Some(ctx.ns.tracker_name(uid)),
        BlockTracker,
        ctx.ns.tracker_group(uid),
        sup.clone(),
    )
    .await
    .map_err(|e| spawn_failed("block tracker", e))?;
    let results = futures::future::join_all(starts).await;
    let mut replicas = Vec::with_capacity(roles.len());
    let mut failure = None;
    for ((replica_uid, role), r) in roles.iter().zip(results) {
        match r {
            Ok(actor) => replicas.push((replica_uid.clone(), *role, actor)),
            Err(e) => {
                if !matches!(e, ActorError::LaunchCancelled(_)) {
                    tracing::warn!(model_uid = %uid, %replica_uid, error = %e, "replica failed to start");
                }
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
    let args = RouterArgs { replicas, prefill_fallback: front.prefill_fallback };
    match Actor::spawn_linked(Some(ctx.ns.router_name(uid)), router, args, sup).await {
        Ok((router, _)) => {
            let limit = front.request_limit.map(crate::limit::RequestLimit::new);
            let prefill_fallback = front.prefill_fallback;
            ctx.models
                .insert(uid, ModelActors { router, tracker, chat: front.chat, limit, prefill_fallback });
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
pub(super) async fn run_scale(
    ctx: &TaskCtx,
    uid: &str,
    actors: Option<ModelActors>,
    plan: &ScalePlan,
) -> Result<(), ActorError> {
    let result = async {
        let actors = actors.ok_or_else(|| ActorError::ModelNotFound(uid.to_owned()))?;
        let starts = plan.placements.iter().map(|p| start_replica(ctx, uid, &plan.common, p));
        let mut added = Vec::with_capacity(plan.placements.len());
        for (p, r) in plan.placements.iter().zip(futures::future::join_all(starts).await) {
            added.push((p.replica_uid.clone(), p.role, r?));
        }
        let running =
            call_local(&actors.router, "router", ctx.times.call, |reply| RouterMsg::Replicas { reply })
                .await?;
        let mut all: Vec<_> = running
            .into_iter()
            .filter_map(|held| {
                let role = plan.others.iter().find(|(o, _)| *o == held.uid).map(|(_, role)| *role)?;
                Some((held.uid, role, held.replica))
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
    replicas: &[(String, Role, ActorRef<ReplicaMsg>)],
) -> Result<(), ActorError> {
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
    common: &ModelCommon,
    p: &Placement,
) -> Result<ActorRef<ReplicaMsg>, ActorError> {
    let what = format!("worker {}", p.worker_id);
    let worker = worker_ref(ctx, &p.worker_id).ok_or_else(|| ActorError::Unreachable {
        what: what.clone(),
        reason: "it left the cluster".into(),
    })?;
    let spec = p.replica_spec(uid, common);
    let load = call(&worker, &what, ctx.times.load, |reply| WorkerMsg::SpawnReplica {
        spec: Wire::ok(Box::new(spec)),
        reply,
    });
    // A worker that freezes or loses its network while loading never answers: the launch
    // fails once the supervisor stops counting it alive, not at the load's deadline.
    tokio::select! {
        loaded = load => loaded?,
        () = worker_lost(ctx, &p.worker_id) => {
            return Err(ActorError::Unreachable {
                what,
                reason: "it stopped sending heartbeats while the replica was loading".into(),
            });
        }
    }
    find_replica(ctx, &p.replica_uid).await
}

/// The workers the supervisor no longer counts alive (none when it does not answer).
async fn lost_workers(ctx: &TaskCtx) -> Vec<String> {
    let workers =
        call(&ctx.sup, "supervisor", ctx.times.call, |reply| SupervisorMsg::ListWorkers { reply }).await;
    workers.unwrap_or_default().into_iter().filter(|w| !w.alive).map(|w| w.info.worker_id).collect()
}

/// Resolves once the supervisor no longer counts worker `worker_id` alive (its heartbeats
/// stopped, or its node went); asked at each heartbeat check. Never resolves while the
/// supervisor does not answer, so that a busy supervisor fails no launch.
async fn worker_lost(ctx: &TaskCtx, worker_id: &str) {
    let mut tick = tokio::time::interval(ctx.times.heartbeat_check);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if lost_workers(ctx).await.iter().any(|w| w == worker_id) {
            return;
        }
    }
}

/// Destroys whatever a failed launch created: its local actors and every replica placed.
pub(super) async fn rollback(ctx: &TaskCtx, uid: &str, placements: &[Placement]) {
    let actors = ctx.models.remove(uid);
    let replicas: Vec<(String, String)> =
        placements.iter().map(|p| (p.worker_id.clone(), p.replica_uid.clone())).collect();
    teardown(ctx, actors, &replicas).await;
}

/// Stops a model's router and tracker, then its replicas, each within the stop time.
pub(super) async fn teardown(ctx: &TaskCtx, actors: Option<ModelActors>, replicas: &[(String, String)]) {
    if let Some(actors) = actors {
        for cell in [actors.router.get_cell(), actors.tracker.get_cell()] {
            if let Err(e) = cell.stop_and_wait(Some("model terminated".into()), Some(ctx.times.stop)).await {
                tracing::warn!(error = %e, "a model actor did not stop in time");
            }
        }
    }
    // A worker the supervisor counts lost would only let the call run to its deadline; it
    // stops the replica itself when it reports back and its model is gone.
    let lost = lost_workers(ctx).await;
    let stops = replicas.iter().filter(|(worker_id, _)| !lost.contains(worker_id)).map(
        |(worker_id, replica_uid)| async move {
            let Some(worker) = worker_ref(ctx, worker_id) else { return };
            let stopped =
                call(&worker, &format!("worker {worker_id}"), ctx.times.call + ctx.times.stop, |reply| {
                    WorkerMsg::StopReplica { replica_uid: replica_uid.clone(), reply }
                })
                .await;
            if let Err(e) = stopped {
                tracing::warn!(%replica_uid, error = %e, "could not stop a replica");
            }
        },
    );
    futures::future::join_all(stops).await;
}
