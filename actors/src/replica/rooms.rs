//! The prefill side of a handoff, as a pure state machine: rooms, their leases, and the
//! counters that prove pages moved.
//!
//! A prefill publishes a *room* (a random 63-bit id) holding one pinned prompt. The room lives
//! until the decode side releases it (after importing), the request is aborted, or its lease
//! expires. Two leases:
//! - **unclaimed**: nobody has fetched yet — the decode side never came (its caller vanished,
//!   or it failed before fetching);
//! - **claimed idle**: a fetch started, renewed by every fetch; it bounds a decode side that
//!   dies mid-transfer.
//!
//! Whatever ends a room hands back its request id exactly once, and the caller frees the
//! engine's pinned blocks under it.

use crate::view::HandoffStats;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use xinf_engine::{EngineError, ErrorClass};

#[cfg(test)]
mod tests;

/// Lease lengths of a room.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Leases {
    /// A room nobody fetched from is freed after this.
    pub(crate) unclaimed: Duration,
    /// A claimed room without a fetch for this long is freed.
    pub(crate) claimed_idle: Duration,
}

#[derive(Debug)]
struct Room {
    request_id: String,
    pages: u32,
    /// Snapshot keys of the prompt's complete pages (empty when not kept).
    keys: Arc<[u64]>,
    claimed: bool,
    deadline: Instant,
}

/// Why a fetch cannot read a room.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RoomError {
    /// No such room (released, aborted, expired, or never published).
    Unknown,
    /// The range is outside the room's pages.
    OutOfRange { pages: u32 },
}

/// Every open room of a prefill replica.
#[derive(Debug)]
pub(crate) struct RoomTable {
    rooms: HashMap<u64, Room>,
    /// Requests aborted recently: a prefill that finishes after its abort arrived must not
    /// publish a room nobody will claim.
    aborted: HashMap<String, AbortMark>,
    /// Aborts counted so far: the clock that tells an abort of a request's attempt from one of
    /// an earlier attempt under the same id (a client's retry).
    aborts: u64,
    leases: Leases,
    expired: u64,
    failed: u64,
    local: u64,
}

/// An abort that found no room to close: when it lapses, and its place on the abort clock.
#[derive(Debug, Clone, Copy)]
struct AbortMark {
    lapse: Instant,
    at: u64,
}

impl RoomTable {
    pub(crate) fn new(leases: Leases) -> Self {
        Self {
            rooms: HashMap::new(),
            aborted: HashMap::new(),
            aborts: 0,
            leases,
            expired: 0,
            failed: 0,
            local: 0,
        }
    }

    /// The abort clock now. A prefill or an import notes it when it starts (in the order the
    /// replica takes its messages); the aborts counted after it are the ones that apply to it.
    /// An abort counted before it ended an earlier attempt under the same id.
    pub(crate) fn epoch(&self) -> u64 {
        self.aborts
    }

    /// Whether `request_id`'s attempt that started at `since` ([`epoch`](Self::epoch)) was
    /// aborted.
    fn aborted_since(&self, request_id: &str, since: u64) -> bool {
        self.aborted.get(request_id).is_some_and(|m| m.at > since)
    }

    /// Opens a room for a pinned prompt of `pages` pages, computed by a prefill that started
    /// at `since` ([`epoch`](Self::epoch)); `false` (and no room) when the request was aborted
    /// meanwhile, so the caller frees the KV at once.
    pub(crate) fn publish(
        &mut self,
        room: u64,
        request_id: &str,
        pages: u32,
        keys: Arc<[u64]>,
        now: Instant,
        since: u64,
    ) -> bool {
        if self.aborted_since(request_id, since) {
            self.aborted.remove(request_id);
            return false;
        }
        let deadline = now + self.leases.unclaimed;
        let r = Room { request_id: request_id.to_owned(), pages, keys, claimed: false, deadline };
        self.rooms.insert(room, r);
        true
    }

    /// A fetch of `first .. first + count` starts: the room is claimed and its idle lease
    /// renewed. Returns the request id whose pinned KV to read.
    pub(crate) fn claim(
        &mut self,
        room: u64,
        first: u32,
        count: u32,
        now: Instant,
    ) -> Result<String, RoomError> {
        let r = self.rooms.get_mut(&room).ok_or(RoomError::Unknown)?;
        if first.checked_add(count).is_none_or(|end| end > r.pages) {
            return Err(RoomError::OutOfRange { pages: r.pages });
        }
        r.claimed = true;
        r.deadline = now + self.leases.claimed_idle;
        Ok(r.request_id.clone())
    }

    /// The snapshot keys of an open room's complete pages.
    pub(crate) fn keys(&self, room: u64) -> Option<Arc<[u64]>> {
        self.rooms.get(&room).map(|r| r.keys.clone())
    }

    /// Closes a room (the decode side is done with it); its request id, once.
    pub(crate) fn release(&mut self, room: u64) -> Option<String> {
        self.rooms.remove(&room).map(|r| r.request_id)
    }

    /// Closes every room of a request (it was aborted) and marks the request, so a prefill of
    /// it still running publishes nothing; the count of rooms closed.
    pub(crate) fn abort_request(&mut self, request_id: &str, now: Instant) -> usize {
        let before = self.rooms.len();
        self.rooms.retain(|_, r| r.request_id != request_id);
        let closed = before - self.rooms.len();
        if closed == 0 {
            self.aborts += 1;
            let mark = AbortMark { lapse: now + self.leases.unclaimed, at: self.aborts };
            self.aborted.insert(request_id.to_owned(), mark);
        }
        closed
    }

    /// Whether the attempt of a request that started at `since` ([`epoch`](Self::epoch)) was
    /// aborted since (the mark has not lapsed or been used).
    pub(crate) fn was_aborted(&self, request_id: &str, since: u64) -> bool {
        self.aborted_since(request_id, since)
    }

    /// Closes the rooms whose lease ran out; their request ids.
    pub(crate) fn expire(&mut self, now: Instant) -> Vec<String> {
        self.aborted.retain(|_, m| m.lapse > now);
        let gone: Vec<u64> =
            self.rooms.iter().filter(|(_, r)| r.deadline <= now).map(|(id, _)| *id).collect();
        self.expired += gone.len() as u64;
        gone.into_iter().filter_map(|id| self.rooms.remove(&id)).map(|r| r.request_id).collect()
    }

    /// Counts a failed handoff.
    pub(crate) fn fail(&mut self) {
        self.failed += 1;
    }

    /// Counts a prefill's error as a failed handoff when it is the prefill side's fault (its
    /// engine failed, is out of reach or overloaded); a prompt the engine refuses as invalid,
    /// or a request cancelled, is no handoff that failed.
    pub(crate) fn fail_on(&mut self, e: &EngineError) {
        if matches!(e.class(), ErrorClass::Unavailable | ErrorClass::Internal | ErrorClass::Overloaded) {
            self.fail();
        }
    }

    /// Counts a prompt left to the decode replica.
    pub(crate) fn local(&mut self) {
        self.local += 1;
    }

    /// Rooms open now.
    #[cfg(test)]
    pub(crate) fn active(&self) -> usize {
        self.rooms.len()
    }

    /// Whether a room is claimed (for tests and diagnosis).
    #[cfg(test)]
    pub(crate) fn is_claimed(&self, room: u64) -> Option<bool> {
        self.rooms.get(&room).map(|r| r.claimed)
    }

    /// This table's part of the handoff figures.
    pub(crate) fn stats(&self) -> HandoffStats {
        HandoffStats {
            active_rooms: self.rooms.len() as u64,
            expired_leases: self.expired,
            failed: self.failed,
            local_prefills: self.local,
            ..HandoffStats::default()
        }
    }
}
