//! The caller's side of the pull protocol: a task pulls a request's events from its replica and
//! feeds a local [`TokenStream`].
//!
//! The task ends when the request ends, when the replica cannot be reached (a typed error on
//! the stream), when the router reports the replica lost (an error at once, without waiting
//! for a time limit), or when the stream's consumer drops it (the request is then aborted on
//! the replica; if even that fails, the replica's idle sweep aborts it).

use super::guard::RequestGuard;
use crate::error::ActorError;
use crate::replica::ReplicaMsg;
use crate::router::{Routed, RouterMsg};
use crate::wire::call;
use futures::StreamExt;
use futures::future::BoxFuture;
use ractor::ActorRef;
use std::time::Duration;
use tokio::sync::mpsc;
use xinf_engine::{EngineError, TokenEvent, TokenStream};

/// Time limits of a pull loop.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PullSettings {
    /// The replica's long-poll time; a pull waits this plus `call` at most.
    pub(crate) long_poll: Duration,
    /// Ordinary call time limit (used for the abort of an abandoned request).
    pub(crate) call: Duration,
}

/// How a pull loop ended.
enum Ending {
    /// The request's last events were delivered.
    Done,
    /// The stream's consumer went away: abort on the replica.
    Abandoned,
    /// An error was delivered (replica lost or unreachable).
    Failed,
}

/// Starts pulling a routed request's events, after `lead` where given; returns the local
/// stream.
pub(crate) fn open(
    routed: Routed,
    router: ActorRef<RouterMsg>,
    settings: PullSettings,
    lead: Option<TokenEvent>,
) -> TokenStream {
    // A small buffer: the consumer's pace limits how fast we pull.
    let (tx, rx) = mpsc::channel::<Result<TokenEvent, EngineError>>(64);
    tokio::spawn(async move {
        if let Some(lead) = lead
            && tx.send(Ok(lead)).await.is_err()
        {
            tracing::debug!("the stream was dropped before it started");
        }
        pump(routed, router, settings, tx, None).await
    });
    tokio_stream::wrappers::ReceiverStream::new(rx).boxed()
}

/// The stream of a P/D request whose prefill's first token is shown before its decode leg
/// ran: `first` at once (the first token, after the prompt's report where asked for), then (once `leg` started the decode replica) the decode replica's
/// events, less its own copy of the first token. Until the leg started, `guard` cleans up
/// after a caller that goes away.
pub(super) fn open_after_first(
    first: Vec<TokenEvent>,
    leg: BoxFuture<'static, Result<(), ActorError>>,
    mut guard: RequestGuard,
    mut routed: Routed,
    router: ActorRef<RouterMsg>,
    settings: PullSettings,
) -> TokenStream {
    let (tx, rx) = mpsc::channel::<Result<TokenEvent, EngineError>>(64);
    let shown = first.iter().find_map(|event| match event {
        TokenEvent::Delta { token_id, text, .. } => Some((*token_id, text.clone())),
        TokenEvent::Prompt(_) | TokenEvent::Finished { .. } => None,
    });
    tokio::spawn(async move {
        for event in first {
            if tx.send(Ok(event)).await.is_err() {
                return;
            }
        }
        let started = tokio::select! {
            biased;
            reason = &mut routed.lost => {
                let _ = tx.send(Err(self::lost(reason))).await;
                return;
            }
            () = tx.closed() => return,
            started = leg => started,
        };
        guard.disarm();
        if let Err(e) = self::started(&router, &routed.request_id, true, started) {
            let _ = tx.send(Err(e.into_engine_error())).await;
            return;
        }
        pump(routed, router, settings, tx, shown).await;
    });
    tokio_stream::wrappers::ReceiverStream::new(rx).boxed()
}

/// Tells the router how a request's start went: a failed one is finished, a P/D one no longer
/// depends on its prefill replica. Returns the outcome.
pub(super) fn started<T>(
    router: &ActorRef<RouterMsg>,
    request_id: &str,
    pd: bool,
    outcome: Result<T, ActorError>,
) -> Result<T, ActorError> {
    let request_id = request_id.to_owned();
    let message = match &outcome {
        Err(_) => RouterMsg::Finished { request_id },
        Ok(_) if pd => RouterMsg::PrefillDone { request_id },
        Ok(_) => return outcome,
    };
    if router.cast(message).is_err() {
        tracing::debug!("the router is gone");
    }
    outcome
}

/// Pulls a request's events from its replica into `tx` until it ends. `shown`: a first token
/// the caller has had already, dropped from the replica's events when they start with it.
async fn pump(
    routed: Routed,
    router: ActorRef<RouterMsg>,
    settings: PullSettings,
    tx: mpsc::Sender<Result<TokenEvent, EngineError>>,
    mut shown: Option<(u32, String)>,
) {
    let Routed { request_id, replica_uid, replica, mut lost, .. } = routed;
    let what = format!("replica `{replica_uid}`");
    let pull_limit = settings.long_poll + settings.call;
    let ending = 'pull: loop {
        let pull = call(&replica, &what, pull_limit, |reply| ReplicaMsg::NextEvents {
            request_id: request_id.clone(),
            reply,
        });
        tokio::select! {
            biased;
            reason = &mut lost => {
                // The caller hears at once; then, best effort (a frozen replica answers
                // nothing), the replica is told, as it may still be running the request.
                let _ = tx.send(Err(self::lost(reason))).await;
                abort(&replica, &what, &request_id, settings.call).await;
                break 'pull Ending::Failed;
            }
            () = tx.closed() => break 'pull Ending::Abandoned,
            batch = pull => match batch {
                Ok(batch) => {
                    for event in batch.events {
                        if let Some((token, text)) = shown.take()
                            && let Ok(TokenEvent::Delta { token_id, text: again, .. }) = &event
                            && *token_id == token
                        {
                            if *again != text {
                                tracing::debug!(%request_id, shown = %text, decoded = %again, "the decode side decoded the first token differently");
                            }
                            continue;
                        }
                        if tx.send(event).await.is_err() {
                            break 'pull Ending::Abandoned;
                        }
                    }
                    if batch.done {
                        break 'pull Ending::Done;
                    }
                }
                Err(e) => {
                    let _ = tx.send(Err(e.into_engine_error())).await;
                    break 'pull Ending::Failed;
                }
            },
        }
    };
    if let Ending::Abandoned = ending {
        tracing::debug!(%request_id, "the stream was dropped; aborting the request");
        abort(&replica, &what, &request_id, settings.call).await;
    }
    if router.cast(RouterMsg::Finished { request_id }).is_err() {
        tracing::debug!("the router is gone");
    }
}

/// The error of a request whose replica was lost (or whose model was terminated): the service
/// cannot serve it now; a later request may be routed elsewhere.
pub(crate) fn lost(reason: Result<String, tokio::sync::oneshot::error::RecvError>) -> EngineError {
    EngineError::ReplicaLost(reason.unwrap_or_else(|_| "the model was terminated".into()))
}

async fn abort(replica: &ActorRef<ReplicaMsg>, what: &str, request_id: &str, timeout: Duration) {
    let request_id = request_id.to_owned();
    if let Err(e) = call(replica, what, timeout, |reply| ReplicaMsg::Abort { request_id, reply }).await {
        tracing::debug!(error = %e, "could not abort a request");
    }
}
