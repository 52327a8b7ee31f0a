//! A client's retry that reuses its request id.
//!
//! A client that gives up on a request (its own timeout, a restart) and sends it again with the
//! same `X-Request-Id` (or `request_id`) usually does so before the server has noticed the first
//! connection close: the server sees a closed connection only when it next writes to it or
//! polls it, and the abort then travels to the replica or engine server that runs the request.
//! Until that lands the id is still running, and the retry would be refused as a duplicate
//! (409). The REST layer therefore lets such a start wait, briefly, for the id to come free;
//! a true duplicate (both connections open) is still refused, once the wait is over.

use crate::api::{ModelService, ServiceError};
use std::time::Duration;
use tokio::time::Instant;
use xinf_engine::{GenerateRequest, TokenStream};

/// How long a start whose id is still running waits for it to end. An abort lands within a
/// step or two of the engine (a prompt chunk on a slow CPU is well under a second), and an
/// external engine server's abort within its call timeout's first second.
pub(crate) const DUPLICATE_GRACE: Duration = Duration::from_secs(2);

/// How often the start is tried again meanwhile.
const RETRY_EVERY: Duration = Duration::from_millis(20);

/// [`ModelService::generate_all`], tried again while the refusal is a duplicate request id and
/// [`DUPLICATE_GRACE`] has not passed; then its outcome as it is.
pub(crate) async fn generate_all(
    service: &dyn ModelService,
    model: &str,
    requests: Vec<GenerateRequest>,
) -> Result<Vec<TokenStream>, ServiceError> {
    let deadline = Instant::now() + DUPLICATE_GRACE;
    loop {
        match service.generate_all(model, requests.clone()).await {
            Err(e) if is_duplicate(&e) && Instant::now() + RETRY_EVERY < deadline => {
                tracing::debug!(target: "xinf::api", error = %e, "request id still running; trying again");
                tokio::time::sleep(RETRY_EVERY).await;
            }
            outcome => return outcome,
        }
    }
}

/// Whether a start was refused because its id is running: the router's refusal or the
/// engine's.
fn is_duplicate(e: &ServiceError) -> bool {
    e.code() == "duplicate_request_id"
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::ModelInfo;
    use crate::api::ModelStats;
    use crate::api::service::ServiceFuture;
    use futures::FutureExt;
    use std::sync::Mutex;
    use xinf_engine::EngineError;

    /// Refuses each start as a duplicate until `free_after` starts have been refused, then
    /// answers with no streams; counts the starts.
    struct Held {
        free_after: usize,
        starts: Mutex<usize>,
        error: fn() -> ServiceError,
    }

    impl ModelService for Held {
        fn list(&self) -> ServiceFuture<Vec<ModelInfo>> {
            async { Ok(Vec::new()) }.boxed()
        }
        fn get(&self, uid: &str) -> ServiceFuture<ModelInfo> {
            let uid = uid.to_owned();
            async move { Err(ServiceError::NotFound(uid)) }.boxed()
        }
        fn generate(&self, _: &str, _: GenerateRequest) -> ServiceFuture<TokenStream> {
            async { Err(ServiceError::Unsupported("one start")) }.boxed()
        }
        fn generate_all(&self, _: &str, _: Vec<GenerateRequest>) -> ServiceFuture<Vec<TokenStream>> {
            let mut starts = self.starts.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            *starts += 1;
            let outcome = if *starts > self.free_after { Ok(Vec::new()) } else { Err((self.error)()) };
            async move { outcome }.boxed()
        }
        fn abort(&self, _: &str, _: &str) -> ServiceFuture<bool> {
            async { Ok(false) }.boxed()
        }
        fn stats(&self, uid: &str) -> ServiceFuture<ModelStats> {
            let uid = uid.to_owned();
            async move { Err(ServiceError::NotFound(uid)) }.boxed()
        }
    }

    fn held(free_after: usize, error: fn() -> ServiceError) -> Held {
        Held { free_after, starts: Mutex::new(0), error }
    }

    fn engine_duplicate() -> ServiceError {
        ServiceError::Engine(EngineError::DuplicateRequest("r".into()))
    }

    fn router_duplicate() -> ServiceError {
        ServiceError::Cluster(xinf_actors::ActorError::DuplicateRequest("r".into()))
    }

    fn starts(h: &Held) -> usize {
        *h.starts.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    #[tokio::test]
    async fn a_start_waits_for_its_id_to_come_free() {
        for error in [engine_duplicate as fn() -> ServiceError, router_duplicate] {
            let h = held(3, error);
            let streams = generate_all(&h, "m", Vec::new()).await;
            assert!(matches!(streams, Ok(ref s) if s.is_empty()), "{:?}", streams.err());
            assert_eq!(starts(&h), 4);
        }
    }

    #[tokio::test]
    async fn an_id_that_stays_running_is_refused_after_the_grace() {
        let h = held(usize::MAX, router_duplicate);
        let began = Instant::now();
        let e = generate_all(&h, "m", Vec::new()).await.err();
        assert_eq!(e.map(|e| e.code()), Some("duplicate_request_id"));
        assert!(began.elapsed() + RETRY_EVERY >= DUPLICATE_GRACE, "{:?}", began.elapsed());
        assert!(starts(&h) > 1);
    }

    #[tokio::test]
    async fn other_refusals_are_not_tried_again() {
        let h = held(usize::MAX, || ServiceError::NotReady("m".into()));
        let e = generate_all(&h, "m", Vec::new()).await.err();
        assert_eq!(e.map(|e| e.code()), Some("model_not_ready"));
        assert_eq!(starts(&h), 1);
    }
}
