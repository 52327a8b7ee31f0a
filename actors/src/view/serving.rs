//! Per-request serving figures of one replica: how long requests waited, how fast their tokens
//! came, and how they ended. The replica records them as its requests run; they travel inside
//! [`ReplicaStats`](super::ReplicaStats) to `GET /v1/models/{uid}/stats` and `GET /metrics`.

use serde::{Deserialize, Serialize};
use xinf_engine::FinishReason;

/// Upper bounds, in seconds, of the request latency histograms' buckets (the last bucket,
/// `+Inf`, is implied by the count). One set serves TTFT, TPOT, queue and end-to-end times, so
/// it spans a few milliseconds (a token's step) to minutes (a long generation).
pub const REQUEST_LATENCY_BOUNDS: [f64; 16] =
    [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 600.0];

/// A histogram of request times over [`REQUEST_LATENCY_BOUNDS`], in Prometheus' cumulative
/// form. Integer microseconds keep it `Eq` and exact when summed over replicas.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestHistogram {
    /// Observations of at most `REQUEST_LATENCY_BOUNDS[i]` seconds.
    pub buckets: [u64; 16],
    /// Observations in all.
    pub count: u64,
    /// Their total, in microseconds.
    pub sum_us: u64,
}

impl RequestHistogram {
    /// Counts one observation of `secs` seconds.
    pub fn observe(&mut self, secs: f64) {
        super::count_in(&mut self.buckets, &REQUEST_LATENCY_BOUNDS, secs);
        self.count += 1;
        self.sum_us += (secs.max(0.0) * 1e6) as u64;
    }

    /// Bucket-wise sum.
    pub fn add(&mut self, o: &Self) {
        super::add_buckets(&mut self.buckets, &o.buckets);
        self.count += o.count;
        self.sum_us += o.sum_us;
    }
}

/// How a replica's requests ended, by finish reason.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct FinishCounts {
    /// An end-of-sequence token, a stop token or a stop string.
    pub stop: u64,
    /// `max_tokens` or the context length.
    pub length: u64,
    /// Aborted (by the caller, or because nobody pulled its events any more).
    pub abort: u64,
    /// The engine failed the request.
    pub error: u64,
}

impl FinishCounts {
    /// The counts with their finish reason's name, in a fixed order.
    pub fn by_reason(&self) -> [(&'static str, u64); 4] {
        [("stop", self.stop), ("length", self.length), ("abort", self.abort), ("error", self.error)]
    }

    /// Counts one request that ended for `reason`.
    pub fn count(&mut self, reason: FinishReason) {
        match reason {
            FinishReason::Stop => self.stop += 1,
            FinishReason::Length => self.length += 1,
            FinishReason::Abort => self.abort += 1,
        }
    }

    /// Field-wise sum.
    pub fn add(&mut self, o: &Self) {
        self.stop += o.stop;
        self.length += o.length;
        self.abort += o.abort;
        self.error += o.error;
    }
}

/// Per-request serving figures of one replica, since it started.
///
/// A hybrid or decode replica counts every figure for the requests it generates; a prefill
/// replica records only TTFT (its prompt computation, which samples the first token), since
/// the request goes on and ends on a decode replica.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ServingStats {
    /// Time to first token: from the request reaching the replica to its first token.
    pub ttft: RequestHistogram,
    /// Time per output token after the first, one observation per request with two or more.
    pub tpot: RequestHistogram,
    /// From the request reaching the replica to its end.
    pub e2e: RequestHistogram,
    /// From the request reaching the replica to the engine accepting it (for a decode replica
    /// this covers the fetch of its prompt's pages). Engines do not report when their own
    /// scheduler admits a request, so the wait inside the engine is part of TTFT.
    pub queue: RequestHistogram,
    /// Finished requests by finish reason.
    pub finished: FinishCounts,
}

impl ServingStats {
    /// Field-wise sum, for a model's total over its replicas.
    pub fn add(&mut self, o: &Self) {
        self.ttft.add(&o.ttft);
        self.tpot.add(&o.tpot);
        self.e2e.add(&o.e2e);
        self.queue.add(&o.queue);
        self.finished.add(&o.finished);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_cumulative() {
        let mut h = RequestHistogram::default();
        for secs in [0.001, 0.02, 0.02, 3.0, 1000.0] {
            h.observe(secs);
        }
        assert!(h.buckets.windows(2).all(|w| w[0] <= w[1]));
        assert_eq!(h.buckets[0], 1);
        assert_eq!(h.buckets[2], 3);
        assert_eq!(h.buckets[15], 4);
        assert_eq!(h.count, 5);
        // Float seconds to whole microseconds may lose one per observation.
        assert!(h.sum_us.abs_diff(1_003_041_000) <= 5);
        let mut twice = h;
        twice.add(&h);
        assert_eq!(twice.count, 10);
        assert_eq!(twice.buckets[2], 6);
    }

    #[test]
    fn finish_counts() {
        let mut f = FinishCounts::default();
        f.count(FinishReason::Stop);
        f.count(FinishReason::Length);
        f.count(FinishReason::Stop);
        f.error += 1;
        assert_eq!(f.by_reason(), [("stop", 2), ("length", 1), ("abort", 0), ("error", 1)]);
    }
}
