//! The block allocator, with a prefix cache.
//!
//! Every full block of computed tokens is kept under a key: a hash of the key of the block
//! before it and the block's tokens, so equal keys mean the same tokens at the same positions
//! after the same history. A sequence starting from nothing takes the cached blocks its prompt
//! begins with instead of computing them again (at least its last prompt token is always
//! computed, for its logits). A block is shared by every sequence holding it and written by
//! none: a sequence only writes past what it computed or took. When nobody holds a cached
//! block it stays cached, counted as free, until a new block is needed and none is free: then
//! the block unused longest is forgotten and handed out.
//!
//! Where the computation of a token depends on more than the tokens, so does the key: with
//! quantized weights on the CPU a prompt token of a long prompt is multiplied in F32 and every
//! other token block by block ([`RowKinds`](crate::weights::RowKinds)), so a block's key also
//! says how many of its tokens were prompt tokens and whether the prompt was short, and a block
//! is only reused where computing it again would take the same arithmetic. Its floats are those
//! of the chunk that first computed it: like a prompt cut into chunks, a prompt that takes it can
//! differ from one computed whole in the last bits (a product's blocking follows its size).
//!
//! The hash is SipHash with keys drawn when the engine starts, so that no client can aim a
//! prompt at another's cached blocks; a key is 64 bits.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::hash::{BuildHasher, RandomState};

/// Block ids handed out and given back, and the cached ones.
pub(crate) struct Blocks {
    block_size: usize,
    /// Whether full blocks are cached (`enable_prefix_caching`).
    caching: bool,
    /// Whether a token's K and V depend on its row kind (quantized CPU weights).
    by_row_kind: bool,
    /// Blocks holding nothing anyone may want.
    free: VecDeque<u32>,
    /// Per block: the sequences holding it.
    refs: Vec<u32>,
    /// Per block: the key it is cached under.
    key: Vec<Option<u64>>,
    /// The cached blocks by key.
    by_key: HashMap<u64, u32>,
    /// Cached blocks nobody holds, by when they were last given back (oldest first).
    idle: BTreeMap<u64, u32>,
    /// Per block: its place in `idle`.
    idle_at: Vec<u64>,
    clock: u64,
    hasher: RandomState,
}

impl Blocks {
    /// `num_blocks` blocks of `block_size` tokens; block 0 is never handed out.
    pub(crate) fn new(num_blocks: usize, block_size: usize, caching: bool) -> Self {
        Self {
            block_size: block_size.max(1),
            caching,
            by_row_kind: false,
            free: (1..num_blocks as u32).collect(),
            refs: vec![0; num_blocks],
            key: vec![None; num_blocks],
            by_key: HashMap::new(),
            idle: BTreeMap::new(),
            idle_at: vec![0; num_blocks],
            clock: 0,
            hasher: RandomState::new(),
        }
    }

    /// Keys blocks by their tokens' row kinds too (see the module's doc).
    pub(crate) fn set_by_row_kind(&mut self, on: bool) {
        self.by_row_kind = on;
    }

    /// Whether full blocks are cached.
    pub(crate) fn caching(&self) -> bool {
        self.caching
    }

    /// Blocks a sequence may be given now: the free ones and the cached ones nobody holds.
    pub(crate) fn free_blocks(&self) -> usize {
        self.free.len() + self.idle.len()
    }

    /// Cached blocks nobody holds.
    #[cfg(test)]
    pub(crate) fn idle_blocks(&self) -> usize {
        self.idle.len()
    }

    /// Grows `table` by `need` blocks; `false` (and no change) when there are not enough.
    pub(crate) fn take(&mut self, table: &mut Vec<u32>, need: usize) -> bool {
        if need > self.free_blocks() {
            return false;
        }
        for _ in 0..need {
            let Some(b) = self.free.pop_front().or_else(|| self.evict()) else { return false };
            self.refs[b as usize] = 1;
            table.push(b);
        }
        true
    }

    /// Forgets the cached block unused longest and hands it out.
    fn evict(&mut self) -> Option<u32> {
        let (_, b) = self.idle.pop_first()?;
        if let Some(k) = self.key[b as usize].take() {
            self.by_key.remove(&k);
        }
        Some(b)
    }

    /// Gives back every block of `table`: a block nobody holds any more stays cached if it is,
    /// else it is free.
    pub(crate) fn release(&mut self, table: &mut Vec<u32>) {
        for b in table.drain(..) {
            let i = b as usize;
            self.refs[i] = self.refs[i].saturating_sub(1);
            if self.refs[i] > 0 {
                continue;
            }
            if self.key[i].is_some() {
                self.clock += 1;
                self.idle.insert(self.clock, b);
                self.idle_at[i] = self.clock;
            } else {
                self.free.push_back(b);
            }
        }
    }

    /// The key of block `index` of a sequence whose prompt has `prompt_len` tokens, holding
    /// `tokens`, after the block keyed `before`.
    fn key_of(&self, before: Option<u64>, tokens: &[u32], index: usize, prompt_len: usize) -> u64 {
        let kinds = if !self.by_row_kind {
            0
        } else if crate::weights::RowKinds::quantized_at(0, prompt_len) {
            // A short prompt: every token block by block.
            u64::MAX
        } else {
            // The block's prompt tokens (F32) before its generated ones (block by block).
            prompt_len.saturating_sub(index * self.block_size).min(self.block_size) as u64
        };
        self.hasher.hash_one((before, tokens, kinds))
    }

    /// Gives an empty `table` the cached blocks that `tokens` (a prompt of `prompt_len` and
    /// any tokens generated since) begin with, all but the last token's block at most, their
    /// keys in `keys`; the tokens they hold.
    pub(crate) fn reuse(
        &mut self,
        tokens: &[u32],
        prompt_len: usize,
        table: &mut Vec<u32>,
        keys: &mut Vec<u64>,
    ) -> usize {
        if !self.caching || !table.is_empty() {
            return 0;
        }
        keys.clear();
        let bs = self.block_size;
        for (i, block) in tokens[..tokens.len().saturating_sub(1)].chunks_exact(bs).enumerate() {
            let k = self.key_of(keys.last().copied(), block, i, prompt_len);
            let Some(&b) = self.by_key.get(&k) else { break };
            let i = b as usize;
            if self.refs[i] == 0 {
                self.idle.remove(&self.idle_at[i]);
            }
            self.refs[i] += 1;
            table.push(b);
            keys.push(k);
        }
        table.len() * bs
    }

    /// Caches the full blocks of `table` among the first `computed` of `tokens` that `keys`
    /// does not cover yet, extending `keys`. A block whose key is cached already (the same
    /// tokens computed by another sequence at the same time) stays the sequence's own.
    pub(crate) fn publish(
        &mut self,
        tokens: &[u32],
        prompt_len: usize,
        computed: usize,
        table: &[u32],
        keys: &mut Vec<u64>,
    ) {
        if !self.caching {
            return;
        }
        let bs = self.block_size;
        let full = (computed.min(tokens.len()) / bs).min(table.len());
        for i in keys.len()..full {
            let k = self.key_of(keys.last().copied(), &tokens[i * bs..(i + 1) * bs], i, prompt_len);
            keys.push(k);
            let b = table[i];
            if self.key[b as usize].is_none() && !self.by_key.contains_key(&k) {
                self.key[b as usize] = Some(k);
                self.by_key.insert(k, b);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Blocks;

    fn tokens(n: usize, salt: u32) -> Vec<u32> {
        (0..n as u32).map(|i| i * 7 + salt).collect()
    }

    #[test]
    fn a_finished_prompts_full_blocks_serve_the_next_one() {
        let mut b = Blocks::new(9, 4, true);
        let prompt = tokens(10, 1);
        let (mut table, mut keys) = (Vec::new(), Vec::new());
        assert_eq!(b.reuse(&prompt, prompt.len(), &mut table, &mut keys), 0);
        assert!(b.take(&mut table, 3));
        b.publish(&prompt, prompt.len(), 10, &table, &mut keys);
        assert_eq!(keys.len(), 2, "two full blocks of 4");
        let first = table.clone();
        b.release(&mut table);
        assert_eq!((b.free_blocks(), b.idle_blocks()), (8, 2));

        // The same prompt, and a longer one, take both blocks; another prefix takes none.
        let (mut t2, mut k2) = (Vec::new(), Vec::new());
        assert_eq!(b.reuse(&prompt, prompt.len(), &mut t2, &mut k2), 8);
        assert_eq!(t2, first[..2]);
        let (mut t3, mut k3) = (Vec::new(), Vec::new());
        assert_eq!(b.reuse(&tokens(20, 1), 20, &mut t3, &mut k3), 8);
        assert_eq!(t3, t2, "shared, not copied");
        let mut other = tokens(10, 1);
        other[5] = 999;
        let (mut t4, mut k4) = (Vec::new(), Vec::new());
        assert_eq!(b.reuse(&other, other.len(), &mut t4, &mut k4), 4, "only the block before the change");
        // Held blocks are not free; given back, they are cached again.
        assert_eq!(b.idle_blocks(), 0);
        for t in [&mut t2, &mut t3, &mut t4] {
            b.release(t);
        }
        assert_eq!((b.free_blocks(), b.idle_blocks()), (8, 2));
    }

    #[test]
    fn the_last_prompt_token_is_always_computed() {
        let mut b = Blocks::new(9, 4, true);
        let prompt = tokens(8, 2);
        let (mut table, mut keys) = (Vec::new(), Vec::new());
        assert!(b.take(&mut table, 2));
        b.publish(&prompt, prompt.len(), 8, &table, &mut keys);
        b.release(&mut table);
        // Exactly two blocks: the second holds the last token, so it is computed again.
        assert_eq!(b.reuse(&prompt, prompt.len(), &mut table, &mut keys), 4);
    }

    #[test]
    fn cached_blocks_are_forgotten_oldest_first_when_blocks_run_short() {
        let mut b = Blocks::new(5, 2, true);
        let (a, c) = (tokens(5, 3), tokens(5, 4));
        for p in [&a, &c] {
            let (mut t, mut k) = (Vec::new(), Vec::new());
            assert!(b.take(&mut t, 2));
            b.publish(p, p.len(), 4, &t, &mut k);
            b.release(&mut t);
        }
        assert_eq!((b.free_blocks(), b.idle_blocks()), (4, 4));
        // Two new blocks: none is free, so `a`'s, given back first, are forgotten.
        let mut t = Vec::new();
        assert!(b.take(&mut t, 2));
        let (mut ta, mut ka) = (Vec::new(), Vec::new());
        assert_eq!(b.reuse(&a, a.len(), &mut ta, &mut ka), 0, "forgotten");
        let (mut tc, mut kc) = (Vec::new(), Vec::new());
        assert_eq!(b.reuse(&c, c.len(), &mut tc, &mut kc), 4, "kept");
        // Held, `c`'s blocks cannot be handed out.
        assert!(!b.take(&mut t, 1));
    }

    #[test]
    fn a_block_computed_twice_is_cached_once_and_caching_can_be_off() {
        let mut b = Blocks::new(9, 4, true);
        let p = tokens(9, 5);
        let (mut t1, mut k1, mut t2, mut k2) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        assert!(b.take(&mut t1, 3) && b.take(&mut t2, 3));
        b.publish(&p, p.len(), 9, &t1, &mut k1);
        b.publish(&p, p.len(), 9, &t2, &mut k2);
        assert_eq!(k1, k2);
        b.release(&mut t1);
        b.release(&mut t2);
        // The second copy's blocks went back to the free list.
        assert_eq!((b.free_blocks(), b.idle_blocks()), (8, 2));

        let mut off = Blocks::new(9, 4, false);
        let (mut t, mut k) = (Vec::new(), Vec::new());
        assert!(off.take(&mut t, 3));
        off.publish(&p, p.len(), 9, &t, &mut k);
        off.release(&mut t);
        assert_eq!(off.reuse(&p, p.len(), &mut t, &mut k), 0);
        assert_eq!(off.idle_blocks(), 0);
    }

    #[test]
    fn by_row_kind_a_block_is_reused_only_where_it_was_computed_alike() {
        let mut b = Blocks::new(17, 4, true);
        b.set_by_row_kind(true);
        // A 40-token prompt and 8 generated tokens, all computed and published.
        let seq = tokens(48, 6);
        let (mut t, mut k) = (Vec::new(), Vec::new());
        assert!(b.take(&mut t, 12));
        b.publish(&seq, 40, 48, &t, &mut k);
        b.release(&mut t);
        // The next turn's prompt holds the answer as prompt tokens (F32 rows, not block by
        // block): only the first prompt's blocks are taken.
        let (mut t2, mut k2) = (Vec::new(), Vec::new());
        assert_eq!(b.reuse(&tokens(60, 6), 60, &mut t2, &mut k2), 40);
        b.release(&mut t2);
        // A short prompt (every row block by block) takes none of a long prompt's blocks.
        let (mut t3, mut k3) = (Vec::new(), Vec::new());
        assert_eq!(b.reuse(&tokens(20, 6), 20, &mut t3, &mut k3), 0);
        // Without row kinds, the answer's blocks are taken too.
        let mut plain = Blocks::new(17, 4, true);
        let (mut t, mut k) = (Vec::new(), Vec::new());
        assert!(plain.take(&mut t, 12));
        plain.publish(&seq, 40, 48, &t, &mut k);
        plain.release(&mut t);
        assert_eq!(plain.reuse(&tokens(60, 6), 60, &mut t, &mut k), 48);
    }
}
