//! The scheduler's decisions, made over block counts alone: which waiting sequences start,
//! what each running sequence computes in a step, and which one gives its blocks back when the
//! cache runs out. Nothing here touches the model or the cache's memory, so every decision can
//! be checked with a stand-in for the block allocator; the compute thread carries them out.
//!
//! The policy: sequences start first come, first served, while the sequence limit and free
//! blocks allow (a prompt that does not fit waits at the head of the queue, so later ones do
//! not overtake it). A step's token budget goes first to every decoding sequence (one token
//! each), then to prompt chunks in admission order. When a sequence cannot grow, the most
//! recently admitted other sequence is preempted: its blocks are freed and it is recomputed
//! from the start later, so the older requests keep going.

use std::collections::VecDeque;

/// The block accounting of the KV cache: all the scheduler needs of it.
pub(super) trait BlockPool {
    /// Grows `table` to cover `tokens` tokens; `false` (and no change) when blocks are short.
    fn ensure(&mut self, table: &mut Vec<u32>, tokens: usize) -> bool;
    /// Gives back every block of `table`, leaving it empty.
    fn release(&mut self, table: &mut Vec<u32>);
    /// Blocks free now.
    fn free_blocks(&self) -> usize;
    /// Blocks there are to hand out.
    fn capacity_blocks(&self) -> usize;
    /// Tokens a block holds.
    fn block_size(&self) -> usize;
    /// Gives an empty `table` the cached blocks that `tokens` (a prompt of `prompt_len` and
    /// what was generated since) begin with, their keys in `keys`; the tokens they hold (0
    /// without a prefix cache).
    fn reuse(
        &mut self,
        _tokens: &[u32],
        _prompt_len: usize,
        _table: &mut Vec<u32>,
        _keys: &mut Vec<u64>,
    ) -> usize {
        0
    }
    /// The block size when full blocks are cached for later prompts; `None` when they are not.
    fn caching_blocks_of(&self) -> Option<usize> {
        None
    }
}

/// A sequence that starts from nothing, as [`Schedulable::fresh`] shows it: its tokens, its
/// prompt's length, its block table and its blocks' keys.
pub(super) type Fresh<'a> = (&'a [u32], usize, &'a mut Vec<u32>, &'a mut Vec<u64>);

/// What the scheduler reads and changes of a sequence.
pub(super) trait Schedulable {
    /// Tokens known: the prompt and what was sampled so far.
    fn len(&self) -> usize;
    /// Tokens whose K and V are in the cache.
    fn computed(&self) -> usize;
    /// The blocks holding the sequence's K and V.
    fn table(&mut self) -> &mut Vec<u32>;
    /// How many blocks it holds.
    fn held_blocks(&self) -> usize;
    /// Tokens of cache to hold on admission when the prompt's KV is imported, not computed.
    fn import_need(&self) -> Option<usize>;
    /// Forgets what was in the cache (its blocks were given back): computed again from the
    /// start, imported KV included.
    fn forget(&mut self);
    /// For a sequence that starts from nothing (no KV computed, none imported): its tokens,
    /// its prompt's length, its block table and its blocks' keys, to take cached blocks with.
    fn fresh(&mut self) -> Option<Fresh<'_>> {
        None
    }
    /// Sets the tokens whose K and V are in the cache (cached blocks it took).
    fn set_computed(&mut self, _tokens: usize) {}
    /// Its tokens and its prompt's length.
    fn known(&self) -> (&[u32], usize) {
        (&[], 0)
    }
    /// The most tokens it computes in one step (besides the step's budget).
    fn chunk_limit(&self) -> usize {
        usize::MAX
    }
}

impl<T: Schedulable + ?Sized> Schedulable for Box<T> {
    fn len(&self) -> usize {
        (**self).len()
    }

    fn computed(&self) -> usize {
        (**self).computed()
    }

    fn table(&mut self) -> &mut Vec<u32> {
        (**self).table()
    }

    fn held_blocks(&self) -> usize {
        (**self).held_blocks()
    }

    fn import_need(&self) -> Option<usize> {
        (**self).import_need()
    }

    fn forget(&mut self) {
        (**self).forget()
    }

    fn fresh(&mut self) -> Option<Fresh<'_>> {
        (**self).fresh()
    }

    fn set_computed(&mut self, tokens: usize) {
        (**self).set_computed(tokens)
    }

    fn known(&self) -> (&[u32], usize) {
        (**self).known()
    }

    fn chunk_limit(&self) -> usize {
        (**self).chunk_limit()
    }
}

/// The engine options the scheduler works within.
#[derive(Debug, Clone, Copy)]
pub(super) struct Limits {
    /// Sequences running at once.
    pub(super) max_num_seqs: usize,
    /// Tokens of one step (raised to the running sequences' count, one decode token each).
    pub(super) max_batch_tokens: usize,
}

/// A waiting sequence that left the queue.
pub(super) enum Admission<S> {
    /// Its first blocks are held: the caller starts it.
    Admitted(S),
    /// It does not fit even in an empty cache with nothing running: the caller fails it.
    TooLarge(S),
}

/// Takes the sequence at the head of `waiting` if the sequence limit and the free blocks
/// allow, holding blocks for its first chunk (or for its imported KV); `None` when nothing
/// more starts this step, the head staying first in line.
pub(super) fn admit_next<S: Schedulable>(
    waiting: &mut VecDeque<S>,
    running: &[S],
    blocks: &mut impl BlockPool,
    limits: Limits,
) -> Option<Admission<S>> {
    if running.len() >= limits.max_num_seqs {
        return None;
    }
    let mut s = waiting.pop_front()?;
    // Cached blocks first: the first chunk starts after them.
    let reused =
        s.fresh().map(|(tokens, prompt_len, table, keys)| blocks.reuse(tokens, prompt_len, table, keys));
    let cached = reused.unwrap_or(0);
    s.set_computed(cached);
    // Another sequence is computing the prompt block this one needs next (`n` choices, or
    // requests with one system prompt that came together): this one waits a step for it and
    // then takes it from the cache, instead of computing it as well.
    if let Some(bs) = blocks.caching_blocks_of()
        && reused.is_some()
        && waits_for_block(&s, running, cached, bs)
    {
        if cached > 0 {
            blocks.release(s.table());
            s.forget();
        }
        waiting.push_front(s);
        return None;
    }
    let need = s.import_need().unwrap_or_else(|| cached + (s.len() - cached).min(limits.max_batch_tokens));
    // The room the running sequences grow into next is theirs: a sequence admitted into it
    // would be preempted for it, and admitted again, for ever.
    let bs = blocks.block_size().max(1);
    let reserve = growth(running, bs, limits.max_batch_tokens);
    let fits = blocks.free_blocks() >= reserve + need.div_ceil(bs).saturating_sub(s.held_blocks());
    if fits && blocks.ensure(s.table(), need) {
        return Some(Admission::Admitted(s));
    }
    // Not now: the cached blocks go back, to be taken again next time.
    if cached > 0 {
        blocks.release(s.table());
        s.forget();
    }
    // Nothing will ever free more blocks than an idle, empty cache has.
    if running.is_empty() && blocks.free_blocks() == blocks.capacity_blocks() {
        return Some(Admission::TooLarge(s));
    }
    waiting.push_front(s);
    None
}

/// The blocks the running sequences take in their next step beyond those they hold, as
/// [`plan`] hands out the step's tokens: one to each decoding sequence, then the rest of the
/// budget to prompt chunks in admission order.
fn growth<S: Schedulable>(running: &[S], block_size: usize, max_batch_tokens: usize) -> usize {
    let mut budget = max_batch_tokens.max(running.len());
    // Two passes, not a partition: this runs for every admission, and allocates nothing.
    let decodes = running.iter().filter(|s| s.len() - s.computed() <= 1);
    let prompts = running.iter().filter(|s| s.len() - s.computed() > 1);
    let mut blocks = 0;
    for s in decodes.chain(prompts) {
        let next = (s.len() - s.computed()).min(budget).min(s.chunk_limit());
        budget -= next;
        blocks += (s.computed() + next).div_ceil(block_size).saturating_sub(s.held_blocks());
    }
    blocks
}

/// Whether a running sequence is computing the block of `s`'s prompt after its first `cached`
/// tokens: the same tokens up to its end, not computed yet, within that sequence's prompt, and
/// a block `s` could take (not the one holding its last token).
fn waits_for_block<S: Schedulable>(s: &S, running: &[S], cached: usize, block_size: usize) -> bool {
    let (tokens, _) = s.known();
    let end = cached + block_size;
    if end > tokens.len().saturating_sub(1) {
        return false;
    }
    running.iter().any(|r| {
        let (theirs, prompt_len) = r.known();
        r.computed() < end && end <= prompt_len && theirs.get(..end) == tokens.get(..end)
    })
}

/// One running sequence's part of a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Work {
    /// Index in `running`.
    pub(super) seq: usize,
    /// Tokens computed, from its first one not in the cache.
    pub(super) tokens: usize,
}

/// What a step does.
pub(super) enum Plan<S> {
    /// Compute these parts, in this order; every one's blocks cover what it computes.
    Run(Vec<Work>),
    /// A sequence was preempted (now first in `waiting`): `running`'s indices moved, so the
    /// step computes nothing and is planned again.
    Preempted,
    /// This sequence could not grow and runs alone, so nothing can make room: it left
    /// `running`, for the caller to fail.
    Overflow(S),
}

/// Plans one step over `running`: decodes first (one token each), then prompt chunks in
/// admission order, within the token budget; every part's blocks grow to cover what it
/// computes. When a part cannot grow, another sequence is preempted instead (see [`Plan`]).
pub(super) fn plan<S: Schedulable>(
    running: &mut Vec<S>,
    waiting: &mut VecDeque<S>,
    blocks: &mut impl BlockPool,
    limits: Limits,
) -> Plan<S> {
    let mut budget = limits.max_batch_tokens.max(running.len());
    let mut order: Vec<usize> = (0..running.len()).collect();
    // A stable sort: decodes (one token to compute) keep their order, ahead of prompt chunks.
    order.sort_by_key(|&i| running[i].len() - running[i].computed() > 1);
    let mut work = Vec::new();
    for seq in order {
        let s = &mut running[seq];
        let tokens = (s.len() - s.computed()).min(budget).min(s.chunk_limit());
        if tokens == 0 {
            continue;
        }
        let upto = s.computed() + tokens;
        if !blocks.ensure(s.table(), upto) {
            if preempt(running, waiting, blocks, seq) {
                return Plan::Preempted;
            }
            return Plan::Overflow(running.remove(seq));
        }
        budget -= tokens;
        work.push(Work { seq, tokens });
    }
    Plan::Run(work)
}

/// Frees the most recently admitted sequence other than `keep` and puts it first in
/// `waiting`, to be recomputed later; `false` when `keep` is the only one running.
fn preempt<S: Schedulable>(
    running: &mut Vec<S>,
    waiting: &mut VecDeque<S>,
    blocks: &mut impl BlockPool,
    keep: usize,
) -> bool {
    let Some(victim) = (0..running.len()).rev().find(|&i| i != keep) else { return false };
    let mut s = running.remove(victim);
    blocks.release(s.table());
    s.forget();
    waiting.push_front(s);
    true
}

#[cfg(test)]
mod tests;
