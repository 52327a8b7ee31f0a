//! Which replica holds which KV blocks, by content hash, as a pure state machine.
//!
//! Engines reuse block ids: when a replica registers a block id again with another hash, the
//! old hash no longer lives there and is dropped (replace-on-register), so a query never points
//! at a block that now holds something else. A replica that goes away takes all its entries
//! with it.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap};

#[cfg(test)]
mod tests;

/// Where a block with a given content hash can be read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockLocation {
    /// The block's content hash.
    pub hash: u64,
    /// The replica holding it.
    pub replica_uid: String,
    /// The block id inside that replica's KV cache (or its snapshot store).
    pub block_id: u32,
    /// Where the block can be read, when the replica said.
    pub endpoint: Option<xinf_transfer::transport::Endpoint>,
}

/// The registry of one model's blocks.
#[derive(Debug, Default)]
pub(crate) struct BlockTrackerState {
    /// hash → holders `(replica, block)`, ordered so answers are deterministic.
    by_hash: HashMap<u64, BTreeSet<(String, u32)>>,
    /// replica → block → hash.
    by_replica: HashMap<String, BTreeMap<u32, u64>>,
    /// replica → where its blocks are read.
    endpoints: HashMap<String, xinf_transfer::transport::Endpoint>,
}

impl BlockTrackerState {
    /// Records that `replica_uid` holds each `(hash, block_id)`.
    pub(crate) fn register(
        &mut self,
        replica_uid: &str,
        endpoint: Option<xinf_transfer::transport::Endpoint>,
        blocks: &[(u64, u32)],
    ) {
        if let Some(e) = endpoint {
            self.endpoints.insert(replica_uid.to_owned(), e);
        }
        for &(hash, block) in blocks {
            let owned = self.by_replica.entry(replica_uid.to_owned()).or_default();
            if let Some(old) = owned.insert(block, hash)
                && old != hash
            {
                drop_holder(&mut self.by_hash, old, replica_uid, block);
            }
            self.by_hash.entry(hash).or_default().insert((replica_uid.to_owned(), block));
        }
    }

    /// For each hash, the first holder other than `exclude`; hashes nobody holds are left out.
    pub(crate) fn query(&self, hashes: &[u64], exclude: Option<&str>) -> Vec<BlockLocation> {
        hashes
            .iter()
            .filter_map(|h| {
                let holders = self.by_hash.get(h)?;
                let (replica, block) = holders.iter().find(|(r, _)| Some(r.as_str()) != exclude)?;
                Some(BlockLocation {
                    hash: *h,
                    replica_uid: replica.clone(),
                    block_id: *block,
                    endpoint: self.endpoints.get(replica).cloned(),
                })
            })
            .collect()
    }

    /// Forgets some blocks of a replica (freed or evicted).
    pub(crate) fn unregister(&mut self, replica_uid: &str, block_ids: &[u32]) {
        let Some(owned) = self.by_replica.get_mut(replica_uid) else { return };
        for block in block_ids {
            if let Some(hash) = owned.remove(block) {
                drop_holder(&mut self.by_hash, hash, replica_uid, *block);
            }
        }
        if owned.is_empty() {
            self.by_replica.remove(replica_uid);
        }
    }

    /// Forgets everything a replica held (it died or was removed); returns how many blocks.
    pub(crate) fn unregister_replica(&mut self, replica_uid: &str) -> usize {
        self.endpoints.remove(replica_uid);
        let Some(owned) = self.by_replica.remove(replica_uid) else { return 0 };
        for (block, hash) in &owned {
            drop_holder(&mut self.by_hash, *hash, replica_uid, *block);
        }
        owned.len()
    }

    /// Blocks registered, over all replicas.
    pub(crate) fn len(&self) -> usize {
        self.by_replica.values().map(BTreeMap::len).sum()
    }
}

fn drop_holder(by_hash: &mut HashMap<u64, BTreeSet<(String, u32)>>, hash: u64, replica: &str, block: u32) {
    if let Some(holders) = by_hash.get_mut(&hash) {
        holders.remove(&(replica.to_owned(), block));
        if holders.is_empty() {
            by_hash.remove(&hash);
        }
    }
}
