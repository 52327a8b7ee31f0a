//! [`Totals`]: a cluster model's counters that never go down.
//!
//! A model's figures are the sum over the replicas that answer. A replica that leaves (lost
//! with its worker, removed, replaced, restarted under its uid) would take its counts with it:
//! `prompt_tokens` or `xinf_handoff_pages_total` would fall, and Prometheus reads a counter that
//! falls as a reset, so `rate()` would count the remaining replicas' whole totals again. So the
//! service remembers each replica's counters at the last look and keeps counting those of a
//! replica that no longer answers.

use crate::api::ModelStats;
use std::collections::HashMap;
use std::sync::Mutex;
use xinf_actors::{HandoffStats, ReplicaStats};

/// How many replicas that no longer answer a model's record keeps apart; past that, their
/// counters are folded into those of ended lives, and one that comes back would be counted
/// twice. Replicas come and go by failures and scaling: a model sees a handful.
const ABSENT_KEPT: usize = 256;

/// The counters of every cluster model the service has shown, by model uid.
#[derive(Debug, Default)]
pub(crate) struct Totals {
    models: Mutex<HashMap<String, Record>>,
}

#[derive(Debug, Default)]
struct Record {
    /// Each replica's counters at the last look, whether it still answers or not: one that
    /// does not answer a single look (a slow worker) counts the same until it is back.
    last: HashMap<String, Counters>,
    /// Counters of lives that ended: a replica whose counters fell (it restarted under its
    /// uid), or absent ones folded to keep `last` bounded.
    ended: Counters,
}

/// The counters among a replica's figures (the gauges are left at zero).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Counters {
    requests_served: u64,
    prompt_tokens: u64,
    cached_prompt_tokens: u64,
    generated_tokens: u64,
    handoff: HandoffStats,
}

impl Counters {
    fn of(r: &ReplicaStats) -> Self {
        Self {
            requests_served: r.requests_served,
            prompt_tokens: r.prompt_tokens,
            cached_prompt_tokens: r.cached_prompt_tokens,
            generated_tokens: r.generated_tokens,
            handoff: r.handoff.counters(),
        }
    }

    fn add(&mut self, o: &Self) {
        self.requests_served += o.requests_served;
        self.prompt_tokens += o.prompt_tokens;
        self.cached_prompt_tokens += o.cached_prompt_tokens;
        self.generated_tokens += o.generated_tokens;
        self.handoff.add(&o.handoff);
    }

    /// Whether a replica's counters are below what it showed before: a new life under the
    /// same uid, which started again from zero.
    fn restarted_since(&self, before: &Self) -> bool {
        let (a, b) = (&self.handoff, &before.handoff);
        self.requests_served < before.requests_served
            || self.prompt_tokens < before.prompt_tokens
            || self.generated_tokens < before.generated_tokens
            || a.pages_transferred < b.pages_transferred
            || a.failed < b.failed
            || a.local_prefills < b.local_prefills
            || a.decode_prompts < b.decode_prompts
            || a.latency.count < b.latency.count
    }
}

impl Totals {
    /// Adds to `stats` (a cluster model's sum over the replicas that answered) the counters of
    /// the replicas that answered before and not now, and of their ended lives, and remembers
    /// this look. A single engine's figures (no replicas) are left as they are.
    pub(crate) fn settle(&self, model_uid: &str, stats: &mut ModelStats) {
        let Some(replicas) = stats.replicas.as_ref() else { return };
        let mut models = self.models.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let record = models.entry(model_uid.to_owned()).or_default();
        for r in replicas {
            let now = Counters::of(r);
            if let Some(before) = record.last.insert(r.replica_uid.clone(), now)
                && now.restarted_since(&before)
            {
                record.ended.add(&before);
            }
        }
        let answered = |uid: &String| replicas.iter().any(|r| &r.replica_uid == uid);
        let absent: Vec<String> = record.last.keys().filter(|uid| !answered(uid)).cloned().collect();
        let mut gone = record.ended;
        for uid in &absent {
            if let Some(c) = record.last.get(uid) {
                gone.add(c);
            }
        }
        if absent.len() > ABSENT_KEPT {
            record.ended = gone;
            record.last.retain(|uid, _| answered(uid));
        }
        stats.requests_served = Some(stats.requests_served.unwrap_or_default() + gone.requests_served);
        stats.prompt_tokens += gone.prompt_tokens;
        stats.cached_prompt_tokens += gone.cached_prompt_tokens;
        stats.generated_tokens += gone.generated_tokens;
        if let Some(h) = stats.handoff.as_mut() {
            h.add(&gone.handoff);
        }
    }

    /// Forgets a model (terminated): a model launched later under its uid counts from zero.
    pub(crate) fn forget(&self, model_uid: &str) {
        self.models.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(model_uid);
    }
}

#[cfg(test)]
mod tests;
