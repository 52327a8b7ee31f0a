//! P/D handoffs of an engine server through xinf's KV connector (`python/xinf_kv`), which runs
//! inside the server: the fields xinf adds to a request, and what it reads back.
//!
//! The prefill leg asks the server to compute the prompt (one output token) and publish its KV
//! as a room, `kv_transfer_params: {"xinf": {"room", "lease_ms"}}`; the answer's
//! `kv_transfer_params.xinf` names the page server in the engine's process that serves it. The
//! decode leg asks a server to load the room instead of computing the prompt,
//! `{"xinf": {"fetch": {"room", "endpoint", "device", "prompt_len"}}}`. The room is released
//! by xinf's page-plane release (`XKR1`) when the decode side is done, or by its lease.
//!
//! SGLang's requests carry no such fields: its transfer backends get only the bootstrap
//! address and room of a request. xinf's backend (`xinf_kv.sglang_backend`) reads its handoff
//! from `bootstrap_host`, which xinf fills with a *ticket* (`xinf-` and the hex of a JSON
//! object; see `xinf_kv.params`), and the room is `bootstrap_room`. A prefill's answer then
//! names no page server: the server wrote where its page server is to a file at start
//! ([`PageHost`]).

use crate::Flavor;
use serde_json::{Value, json};
use std::time::Duration;
use xinf_engine::{EngineError, ModelContract, RemoteKv, RemoteRoom};
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

/// What starts an SGLang ticket.
const TICKET_PREFIX: &str = "xinf-";

/// The model's KV shape as a ticket states it (SGLang's backend checks it against its pool).
fn shape(c: &ModelContract) -> Value {
    json!({ "layers": c.num_layers, "kv_heads": c.kv_heads, "head_dim": c.head_dim, "elem_bytes": c.dtype.size() })
}

/// `bootstrap_host` carrying `fields`.
fn ticket(fields: &Value) -> String {
    format!("{TICKET_PREFIX}{}", xinf_transfer::hex::encode(fields.to_string().as_bytes()))
}

/// The bootstrap fields of an SGLang prefill leg that publishes its KV as `room`.
pub(crate) fn sglang_prefill_fields(room: u64, contract: &ModelContract) -> Value {
    let t = ticket(&json!({ "lease_ms": LEASE_MS, "shape": shape(contract) }));
    json!({ "bootstrap_host": t, "bootstrap_port": 0, "bootstrap_room": room })
}

/// The bootstrap fields of an SGLang decode leg that loads `kv`'s room (and starts from the
/// prefill's first token, which SGLang's decode takes with the KV).
pub(crate) fn sglang_fetch_fields(kv: &RemoteKv, contract: &ModelContract) -> Value {
    let mut fetch = json!({
        "endpoint": kv.endpoint,
        "device": kv.device,
        "prompt_len": kv.prompt_ids.len(),
        "first_token": kv.first_token,
    });
    if let Some(l) = &kv.first_logprobs {
        // SGLang's decode reports the first token's log-probabilities from what its transfer
        // backend wrote with the token: the prefill side's.
        let top: Vec<Value> = l.top.iter().map(|t| json!([t.token_id, finite(t.logprob)])).collect();
        fetch["first_logprobs"] = json!({ "logprob": finite(l.chosen.logprob), "top": top });
    }
    let t = ticket(&json!({ "fetch": fetch, "shape": shape(contract) }));
    json!({ "bootstrap_host": t, "bootstrap_port": 0, "bootstrap_room": kv.room })
}

/// A log-probability as JSON carries it (minus infinity, which JSON has no number for, as the
/// lowest finite value).
fn finite(logprob: f32) -> f32 {
    if logprob.is_finite() { logprob } else { f32::MIN }
}

/// Where an SGLang prefill server's page server is: what its transfer backend wrote at start.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
pub(crate) struct PageHost {
    pub(crate) endpoint: Endpoint,
    pub(crate) device: Option<KvDevice>,
}

impl PageHost {
    /// Reads the file the server's backend wrote (`XINF_KV_ENDPOINT_FILE`).
    pub(crate) fn read(path: &std::path::Path) -> Result<Self, EngineError> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            EngineError::Process(format!(
                "the SGLang server is up but its xinf transfer backend did not say where its pages are \
                 ({}: {e}); is xinf_kv installed for the server's Python?",
                path.display()
            ))
        })?;
        serde_json::from_str(&text)
            .map_err(|e| EngineError::Process(format!("{}: not what xinf_kv writes: {e}", path.display())))
    }
}

/// What a prefill leg's (non-streamed) answer says.
#[derive(Debug, PartialEq)]
pub(crate) struct PrefillAnswer {
    pub(crate) first_token: u32,
    /// The first token's text, when it may be shown at once (see [`first_text`]).
    pub(crate) first_text: Option<String>,
    /// The first token's log-probabilities, when the request asked for them.
    pub(crate) first_logprobs: Option<crate::protocol::Scored>,
    pub(crate) room: RemoteRoom,
}

/// The first token's text of a prefill answer when it may be shown before the decode side
/// answers: the server ended the leg by its length (a stop token or string ends it as `stop`),
/// the request has no stop strings (`stops`: the text could be held back or cut), and the
/// text is whole (not empty, no replacement character of a partial one).
fn first_text(flavor: Flavor, v: &Value, stops: bool) -> Option<String> {
    let (text, reason) = match flavor {
        Flavor::Vllm => (v.pointer("/choices/0/text"), v.pointer("/choices/0/finish_reason")),
        Flavor::Sglang => (v.pointer("/text"), v.pointer("/meta_info/finish_reason/type")),
    };
    let text = text?.as_str()?;
    (!stops && reason?.as_str()? == "length" && !text.is_empty() && !text.contains('\u{FFFD}'))
        .then(|| text.to_owned())
}

/// The first token and the published room of a prefill leg's (non-streamed) answer; SGLang's
/// room is at `host`, the server's page server. `stops`: the request has stop strings.
pub(crate) fn prefill_answer(
    flavor: Flavor,
    v: &Value,
    room: u64,
    host: Option<&PageHost>,
    stops: bool,
) -> Result<PrefillAnswer, EngineError> {
    let bad = |what: &str| {
        EngineError::Process(format!(
            "the {flavor} server's prefill answer {what} (is xinf_kv installed for the server's Python, \
             and the server started with xinf's connector? its log says more)"
        ))
    };
    let first = match flavor {
        Flavor::Vllm => v.pointer("/choices/0/token_ids/0"),
        Flavor::Sglang => v.pointer("/output_ids/0"),
    };
    let first = first
        .and_then(Value::as_u64)
        .and_then(|t| u32::try_from(t).ok())
        .ok_or_else(|| bad("has no token id"))?;
    let first_text = first_text(flavor, v, stops);
    let first_logprobs = crate::protocol::answer_logprobs(flavor, v);
    if flavor == Flavor::Sglang {
        let host = host.ok_or_else(|| bad("cannot be fetched: the server named no page server"))?;
        let room = RemoteRoom { room, endpoint: host.endpoint.clone(), device: host.device.clone() };
        return Ok(PrefillAnswer { first_token: first, first_text, first_logprobs, room });
    }
    let x = v.pointer("/kv_transfer_params/xinf").ok_or_else(|| bad("names no room"))?;
    if x.get("room").and_then(Value::as_u64) != Some(room) {
        return Err(bad("names another room"));
    }
    let endpoint: Endpoint =
        from_text_or_object(x.get("endpoint")).ok_or_else(|| bad("has no page server"))?;
    let device: Option<KvDevice> = from_text_or_object(x.get("device"));
    let room = RemoteRoom { room, endpoint, device };
    Ok(PrefillAnswer { first_token: first, first_text, first_logprobs, room })
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
