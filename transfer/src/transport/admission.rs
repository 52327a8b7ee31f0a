//! Which connections a page server spends a task and a slot on.
//!
//! A connection first proves that its peer holds the cluster's page key ([`super::auth`], within
//! [`FRAME_TIME`](super::wire::FRAME_TIME)), and only then takes one of the server's
//! [`Slots`]. Until then it is one of a bounded set of [`Handshakes`]: when all are taken, a new
//! connection ends the oldest. A peer that holds the key answers the hello within a round trip,
//! so connections that open and stay silent, however many, only push each other out; they can
//! no longer fill the slots that the cluster's own fetches need, nor the process's descriptors.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::AbortHandle;

/// The connections whose handshake is under way, each served by a task of its own.
#[derive(Debug)]
pub(super) struct Handshakes {
    cap: usize,
    pending: Mutex<Pending>,
}

#[derive(Debug, Default)]
struct Pending {
    next: u64,
    /// By age: the first entry is the oldest handshake.
    tasks: BTreeMap<u64, AbortHandle>,
}

impl Handshakes {
    /// At most `cap` (at least 1) handshakes under way at once.
    pub(super) fn new(cap: usize) -> Arc<Self> {
        Arc::new(Self { cap: cap.max(1), pending: Mutex::default() })
    }

    fn lock(&self) -> MutexGuard<'_, Pending> {
        // Nothing panics while holding it; a poisoned map is still a consistent one.
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Spawns `task` with the [`Ticket`] of a new pending handshake, ending the oldest pending
    /// one first when all are taken. Returns whether one was ended.
    pub(super) fn spawn<F, T>(self: &Arc<Self>, task: F) -> bool
    where
        F: FnOnce(Ticket) -> T,
        T: Future<Output = ()> + Send + 'static,
    {
        let mut pending = self.lock();
        let ended = if pending.tasks.len() >= self.cap {
            pending.tasks.pop_first().map(|(_, oldest)| oldest.abort()).is_some()
        } else {
            false
        };
        let id = pending.next;
        pending.next += 1;
        // Registered before the lock is let go, so the task cannot finish (and deregister)
        // before it is registered.
        let handle = tokio::spawn(task(Ticket { owner: self.clone(), id }));
        pending.tasks.insert(id, handle.abort_handle());
        ended
    }
}

/// One pending handshake: its task is among those a new connection may end until
/// [`done`](Self::done) (or until the task ends).
#[derive(Debug)]
pub(super) struct Ticket {
    owner: Arc<Handshakes>,
    id: u64,
}

impl Ticket {
    /// The handshake is over: the task is no longer one a new connection may end. `false` when
    /// it was ended already (it is being aborted and should stop).
    pub(super) fn done(self) -> bool {
        self.owner.lock().tasks.remove(&self.id).is_some()
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.owner.lock().tasks.remove(&self.id);
    }
}

/// The connections a page server serves at once, past their handshake. Each holds a task and a
/// socket until its peer closes it or stays idle past [`IDLE`](super::wire::IDLE).
#[derive(Debug)]
pub(super) struct Slots {
    free: Arc<Semaphore>,
    /// Whether the cap was met and not since left: warned once each time, not once per refused
    /// connection of a burst.
    at_cap: AtomicBool,
}

impl Slots {
    pub(super) fn new(cap: usize) -> Arc<Self> {
        Arc::new(Self { free: Arc::new(Semaphore::new(cap)), at_cap: AtomicBool::new(false) })
    }

    /// A slot for an authenticated connection from `peer`, or `None` at the cap.
    pub(super) fn take(&self, peer: Option<SocketAddr>) -> Option<OwnedSemaphorePermit> {
        let slot = self.free.clone().try_acquire_owned().ok();
        let was_at_cap = self.at_cap.swap(slot.is_none(), Ordering::Relaxed);
        if slot.is_none() && !was_at_cap {
            tracing::warn!(?peer, "the page server is at its connection cap; new connections are closed");
        }
        slot
    }
}

/// Peers refused for not holding the key, logged at most once every [`Refusals::EVERY`] with the
/// count since the last line: a flood of such peers must not fill the log.
#[derive(Debug)]
pub(super) struct Refusals {
    /// When the last line was written (none yet: `None`), and the refusals not logged since.
    last: Mutex<(Option<Instant>, u64)>,
}

impl Refusals {
    const EVERY: Duration = Duration::from_secs(60);

    pub(super) fn new() -> Arc<Self> {
        Arc::new(Self { last: Mutex::new((None, 0)) })
    }

    /// Notes that `peer` was refused; writes a warning when the last is old enough.
    pub(super) fn note(&self, peer: Option<SocketAddr>) {
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        if last.0.is_some_and(|at| now.duration_since(at) < Self::EVERY) {
            last.1 += 1;
            return;
        }
        let unlogged = std::mem::take(&mut last.1);
        last.0 = Some(now);
        drop(last);
        tracing::warn!(?peer, unlogged, "a page-plane client without this cluster's key was refused");
    }
}

#[cfg(test)]
mod tests {
    use super::Refusals;

    /// The first refusal is logged; those within the next minute are only counted, for the
    /// line after it.
    #[test]
    fn refusals_within_a_minute_are_counted_not_logged() {
        let r = Refusals::new();
        for _ in 0..3 {
            r.note(None);
        }
        let last = r.last.lock().expect("lock");
        assert!(last.0.is_some());
        assert_eq!(last.1, 2);
    }
}
