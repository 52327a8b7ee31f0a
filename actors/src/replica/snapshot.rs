//! The CPU snapshot cache of a prefill replica: complete prompt pages kept after their handoff,
//! under content keys, so a later prompt with the same prefix imports them instead of
//! computing them again (on this replica, or on another one that finds them through the
//! model's block tracker).
//!
//! A key is a chained hash: page `i`'s key hashes page `i - 1`'s key, the model contract's
//! fingerprint and the page's 64 token ids. Equal keys therefore mean the same model and the
//! same whole prefix, so a page is never reused under a different history. Only complete pages
//! (64 valid tokens) are kept. The store has a byte budget and evicts the least recently used
//! pages that no request holds a lease on; a page that cannot fit is simply not kept.

use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::Arc;
use xinf_engine::{ModelContract, PAGE_TOKENS};

#[cfg(test)]
mod tests;

/// The content keys of the first `pages` complete pages of `ids`.
pub(crate) fn chain_keys(contract: &ModelContract, ids: &[u32], pages: usize) -> Vec<u64> {
    let seed = {
        let mut h = Sha256::new();
        h.update(b"xinf-snapshot-v1");
        h.update(serde_json::to_vec(contract).unwrap_or_default());
        h.finalize()
    };
    let mut prev: [u8; 32] = seed.into();
    ids.chunks_exact(PAGE_TOKENS)
        .take(pages)
        .map(|page| {
            let mut h = Sha256::new();
            h.update(prev);
            for id in page {
                h.update(id.to_le_bytes());
            }
            prev = h.finalize().into();
            u64::from_le_bytes([prev[0], prev[1], prev[2], prev[3], prev[4], prev[5], prev[6], prev[7]])
        })
        .collect()
}

#[derive(Debug)]
struct Entry {
    page: Arc<[u8]>,
    /// The key of the page before it in its prefix; `None` for a first page.
    parent: Option<u64>,
    /// Tracker slot: a small number naming the entry in the block tracker.
    slot: u32,
    last_use: u64,
    leases: u32,
}

/// What an insertion changed, for the block tracker.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Inserted {
    /// `(key, slot)` of the pages now held.
    pub(crate) added: Vec<(u64, u32)>,
    /// Slots of the pages evicted to make room.
    pub(crate) evicted: Vec<u32>,
}

/// Figures of a snapshot store.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct StoreStats {
    pub(crate) pages: u64,
    pub(crate) bytes: u64,
    pub(crate) evictions: u64,
}

/// Pages under content keys, within a byte budget.
#[derive(Debug)]
pub(crate) struct SnapshotStore {
    budget: usize,
    used: usize,
    entries: HashMap<u64, Entry>,
    clock: u64,
    next_slot: u32,
    evictions: u64,
}

impl SnapshotStore {
    /// An empty store holding at most `budget` bytes of pages.
    pub(crate) fn new(budget: usize) -> Self {
        Self { budget, used: 0, entries: HashMap::new(), clock: 0, next_slot: 0, evictions: 0 }
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// Keeps the pages of a prefix: `pages[i]` is the page under `keys[first + i]`. Pages
    /// already held are only touched; pages that do not fit even after evicting every
    /// unleased page are not kept (nor anything after them, since a page is only reachable
    /// through its whole prefix).
    pub(crate) fn insert(&mut self, keys: &[u64], first: usize, pages: &[&[u8]]) -> Inserted {
        let mut out = Inserted::default();
        for (i, page) in pages.iter().enumerate() {
            let at = first + i;
            let Some(&key) = keys.get(at) else { break };
            let now = self.tick();
            if let Some(e) = self.entries.get_mut(&key) {
                e.last_use = now;
                continue;
            }
            if !self.make_room(page.len(), &mut out.evicted) {
                break;
            }
            let slot = self.next_slot;
            self.next_slot = self.next_slot.wrapping_add(1);
            let parent = at.checked_sub(1).and_then(|p| keys.get(p).copied());
            self.used += page.len();
            self.entries
                .insert(key, Entry { page: Arc::from(*page), parent, slot, last_use: now, leases: 0 });
            out.added.push((key, slot));
        }
        out
    }

    /// Evicts least recently used unleased pages until `bytes` more fit; `false` when they
    /// cannot.
    fn make_room(&mut self, bytes: usize, evicted: &mut Vec<u32>) -> bool {
        if bytes > self.budget {
            return false;
        }
        while self.used + bytes > self.budget {
            let victim = self.entries.iter().filter(|(_, e)| e.leases == 0).min_by_key(|(_, e)| e.last_use);
            let Some((&key, _)) = victim else { return false };
            if let Some(e) = self.entries.remove(&key) {
                self.used -= e.page.len();
                self.evictions += 1;
                evicted.push(e.slot);
            }
        }
        true
    }

    /// How many of `keys`, from the first, are held.
    pub(crate) fn longest_prefix(&self, keys: &[u64]) -> usize {
        keys.iter().take_while(|k| self.entries.contains_key(k)).count()
    }

    /// Leases the pages under `keys` (all held, else `None` and nothing leased): they are not
    /// evicted until [`unlease`](Self::unlease).
    pub(crate) fn lease(&mut self, keys: &[u64]) -> Option<Vec<Arc<[u8]>>> {
        if !keys.iter().all(|k| self.entries.contains_key(k)) {
            return None;
        }
        let now = self.tick();
        let mut pages = Vec::with_capacity(keys.len());
        for k in keys {
            if let Some(e) = self.entries.get_mut(k) {
                e.leases += 1;
                e.last_use = now;
                pages.push(e.page.clone());
            }
        }
        Some(pages)
    }

    /// Ends a lease taken with [`lease`](Self::lease).
    pub(crate) fn unlease(&mut self, keys: &[u64]) {
        for k in keys {
            if let Some(e) = self.entries.get_mut(k) {
                e.leases = e.leases.saturating_sub(1);
            }
        }
    }

    /// The `count` pages of the prefix that ends with `last`, in prefix order (walking back
    /// through the parents); `None` when one of them is not held.
    pub(crate) fn chain(&mut self, last: u64, count: usize) -> Option<Vec<Arc<[u8]>>> {
        // `count` comes off the wire: the chain cannot be longer than the store.
        let mut keys = Vec::with_capacity(count.min(self.entries.len()));
        let mut at = Some(last);
        while keys.len() < count {
            let key = at?;
            let e = self.entries.get(&key)?;
            keys.push(key);
            at = e.parent;
        }
        keys.reverse();
        let pages = self.lease(&keys)?;
        self.unlease(&keys);
        Some(pages)
    }

    /// Pages, bytes and evictions so far.
    pub(crate) fn stats(&self) -> StoreStats {
        StoreStats { pages: self.entries.len() as u64, bytes: self.used as u64, evictions: self.evictions }
    }
}
