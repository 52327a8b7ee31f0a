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

use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[cfg(test)]
mod tests;

/// Upper bounds, in seconds, of the handoff latency histogram's buckets (the last bucket,
/// `+Inf`, is implied by the count).
pub const HANDOFF_LATENCY_BOUNDS: [f64; 12] =
    [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5];

/// A histogram of page-fetch times (a decode replica's wait from asking for a handoff's pages
/// to holding them), in Prometheus' cumulative form.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LatencyHistogram {
    /// Fetches that took at most `HANDOFF_LATENCY_BOUNDS[i]` seconds.
    pub buckets: [u64; 12],
    /// Fetches in all.
    pub count: u64,
    /// Their total time, in microseconds.
    pub sum_us: u64,
}

impl LatencyHistogram {
    /// Counts one fetch of `secs` seconds.
    pub fn observe(&mut self, secs: f64) {
        for (b, bound) in self.buckets.iter_mut().zip(HANDOFF_LATENCY_BOUNDS) {
            if secs <= bound {
                *b += 1;
            }
        }
        self.count += 1;
        self.sum_us += (secs * 1e6) as u64;
    }

    /// Bucket-wise sum.
    pub fn add(&mut self, o: &Self) {
        for (a, b) in self.buckets.iter_mut().zip(o.buckets) {
            *a += b;
        }
        self.count += o.count;
        self.sum_us += o.sum_us;
    }
}

/// Handoff figures of one replica (a prefill replica counts rooms, a decode replica counts the
/// pages it received).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct HandoffStats {
    /// Rooms published and not yet released.
    pub active_rooms: u64,
    /// Pages moved (counted by the decode side).
    pub pages_transferred: u64,
    /// Bytes moved (counted by the decode side).
    pub bytes_transferred: u64,
    /// Fetches that went over TCP.
    pub tcp_transfers: u64,
    /// Fetches served in process.
    pub in_process_transfers: u64,
    /// Fetches whose bytes moved through NIXL (host memory).
    pub nixl_transfers: u64,
    /// Fetches that moved GPU to GPU inside one process.
    pub gpu_in_process_transfers: u64,
    /// Fetches that moved GPU to GPU through CUDA IPC.
    pub cuda_ipc_transfers: u64,
    /// Fetches that moved GPU to GPU through NIXL (VRAM).
    pub nixl_vram_transfers: u64,
    /// Bytes that moved GPU to GPU without touching host memory (part of `bytes_transferred`).
    pub gpu_bytes_transferred: u64,
    /// GPU-to-GPU fetches refused by the platform (CUDA IPC) that went through host memory.
    pub gpu_fallbacks: u64,
    /// Handoffs that failed (prefill, fetch or import).
    pub failed: u64,
    /// Rooms freed because their lease ran out.
    pub expired_leases: u64,
    /// Prompt pages reused from a snapshot cache instead of computed (counted by the prefill
    /// replica that reused them).
    pub snapshot_hits: u64,
    /// Of those, pages fetched from another replica's snapshot cache.
    pub snapshot_remote_hits: u64,
    /// Pages held in this replica's snapshot cache.
    pub snapshot_pages: u64,
    /// Bytes held in this replica's snapshot cache.
    pub snapshot_bytes: u64,
    /// Pages evicted from the snapshot cache to make room.
    pub snapshot_evictions: u64,
    /// How long page fetches took (counted by the decode side).
    pub latency: LatencyHistogram,
}

impl HandoffStats {
    /// Field-wise sum, for a model's total over its replicas.
    pub fn add(&mut self, o: &Self) {
        self.active_rooms += o.active_rooms;
        self.pages_transferred += o.pages_transferred;
        self.bytes_transferred += o.bytes_transferred;
        self.tcp_transfers += o.tcp_transfers;
        self.in_process_transfers += o.in_process_transfers;
        self.nixl_transfers += o.nixl_transfers;
        self.gpu_in_process_transfers += o.gpu_in_process_transfers;
        self.cuda_ipc_transfers += o.cuda_ipc_transfers;
        self.nixl_vram_transfers += o.nixl_vram_transfers;
        self.gpu_bytes_transferred += o.gpu_bytes_transferred;
        self.gpu_fallbacks += o.gpu_fallbacks;
        self.failed += o.failed;
        self.expired_leases += o.expired_leases;
        self.snapshot_hits += o.snapshot_hits;
        self.snapshot_remote_hits += o.snapshot_remote_hits;
        self.snapshot_pages += o.snapshot_pages;
        self.snapshot_bytes += o.snapshot_bytes;
        self.snapshot_evictions += o.snapshot_evictions;
        self.latency.add(&o.latency);
    }
}

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
    /// Requests aborted recently, by when the mark lapses: a prefill that finishes after its
    /// abort arrived must not publish a room nobody will claim.
    aborted: HashMap<String, Instant>,
    leases: Leases,
    expired: u64,
    failed: u64,
}

impl RoomTable {
    pub(crate) fn new(leases: Leases) -> Self {
        Self { rooms: HashMap::new(), aborted: HashMap::new(), leases, expired: 0, failed: 0 }
    }

    /// Opens a room for a pinned prompt of `pages` pages; `false` (and no room) when the
    /// request was aborted meanwhile, so the caller frees the KV at once.
    pub(crate) fn publish(
        &mut self,
        room: u64,
        request_id: &str,
        pages: u32,
        keys: Arc<[u64]>,
        now: Instant,
    ) -> bool {
        if self.aborted.remove(request_id).is_some() {
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
            self.aborted.insert(request_id.to_owned(), now + self.leases.unclaimed);
        }
        closed
    }

    /// Whether a request was aborted recently (its mark has not lapsed or been used).
    pub(crate) fn was_aborted(&self, request_id: &str) -> bool {
        self.aborted.contains_key(request_id)
    }

    /// Closes the rooms whose lease ran out; their request ids.
    pub(crate) fn expire(&mut self, now: Instant) -> Vec<String> {
        self.aborted.retain(|_, lapse| *lapse > now);
        let gone: Vec<u64> =
            self.rooms.iter().filter(|(_, r)| r.deadline <= now).map(|(id, _)| *id).collect();
        self.expired += gone.len() as u64;
        gone.into_iter().filter_map(|id| self.rooms.remove(&id)).map(|r| r.request_id).collect()
    }

    /// Counts a failed handoff.
    pub(crate) fn fail(&mut self) {
        self.failed += 1;
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
            ..HandoffStats::default()
        }
    }
}
