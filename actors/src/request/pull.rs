//! The caller's side of the pull protocol: a task pulls a request's events from its replica and
//! feeds a local [`TokenStream`].
//!
//! The task ends when the request ends, when the replica cannot be reached (a typed error on
//! the stream), when the router reports the replica lost (an error at once, without waiting
//! for a time limit), or when the stream's consumer drops it (the request is then aborted on
//! the replica; if even that fails, the replica's idle sweep aborts it).

use crate::replica::ReplicaMsg;
use crate::router::{Routed, RouterMsg};
use crate::wire::call;
use futures::StreamExt;
use ractor::ActorRef;
use std::time::Duration;
use tokio::sync::mpsc;
use xinf_engine::{EngineError, TokenStream};

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

/// Starts pulling a routed request's events; returns the local stream.
pub(crate) fn open(routed: Routed, router: ActorRef<RouterMsg>, settings: PullSettings) -> TokenStream {
    // A small buffer: the consumer's pace limits how fast we pull.
    let (tx, rx) = mpsc::channel::<Result<xinf_engine::TokenEvent, EngineError>>(64);
    tokio::spawn(async move {
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
    });
    tokio_stream::wrappers::ReceiverStream::new(rx).boxed()
}

/// The error of a request whose replica was lost (or whose model was terminated): the service
/// cannot serve it now; a later request may be routed elsewhere.
pub(crate) fn lost(reason: Result<String, tokio::sync::oneshot::error::RecvError>) -> EngineError {
    EngineError::Process(reason.unwrap_or_else(|_| "the model was terminated".into()))
}

async fn abort(replica: &ActorRef<ReplicaMsg>, what: &str, request_id: &str, timeout: Duration) {
    let request_id = request_id.to_owned();
    if let Err(e) = call(replica, what, timeout, |reply| ReplicaMsg::Abort { request_id, reply }).await {
        tracing::debug!(error = %e, "could not abort a request");
    }
}
