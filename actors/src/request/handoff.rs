//! The P/D start of a request: the prefill leg computes the prompt and publishes its KV, the
//! decode leg has a decode replica fetch it and generate.
//!
//! The prefill's first token is the request's first output. Where it can be shown before the
//! decode leg answers ([`shows_first`]), the caller gets it at once, and the decode replica is
//! told so (the handoff keeps its text) and continues after it: the time to the first token is
//! then the prefill leg's, not the prefill leg's plus the decode leg's.

use crate::cluster::Cluster;
use crate::error::ActorError;
use crate::replica::ReplicaMsg;
use crate::replica::handoff::{Handoff, Prefilled};
use crate::router::RouterMsg;
use crate::wire::{Wire, call};
use ractor::ActorRef;
use std::time::Duration;
use xinf_engine::{ErrorClass, GenerateRequest, SamplingParams};

/// Time limits of a decode leg.
#[derive(Debug, Clone, Copy)]
pub(super) struct DecodeTimes {
    /// Fetching the pages and starting.
    start: Duration,
    /// The release of the room.
    release: Duration,
}

/// A replica taking part in a handoff, and its uid (for errors).
pub(super) type Party = (String, ActorRef<ReplicaMsg>);

impl Cluster {
    /// The prefill leg: the prefill replica computes the prompt (one token, the request's
    /// sampling) and publishes its KV in a room, or leaves a short prompt to the decode
    /// replica (`max_local_prefill_tokens`). A caller that goes away mid-way aborts it (the
    /// caller's guard); a lost answer is covered by the room's lease. The request keeps its own
    /// `max_tokens`, which the prefill engine checks against the context before it computes
    /// anything (`Engine::prefill_pinned`): a request that cannot fit is refused at once,
    /// naming the field, not after its prompt was computed.
    pub(super) async fn prefill_leg(
        &self,
        (prefill_uid, prefill): &Party,
        request: &GenerateRequest,
    ) -> Result<Prefilled, ActorError> {
        let first = request.clone();
        let what = format!("prefill replica `{prefill_uid}`");
        call(prefill, &what, self.inner.options.prefill_timeout, |reply| ReplicaMsg::Prefill {
            request: Wire::ok(first),
            reply,
        })
        .await
    }

    /// The time limits of this node's decode legs.
    pub(super) fn decode_times(&self) -> DecodeTimes {
        let o = &self.inner.options;
        DecodeTimes { start: o.transfer_timeout + o.call_timeout, release: o.call_timeout }
    }
}

/// Whether a prefill leg's error is the prefill side's (its engine failed, is unreachable,
/// overloaded or timed out), not the request's: with `prefill_fallback`, the decode replica then
/// computes the request instead. A request the prefill engine refuses as invalid would be
/// refused by the decode engine too, and an aborted one is over.
pub(super) fn prefill_side_failed(e: &ActorError) -> bool {
    matches!(e.class(), ErrorClass::Unavailable | ErrorClass::Internal | ErrorClass::Overloaded)
}

/// Tells the router that a request no longer depends on its prefill replica (it runs whole on
/// its decode replica), so that replica's loss does not end it.
pub(super) fn prefill_over(router: &ActorRef<RouterMsg>, request_id: &str) {
    if router.cast(RouterMsg::PrefillDone { request_id: request_id.to_owned() }).is_err() {
        tracing::debug!("the router is gone");
    }
}

/// Whether the prefill's first token is shown before the decode leg: its engine gave the text
/// (no stop string could hold it back, no stop token ended it, the text is whole), the request
/// wants more than that one token, no penalty counts output tokens (an engine that takes the
/// shown token as input would not count it), and no grammar holds the output (such an engine
/// would start its grammar after the shown token; not shown, it samples the first token under
/// its grammar itself).
pub(super) fn shows_first(s: &SamplingParams, first_text: Option<&str>) -> bool {
    first_text.is_some()
        && s.max_tokens != Some(1)
        && s.presence_penalty == 0.0
        && s.frequency_penalty == 0.0
        && s.structured.is_none()
}

/// The decode leg: the decode replica fetches the pages, imports them and starts generating;
/// then the room is released, whatever happened (off the request's path; a lost release is
/// covered by the room's lease).
pub(super) async fn decode_leg(
    times: DecodeTimes,
    prefill: Party,
    (decode_uid, decode): Party,
    request: GenerateRequest,
    handoff: Box<Handoff>,
) -> Result<(), ActorError> {
    let room = handoff.room;
    let what = format!("decode replica `{decode_uid}`");
    let started = call(&decode, &what, times.start, |reply| ReplicaMsg::GenerateImported {
        request: Wire::ok(request),
        handoff: Wire::ok(handoff),
        reply,
    })
    .await;
    let (prefill_uid, prefill) = prefill;
    tokio::spawn(async move {
        let what = format!("prefill replica `{prefill_uid}`");
        if let Err(e) =
            call(&prefill, &what, times.release, |reply| ReplicaMsg::Release { room, reply }).await
        {
            tracing::warn!(room, error = %e, "could not release a handoff room; its lease will");
        }
    });
    started
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sampling(edit: impl FnOnce(&mut SamplingParams)) -> SamplingParams {
        let mut s = SamplingParams::greedy(8);
        edit(&mut s);
        s
    }

    #[test]
    fn the_first_token_is_shown_early_only_when_the_rest_follows_from_it_exactly() {
        assert!(shows_first(&sampling(|_| {}), Some(" a")));
        assert!(shows_first(&sampling(|s| s.max_tokens = None), Some(" a")));
        // No text from the prefill engine, nothing after it, a penalty over the output.
        assert!(!shows_first(&sampling(|_| {}), None));
        assert!(!shows_first(&sampling(|s| s.max_tokens = Some(1)), Some(" a")));
        assert!(!shows_first(&sampling(|s| s.presence_penalty = 0.5), Some(" a")));
        assert!(!shows_first(&sampling(|s| s.frequency_penalty = -0.5), Some(" a")));
        let json = |s: &mut SamplingParams| s.structured = Some(xinf_engine::StructuredOutput::JsonObject);
        assert!(!shows_first(&sampling(json), Some(" a")));
    }
}
