//! The replica: one per model replica, on a worker node. It owns one engine and serves the
//! pull protocol:
//!
//! 1. `Generate` starts a request on the engine and returns at once; a task drains the
//!    engine's stream into the request's buffer.
//! 2. The caller pulls with `NextEvents` (a long poll): the reply comes as soon as at least one
//!    event is buffered, or after the long-poll time with an empty batch. A batch with `done`
//!    is the last.
//! 3. A caller that stops pulling (it went away, or its node did) is noticed by the sweep: the
//!    request is aborted after the idle time. `Abort` ends a request at once.
//!
//! Pulling instead of pushing keeps every message serializable: an actor reference cannot
//! travel inside a cluster message, so the replica cannot be handed a place to push to.

pub(crate) mod handoff;
pub(crate) mod requests;
pub(crate) mod rooms;
pub(crate) mod serving;
pub(crate) mod snapshot;

use crate::error::ActorError;
use crate::spec::ReplicaSpec;
use crate::spec::Role;
use crate::view::ReplicaStats;
use crate::wire::{Wire, answer};
use handoff::{Handoff, HandoffSide, HandoffTimes, Prefilled};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use ractor_cluster::RactorClusterMessage;
use requests::{EventBatch, RequestTable};
use serving::{Recorder, Timeline};
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use xinf_engine::{Engine, EngineError, Engines, GenerateRequest};

/// Messages of a replica; every one may cross nodes.
#[derive(RactorClusterMessage)]
pub(crate) enum ReplicaMsg {
    /// Start a request; the reply comes once the engine accepted it.
    #[rpc]
    Generate { request: Wire<GenerateRequest>, reply: RpcReplyPort<Wire<()>> },
    /// Pull the next events of a request (long poll).
    #[rpc]
    NextEvents { request_id: String, reply: RpcReplyPort<Wire<EventBatch>> },
    /// Abort a request; `true` when it was running here.
    #[rpc]
    Abort { request_id: String, reply: RpcReplyPort<Wire<bool>> },
    /// Load figures.
    #[rpc]
    Stats { reply: RpcReplyPort<Wire<ReplicaStats>> },
    /// Compute a prompt and publish its KV in a room (prefill replicas); the reply is the
    /// handoff a decode replica needs.
    #[rpc]
    Prefill { request: Wire<GenerateRequest>, reply: RpcReplyPort<Wire<Prefilled>> },
    /// Fetch a handoff's pages and start the request on them (decode replicas); the reply
    /// comes once the engine accepted it, and the events are pulled as for `Generate`.
    #[rpc]
    GenerateImported {
        request: Wire<GenerateRequest>,
        handoff: Wire<Box<Handoff>>,
        reply: RpcReplyPort<Wire<()>>,
    },
    /// The model contract of the loaded engine (compared across P/D replicas at launch).
    #[rpc]
    Contract { reply: RpcReplyPort<Wire<xinf_engine::ModelContract>> },
    /// The decode side is done with a room: free its pinned KV. `false` when it was gone.
    #[rpc]
    Release { room: u64, reply: RpcReplyPort<Wire<bool>> },
    /// Abort requests nobody pulls any more (sent by the replica to itself).
    Sweep,
}

/// Time limits of the pull protocol.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PullTimes {
    /// How long a `NextEvents` waits for an event before answering with an empty batch.
    pub(crate) long_poll: Duration,
    /// How long a request may go unpulled before it is aborted.
    pub(crate) idle_abort: Duration,
}

/// What a replica starts with.
pub(crate) struct ReplicaArgs {
    pub(crate) spec: ReplicaSpec,
    pub(crate) times: PullTimes,
    /// The process group the replica joins once its engine is loaded, so the router finds it.
    pub(crate) group: String,
    /// The process group of the model's block tracker.
    pub(crate) tracker_group: String,
    pub(crate) worker_id: String,
    /// The address of the worker's node, where a prefill replica serves its pages.
    pub(crate) ip: IpAddr,
    pub(crate) handoff: HandoffTimes,
    /// The engines this node offers.
    pub(crate) engines: Engines,
}

/// The replica actor.
pub(crate) struct Replica;

/// A loaded replica.
pub(crate) struct ReplicaState {
    engine: Arc<dyn Engine>,
    requests: Arc<RequestTable>,
    replica_uid: String,
    worker_id: String,
    role: Role,
    times: PullTimes,
    served: Arc<AtomicU64>,
    /// Per-request latencies and finish reasons, recorded by the request tasks.
    serving: Arc<Recorder>,
    handoff: Arc<HandoffSide>,
}

/// Loads the replica's engine through the node's loader of that name (blocking: file reads,
/// maybe a download).
fn load_engine(spec: &ReplicaSpec, engines: &Engines, ip: IpAddr) -> Result<Arc<dyn Engine>, ActorError> {
    let loader = engines.get(&spec.engine).ok_or_else(|| {
        ActorError::launch(
            crate::LaunchRule::EngineNotAvailable,
            format!(
                "model_engine '{}' is not available on this worker (it offers {:?})",
                spec.engine, engines
            ),
        )
    })?;
    let mut config = spec.engine_config.clone();
    match spec.role {
        crate::spec::Role::Prefill => config.set_kv_role(xinf_engine::KvRole::Producer),
        crate::spec::Role::Decode => config.set_kv_role(xinf_engine::KvRole::Consumer),
        crate::spec::Role::Hybrid => {}
    }
    // An engine server publishes rooms from its own process: on this worker's data address.
    config.set_page_ip(ip);
    Ok(loader.load(&spec.source, &config)?)
}

impl Actor for Replica {
    type Msg = ReplicaMsg;
    type State = ReplicaState;
    type Arguments = ReplicaArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: ReplicaArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        let spec = args.spec;
        let times = args.handoff.with_model(&spec.handoff);
        if times.policy == xinf_transfer::transport::TransportPolicy::Nixl {
            // Refuse at load, with what to install, rather than at the first request.
            xinf_transfer::nixl::available().map_err(|e| ActorError::NixlNotAvailable(e.to_string()))?;
        }
        tracing::info!(model_uid = %spec.model_uid, replica_uid = %spec.replica_uid, gpus = ?spec.gpus, "loading replica");
        let (loader, engines, ip) = (spec.clone(), args.engines, args.ip);
        let engine = tokio::task::spawn_blocking(move || load_engine(&loader, &engines, ip))
            .await
            .map_err(|e| ActorError::Internal(format!("the loading thread failed: {e}")))??;
        let serve_pages = spec.role == Role::Prefill;
        let handoff = HandoffSide::new(engine.clone(), serve_pages, args.ip, times).await?;
        handoff.join_tracker(&spec.replica_uid, &args.tracker_group);
        let handoff = Arc::new(handoff);
        ractor::pg::join(args.group, vec![myself.get_cell()]);
        watch_engine(&myself, &engine, &spec.replica_uid);
        myself.send_interval(Duration::from_millis(500).min(args.times.idle_abort), || ReplicaMsg::Sweep);
        Ok(ReplicaState {
            engine,
            requests: Arc::new(RequestTable::default()),
            replica_uid: spec.replica_uid,
            worker_id: args.worker_id,
            role: spec.role,
            times: args.times,
            served: Arc::default(),
            serving: Arc::default(),
            handoff,
        })
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        for id in state.requests.drain_all() {
            state.engine.abort(&id);
        }
        // An engine with processes of its own stops them before the replica is gone, so a
        // replica launched next on the same GPU finds its memory free.
        let engine = state.engine.clone();
        if let Err(e) = tokio::task::spawn_blocking(move || engine.shutdown()).await {
            tracing::warn!(replica_uid = %state.replica_uid, error = %e, "stopping the engine failed");
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
            ReplicaMsg::Generate { request, reply } => {
                let outcome = request.0.and_then(|request| start(state, request));
                answer(reply, Wire(outcome));
            }
            ReplicaMsg::NextEvents { request_id, reply } => next_events(state, request_id, reply),
            ReplicaMsg::Abort { request_id, reply } => {
                state.requests.aborted(&request_id);
                let running = state.engine.abort(&request_id);
                let held = state.handoff.abort(&request_id);
                answer(reply, Wire::ok(running || held));
            }
            ReplicaMsg::Prefill { request, reply } => match request.0 {
                Err(e) => answer(reply, Wire(Err(e))),
                Ok(request) => prefill(state, request, reply),
            },
            ReplicaMsg::GenerateImported { request, handoff, reply } => match (request.0, handoff.0) {
                (Err(e), _) | (_, Err(e)) => answer(reply, Wire(Err(e))),
                (Ok(request), Ok(handoff)) => generate_imported(state, request, handoff, reply),
            },
            ReplicaMsg::Contract { reply } => answer(reply, Wire::ok(state.engine.contract().clone())),
            ReplicaMsg::Release { room, reply } => answer(reply, Wire::ok(state.handoff.release(room))),
            ReplicaMsg::Stats { reply } => answer(reply, Wire::ok(stats(state))),
            ReplicaMsg::Sweep => {
                for id in state.requests.expire(Instant::now(), state.times.idle_abort) {
                    tracing::info!(request_id = %id, replica_uid = %state.replica_uid, "nobody pulls the request any more; aborting it");
                    state.engine.abort(&id);
                }
                state.handoff.sweep();
            }
        }
        Ok(())
    }
}

/// Stops the replica as soon as its engine can serve no more (its server process died): the
/// worker sees the replica stop and tells the supervisor, which marks it dead, so the router
/// stops sending to it and the model's status says so.
fn watch_engine(myself: &ActorRef<ReplicaMsg>, engine: &Arc<dyn Engine>, replica_uid: &str) {
    let (exited, myself, uid) = (engine.exited(), myself.clone(), replica_uid.to_owned());
    tokio::spawn(async move {
        let why = exited.await;
        tracing::error!(replica_uid = %uid, error = %why, "the replica's engine died");
        myself.stop(Some(why.to_string()));
    });
}

/// Answers a pull once events are buffered (or after the long poll), off the mailbox.
fn next_events(state: &ReplicaState, request_id: String, reply: RpcReplyPort<Wire<EventBatch>>) {
    match state.requests.get(&request_id) {
        None => answer(reply, Wire(Err(ActorError::Engine(EngineError::UnknownRequest(request_id))))),
        Some(slot) => {
            let table = state.requests.clone();
            let long_poll = state.times.long_poll;
            // Wait off the mailbox, so one slow request never holds up the others.
            tokio::spawn(async move {
                let batch = slot.next_batch(long_poll).await;
                if batch.done {
                    table.remove(&request_id);
                }
                answer(reply, Wire::ok(batch));
            });
        }
    }
}

/// Computes a prompt and publishes its KV off the mailbox; a room nobody will fetch (the caller
/// went away) is released at once.
fn prefill(state: &ReplicaState, request: GenerateRequest, reply: RpcReplyPort<Wire<Prefilled>>) {
    let received = Instant::now();
    let prefill = state.handoff.prefill(request);
    let (side, serving) = (state.handoff.clone(), state.serving.clone());
    // Compute off the mailbox: other requests and pulls go on meanwhile.
    tokio::spawn(async move {
        let result = prefill.await;
        let room = match &result {
            Ok(Prefilled::Room(h)) => Some(h.room),
            _ => None,
        };
        if room.is_some() {
            serving.prefilled(received, Instant::now());
        }
        if reply.send(Wire(result)).is_err()
            && let Some(room) = room
        {
            // Nobody will come for the pages.
            side.release(room);
        }
    });
}

/// Fetches a handoff's pages and starts the request on them, off the mailbox.
fn generate_imported(
    state: &ReplicaState,
    request: GenerateRequest,
    handoff: Box<Handoff>,
    reply: RpcReplyPort<Wire<()>>,
) {
    if !state.requests.free_for_new(&request.request_id) {
        let id = request.request_id;
        answer(reply, Wire(Err(ActorError::Engine(EngineError::DuplicateRequest(id)))));
        return;
    }
    let received = Instant::now();
    let since = state.handoff.epoch();
    let (engine, requests, served) = (state.engine.clone(), state.requests.clone(), state.served.clone());
    let (side, serving) = (state.handoff.clone(), state.serving.clone());
    // An engine that loads the KV itself (an engine server) is told the room instead, and the
    // answer (after which the router releases the room) waits for its stream's first event:
    // the engine's load is over by then.
    let fetch = (!engine.fetches_kv()).then(|| state.handoff.fetch(&handoff));
    tokio::spawn(async move {
        let started = async {
            let id = request.request_id.clone();
            let stream = match fetch {
                Some(fetch) => {
                    let kv = fetch.await?;
                    engine.submit_imported(request, kv).inspect_err(|_| side.failed())?
                }
                None => {
                    let kv = side.remote_kv(&handoff)?;
                    let mut stream = engine.submit_remote(request, kv).inspect_err(|_| side.failed())?;
                    let first = futures::StreamExt::next(&mut stream).await;
                    Box::pin(futures::StreamExt::chain(futures::stream::iter(first), stream))
                }
            };
            drain(Drain { requests: &requests, served: &served, serving: &serving, received }, &id, stream);
            if side.was_aborted(&id, since) {
                // The abort came while the pages were in flight.
                requests.aborted(&id);
                engine.abort(&id);
            }
            Ok::<_, ActorError>(())
        }
        .await;
        answer(reply, Wire(started));
    });
}

/// The replica's load figures.
fn stats(state: &ReplicaState) -> ReplicaStats {
    let s = state.engine.stats();
    ReplicaStats {
        replica_uid: state.replica_uid.clone(),
        worker_id: state.worker_id.clone(),
        running: s.running as u64,
        queued: s.queued as u64,
        requests_served: state.served.load(Ordering::Relaxed),
        prompt_tokens: s.prompt_tokens,
        cached_prompt_tokens: s.cached_prompt_tokens,
        generated_tokens: s.generated_tokens,
        pinned_blocks: s.pinned_blocks as u64,
        handoff: state.handoff.stats(),
        role: state.role,
        serving: state.serving.stats(),
        // The replica does not know; the router, which took it out of rotation, says.
        draining: false,
    }
}

/// Starts a request on the engine and a task that buffers its events.
fn start(state: &mut ReplicaState, request: GenerateRequest) -> Result<(), ActorError> {
    let received = Instant::now();
    let id = request.request_id.clone();
    if !state.requests.free_for_new(&id) {
        return Err(ActorError::Engine(EngineError::DuplicateRequest(id)));
    }
    let stream = state.engine.submit(request)?;
    if state.role == Role::Decode {
        state.handoff.computed_own_prompt();
    }
    let to = Drain { requests: &state.requests, served: &state.served, serving: &state.serving, received };
    drain(to, &id, stream);
    Ok(())
}

/// Where a started request's events and figures go.
struct Drain<'a> {
    requests: &'a RequestTable,
    served: &'a AtomicU64,
    serving: &'a Arc<Recorder>,
    /// When the request reached the replica.
    received: Instant,
}

/// Registers a started request and a task that buffers its events for the pulls and records
/// its latencies and finish reason once its stream ends.
fn drain(to: Drain<'_>, id: &str, mut stream: xinf_engine::TokenStream) {
    let now = Instant::now();
    let slot = to.requests.insert(id, now);
    to.served.fetch_add(1, Ordering::Relaxed);
    to.serving.accepted(to.received, now);
    let (serving, mut timeline) = (to.serving.clone(), Timeline::new(to.received));
    tokio::spawn(async move {
        use futures::StreamExt;
        let mut recorded = false;
        while let Some(event) = stream.next().await {
            let now = Instant::now();
            timeline.see(&event, now);
            // Record before the caller can see the last event, so stats read after a request
            // ended include it.
            if timeline.ended() && !recorded {
                serving.finished(&timeline, now);
                recorded = true;
            }
            slot.push(event);
        }
        if !recorded {
            serving.finished(&timeline, Instant::now());
        }
        slot.finish();
    });
}
