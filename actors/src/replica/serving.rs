//! The replica's record of per-request serving figures ([`ServingStats`]): a [`Timeline`] per
//! request follows its stream, and the [`Recorder`] folds each finished one into the replica's
//! histograms. Both are plain state, so the stream task only calls them.

use crate::view::ServingStats;
use std::sync::Mutex;
use std::time::Instant;
use xinf_engine::{EngineError, FinishReason, TokenEvent};
use xinf_transfer::sync::lock;

/// The replica's serving figures, shared with its request tasks.
#[derive(Default)]
pub(crate) struct Recorder {
    stats: Mutex<ServingStats>,
}

impl Recorder {
    /// The figures so far.
    pub(crate) fn stats(&self) -> ServingStats {
        *lock(&self.stats)
    }

    /// The engine accepted a request that reached the replica at `received`.
    pub(crate) fn accepted(&self, received: Instant, now: Instant) {
        lock(&self.stats).queue.observe(secs(received, now));
    }

    /// A prefill that began at `received` sampled its first token at `now`.
    pub(crate) fn prefilled(&self, received: Instant, now: Instant) {
        lock(&self.stats).ttft.observe(secs(received, now));
    }

    /// A request's stream ended at `now`.
    pub(crate) fn finished(&self, t: &Timeline, now: Instant) {
        let mut s = lock(&self.stats);
        if let Some(first) = t.first {
            s.ttft.observe(secs(t.received, first));
        }
        if let (Some(first), Some(last)) = (t.first, t.last)
            && t.tokens >= 2
        {
            s.tpot.observe(secs(first, last) / (t.tokens - 1) as f64);
        }
        s.e2e.observe(secs(t.received, now));
        match t.end {
            End::Finished(reason) => s.finished.count(reason),
            End::Failed => s.finished.error += 1,
            // The stream stopped without saying why: the engine dropped an aborted request.
            End::Open => s.finished.count(FinishReason::Abort),
        }
    }
}

/// Seconds from `a` to `b` (0 when `b` is earlier).
fn secs(a: Instant, b: Instant) -> f64 {
    b.saturating_duration_since(a).as_secs_f64()
}

/// How a request's stream ended, as far as seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// No last event yet.
    Open,
    /// A `Finished` event with its reason.
    Finished(FinishReason),
    /// An error event.
    Failed,
}

/// What the replica saw of one request's stream.
#[derive(Debug, Clone)]
pub(crate) struct Timeline {
    received: Instant,
    first: Option<Instant>,
    last: Option<Instant>,
    tokens: u64,
    end: End,
}

impl Timeline {
    /// A request that reached the replica at `received`.
    pub(crate) fn new(received: Instant) -> Self {
        Self { received, first: None, last: None, tokens: 0, end: End::Open }
    }

    /// Whether the last event (a finish or an error) was seen.
    pub(crate) fn ended(&self) -> bool {
        self.end != End::Open
    }

    /// Notes an event of the stream, seen at `now`.
    pub(crate) fn see(&mut self, event: &Result<TokenEvent, EngineError>, now: Instant) {
        match event {
            Ok(TokenEvent::Delta { .. }) => {
                self.first.get_or_insert(now);
                self.last = Some(now);
                self.tokens += 1;
            }
            Ok(TokenEvent::Finished { reason, .. }) => self.end = End::Finished(*reason),
            Ok(TokenEvent::Prompt(_)) => {}
            Err(_) => self.end = End::Failed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use xinf_engine::Usage;

    fn delta() -> Result<TokenEvent, EngineError> {
        Ok(TokenEvent::Delta { token_id: 1, text: "a".into(), logprobs: None })
    }

    #[test]
    fn a_request_is_recorded() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let recorder = Recorder::default();
        recorder.accepted(t0, at(2));
        let mut t = Timeline::new(t0);
        assert!(!t.ended());
        t.see(&delta(), at(100));
        t.see(&delta(), at(120));
        t.see(&delta(), at(140));
        let usage = Usage { prompt_tokens: 3, completion_tokens: 3 };
        t.see(&Ok(TokenEvent::Finished { reason: FinishReason::Length, usage }), at(141));
        assert!(t.ended());
        recorder.finished(&t, at(150));
        let s = recorder.stats();
        assert_eq!((s.queue.count, s.queue.buckets[0]), (1, 1));
        assert_eq!((s.ttft.count, s.ttft.sum_us), (1, 100_000));
        assert_eq!((s.tpot.count, s.tpot.sum_us), (1, 20_000));
        assert_eq!((s.e2e.count, s.e2e.sum_us), (1, 150_000));
        assert_eq!(s.finished.length, 1);
    }

    #[test]
    fn failed_and_dropped_streams() {
        let t0 = Instant::now();
        let recorder = Recorder::default();
        let mut failed = Timeline::new(t0);
        failed.see(&Err(EngineError::UnknownRequest("r".into())), t0);
        recorder.finished(&failed, t0);
        recorder.finished(&Timeline::new(t0), t0);
        let s = recorder.stats();
        assert_eq!((s.finished.error, s.finished.abort), (1, 1));
        assert_eq!((s.ttft.count, s.tpot.count, s.e2e.count), (0, 0, 2));
    }
}
