//! Draining: a stopping worker's replicas leave the rotation and finish their requests (the
//! worker asks how many still run until none do, and says when its drain time ran out, which
//! ends the rest); and one replica removed from its model (`DELETE
//! /v1/models/{uid}/replicas/{id}`), which drains for at most the time the caller gave, then
//! is stopped by its worker and leaves the model.

use super::tasks::{TaskCtx, teardown};
use super::{ModelActors, Supervisor, SupervisorMsg};
use crate::block_tracker::BlockTrackerMsg;
use crate::router::RouterMsg;
use crate::supervisor::state::{Removal, SupervisorState};
use crate::wire::{Wire, answer, call, call_raw};
use ractor::{ActorRef, RpcReplyPort};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How often a removal asks the router whether the replica still runs requests.
const DRAIN_POLL: Duration = Duration::from_millis(200);

impl Supervisor {
    /// Takes a stopping worker's replicas out of their routers' rotation and answers with the
    /// number of requests still running on them (asked off the mailbox: a router is local, but
    /// the supervisor answers nobody while it waits).
    pub(super) fn drain_worker(
        &self,
        state: &mut SupervisorState,
        worker_id: &str,
        reply: RpcReplyPort<Wire<u64>>,
    ) {
        let mut by_model: HashMap<String, Vec<String>> = HashMap::new();
        for (model_uid, replica_uid) in state.drain_worker(worker_id) {
            by_model.entry(model_uid).or_default().push(replica_uid);
        }
        let routers: Vec<(ActorRef<RouterMsg>, Vec<String>)> = by_model
            .into_iter()
            .filter_map(|(model_uid, uids)| self.models.get(&model_uid).map(|a| (a.router, uids)))
            .collect();
        let timeout = self.times.call;
        tokio::spawn(async move {
            let mut running = 0u64;
            for (router, replica_uids) in routers {
                // A router that is gone ended with its model: nothing runs there.
                let n =
                    call_raw(&router, "router", timeout, |reply| RouterMsg::Drain { replica_uids, reply })
                        .await;
                running += n.map_or(0, |n| n as u64);
            }
            answer(reply, Wire::ok(running));
        });
    }

    /// Ends the requests still running on a draining worker's replicas, with `why`: the
    /// worker stops them now.
    pub(super) fn cut_drained(&self, state: &mut SupervisorState, worker_id: &str, why: &str) {
        for (model_uid, replica_uid) in state.drain_worker(worker_id) {
            if let Some(actors) = self.models.get(&model_uid) {
                let reason = format!("replica `{replica_uid}` of model `{model_uid}` stopped: {why}");
                if actors.router.cast(RouterMsg::RemoveReplica { replica_uid, reason }).is_err() {
                    tracing::debug!("the router is gone");
                }
            }
        }
    }

    /// Starts removing a replica; a task drains and stops it, reports back with `RemoveDone`,
    /// then answers.
    pub(super) fn remove_replica(
        &self,
        myself: &ActorRef<SupervisorMsg>,
        state: &mut SupervisorState,
        model_uid: String,
        replica_uid: String,
        drain: Duration,
        reply: RpcReplyPort<Wire<()>>,
    ) {
        let worker_id = match state.begin_remove(&model_uid, &replica_uid) {
            Err(e) => return answer(reply, Wire(Err(e))),
            Ok(Removal::Forgotten) => {
                tracing::info!(%model_uid, %replica_uid, "a lost replica was removed from its model");
                return answer(reply, Wire::ok(()));
            }
            Ok(Removal::Drain { worker_id }) => worker_id,
        };
        tracing::info!(%model_uid, %replica_uid, ?drain, "removing a replica: it drains first");
        let ctx = self.task_ctx(myself);
        let actors = self.models.get(&model_uid);
        tokio::spawn(async move {
            let left = match &actors {
                Some(actors) => drained(&ctx, &actors.router, &replica_uid, drain).await,
                None => 0,
            };
            if left > 0 {
                tracing::warn!(%model_uid, %replica_uid, running = left, "requests still run after the drain time; they end now");
            }
            if let Some(actors) = &actors {
                forget(actors, &model_uid, &replica_uid);
            }
            teardown(&ctx, None, &[(worker_id, replica_uid.clone())]).await;
            let done = call(&ctx.sup, "supervisor", ctx.times.call, |reply| SupervisorMsg::RemoveDone {
                model_uid: model_uid.clone(),
                replica_uid: replica_uid.clone(),
                reply,
            })
            .await;
            tracing::info!(%model_uid, %replica_uid, "replica removed");
            answer(reply, Wire(done));
        });
    }
}

/// Takes the replica out of rotation and waits until it runs no request, at most `drain`;
/// returns how many still run.
async fn drained(ctx: &TaskCtx, router: &ActorRef<RouterMsg>, replica_uid: &str, drain: Duration) -> usize {
    let deadline = Instant::now() + drain;
    loop {
        let replica_uids = vec![replica_uid.to_owned()];
        let asked =
            call_raw(router, "router", ctx.times.call, |reply| RouterMsg::Drain { replica_uids, reply });
        // A router that is gone ended with its model: nothing runs there.
        let running = asked.await.unwrap_or(0);
        let now = Instant::now();
        if running == 0 || now >= deadline {
            return running;
        }
        tokio::time::sleep(DRAIN_POLL.min(deadline - now)).await;
    }
}

/// The router and block tracker let go of a removed replica; requests still on it end with
/// the reason.
fn forget(actors: &ModelActors, model_uid: &str, replica_uid: &str) {
    let reason = format!("replica `{replica_uid}` of model `{model_uid}` was removed");
    let removed = RouterMsg::RemoveReplica { replica_uid: replica_uid.to_owned(), reason };
    if actors.router.cast(removed).is_err() {
        tracing::debug!("the router is gone");
    }
    let unregister = BlockTrackerMsg::UnregisterReplica { replica_uid: replica_uid.to_owned() };
    if actors.tracker.cast(unregister).is_err() {
        tracing::debug!("the block tracker is gone");
    }
}
