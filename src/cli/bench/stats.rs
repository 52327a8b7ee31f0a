//! What the requests measured, summed up per model and concurrency level.

use serde_json::{Value, json};

/// Distinct error messages kept per result.
const ERROR_MESSAGES: usize = 3;

/// Nearest-rank percentile `p` (0 to 100) of sorted samples; `None` without samples.
fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p / 100.0 * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted.get(rank - 1).copied()
}

/// What one successful request measured.
#[derive(Debug, Clone, Copy)]
pub(super) struct Sample {
    /// Send to first text, in milliseconds.
    pub(super) ttft_ms: f64,
    /// Mean time between output tokens after the first, in milliseconds; `None` for a single
    /// output token.
    pub(super) tpot_ms: Option<f64>,
    pub(super) output_tokens: usize,
}

/// The measurements of one model at one concurrency level.
#[derive(Debug)]
pub(super) struct Level {
    pub(super) model_uid: String,
    pub(super) concurrency: usize,
    pub(super) requests: usize,
    pub(super) errors: usize,
    /// The first few distinct error messages.
    pub(super) error_messages: Vec<String>,
    pub(super) ttft_p50: Option<f64>,
    pub(super) ttft_p95: Option<f64>,
    pub(super) tpot_p50: Option<f64>,
    pub(super) output_tokens_per_s: f64,
    wall_s: f64,
    /// When the level's first request was sent, in seconds since the Unix epoch: what lines
    /// up a server's log (`doc/bench/gpu/steps.py --bench`) with the level.
    pub(super) started_unix_s: Option<f64>,
}

/// Sums up the outcomes of `requests` requests that took `wall_s` seconds in all. Requests
/// without an outcome count as errors.
pub(super) fn summarize(
    model_uid: &str,
    concurrency: usize,
    requests: usize,
    outcomes: &[Result<Sample, String>],
    wall_s: f64,
) -> Level {
    let samples: Vec<Sample> = outcomes.iter().filter_map(|o| o.as_ref().ok().copied()).collect();
    let mut error_messages: Vec<String> = Vec::new();
    for message in outcomes.iter().filter_map(|o| o.as_ref().err()) {
        if error_messages.len() < ERROR_MESSAGES && !error_messages.contains(message) {
            error_messages.push(message.clone());
        }
    }
    let sorted = |values: Vec<f64>| {
        let mut v = values;
        v.sort_by(f64::total_cmp);
        v
    };
    let ttft = sorted(samples.iter().map(|s| s.ttft_ms).collect());
    let tpot = sorted(samples.iter().filter_map(|s| s.tpot_ms).collect());
    let output: usize = samples.iter().map(|s| s.output_tokens).sum();
    Level {
        model_uid: model_uid.to_owned(),
        concurrency,
        requests,
        errors: requests.saturating_sub(samples.len()),
        error_messages,
        ttft_p50: percentile(&ttft, 50.0),
        ttft_p95: percentile(&ttft, 95.0),
        tpot_p50: percentile(&tpot, 50.0),
        output_tokens_per_s: if wall_s > 0.0 { output as f64 / wall_s } else { 0.0 },
        wall_s,
        started_unix_s: None,
    }
}

/// Rounds to microseconds (of milliseconds) or thousandths, which is all the JSON needs.
fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

impl Level {
    pub(super) fn json(&self) -> Value {
        json!({
            "model_uid": self.model_uid,
            "concurrency": self.concurrency,
            "requests": self.requests,
            "errors": self.errors,
            "error_messages": self.error_messages,
            "ttft_ms": {"p50": self.ttft_p50.map(round3), "p95": self.ttft_p95.map(round3)},
            "tpot_ms": {"p50": self.tpot_p50.map(round3)},
            "output_tokens_per_s": round3(self.output_tokens_per_s),
            "wall_s": round3(self.wall_s),
            "started_unix_s": self.started_unix_s.map(round3),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentile_is_nearest_rank() {
        let v: Vec<f64> = (1..=10).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), Some(5.0));
        assert_eq!(percentile(&v, 95.0), Some(10.0));
        assert_eq!(percentile(&v, 90.0), Some(9.0));
        assert_eq!(percentile(&v, 0.0), Some(1.0));
        assert_eq!(percentile(&v, 100.0), Some(10.0));
        assert_eq!(percentile(&[7.0], 95.0), Some(7.0));
        assert_eq!(percentile(&[], 50.0), None);
        let w: Vec<f64> = (1..=20).map(f64::from).collect();
        assert_eq!(percentile(&w, 95.0), Some(19.0));
    }

    #[test]
    fn summary_counts_errors_and_throughput() {
        let ok = |ttft_ms, output_tokens| Ok(Sample { ttft_ms, tpot_ms: Some(2.0), output_tokens });
        let outcomes = vec![
            ok(10.0, 32),
            Err("boom".to_owned()),
            ok(30.0, 32),
            Err("boom".to_owned()),
            Err("bang".to_owned()),
            ok(20.0, 32),
        ];
        // Seven requests and six outcomes: the missing one is an error too.
        let level = summarize("m", 4, 7, &outcomes, 2.0);
        assert_eq!(level.errors, 4);
        assert_eq!(level.error_messages, ["boom", "bang"]);
        assert_eq!(level.ttft_p50, Some(20.0));
        assert_eq!(level.ttft_p95, Some(30.0));
        assert_eq!(level.tpot_p50, Some(2.0));
        assert_eq!(level.output_tokens_per_s, 48.0);
        let json = level.json();
        assert_eq!(json["ttft_ms"]["p50"], 20.0);
        let none = summarize("m", 1, 2, &[Err("x".into()), Err("x".into())], 0.5);
        assert_eq!((none.errors, none.ttft_p50, none.output_tokens_per_s), (2, None, 0.0));
        assert_eq!(none.json()["ttft_ms"]["p50"], Value::Null);
    }
}
