//! How message payloads cross nodes, and calls with a time limit.
//!
//! With ractor's `cluster` feature, every field of a remotable message must implement
//! [`BytesConvertable`], whose decoding cannot fail. [`Wire`] carries a `Result`, so a payload
//! that does not decode (a peer of another version) arrives as a typed [`ActorError::Wire`] the
//! handler answers with, rather than a panic or a silently defaulted value.

use crate::error::ActorError;
use ractor::rpc::CallResult;
use ractor::{ActorRef, BytesConvertable, Message, MessagingErr, RpcReplyPort};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::time::Duration;

/// The most bytes a decoded payload may claim: the cluster's frame limit (ractor_cluster's
/// default inbound frame size). bincode allocates the length a payload states for a string or
/// a byte list, so without a limit one crafted length (2^40) aborts the process.
const MAX_PAYLOAD: usize = 16 << 20;

/// bincode 2's standard configuration, with decoding bounded by [`MAX_PAYLOAD`].
fn bincode_config() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<MAX_PAYLOAD>()
}

/// A payload or reply that may cross nodes: bincode 2 (`config::standard()`) on the wire.
pub(crate) struct Wire<T>(pub(crate) Result<T, ActorError>);

impl<T> Wire<T> {
    /// A successful payload.
    pub(crate) fn ok(value: T) -> Self {
        Self(Ok(value))
    }
}

impl<T> From<Result<T, ActorError>> for Wire<T> {
    fn from(r: Result<T, ActorError>) -> Self {
        Self(r)
    }
}

impl<T: Serialize + DeserializeOwned> BytesConvertable for Wire<T> {
    fn into_bytes(self) -> Vec<u8> {
        let config = bincode_config();
        match bincode::serde::encode_to_vec(&self.0, config) {
            Ok(bytes) => bytes,
            Err(e) => {
                // Tell the receiver what went wrong instead of sending nothing.
                let err: Result<T, ActorError> = Err(ActorError::Wire(format!("encoding: {e}")));
                bincode::serde::encode_to_vec(&err, config).unwrap_or_default()
            }
        }
    }

    fn from_bytes(bytes: Vec<u8>) -> Self {
        match bincode::serde::decode_from_slice(&bytes, bincode_config()) {
            Ok((value, _)) => Self(value),
            Err(e) => Self(Err(ActorError::Wire(format!("decoding: {e}")))),
        }
    }
}

/// A payload that holds free-form JSON (`serde_json::Value`, flattened maps), which bincode
/// cannot carry because it needs a self-describing format: serde_json on the wire.
pub(crate) struct JsonWire<T>(pub(crate) Result<T, ActorError>);

impl<T: Serialize + DeserializeOwned> BytesConvertable for JsonWire<T> {
    fn into_bytes(self) -> Vec<u8> {
        match serde_json::to_vec(&self.0) {
            Ok(bytes) => bytes,
            Err(e) => {
                let err: Result<T, ActorError> = Err(ActorError::Wire(format!("encoding: {e}")));
                serde_json::to_vec(&err).unwrap_or_default()
            }
        }
    }

    fn from_bytes(bytes: Vec<u8>) -> Self {
        match serde_json::from_slice(&bytes) {
            Ok(value) => Self(value),
            Err(e) => Self(Err(ActorError::Wire(format!("decoding: {e}")))),
        }
    }
}

/// Sends a reply, ignoring a caller that has gone away (its time limit passed): there is no one
/// left to tell.
pub(crate) fn answer<T: Send + 'static>(reply: RpcReplyPort<T>, value: T) {
    if reply.send(value).is_err() {
        tracing::debug!("a reply found its caller gone");
    }
}

/// Calls `actor` and waits at most `timeout` for the answer; every failure is typed.
pub(crate) async fn call_raw<M, R>(
    actor: &ActorRef<M>,
    what: &str,
    timeout: Duration,
    build: impl FnOnce(RpcReplyPort<R>) -> M,
) -> Result<R, ActorError>
where
    M: Message,
    R: Send + 'static,
{
    match actor.call(build, Some(timeout)).await {
        Ok(CallResult::Success(r)) => Ok(r),
        Ok(CallResult::Timeout) => {
            Err(ActorError::Timeout { what: what.to_owned(), after_ms: timeout.as_millis() as u64 })
        }
        Ok(CallResult::SenderError) => Err(ActorError::Unreachable {
            what: what.to_owned(),
            reason: "it stopped before answering".into(),
        }),
        Err(e) => Err(ActorError::Unreachable { what: what.to_owned(), reason: messaging_reason(&e) }),
    }
}

/// Calls `actor` with a [`Wire`] reply.
pub(crate) async fn call<M, T>(
    actor: &ActorRef<M>,
    what: &str,
    timeout: Duration,
    build: impl FnOnce(RpcReplyPort<Wire<T>>) -> M,
) -> Result<T, ActorError>
where
    M: Message,
    T: Send + 'static,
{
    call_raw(actor, what, timeout, build).await?.0
}

/// Calls a local actor whose reply is a plain `Result` (it carries things that never cross
/// nodes, such as actor references or channels).
pub(crate) async fn call_local<M, T>(
    actor: &ActorRef<M>,
    what: &str,
    timeout: Duration,
    build: impl FnOnce(RpcReplyPort<Result<T, ActorError>>) -> M,
) -> Result<T, ActorError>
where
    M: Message,
    T: Send + 'static,
{
    call_raw(actor, what, timeout, build).await?
}

/// Why a message could not be delivered, in words.
pub(crate) fn messaging_reason<M>(e: &MessagingErr<M>) -> String {
    match e {
        MessagingErr::SendErr(_) => "it is not running".into(),
        MessagingErr::ChannelClosed => "its mailbox is closed".into(),
        MessagingErr::InvalidActorType => "it is not the kind of actor expected".into(),
    }
}
