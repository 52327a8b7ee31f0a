//! The replica's request buffers: events wait here between the engine and the caller's pulls.

use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::Notify;
use xinf_engine::{EngineError, TokenEvent};
use xinf_transfer::sync::lock;

#[cfg(test)]
mod tests;

/// One answer to a pull.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct EventBatch {
    /// The events buffered since the last pull, oldest first.
    pub(crate) events: Vec<Result<TokenEvent, EngineError>>,
    /// The request has ended: these are its last events.
    pub(crate) done: bool,
}

struct SlotInner {
    events: Vec<Result<TokenEvent, EngineError>>,
    done: bool,
    last_pull: Instant,
    /// The request was aborted: once its stream has ended, a new request may take its id.
    aborted: bool,
}

/// The buffer of one request.
pub(crate) struct Slot {
    inner: Mutex<SlotInner>,
    notify: Notify,
}

impl Slot {
    /// Buffers an event and wakes a waiting pull.
    pub(crate) fn push(&self, event: Result<TokenEvent, EngineError>) {
        lock(&self.inner).events.push(event);
        self.notify.notify_one();
    }

    /// The engine's stream ended.
    pub(crate) fn finish(&self) {
        lock(&self.inner).done = true;
        self.notify.notify_one();
    }

    fn take(&self) -> Option<EventBatch> {
        let mut g = lock(&self.inner);
        g.last_pull = Instant::now();
        if g.events.is_empty() && !g.done {
            return None;
        }
        Some(EventBatch { events: std::mem::take(&mut g.events), done: g.done })
    }

    /// Waits until at least one event is buffered (or the request ended), at most `long_poll`,
    /// and takes everything buffered.
    pub(crate) async fn next_batch(&self, long_poll: Duration) -> EventBatch {
        let deadline = tokio::time::Instant::now() + long_poll;
        loop {
            if let Some(batch) = self.take() {
                return batch;
            }
            // A wake-up without events (a stale permit) just loops.
            if tokio::time::timeout_at(deadline, self.notify.notified()).await.is_err() {
                return self.take().unwrap_or(EventBatch { events: Vec::new(), done: false });
            }
        }
    }
}

/// All buffered requests of a replica. Shared with the tasks that answer pulls.
#[derive(Default)]
pub(crate) struct RequestTable {
    slots: Mutex<HashMap<String, Arc<Slot>>>,
}

impl RequestTable {
    /// Adds a request's buffer; `now` counts as its last pull.
    pub(crate) fn insert(&self, request_id: &str, now: Instant) -> Arc<Slot> {
        let slot = Arc::new(Slot {
            inner: Mutex::new(SlotInner { events: Vec::new(), done: false, last_pull: now, aborted: false }),
            notify: Notify::new(),
        });
        lock(&self.slots).insert(request_id.to_owned(), slot.clone());
        slot
    }

    /// A request's buffer.
    pub(crate) fn get(&self, request_id: &str) -> Option<Arc<Slot>> {
        lock(&self.slots).get(request_id).cloned()
    }

    /// Drops a request's buffer (its last batch was taken).
    pub(crate) fn remove(&self, request_id: &str) {
        lock(&self.slots).remove(request_id);
    }

    /// Notes that a request was aborted: its id is free again once its stream has ended,
    /// whether or not anyone pulls its last events (a caller that went away never will).
    pub(crate) fn aborted(&self, request_id: &str) {
        if let Some(slot) = lock(&self.slots).get(request_id) {
            lock(&slot.inner).aborted = true;
        }
    }

    /// Whether a new request may take `request_id`: no request holds it, or an aborted one
    /// whose stream has ended, whose buffer is then dropped. A client that retries under the
    /// same id after its first attempt was aborted (it went away) is served as soon as the
    /// engine has let go of the first.
    pub(crate) fn free_for_new(&self, request_id: &str) -> bool {
        let mut slots = lock(&self.slots);
        let Some(slot) = slots.get(request_id) else { return true };
        let ended = {
            let g = lock(&slot.inner);
            g.aborted && g.done
        };
        if ended {
            slots.remove(request_id);
        }
        ended
    }

    /// Drops the buffers nobody pulled for longer than `idle`; returns the ids of those still
    /// running, which the caller aborts.
    pub(crate) fn expire(&self, now: Instant, idle: Duration) -> Vec<String> {
        let mut slots = lock(&self.slots);
        let mut running = Vec::new();
        slots.retain(|id, slot| {
            let g = lock(&slot.inner);
            if now.saturating_duration_since(g.last_pull) <= idle {
                return true;
            }
            if !g.done {
                running.push(id.clone());
            }
            false
        });
        running
    }

    /// Drops every buffer; returns the ids of the requests still running.
    pub(crate) fn drain_all(&self) -> Vec<String> {
        let mut slots = lock(&self.slots);
        slots.drain().filter(|(_, s)| !lock(&s.inner).done).map(|(id, _)| id).collect()
    }
}
