use super::*;

/// The allocator's accounting as the KV cache keeps it: blocks of `BLOCK` tokens, block 0
/// never handed out.
struct Pool {
    free: VecDeque<u32>,
    capacity: usize,
}

const BLOCK: usize = 16;

impl Pool {
    fn new(blocks: usize) -> Self {
        Self { free: (1..=blocks as u32).collect(), capacity: blocks }
    }
}

impl BlockPool for Pool {
    fn ensure(&mut self, table: &mut Vec<u32>, tokens: usize) -> bool {
        let need = tokens.div_ceil(BLOCK).saturating_sub(table.len());
        if need > self.free.len() {
            return false;
        }
        table.extend(self.free.drain(..need));
        true
    }

    fn release(&mut self, table: &mut Vec<u32>) {
        self.free.extend(table.drain(..));
    }

    fn free_blocks(&self) -> usize {
        self.free.len()
    }

    fn capacity_blocks(&self) -> usize {
        self.capacity
    }

    fn block_size(&self) -> usize {
        BLOCK
    }
}

#[derive(Debug, Default, PartialEq)]
struct S {
    name: &'static str,
    len: usize,
    computed: usize,
    table: Vec<u32>,
    import: Option<usize>,
    /// Its tokens, where a test looks at them (all prompt).
    tokens: Vec<u32>,
    keys: Vec<u64>,
    /// The most tokens it computes a step, where limited.
    limit: Option<usize>,
}

impl Schedulable for S {
    fn len(&self) -> usize {
        self.len
    }
    fn computed(&self) -> usize {
        self.computed
    }
    fn table(&mut self) -> &mut Vec<u32> {
        &mut self.table
    }
    fn held_blocks(&self) -> usize {
        self.table.len()
    }
    fn import_need(&self) -> Option<usize> {
        self.import
    }
    fn forget(&mut self) {
        self.computed = 0;
        self.import = None;
    }
    fn known(&self) -> (&[u32], usize) {
        (&self.tokens, self.tokens.len())
    }
    fn chunk_limit(&self) -> usize {
        self.limit.unwrap_or(usize::MAX)
    }
    fn fresh(&mut self) -> Option<Fresh<'_>> {
        let fresh = self.computed == 0 && self.import.is_none() && self.table.is_empty();
        fresh.then_some((&self.tokens, self.tokens.len(), &mut self.table, &mut self.keys))
    }
}

/// A sequence of `len` tokens, none in the cache.
fn seq(name: &'static str, len: usize) -> S {
    S { name, len, ..S::default() }
}

/// A running sequence of `len` tokens, `computed` of them in its blocks.
fn running(name: &'static str, len: usize, computed: usize, pool: &mut Pool) -> S {
    let mut s = S { name, len, computed, ..S::default() };
    assert!(pool.ensure(&mut s.table, computed), "the test pool is too small");
    s
}

const LIMITS: Limits = Limits { max_num_seqs: 4, max_batch_tokens: 64 };

/// Admits as admission does each step: until `admit_next` says no more.
fn admit_all(
    waiting: &mut VecDeque<S>,
    run: &mut Vec<S>,
    pool: &mut impl BlockPool,
    limits: Limits,
) -> Vec<&'static str> {
    let mut refused = Vec::new();
    while let Some(a) = admit_next(waiting, run, pool, limits) {
        match a {
            Admission::Admitted(s) => run.push(s),
            Admission::TooLarge(s) => refused.push(s.name),
        }
    }
    refused
}

fn names(seqs: impl IntoIterator<Item = impl std::borrow::Borrow<S>>) -> Vec<&'static str> {
    seqs.into_iter().map(|s| s.borrow().name).collect()
}

#[test]
fn admission_stops_when_blocks_run_out_and_keeps_the_head_first() {
    let mut pool = Pool::new(4);
    let mut waiting: VecDeque<S> = [seq("a", 20), seq("b", 20), seq("c", 10)].into();
    let mut run = Vec::new();
    assert!(admit_all(&mut waiting, &mut run, &mut pool, LIMITS).is_empty());
    // a and b take two blocks each; c would fit nowhere and waits.
    assert_eq!(names(&run), ["a", "b"]);
    assert_eq!(names(&waiting), ["c"]);
    assert_eq!(pool.free_blocks(), 0);
    // Blocks come back: c starts.
    let mut a = run.remove(0);
    pool.release(&mut a.table);
    admit_all(&mut waiting, &mut run, &mut pool, LIMITS);
    assert_eq!(names(&run), ["b", "c"]);
}

#[test]
fn a_prompt_that_does_not_fit_now_keeps_later_ones_waiting() {
    let mut pool = Pool::new(4);
    let run = vec![running("old", 40, 40, &mut pool)];
    // 3 blocks for the head, 1 free: the small one behind it must not overtake it.
    let mut waiting: VecDeque<S> = [seq("big", 40), seq("small", 5)].into();
    assert!(admit_next(&mut waiting, &run, &mut pool, LIMITS).is_none());
    assert_eq!(names(&waiting), ["big", "small"]);
    assert!(waiting[0].table.is_empty(), "a refused admission holds no blocks");
    assert_eq!(pool.free_blocks(), 1);
}

#[test]
fn admission_respects_the_sequence_limit() {
    let mut pool = Pool::new(100);
    let mut waiting: VecDeque<S> = (0..6).map(|_| seq("s", 1)).collect();
    let mut run = Vec::new();
    admit_all(&mut waiting, &mut run, &mut pool, LIMITS);
    assert_eq!(run.len(), LIMITS.max_num_seqs);
    assert_eq!(waiting.len(), 2);
}

#[test]
fn admission_holds_blocks_for_the_first_chunk_or_the_imported_kv() {
    let mut pool = Pool::new(100);
    let mut imported = seq("imported", 100);
    imported.import = Some(90);
    let mut waiting: VecDeque<S> = [seq("long", 1000), imported].into();
    let mut run = Vec::new();
    admit_all(&mut waiting, &mut run, &mut pool, LIMITS);
    // A prompt holds blocks for one batch of tokens (64 → 4 blocks), not its whole length.
    assert_eq!(run[0].table.len(), 4);
    // Imported KV is held whole on admission (90 tokens → 6 blocks).
    assert_eq!(run[1].table.len(), 6);
}

#[test]
fn a_prompt_too_large_for_the_empty_cache_is_refused() {
    let mut pool = Pool::new(2);
    let mut waiting: VecDeque<S> = [seq("huge", 40), seq("fits", 20)].into();
    let mut run = Vec::new();
    assert_eq!(admit_all(&mut waiting, &mut run, &mut pool, LIMITS), ["huge"]);
    assert_eq!(names(&run), ["fits"]);
    // Not while anything runs: blocks may come back.
    let mut waiting: VecDeque<S> = [seq("huge", 40)].into();
    assert!(admit_all(&mut waiting, &mut run, &mut pool, LIMITS).is_empty());
    assert_eq!(names(&waiting), ["huge"]);
}

#[test]
fn decodes_come_first_then_prompt_chunks_fill_the_budget() {
    let mut pool = Pool::new(100);
    let limits = Limits { max_num_seqs: 8, max_batch_tokens: 50 };
    let mut run = vec![
        running("prompt1", 40, 0, &mut pool),
        running("decode1", 11, 10, &mut pool),
        running("prompt2", 30, 0, &mut pool),
        running("decode2", 21, 20, &mut pool),
    ];
    let mut waiting = VecDeque::new();
    let Plan::Run(work) = plan(&mut run, &mut waiting, &mut pool, limits) else { panic!("a plan") };
    // 1 + 1 decode tokens, then prompt1 whole (40), then 8 of prompt2's 30: 50 in all.
    let w = |seq, tokens| Work { seq, tokens };
    assert_eq!(work, [w(1, 1), w(3, 1), w(0, 40), w(2, 8)]);
    // Every part's blocks cover what it computes.
    assert_eq!(run[0].table.len(), 3);
    assert_eq!(run[2].table.len(), 1);
}

#[test]
fn a_spent_budget_leaves_prompts_for_later_steps_but_every_decode_runs() {
    let mut pool = Pool::new(100);
    // A budget below the sequence count is raised: each decode gets its token.
    let limits = Limits { max_num_seqs: 8, max_batch_tokens: 2 };
    let mut run = vec![
        running("d1", 5, 4, &mut pool),
        running("p", 30, 0, &mut pool),
        running("d2", 5, 4, &mut pool),
        running("d3", 5, 4, &mut pool),
    ];
    let Plan::Run(work) = plan(&mut run, &mut VecDeque::new(), &mut pool, limits) else { panic!("a plan") };
    let w = |seq, tokens| Work { seq, tokens };
    assert_eq!(work, [w(0, 1), w(2, 1), w(3, 1), w(1, 1)]);
}

#[test]
fn chunked_prefill_resumes_where_the_last_chunk_ended() {
    let mut pool = Pool::new(100);
    let mut run = vec![running("p", 150, 64, &mut pool)];
    let Plan::Run(work) = plan(&mut run, &mut VecDeque::new(), &mut pool, LIMITS) else { panic!("a plan") };
    assert_eq!(work, [Work { seq: 0, tokens: 64 }]);
    assert_eq!(run[0].table.len(), 128usize.div_ceil(BLOCK));
}

/// A prompt whose every position's logits are wanted computes at most its limit a step; the
/// budget it leaves goes to the next prompt.
#[test]
fn a_limited_chunk_leaves_the_rest_of_the_budget_to_others() {
    let mut pool = Pool::new(100);
    let mut run = vec![running("scored", 150, 0, &mut pool), running("plain", 150, 0, &mut pool)];
    run[0].limit = Some(16);
    let Plan::Run(work) = plan(&mut run, &mut VecDeque::new(), &mut pool, LIMITS) else { panic!("a plan") };
    assert_eq!(work, [Work { seq: 0, tokens: 16 }, Work { seq: 1, tokens: 48 }]);
}

#[test]
fn running_out_preempts_the_most_recently_admitted_other_sequence() {
    let mut pool = Pool::new(4);
    let mut run = vec![
        running("oldest", 17, 16, &mut pool),
        running("middle", 17, 16, &mut pool),
        running("newest", 33, 32, &mut pool),
    ];
    run[2].import = Some(32);
    assert_eq!(pool.free_blocks(), 0);
    let mut waiting: VecDeque<S> = [seq("queued", 4)].into();
    // The oldest needs a second block: the newest gives its blocks back.
    assert!(matches!(plan(&mut run, &mut waiting, &mut pool, LIMITS), Plan::Preempted));
    assert_eq!(names(&run), ["oldest", "middle"]);
    assert_eq!(names(&waiting), ["newest", "queued"]);
    let victim = &waiting[0];
    assert_eq!((victim.computed, victim.import, victim.table.len()), (0, None, 0), "recomputed from scratch");
    assert_eq!(pool.free_blocks(), 2);
    // Planned again, the step fits.
    let Plan::Run(work) = plan(&mut run, &mut waiting, &mut pool, LIMITS) else { panic!("a plan") };
    assert_eq!(work, [Work { seq: 0, tokens: 1 }, Work { seq: 1, tokens: 1 }]);
    assert_eq!(pool.free_blocks(), 0);
}

#[test]
fn the_sequence_that_grows_is_never_its_own_victim() {
    let mut pool = Pool::new(2);
    let mut run = vec![running("a", 16, 16, &mut pool), running("b", 17, 16, &mut pool)];
    // b (the newest) needs a block: a goes, though older, since b cannot preempt itself.
    assert!(matches!(plan(&mut run, &mut VecDeque::new(), &mut pool, LIMITS), Plan::Preempted));
    assert_eq!(names(&run), ["b"]);
}

#[test]
fn a_sequence_alone_that_cannot_grow_overflows() {
    let mut pool = Pool::new(2);
    let mut run = vec![running("alone", 33, 32, &mut pool)];
    let mut waiting = VecDeque::new();
    let Plan::Overflow(s) = plan(&mut run, &mut waiting, &mut pool, LIMITS) else { panic!("an overflow") };
    assert_eq!(s.name, "alone");
    assert!(run.is_empty() && waiting.is_empty());
}

#[test]
fn preemption_needs_another_sequence() {
    let mut pool = Pool::new(4);
    let mut run = vec![running("only", 16, 16, &mut pool)];
    let mut waiting = VecDeque::new();
    assert!(!preempt(&mut run, &mut waiting, &mut pool, 0));
    assert_eq!(names(&run), ["only"]);
    assert_eq!(pool.free_blocks(), 3);
}

/// [`Pool`] with a prefix cache that holds nothing yet.
struct Caching(Pool);

impl BlockPool for Caching {
    fn ensure(&mut self, table: &mut Vec<u32>, tokens: usize) -> bool {
        self.0.ensure(table, tokens)
    }
    fn release(&mut self, table: &mut Vec<u32>) {
        self.0.release(table)
    }
    fn free_blocks(&self) -> usize {
        self.0.free_blocks()
    }
    fn capacity_blocks(&self) -> usize {
        self.0.capacity_blocks()
    }
    fn block_size(&self) -> usize {
        BLOCK
    }
    fn caching_blocks_of(&self) -> Option<usize> {
        Some(BLOCK)
    }
}

#[test]
fn a_sequence_waits_for_the_prompt_block_another_is_computing() {
    let prompt: Vec<u32> = (0..40).collect();
    let with = |name, tokens: Vec<u32>| S { name, len: tokens.len(), tokens, ..S::default() };
    let mut pool = Caching(Pool::new(16));
    let mut first = with("first", prompt.clone());
    assert!(pool.ensure(&mut first.table, 40));
    let mut run = vec![first];
    // The same prompt waits while `first` computes its first block, and stays first in line.
    let mut waiting: VecDeque<S> = [with("same", prompt.clone()), with("other", (100..140).collect())].into();
    assert!(admit_all(&mut waiting, &mut run, &mut pool, LIMITS).is_empty());
    assert_eq!((names(&run), names(&waiting)), (vec!["first"], vec!["same", "other"]));
    // Computed, the block is there to take: both start.
    run[0].computed = 40;
    admit_all(&mut waiting, &mut run, &mut pool, LIMITS);
    assert_eq!(names(&run), ["first", "same", "other"]);

    // A different first block, a prompt too short to take a block, or no prefix cache: no wait.
    let mut pool = Caching(Pool::new(16));
    let mut busy = with("busy", prompt.clone());
    assert!(pool.ensure(&mut busy.table, 40));
    let mut run = vec![busy];
    let short = prompt[..BLOCK].to_vec();
    let mut waiting: VecDeque<S> = [with("other", (100..140).collect()), with("short", short)].into();
    admit_all(&mut waiting, &mut run, &mut pool, LIMITS);
    assert_eq!(names(&run), ["busy", "other", "short"]);
    let mut plain = Pool::new(16);
    let mut busy = with("busy", prompt.clone());
    assert!(plain.ensure(&mut busy.table, 40));
    let mut run = vec![busy];
    let mut waiting: VecDeque<S> = [with("same", prompt)].into();
    admit_all(&mut waiting, &mut run, &mut plain, LIMITS);
    assert_eq!(names(&run), ["busy", "same"]);
}

/// Prompts that together outgrow the cache all finish: a sequence preempted to make room is
/// not admitted again while the sequence it made room for still grows into that room.
#[test]
fn preempted_sequences_are_not_readmitted_into_the_room_they_gave_up() {
    let mut pool = Pool::new(10);
    let limits = Limits { max_num_seqs: 8, max_batch_tokens: 48 };
    let mut waiting: VecDeque<S> = ["a", "b", "c", "d"].into_iter().map(|n| seq(n, 87)).collect();
    let mut run: Vec<S> = Vec::new();
    let mut done = Vec::new();
    for _ in 0..200 {
        assert!(admit_all(&mut waiting, &mut run, &mut pool, limits).is_empty());
        let Plan::Run(work) = plan(&mut run, &mut waiting, &mut pool, limits) else { continue };
        for w in &work {
            let s = &mut run[w.seq];
            s.computed += w.tokens;
            // Two output tokens each, then the sequence ends.
            if s.computed == s.len && s.len < 89 {
                s.len += 1;
            }
        }
        let (finished, rest): (Vec<S>, Vec<S>) = run.drain(..).partition(|s| s.computed == 89);
        run = rest;
        for mut s in finished {
            pool.release(&mut s.table);
            done.push(s.name);
        }
        if done.len() == 4 {
            return;
        }
    }
    panic!("not all finished in 200 steps: done {done:?}, running {:?}", names(&run));
}
