//! [`ModelStats`]: a model's load figures, typed from the engine or the replicas to the JSON of
//! `GET /v1/models/{uid}/stats` and the text of `GET /metrics`.

use serde::{Deserialize, Serialize};
use xinf_actors::{HandoffStats, ReplicaStats};
use xinf_engine::EngineStats;

/// Load figures of a model. A single in-process engine knows its KV blocks; a cluster sums
/// its alive replicas, adds their handoff figures, and lists each replica. Figures a source
/// does not know are left out of the JSON (and of `/metrics`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ModelStats {
    /// Requests being computed.
    pub running: u64,
    /// Requests waiting for admission.
    pub queued: u64,
    /// Prompt tokens computed since start.
    pub prompt_tokens: u64,
    /// Prompt tokens taken from the prefix cache instead of computed, since start.
    #[serde(default)]
    pub cached_prompt_tokens: u64,
    /// Tokens generated since start.
    pub generated_tokens: u64,
    /// KV blocks held pinned for handoffs.
    pub pinned_blocks: u64,
    /// KV blocks in use, pinned ones included (a single engine).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub used_blocks: Option<u64>,
    /// KV blocks in all (a single engine).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_blocks: Option<u64>,
    /// Requests accepted since start (a cluster).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests_served: Option<u64>,
    /// Prefill/decode handoff figures, summed over the replicas (a cluster).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handoff: Option<HandoffStats>,
    /// Each replica's own figures (a cluster).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<Vec<ReplicaStats>>,
    /// The launch's `request_limits` and how it is used (a cluster model launched with one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_limit: Option<xinf_actors::RequestLimitStats>,
}

impl From<&EngineStats> for ModelStats {
    fn from(s: &EngineStats) -> Self {
        Self {
            running: s.running as u64,
            queued: s.queued as u64,
            prompt_tokens: s.prompt_tokens,
            cached_prompt_tokens: s.cached_prompt_tokens,
            generated_tokens: s.generated_tokens,
            pinned_blocks: s.pinned_blocks as u64,
            used_blocks: Some(s.used_blocks as u64),
            total_blocks: Some(s.total_blocks as u64),
            requests_served: None,
            handoff: None,
            replicas: None,
            request_limit: None,
        }
    }
}

impl ModelStats {
    /// The sum over a model's replicas (as the cluster reports them), with each replica kept.
    pub fn from_replicas(replicas: Vec<ReplicaStats>) -> Self {
        let sum = |f: fn(&ReplicaStats) -> u64| replicas.iter().map(f).sum::<u64>();
        let mut handoff = HandoffStats::default();
        for r in &replicas {
            handoff.add(&r.handoff);
        }
        Self {
            running: sum(|r| r.running),
            queued: sum(|r| r.queued),
            prompt_tokens: sum(|r| r.prompt_tokens),
            cached_prompt_tokens: sum(|r| r.cached_prompt_tokens),
            generated_tokens: sum(|r| r.generated_tokens),
            pinned_blocks: sum(|r| r.pinned_blocks),
            used_blocks: None,
            total_blocks: None,
            requests_served: Some(sum(|r| r.requests_served)),
            handoff: Some(handoff),
            replicas: Some(replicas),
            request_limit: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn json_keys() {
        let engine = EngineStats {
            running: 1,
            queued: 2,
            used_blocks: 3,
            pinned_blocks: 4,
            total_blocks: 5,
            prompt_tokens: 6,
            cached_prompt_tokens: 8,
            generated_tokens: 7,
        };
        let local = serde_json::to_value(ModelStats::from(&engine)).unwrap_or_default();
        let want = json!({"running": 1, "queued": 2, "used_blocks": 3, "pinned_blocks": 4,
            "total_blocks": 5, "prompt_tokens": 6, "cached_prompt_tokens": 8, "generated_tokens": 7});
        assert_eq!(local, want);

        let replica = |uid: &str, n: u64| {
            let handoff = serde_json::to_value(HandoffStats::default()).unwrap_or_default();
            serde_json::from_value::<ReplicaStats>(json!({"replica_uid": uid, "worker_id": "w",
                "running": n, "queued": n, "requests_served": n, "prompt_tokens": n,
                "cached_prompt_tokens": n, "generated_tokens": n, "pinned_blocks": n, "handoff": handoff}))
        };
        let replicas = vec![replica("a", 1), replica("b", 10)];
        let replicas: Vec<ReplicaStats> = replicas.into_iter().collect::<Result<_, _>>().unwrap_or_default();
        assert_eq!(replicas.len(), 2);
        let cluster = serde_json::to_value(ModelStats::from_replicas(replicas.clone())).unwrap_or_default();
        let want = json!({"running": 11, "queued": 11, "requests_served": 11, "prompt_tokens": 11,
            "cached_prompt_tokens": 11, "generated_tokens": 11, "pinned_blocks": 11, "handoff": HandoffStats::default(),
            "replicas": replicas});
        assert_eq!(cluster, want);
        let none = serde_json::to_value(ModelStats::from_replicas(Vec::new())).unwrap_or_default();
        assert_eq!(none["replicas"], json!([]));
    }
}
