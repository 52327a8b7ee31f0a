//! The P/D start of a request.

use crate::cluster::Cluster;
use crate::error::ActorError;
use crate::replica::ReplicaMsg;
use crate::wire::{Wire, call};
use ractor::ActorRef;
use xinf_engine::GenerateRequest;

impl Cluster {
    /// The P/D start of a request: the prefill replica computes the prompt (one token, the
    /// request's sampling) and publishes its KV in a room; the decode replica fetches the
    /// pages, imports them and starts generating; then the room is released. Whatever fails,
    /// the prefill side is told (release), and a caller that goes away mid-way aborts the
    /// prefill (the caller's guard); a lost message is covered by the room's lease.
    pub(super) async fn handoff(
        &self,
        prefill_uid: &str,
        prefill: &ActorRef<ReplicaMsg>,
        decode_uid: &str,
        decode: &ActorRef<ReplicaMsg>,
        request: GenerateRequest,
    ) -> Result<(), ActorError> {
        let o = &self.inner.options;
        let mut first = request.clone();
        first.sampling.max_tokens = Some(1);
        let what = format!("prefill replica `{prefill_uid}`");
        let handoff = call(prefill, &what, o.prefill_timeout, |reply| ReplicaMsg::Prefill {
            request: Wire::ok(first),
            reply,
        })
        .await?;
        let room = handoff.room;
        let what = format!("decode replica `{decode_uid}`");
        let limit = o.transfer_timeout + o.call_timeout;
        let started = call(decode, &what, limit, |reply| ReplicaMsg::GenerateImported {
            request: Wire::ok(request),
            handoff: Wire::ok(Box::new(handoff)),
            reply,
        })
        .await;
        // The pages were read (or will never be): free them on the prefill side, off the
        // request's path. A lost release is covered by the room's lease.
        let release = prefill.clone();
        let (t, what) = (o.call_timeout, format!("prefill replica `{prefill_uid}`"));
        tokio::spawn(async move {
            if let Err(e) = call(&release, &what, t, |reply| ReplicaMsg::Release { room, reply }).await {
                tracing::warn!(room, error = %e, "could not release a handoff room; its lease will");
            }
        });
        started
    }
}
