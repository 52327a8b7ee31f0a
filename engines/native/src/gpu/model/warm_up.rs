//! The steps a model runs once it is loaded, before any request: every decode batch size it
//! graphs, and prompt steps of sizes up to its largest step.
//!
//! The first use of a product shape makes cuBLAS pick an algorithm and the driver load that
//! algorithm's kernel (CUDA loads kernels lazily), and the first decode steps of a batch size
//! run eagerly, then are captured into a graph. Served, each of those firsts stalled the step
//! it fell in, by up to tens of milliseconds on a small model — a whole decode level's worth of
//! steps in a short benchmark, and the first requests' latency in production. Here they are
//! paid at load instead, as vLLM and SGLang pay theirs (profile run, graph capture).
//!
//! The warm-up writes K/V only into blocks of the fresh cache that no sequence holds yet, and
//! publishes nothing: what it leaves there is never read as a prompt's.

use super::GpuModel;
use crate::gpu::error::GpuError;
use crate::gpu::plan::{GEMV_ROWS, StepLimits};
use crate::model::Chunk;

impl GpuModel {
    /// Runs the warm-up steps for steps within `limits` ([`WarmUp`]): decode batches of 1 to
    /// `max_seqs` sequences (twice where graphed: run, then captured), then the prompt steps.
    pub(super) fn warm_up(&mut self, limits: &StepLimits) -> Result<(), GpuError> {
        let started = std::time::Instant::now();
        let (bs, blocks, vocab) = (self.desc.block_size(), self.desc.num_blocks, self.fwd.cfg().vocab_size);
        let plan = WarmUp::new(limits, [bs, blocks], self.max_positions, vocab);
        for n in 1..=plan.seqs {
            let chunks = plan.decode(n);
            for _ in 0..self.graphs.warm_up_steps(n) {
                self.step(&chunks, true)?;
            }
        }
        let sizes = prompt_sizes(plan.most);
        for &t in &sizes {
            self.step(&plan.prompt(t), true)?;
        }
        // The counter tells requests' steps replayed from graphs, not these.
        self.graphs.forget_steps();
        tracing::debug!(
            decode_batches = plan.seqs,
            prompt_sizes = sizes.len(),
            ms = started.elapsed().as_millis() as u64,
            "GPU model warmed up"
        );
        Ok(())
    }
}

/// The warm-up's sequences, within a cache of `blocks` blocks of `bs` tokens and the model's
/// positions.
///
/// A decode batch of n: sequence i's one token (id 0) at position 0 of block i. A prompt step
/// of `t` tokens: chunks of at most `per` tokens (the positions or the cache, in whole blocks
/// where that is room for one), sequence j from position 0 over its own `per_blocks` blocks,
/// so that a step as large as `max_batch_tokens` runs whatever the context length; no more
/// chunks than a step has rows. Token ids count up from 0, wrapping at the vocabulary.
struct WarmUp {
    /// Decode batches run: 1 to this.
    seqs: usize,
    /// Most prompt tokens a step.
    most: usize,
    /// Most tokens a prompt chunk, and the blocks each chunk's sequence holds.
    per: usize,
    per_blocks: usize,
    /// A chunk's tokens (the first `len` of them).
    ids: Vec<u32>,
    /// Block ids 0, 1, ...: every sequence's table is a slice of it.
    table: Vec<u32>,
}

impl WarmUp {
    /// For steps within `limits`, a cache of `blocks` blocks of `bs` tokens, `positions`
    /// positions and a vocabulary of `vocab` words.
    fn new(limits: &StepLimits, [bs, blocks]: [usize; 2], positions: usize, vocab: usize) -> Self {
        let seqs = limits.max_seqs.min(blocks);
        let room = positions.min(blocks.saturating_mul(bs));
        let per = if room >= bs { room / bs * bs } else { room.max(1) };
        let per_blocks = per.div_ceil(bs);
        let most = limits.max_tokens.min(blocks / per_blocks * per).min(limits.max_seqs.saturating_mul(per));
        let vocab = u32::try_from(vocab).unwrap_or(u32::MAX).max(1);
        let ids: Vec<u32> = (0..per.min(most) as u32).map(|i| i % vocab).collect();
        let table: Vec<u32> = (0..seqs.max(most.div_ceil(per) * per_blocks) as u32).collect();
        Self { seqs, most, per, per_blocks, ids, table }
    }

    /// A decode step of `n` sequences (`n ≤ seqs`).
    fn decode(&self, n: usize) -> Vec<Chunk<'_>> {
        (0..n).map(|i| chunk(&ZERO, &self.table[i..=i])).collect()
    }

    /// A prompt step of `t` tokens (`t ≤ most`).
    fn prompt(&self, t: usize) -> Vec<Chunk<'_>> {
        (0..t.div_ceil(self.per))
            .map(|j| {
                let len = self.per.min(t - j * self.per);
                chunk(&self.ids[..len], &self.table[j * self.per_blocks..(j + 1) * self.per_blocks])
            })
            .collect()
    }
}

static ZERO: [u32; 1] = [0];

/// A chunk of `tokens` from position 0 of a sequence whose table is `table`, its last token's
/// argmax wanted.
fn chunk<'a>(tokens: &'a [u32], table: &'a [u32]) -> Chunk<'a> {
    Chunk {
        tokens,
        start: 0,
        block_table: table,
        want_logits: true,
        all_logits: false,
        prompt_len: tokens.len(),
        argmax: true,
    }
}

/// Prompt step sizes for the warm-up, largest first: `most`, then below it each power of two
/// and the point halfway to the next, down to the smallest step cuBLAS multiplies (more rows
/// than `GEMV_ROWS`). Two sizes an octave reach the algorithms cuBLAS picks across a range of
/// sizes without paying for every size.
fn prompt_sizes(most: usize) -> Vec<usize> {
    let least = GEMV_ROWS + 1;
    let mut sizes = Vec::new();
    if most < least {
        return sizes;
    }
    sizes.push(most);
    let mut p = most.next_power_of_two();
    while p >= 2 {
        for s in [p + p / 2, p] {
            if s < most && s >= least && sizes.last() != Some(&s) {
                sizes.push(s);
            }
        }
        p /= 2;
    }
    sizes
}

#[cfg(test)]
mod tests;
