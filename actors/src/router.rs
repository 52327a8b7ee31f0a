//! The router: one per model, on the supervisor node. A thin actor around
//! [`policy::RouterPolicy`]; it picks replicas and keeps the running-request table, while the
//! caller drives each request's stream itself (see [`crate::pull`]), so a slow or dead replica
//! never blocks the router's mailbox.

pub(crate) mod policy;

use crate::error::ActorError;
use crate::replica::ReplicaMsg;
use crate::spec::Role;
use crate::wire::{answer, call};
use policy::{RouteError, RouterPolicy};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use ractor_cluster::RactorMessage;
use std::collections::HashMap;
use std::time::Duration;
use tokio::sync::oneshot;

/// A request the router placed on a replica.
pub(crate) struct Routed {
    pub(crate) request_id: String,
    pub(crate) replica_uid: String,
    pub(crate) replica: ActorRef<ReplicaMsg>,
    /// For a P/D model: the prefill replica, which computes the prompt first (the decode
    /// replica above then generates).
    pub(crate) prefill: Option<(String, ActorRef<ReplicaMsg>)>,
    /// Resolves with a reason when the replica is lost or the model terminated: the request
    /// cannot complete and its stream must end with an error at once.
    pub(crate) lost: oneshot::Receiver<String>,
    /// With `prefill_fallback`: resolves when the prefill replica is lost during the prefill;
    /// the request then runs whole on its decode replica.
    pub(crate) prefill_lost: Option<oneshot::Receiver<()>>,
}

/// How long an aborted request id stays refused.
const ABORT_BLOCK: Duration = Duration::from_secs(30);

/// A replica the router holds: in rotation, or draining (its worker stops, and it finishes its
/// running requests).
pub(crate) struct HeldReplica {
    pub(crate) uid: String,
    pub(crate) replica: ActorRef<ReplicaMsg>,
    pub(crate) draining: bool,
}

/// The replicas the router holds, by uid.
pub(crate) type ReplicaList = Vec<HeldReplica>;

/// Messages of the router (local only: they carry actor references and channels).
#[derive(RactorMessage)]
pub(crate) enum RouterMsg {
    /// Pick a replica for a new request.
    Route { request_id: String, reply: RpcReplyPort<Result<Routed, ActorError>> },
    /// A request's stream ended.
    Finished { request_id: String },
    /// A P/D request's decode replica holds its KV: the request no longer depends on its
    /// prefill replica, whose loss must not end it.
    PrefillDone { request_id: String },
    /// Abort a request on every replica.
    Abort { request_id: String, reply: RpcReplyPort<Result<bool, ActorError>> },
    /// A replica is lost: take it out of rotation and fail its requests.
    RemoveReplica { replica_uid: String, reason: String },
    /// A new replica (a scale-up) joins the rotation.
    AddReplica { replica_uid: String, role: Role, replica: ActorRef<ReplicaMsg> },
    /// The replicas in rotation, then those draining.
    Replicas { reply: RpcReplyPort<Result<ReplicaList, ActorError>> },
    /// The replicas' worker is stopping: no new requests for them. The reply counts the
    /// requests still using them, which the worker waits for.
    Drain { replica_uids: Vec<String>, reply: RpcReplyPort<usize> },
}

/// What the router starts with.
pub(crate) struct RouterArgs {
    pub(crate) replicas: Vec<(String, Role, ActorRef<ReplicaMsg>)>,
    /// `prefill_fallback` ([`RouterPolicy::new`]).
    pub(crate) prefill_fallback: bool,
}

/// The router actor of one model.
pub(crate) struct Router {
    pub(crate) model_uid: String,
    pub(crate) call_timeout: Duration,
}

/// The router's state: the pure policy plus the references and kill switches it cannot hold.
pub(crate) struct RouterState {
    policy: RouterPolicy,
    refs: HashMap<String, ActorRef<ReplicaMsg>>,
    kills: HashMap<String, oneshot::Sender<String>>,
    /// What tells a request in its prefill that its prefill replica is lost (`prefill_fallback`).
    spares: HashMap<String, oneshot::Sender<()>>,
    /// Request ids aborted recently, until when: a request that arrives after its own abort
    /// (the abort overtook it) is refused, as Xinference's `block_duration` does.
    blocked: HashMap<String, std::time::Instant>,
}

impl RouterState {
    /// Picks the replicas of a request (a prefill and a decode one in a P/D deployment) and
    /// keeps what kills it when one of them is lost.
    fn route(&mut self, request_id: &str, model_uid: &str) -> Result<Routed, ActorError> {
        let request_id = request_id.to_owned();
        match self.policy.begin_request(&request_id) {
            Err(RouteError::Duplicate) => Err(ActorError::DuplicateRequest(request_id.clone())),
            Err(RouteError::NoReplica(role)) => Err(ActorError::NoReplica {
                model_uid: model_uid.to_owned(),
                role: (role != Role::Hybrid).then_some(role),
            }),
            Ok((prefill_uid, replica_uid)) => {
                let prefill = match prefill_uid {
                    None => Ok(None),
                    Some(uid) => self.refs.get(&uid).cloned().map(|r| Some((uid.clone(), r))).ok_or(uid),
                };
                match (self.refs.get(&replica_uid).cloned(), prefill) {
                    (Some(replica), Ok(prefill)) => {
                        let (kill, lost) = oneshot::channel();
                        self.kills.insert(request_id.clone(), kill);
                        let prefill_lost = (prefill.is_some() && self.policy.falls_back()).then(|| {
                            let (spare, prefill_lost) = oneshot::channel();
                            self.spares.insert(request_id.clone(), spare);
                            prefill_lost
                        });
                        Ok(Routed {
                            request_id: request_id.clone(),
                            replica_uid,
                            replica,
                            prefill,
                            lost,
                            prefill_lost,
                        })
                    }
                    (None, _) | (_, Err(_)) => {
                        self.policy.finish(&request_id);
                        Err(ActorError::Internal(format!("replica `{replica_uid}` has no reference")))
                    }
                }
            }
        }
    }

    /// Lets go of the draining replicas that have finished their last request.
    fn drop_drained(&mut self, model_uid: &str) {
        for replica_uid in self.policy.drop_drained() {
            self.refs.remove(&replica_uid);
            tracing::info!(%model_uid, %replica_uid, "a draining replica finished its requests");
        }
    }

    fn kill(&mut self, request_id: &str, reason: &str) {
        if let Some(kill) = self.kills.remove(request_id) {
            // The stream may have ended already; nothing to tell then.
            let _ = kill.send(reason.to_owned());
        }
    }
}

impl Actor for Router {
    type Msg = RouterMsg;
    type State = RouterState;
    type Arguments = RouterArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        args: RouterArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        let mut policy = RouterPolicy::new(args.prefill_fallback);
        let mut refs = HashMap::new();
        for (uid, role, actor) in args.replicas {
            policy.add(&uid, role);
            refs.insert(uid, actor);
        }
        Ok(RouterState {
            policy,
            refs,
            kills: HashMap::new(),
            spares: HashMap::new(),
            blocked: HashMap::new(),
        })
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let reason = format!("model `{}` was terminated", self.model_uid);
        let ids: Vec<String> = state.kills.keys().cloned().collect();
        for id in ids {
            state.kill(&id, &reason);
        }
        Ok(())
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            RouterMsg::Route { request_id, reply } => {
                let now = std::time::Instant::now();
                if state.blocked.get(&request_id).is_some_and(|until| *until > now) {
                    let aborted = Err(ActorError::Engine(xinf_engine::EngineError::Aborted));
                    if reply.send(aborted).is_err() {
                        tracing::debug!("the caller is gone");
                    }
                    return Ok(());
                }
                let routed = state.route(&request_id, &self.model_uid);
                if reply.send(routed).is_err() {
                    // The caller gave up: the request will never run.
                    state.policy.finish(&request_id);
                    state.kills.remove(&request_id);
                    state.spares.remove(&request_id);
                }
            }
            RouterMsg::Finished { request_id } => {
                state.policy.finish(&request_id);
                state.kills.remove(&request_id);
                state.spares.remove(&request_id);
                state.drop_drained(&self.model_uid);
            }
            RouterMsg::PrefillDone { request_id } => {
                state.policy.prefill_done(&request_id);
                state.spares.remove(&request_id);
                state.drop_drained(&self.model_uid);
            }
            RouterMsg::Abort { request_id, reply } => {
                let now = std::time::Instant::now();
                state.blocked.retain(|_, until| *until > now);
                state.blocked.insert(request_id.clone(), now + ABORT_BLOCK);
                abort_everywhere(state, request_id, self.call_timeout, reply);
            }
            RouterMsg::RemoveReplica { replica_uid, reason } => {
                state.refs.remove(&replica_uid);
                // Requests in their prefill there run whole on their decode replica instead.
                for id in state.policy.spare_prefills_on(&replica_uid) {
                    if let Some(spare) = state.spares.remove(&id) {
                        let _ = spare.send(());
                    }
                }
                for id in state.policy.remove(&replica_uid) {
                    state.kill(&id, &reason);
                }
                tracing::info!(model_uid = %self.model_uid, %replica_uid, %reason, "replica taken out of rotation");
            }
            RouterMsg::Drain { replica_uids, reply } => {
                let mut running = 0;
                for uid in &replica_uids {
                    if state.policy.replicas().iter().any(|(r, _)| r == uid) {
                        tracing::info!(model_uid = %self.model_uid, replica_uid = %uid, "replica drains: its worker is stopping");
                    }
                    running += state.policy.drain(uid);
                }
                state.drop_drained(&self.model_uid);
                answer(reply, running);
            }
            RouterMsg::AddReplica { replica_uid, role, replica } => {
                state.policy.add(&replica_uid, role);
                state.refs.insert(replica_uid.clone(), replica);
                tracing::info!(model_uid = %self.model_uid, %replica_uid, role = role.as_str(), "replica joined the rotation");
            }
            RouterMsg::Replicas { reply } => answer(reply, Ok(held(state))),
        }
        Ok(())
    }
}

/// The replicas in rotation, by uid, then those draining, by uid.
fn held(state: &RouterState) -> ReplicaList {
    let mut rotation: Vec<String> = state.policy.replicas().into_iter().map(|(uid, _)| uid).collect();
    rotation.sort();
    let draining = state.policy.draining().map(str::to_owned);
    let flagged = rotation.into_iter().map(|uid| (uid, false)).chain(draining.map(|uid| (uid, true)));
    flagged
        .filter_map(|(uid, draining)| {
            let replica = state.refs.get(&uid)?.clone();
            Some(HeldReplica { uid, replica, draining })
        })
        .collect()
}

/// Aborts a request on every replica off the mailbox (a dead replica must not stall routing);
/// `true` when one of them was running it.
fn abort_everywhere(
    state: &RouterState,
    request_id: String,
    timeout: Duration,
    reply: RpcReplyPort<Result<bool, ActorError>>,
) {
    let replicas: Vec<(String, ActorRef<ReplicaMsg>)> =
        state.refs.iter().map(|(uid, r)| (uid.clone(), r.clone())).collect();
    // Fan out off the mailbox: a dead replica must not stall routing.
    tokio::spawn(async move {
        let calls = replicas.iter().map(|(uid, replica)| {
            let request_id = request_id.clone();
            async move {
                call(replica, &format!("replica `{uid}`"), timeout, |reply| ReplicaMsg::Abort {
                    request_id,
                    reply,
                })
                .await
            }
        });
        let results = futures::future::join_all(calls).await;
        let found = results.iter().any(|r| matches!(r, Ok(true)));
        let outcome = match results.into_iter().find_map(Result::err) {
            Some(e) if !found => Err(e),
            _ => Ok(found),
        };
        answer(reply, outcome);
    });
}
