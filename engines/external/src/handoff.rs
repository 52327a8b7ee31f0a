//! P/D handoffs of an engine server through xinf's KV connector (`python/xinf_kv`), which runs
//! inside the server: the fields xinf adds to a request, and what it reads back.
//!
//! The prefill leg asks the server to compute the prompt (one output token) and publish its KV
//! as a room, `kv_transfer_params: {"xinf": {"room", "lease_ms"}}`; the answer's
//! `kv_transfer_params.xinf` names the page server in the engine's process that serves it. The
//! decode leg asks a server to load the room instead of computing the prompt,
//! `{"xinf": {"fetch": {"room", "endpoint", "device", "prompt_len"}}}`. The room is released
//! by xinf's page-plane release (`XKR1`) when the decode side is done, or by its lease.

use crate::Flavor;
use serde_json::{Value, json};
use std::time::Duration;
use xinf_engine::{EngineError, RemoteKv, RemoteRoom};
use xinf_transfer::device::KvDevice;
use xinf_transfer::transport::{self, Endpoint};

/// The lease a server's room is published with; the prefill replica's own table releases it
/// sooner when the decode side is done or its lease is shorter.
pub(crate) const LEASE_MS: u64 = 120_000;
/// Time limit of the prefill leg (a long prompt under load).
pub(crate) const PREFILL_TIMEOUT: Duration = Duration::from_secs(600);
/// Time limit of a release.
const RELEASE_TIMEOUT: Duration = Duration::from_secs(5);

/// The `kv_transfer_params` of a prefill leg that publishes its KV as `room`.
pub(crate) fn prefill_params(room: u64) -> Value {
    json!({ "xinf": { "room": room, "lease_ms": LEASE_MS } })
}

/// The `kv_transfer_params` of a decode leg that loads `kv`'s room.
pub(crate) fn fetch_params(kv: &RemoteKv) -> Value {
    json!({ "xinf": { "fetch": {
        "room": kv.room,
        "endpoint": kv.endpoint,
        "device": kv.device,
        "prompt_len": kv.prompt_ids.len(),
    } } })
}

/// The first token and the published room of a prefill leg's (non-streamed) answer.
pub(crate) fn prefill_answer(flavor: Flavor, v: &Value, room: u64) -> Result<(u32, RemoteRoom), EngineError> {
    let bad = |what: &str| {
        EngineError::Process(format!(
            "the {flavor} server's prefill answer {what} (is xinf_kv installed for the server's Python, \
             and the server started with xinf's connector? its log says more)"
        ))
    };
    let first = v
        .pointer("/choices/0/token_ids/0")
        .and_then(Value::as_u64)
        .and_then(|t| u32::try_from(t).ok())
        .ok_or_else(|| bad("has no token id"))?;
    let x = v.pointer("/kv_transfer_params/xinf").ok_or_else(|| bad("names no room"))?;
    if x.get("room").and_then(Value::as_u64) != Some(room) {
        return Err(bad("names another room"));
    }
    let endpoint: Endpoint =
        from_text_or_object(x.get("endpoint")).ok_or_else(|| bad("has no page server"))?;
    let device: Option<KvDevice> = from_text_or_object(x.get("device"));
    Ok((first, RemoteRoom { room, endpoint, device }))
}

/// A field the connector writes either as an object or as its JSON text.
fn from_text_or_object<T: serde::de::DeserializeOwned>(v: Option<&Value>) -> Option<T> {
    match v? {
        Value::String(text) => serde_json::from_str(text).ok(),
        Value::Null => None,
        other => serde_json::from_value(other.clone()).ok(),
    }
}

/// Releases `room` at `endpoint` off the caller's path; a failure is logged (the room's lease
/// frees it).
pub(crate) fn release(endpoint: Endpoint, room: u64) {
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        tracing::warn!(room, "no runtime to release a KV room on; its lease will");
        return;
    };
    handle.spawn(async move {
        match transport::release(&endpoint, room, RELEASE_TIMEOUT).await {
            Ok(true) => {}
            Ok(false) => tracing::debug!(room, "a KV room was gone before its release (its lease ended)"),
            Err(e) => tracing::warn!(room, error = %e, "could not release a KV room; its lease will"),
        }
    });
}

#[cfg(test)]
mod tests;
