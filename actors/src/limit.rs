//! Xinference's `request_limits`: the most requests a model serves at once. One more is
//! refused at once (429, "Rate limit reached for the model") instead of waiting in a queue, so
//! that a caller under load learns it must back off, as Xinference's callers expect.

use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// A model's count of running requests against its limit.
#[derive(Debug)]
pub(crate) struct RequestLimit {
    limit: u32,
    running: AtomicU32,
    /// Requests refused since the model started, for whoever watches its load.
    refused: AtomicU64,
}

/// A model's `request_limits` and how it is used, as `/v1/models/{uid}/stats` and `/metrics`
/// show it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestLimitStats {
    /// The launch's `request_limits`.
    pub limit: u32,
    /// Requests holding a place now.
    pub running: u32,
    /// Requests refused (429) since the model started.
    pub refused: u64,
}

/// One running request's place; given back when dropped (the request's stream ends).
#[derive(Debug)]
pub(crate) struct Permit(Arc<RequestLimit>);

impl RequestLimit {
    pub(crate) fn new(limit: u32) -> Arc<Self> {
        Arc::new(Self { limit, running: AtomicU32::new(0), refused: AtomicU64::new(0) })
    }

    pub(crate) fn limit(&self) -> u32 {
        self.limit
    }

    /// A place for one more request; `None` (counted) when the model runs its limit already.
    pub(crate) fn try_acquire(self: &Arc<Self>) -> Option<Permit> {
        let taken = self
            .running
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < self.limit).then_some(n + 1));
        if taken.is_err() {
            self.refused.fetch_add(1, Ordering::Relaxed);
        }
        taken.ok().map(|_| Permit(Arc::clone(self)))
    }

    pub(crate) fn stats(&self) -> RequestLimitStats {
        RequestLimitStats {
            limit: self.limit,
            running: self.running.load(Ordering::Acquire),
            refused: self.refused.load(Ordering::Relaxed),
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_are_given_back_when_requests_end() {
        let limit = RequestLimit::new(2);
        let a = limit.try_acquire().expect("first");
        let b = limit.try_acquire().expect("second");
        assert!(limit.try_acquire().is_none(), "a third over a limit of 2");
        assert_eq!(limit.stats(), RequestLimitStats { limit: 2, running: 2, refused: 1 });
        drop(a);
        let c = limit.try_acquire().expect("a place came free");
        assert!(limit.try_acquire().is_none());
        drop((b, c));
        assert_eq!(limit.running.load(Ordering::Acquire), 0);
    }

    #[test]
    fn concurrent_callers_never_exceed_the_limit() {
        let limit = RequestLimit::new(3);
        let peak = Arc::new(AtomicU32::new(0));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (limit, peak) = (Arc::clone(&limit), Arc::clone(&peak));
                std::thread::spawn(move || {
                    for _ in 0..2000 {
                        if let Some(p) = limit.try_acquire() {
                            peak.fetch_max(limit.running.load(Ordering::Acquire), Ordering::AcqRel);
                            drop(p);
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("thread");
        }
        assert!(peak.load(Ordering::Acquire) <= 3);
        assert_eq!(limit.running.load(Ordering::Acquire), 0);
    }
}
