//! Removing one replica of a serving model (`DELETE /v1/models/{uid}/replicas/{id}`): the
//! router takes it out of rotation and lets its running requests finish, for at most the
//! drain time the caller gave; then its worker stops it and it leaves the model.

use super::tasks::{TaskCtx, teardown};
use super::{ModelActors, Supervisor, SupervisorMsg};
use crate::block_tracker::BlockTrackerMsg;
use crate::router::RouterMsg;
use crate::supervisor::state::{Removal, SupervisorState};
use crate::wire::{Wire, answer, call, call_raw};
use ractor::{ActorRef, RpcReplyPort};
use std::time::{Duration, Instant};

/// How often a removal asks the router whether the replica still runs requests.
const DRAIN_POLL: Duration = Duration::from_millis(200);

impl Supervisor {
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
