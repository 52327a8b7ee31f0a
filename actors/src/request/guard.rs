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
    fn drop(&mut self) {
        if let Some(router) = self.router.take()
            && router.cast(RouterMsg::Finished { request_id: self.request_id.clone() }).is_err()
        {
            tracing::debug!("the router is gone");
        }
        let (replicas, timeout) = (std::mem::take(&mut self.replicas), self.timeout);
        let Ok(rt) = tokio::runtime::Handle::try_current() else { return };
        for replica in replicas {
            let request_id = self.request_id.clone();
            rt.spawn(async move {
                let abort =
                    call(&replica, "replica", timeout, |reply| ReplicaMsg::Abort { request_id, reply });
                if let Err(e) = abort.await {
                    tracing::debug!(error = %e, "could not abort an abandoned request");
                }
            });
        }
    }
}
