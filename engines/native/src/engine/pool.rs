//! The KV cache as the scheduler sees it: block counts, and the prefix cache's blocks.

use super::scheduler::BlockPool;
use crate::kv_cache::KvCache;

impl BlockPool for KvCache {
    fn ensure(&mut self, table: &mut Vec<u32>, tokens: usize) -> bool {
        KvCache::ensure(self, table, tokens)
    }

    fn release(&mut self, table: &mut Vec<u32>) {
        KvCache::release(self, table)
    }

    fn free_blocks(&self) -> usize {
        KvCache::free_blocks(self)
    }

    fn capacity_blocks(&self) -> usize {
        KvCache::capacity_blocks(self)
    }

    fn block_size(&self) -> usize {
        KvCache::block_size(self)
    }

    fn reuse(
        &mut self,
        tokens: &[u32],
        prompt_len: usize,
        table: &mut Vec<u32>,
        keys: &mut Vec<u64>,
    ) -> usize {
        self.blocks().reuse(tokens, prompt_len, table, keys)
    }

    fn caching_blocks_of(&self) -> Option<usize> {
        self.prefix_block_size()
    }
}
