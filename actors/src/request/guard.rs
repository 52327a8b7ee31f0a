//! What a request leaves behind when its caller goes away early.

use crate::replica::ReplicaMsg;
use crate::router::RouterMsg;
use crate::wire::call;
use ractor::ActorRef;
use std::time::Duration;

/// Cleans up after a request whose caller went away before it started (the client
/// disconnected while the prompt was computed or the pages moved): the router forgets it and
/// it is aborted on its replicas, which also frees any room already published for it.
pub(super) struct RequestGuard {
    pub(super) router: Option<ActorRef<RouterMsg>>,
    pub(super) replicas: Vec<ActorRef<ReplicaMsg>>,
    pub(super) request_id: String,
    pub(super) timeout: Duration,
}

impl RequestGuard {
    /// The request started: nothing to clean up any more.
    pub(super) fn disarm(&mut self) {
        self.router = None;
        self.replicas.clear();
    }
}

impl Drop for RequestGuard {
    /// The replicas are told first and the router after their answers: until then the id stays
    /// taken, so a retry under the same id cannot start before the abort meant for this attempt
    /// lands, and be ended by it.
    fn drop(&mut self) {
        let Some(router) = self.router.take() else { return };
        let (replicas, timeout) = (std::mem::take(&mut self.replicas), self.timeout);
        let request_id = self.request_id.clone();
        let finished = move |router: ActorRef<RouterMsg>, request_id: String| {
            if router.cast(RouterMsg::Finished { request_id }).is_err() {
                tracing::debug!("the router is gone");
            }
        };
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            finished(router, request_id);
            return;
        };
        rt.spawn(async move {
            let aborts = replicas.iter().map(|replica| {
                let request_id = request_id.clone();
                async move {
                    let abort =
                        call(replica, "replica", timeout, |reply| ReplicaMsg::Abort { request_id, reply });
                    if let Err(e) = abort.await {
                        tracing::debug!(error = %e, "could not abort an abandoned request");
                    }
                }
            });
            futures::future::join_all(aborts).await;
            finished(router, request_id);
        });
    }
}
