//! The prefill leg of a handoff through an engine server: one non-streamed call of one output
//! token whose answer names the room the server published, and the first token with its
//! log-probabilities where the request asked for them.

use crate::Flavor;
use crate::stream::{self, Counters};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use xinf_engine::{EngineError, PinnedPrefill};
use xinf_transfer::sync::lock;
use xinf_transfer::transport::Endpoint;

/// The prefill leg of a handoff: one non-streamed call whose answer names the room the server
/// published.
pub(crate) struct PrefillLeg {
    pub(crate) flavor: Flavor,
    pub(crate) client: reqwest::Client,
    pub(crate) url: String,
    pub(crate) rooms: Arc<Mutex<HashMap<String, (Endpoint, u64)>>>,
    pub(crate) counters: Arc<Counters>,
    pub(crate) host: Option<crate::handoff::PageHost>,
    pub(crate) request_id: String,
    /// The request has stop strings (its first token's text is then not shown early).
    pub(crate) stops: bool,
    /// How the first token's log-probabilities are reported, when the request asked for them.
    pub(crate) scoring: Option<crate::stream::Scoring>,
    /// How the prompt's log-probabilities are reported, when the request asked for them (the
    /// leg's answer carries them: vLLM `prompt_logprobs`, SGLang `input_token_logprobs`).
    pub(crate) prompt_scoring: Option<crate::stream::Scoring>,
}

impl PrefillLeg {
    pub(crate) async fn run(
        self,
        ids: Vec<u32>,
        room: u64,
        body: serde_json::Value,
    ) -> Result<PinnedPrefill, EngineError> {
        let flavor = self.flavor;
        let started = std::time::Instant::now();
        let call = self.client.post(&self.url).json(&body).timeout(crate::handoff::PREFILL_TIMEOUT).send();
        let response = call
            .await
            .map_err(|e| EngineError::Process(format!("the {flavor} server's prefill failed: {e}")))?;
        let status = response.status();
        if !status.is_success() {
            return Err(stream::refusal(flavor, status, response).await);
        }
        // One token and the handoff's fields: a few hundred bytes; with the prompt's scores, a
        // few dozen bytes for each alternative of each prompt token more.
        let scored = self.prompt_scoring.as_ref().map_or(0, |s| ids.len() * (s.top + 2) * 256);
        let v = stream::json_body(flavor, response, scored + (1 << 20), "prefill answer").await?;
        let prompt = self.prompt_scoring.as_ref().map(|s| s.prompt_report(flavor, &v, &ids)).transpose()?;
        let answer = crate::handoff::prefill_answer(flavor, &v, room, self.host.as_ref(), self.stops)?;
        let remote = answer.room;
        tracing::debug!(%flavor, request_id = %self.request_id, ms = started.elapsed().as_secs_f64() * 1e3, prompt_len = ids.len(), "prefill leg answered");
        self.counters.prompt_tokens.fetch_add(ids.len() as u64, Ordering::Relaxed);
        lock(&self.rooms).insert(self.request_id.clone(), (remote.endpoint.clone(), room));
        Ok(PinnedPrefill {
            request_id: self.request_id,
            prompt_ids: ids,
            first_token: answer.first_token,
            first_text: answer.first_text,
            first_logprobs: self
                .scoring
                .as_ref()
                .zip(answer.first_logprobs.as_ref())
                .map(|(scoring, scored)| scoring.of(answer.first_token, scored)),
            prompt,
            remote: Some(remote),
        })
    }
}
