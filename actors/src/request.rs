//! Requests on a serving model: one replica runs it, or (P/D) a prefill replica computes the
//! prompt and hands its KV to a decode replica (`handoff`); either way the caller pulls the
//! events (`pull`). A caller that goes away before the request started is cleaned up by the
//! `guard`.

mod guard;
mod handoff;
pub(crate) mod pull;

use crate::cluster::Cluster;
use crate::error::ActorError;
use crate::replica::ReplicaMsg;
use crate::replica::handoff::Prefilled;
use crate::router::RouterMsg;
use crate::wire::{Wire, call, call_local};
use futures::StreamExt;
use guard::RequestGuard;
use pull::PullSettings;
use ractor::ActorRef;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use xinf_engine::{GenerateRequest, TokenEvent, TokenStream};

/// How far a request got when its caller gets its stream.
enum Started {
    /// It runs on the replica that generates it, whose events follow `lead` (the prompt's
    /// report from a prefill replica, where the request asked for one).
    Now { lead: Option<TokenEvent> },
    /// The prefill's first token (after the prompt's report, where asked for), shown at once;
    /// the decode leg, which starts the rest.
    Later { first: Vec<TokenEvent>, leg: futures::future::BoxFuture<'static, Result<(), ActorError>> },
}

/// Starts a whole request (its prompt too) on one replica.
async fn whole(
    (replica_uid, replica): handoff::Party,
    request: GenerateRequest,
    t: std::time::Duration,
) -> Result<Started, ActorError> {
    let what = format!("replica `{replica_uid}`");
    call(&replica, &what, t, |reply| ReplicaMsg::Generate { request: Wire::ok(request), reply }).await?;
    Ok(Started::Now { lead: None })
}

/// Where a P/D request's start is, for a prefill replica lost meanwhile (`prefill_fallback`):
/// computing the prompt (the request then runs whole on its decode replica), ...
const IN_PREFILL: u8 = 0;
/// ... its KV being fetched from there (which cannot complete), ...
const FETCHING: u8 = 1;
/// ... or already whole on its decode replica (nothing to do).
const WHOLE: u8 = 2;

/// A request id for a request that came without one.
fn new_request_id() -> String {
    format!("req-{:032x}", rand::random::<u128>())
}

impl Cluster {
    /// Starts a request on one of the model's replicas (round-robin) and returns its events.
    /// An empty `request_id` gets a generated one; an id already running is refused.
    /// Dropping the stream aborts the request.
    pub async fn generate(
        &self,
        model_uid: &str,
        request: GenerateRequest,
    ) -> Result<TokenStream, ActorError> {
        let mut streams = self.generate_all(model_uid, vec![request]).await?;
        streams.pop().ok_or_else(|| ActorError::Internal("a started request has no stream".into()))
    }

    /// Starts the requests of one call (the choices of `n`, the prompts of a batch) as
    /// [`generate`](Self::generate) does, all or none: one refused aborts the others. The
    /// model's `request_limits` counts the call once, as Xinference does: its requests hold one
    /// place, given back when the last of their streams ends.
    pub async fn generate_all(
        &self,
        model_uid: &str,
        requests: Vec<GenerateRequest>,
    ) -> Result<Vec<TokenStream>, ActorError> {
        let actors = self.serving(model_uid).await?;
        let permit = match &actors.limit {
            Some(limit) => Some(Arc::new(limit.try_acquire().ok_or_else(|| ActorError::RateLimited {
                model_uid: model_uid.to_owned(),
                limit: limit.limit(),
            })?)),
            None => None,
        };
        let starts = requests.into_iter().map(|request| self.start(actors.clone(), request));
        let streams = futures::future::try_join_all(starts).await?;
        Ok(streams
            .into_iter()
            .map(|stream| match &permit {
                // Held by every stream the caller gets, so the place is given back when they end.
                Some(permit) => {
                    let held = Arc::clone(permit);
                    Box::pin(stream.map(move |event| {
                        let _held = &held;
                        event
                    })) as TokenStream
                }
                None => stream,
            })
            .collect())
    }

    /// [`generate`](Self::generate) once the request has its place.
    async fn start(
        &self,
        actors: crate::supervisor::ModelActors,
        mut request: GenerateRequest,
    ) -> Result<TokenStream, ActorError> {
        if request.request_id.trim().is_empty() {
            request.request_id = new_request_id();
        }
        let request_id = request.request_id.clone();
        let t = self.timeout();
        let mut routed = call_local(&actors.router, "router", t, |reply| RouterMsg::Route {
            request_id: request_id.clone(),
            reply,
        })
        .await?;
        let mut replicas = vec![routed.replica.clone()];
        replicas.extend(routed.prefill.as_ref().map(|(_, r)| r.clone()));
        let mut guard = RequestGuard {
            router: Some(actors.router.clone()),
            replicas,
            request_id: request_id.clone(),
            timeout: t,
        };
        let decode: handoff::Party = (routed.replica_uid.clone(), routed.replica.clone());
        // With `prefill_fallback`, the request runs whole on its decode replica if its prefill
        // replica is lost during the prefill.
        let mut spare_rx = routed.prefill_lost.take();
        let mut spare = spare_rx.is_some().then(|| (request.clone(), decode.clone()));
        let phase = Arc::new(AtomicU8::new(IN_PREFILL));
        let fallback = (actors.prefill_fallback, actors.router.clone());
        let start = self.legs(routed.prefill.clone(), decode, request, fallback, phase.clone());
        tokio::pin!(start);
        // A replica lost while the request starts ends it at once (a frozen worker would
        // otherwise hold it until a call's time limit); the guard cleans up.
        let started = loop {
            tokio::select! {
                biased;
                reason = &mut routed.lost => return Err(pull::lost(reason).into()),
                lost = async {
                    match spare_rx.as_mut() {
                        Some(rx) => rx.await,
                        None => std::future::pending().await,
                    }
                }, if spare_rx.is_some() => {
                    spare_rx = None;
                    let Some((request, decode)) = spare.take().filter(|_| lost.is_ok()) else { continue };
                    let prefill_uid = routed.prefill.as_ref().map(|(uid, _)| uid.clone()).unwrap_or_default();
                    match phase.load(Ordering::Acquire) {
                        IN_PREFILL => {
                            tracing::warn!(%request_id, prefill = %prefill_uid, "the prefill replica was lost; the decode replica computes the request");
                            break whole(decode, request, t).await;
                        }
                        FETCHING => {
                            // Its KV was being fetched from there: that cannot complete.
                            let why = format!("prefill replica `{prefill_uid}` was lost while its KV was fetched");
                            return Err(ActorError::Engine(xinf_engine::EngineError::ReplicaLost(why)));
                        }
                        // Already whole on the decode replica.
                        _ => continue,
                    }
                }
                started = &mut start => break started,
            }
        };
        let settings = PullSettings { long_poll: self.inner.options.long_poll, call: t };
        let lead = match started {
            Ok(Started::Later { first, leg }) => {
                return Ok(pull::open_after_first(first, leg, guard, routed, actors.router, settings));
            }
            Ok(Started::Now { lead }) => Ok(lead),
            Err(e) => Err(e),
        };
        guard.disarm();
        let lead = pull::started(&actors.router, &request_id, routed.prefill.is_some(), lead)?;
        Ok(pull::open(routed, actors.router, settings, lead))
    }

    /// Starts a routed request: whole on its replica, or (P/D) its prefill leg, then its decode
    /// leg (or, for a short prompt or under `prefill_fallback`, whole on the decode replica).
    /// `phase` follows it ([`IN_PREFILL`], [`FETCHING`], [`WHOLE`]); `fallback`: the model's
    /// `prefill_fallback` and its router.
    async fn legs(
        &self,
        prefill: Option<handoff::Party>,
        decode: handoff::Party,
        request: GenerateRequest,
        (fallback, router): (bool, ActorRef<RouterMsg>),
        phase: Arc<AtomicU8>,
    ) -> Result<Started, ActorError> {
        let (t, times) = (self.timeout(), self.decode_times());
        let Some(prefill) = prefill else { return whole(decode, request, t).await };
        let mut handoff = match self.prefill_leg(&prefill, &request).await {
            Ok(Prefilled::Room(handoff)) => {
                phase.store(FETCHING, Ordering::Release);
                handoff
            }
            // A short prompt: the decode replica computes it, as an ordinary replica would.
            Ok(Prefilled::Local) => {
                phase.store(WHOLE, Ordering::Release);
                handoff::prefill_over(&router, &request.request_id);
                return whole(decode, request, t).await;
            }
            Err(e) if fallback && handoff::prefill_side_failed(&e) => {
                phase.store(WHOLE, Ordering::Release);
                tracing::warn!(request_id = %request.request_id, prefill = %prefill.0, error = %e, "the prefill leg failed; the decode replica computes the request");
                // The prefill replica's loss, which its failure may herald, must not end
                // the request now.
                handoff::prefill_over(&router, &request.request_id);
                return whole(decode, request, t).await;
            }
            Err(e) => return Err(e),
        };
        if !handoff::shows_first(&request.sampling, handoff.first_text.as_deref()) {
            handoff.first_text = None;
        }
        // The prefill side computed the prompt: its report goes out here, and the decode
        // side, which imports the prompt's KV, is not asked for one.
        let lead = handoff.prompt.take().map(TokenEvent::Prompt);
        let mut request = request;
        request.sampling.prompt_logprobs = None;
        request.sampling.echo = false;
        let first = handoff.first_text.clone().map(|text| TokenEvent::Delta {
            token_id: handoff.first_token,
            text,
            logprobs: handoff.first_logprobs.clone(),
        });
        let leg = handoff::decode_leg(times, prefill, decode, request, handoff);
        match first {
            Some(first) => {
                Ok(Started::Later { first: lead.into_iter().chain([first]).collect(), leg: Box::pin(leg) })
            }
            None => leg.await.map(|()| Started::Now { lead }),
        }
    }

    /// Aborts a request on every replica of the model; `true` when one was running it.
    pub async fn abort(&self, model_uid: &str, request_id: &str) -> Result<bool, ActorError> {
        let actors = self.serving(model_uid).await?;
        // The fan-out itself calls every replica with the call time limit.
        call_local(&actors.router, "router", 2 * self.timeout(), |reply| RouterMsg::Abort {
            request_id: request_id.to_owned(),
            reply,
        })
        .await
    }
}
