//! The steps a model runs once it is loaded, before any request: every decode batch size it
//! graphs, and prompt chunks of sizes up to its largest step.
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
    /// Runs the warm-up steps for steps within `limits`: decode batches of 1 to
    /// `max_seqs` sequences (twice where graphed: run, then captured), then prompt chunks of
    /// [`prompt_sizes`] tokens, all within the cache's blocks and the model's positions.
    pub(super) fn warm_up(&mut self, limits: &StepLimits) -> Result<(), GpuError> {
        let started = std::time::Instant::now();
        let (bs, blocks) = (self.desc.block_size(), self.desc.num_blocks);
        let vocab = u32::try_from(self.fwd.cfg().vocab_size).unwrap_or(u32::MAX).max(1);
        // A decode batch of n: sequence i's one token at position 0 of block i.
        let seqs = limits.max_seqs.min(blocks);
        let tables: Vec<[u32; 1]> = (0..seqs).map(|b| [b as u32]).collect();
        let token = [0u32];
        for n in 1..=seqs {
            let chunks: Vec<Chunk<'_>> = tables[..n].iter().map(|table| one_token(&token, table)).collect();
            for _ in 0..self.graphs.warm_up_steps(n) {
                self.step(&chunks, true)?;
            }
        }
        // One prompt chunk a step, from position 0 over blocks 0, 1, ...
        let most = limits.max_tokens.min(self.max_positions).min(blocks.saturating_mul(bs));
        let ids: Vec<u32> = (0..most as u32).map(|i| i % vocab).collect();
        let table: Vec<u32> = (0..most.div_ceil(bs) as u32).collect();
        let sizes = prompt_sizes(most);
        for &t in &sizes {
            let chunk = Chunk {
                tokens: &ids[..t],
                start: 0,
                block_table: &table,
                want_logits: true,
                all_logits: false,
                prompt_len: t,
                argmax: true,
            };
            self.step(&[chunk], true)?;
        }
        // The counter tells requests' steps replayed from graphs, not these.
        self.graphs.forget_steps();
        tracing::debug!(
            decode_batches = seqs,
            prompt_sizes = sizes.len(),
            ms = started.elapsed().as_millis() as u64,
            "GPU model warmed up"
        );
        Ok(())
    }
}

/// A decode chunk: one token at position 0 of a sequence whose table is `table`.
fn one_token<'a>(token: &'a [u32; 1], table: &'a [u32; 1]) -> Chunk<'a> {
    Chunk {
        tokens: token,
        start: 0,
        block_table: table,
        want_logits: true,
        all_logits: false,
        prompt_len: 1,
        argmax: true,
    }
}

/// Prompt chunk sizes for the warm-up, largest first: `most`, then below it each power of two
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
mod tests {
    use super::prompt_sizes;

    #[test]
    fn prompt_sizes_fall_by_half_octaves_from_the_largest_step() {
        assert_eq!(
            prompt_sizes(8192),
            [
                8192, 6144, 4096, 3072, 2048, 1536, 1024, 768, 512, 384, 256, 192, 128, 96, 64, 48, 32, 24,
                16, 12, 8, 6, 4, 3
            ]
        );
        assert_eq!(
            prompt_sizes(1000),
            [1000, 768, 512, 384, 256, 192, 128, 96, 64, 48, 32, 24, 16, 12, 8, 6, 4, 3]
        );
        assert_eq!(prompt_sizes(3), [3]);
        assert!(prompt_sizes(2).is_empty());
        assert!(prompt_sizes(0).is_empty());
    }
}
