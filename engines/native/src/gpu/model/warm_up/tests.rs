use super::{WarmUp, prompt_sizes};
use crate::gpu::plan::{StepLimits, plan_step};
use std::sync::Arc;

#[test]
fn prompt_sizes_fall_by_half_octaves_from_the_largest_step() {
    assert_eq!(
        prompt_sizes(8192),
        [
            8192, 6144, 4096, 3072, 2048, 1536, 1024, 768, 512, 384, 256, 192, 128, 96, 64, 48, 32, 24, 16,
            12, 8, 6, 4, 3
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

/// Every warm-up step passes the checks a request's step passes (positions, block tables,
/// token ids) and fits the step buffers kept for the model's life, for caches and contexts
/// large and small: the warm-up can neither fail a load nor allocate a step's buffers anew.
#[test]
fn every_warm_up_step_is_a_step_the_model_takes() {
    // (max_batch_tokens, max_num_seqs, block size, cache blocks, positions, vocabulary)
    let cases = [
        (8192, 64, 16, 8192, 4096, 49_152),
        (8192, 64, 16, 8192, 131_072, 128_256),
        (8192, 256, 64, 100, 32_768, 151_936),
        (512, 64, 1, 8192, 2048, 256),
        (8192, 64, 1, 100, 40, 32),
        (8192, 8, 16, 3, 4096, 1000),
        (16, 1, 16, 1, 8, 10),
        (8192, 64, 16, 0, 4096, 1000),
    ];
    for (max_tokens, max_seqs, bs, blocks, positions, vocab) in cases {
        let label =
            format!("max_tokens {max_tokens} seqs {max_seqs} bs {bs} blocks {blocks} positions {positions}");
        let limits = StepLimits {
            max_tokens,
            max_seqs,
            cuda_graphs: true,
            graph_steps: Arc::default(),
            graph_links: Arc::default(),
        };
        let capacity = limits.capacity(blocks);
        let w = WarmUp::new(&limits, [bs, blocks], positions, vocab);
        assert_eq!(w.seqs, max_seqs.min(blocks), "{label}");
        let mut steps: Vec<(String, Vec<crate::model::Chunk<'_>>)> =
            (1..=w.seqs).map(|n| (format!("decode {n}"), w.decode(n))).collect();
        let sizes = prompt_sizes(w.most);
        steps.extend(sizes.iter().map(|&t| (format!("prompt {t}"), w.prompt(t))));
        for (what, chunks) in &steps {
            for flash in [false, true] {
                let plan = plan_step(chunks, bs, blocks, vocab, positions, flash)
                    .unwrap_or_else(|e| panic!("{label}: {what}: {e}"));
                assert!(capacity.fits(&plan), "{label}: {what} does not fit the step buffers");
            }
        }
        for &t in &sizes {
            let tokens: usize = w.prompt(t).iter().map(|c| c.tokens.len()).sum();
            assert_eq!(tokens, t, "{label}: a prompt step of {t}");
        }
        // The largest step runs where the cache and the rows allow it.
        if blocks > 0 && positions >= bs {
            assert_eq!(
                w.most,
                max_tokens.min(blocks / w.per_blocks * w.per).min(max_seqs * w.per),
                "{label}"
            );
        }
    }
    // 8,192-token steps run on an 8B model served with a 4,096-token context: two chunks.
    let limits = StepLimits {
        max_tokens: 8192,
        max_seqs: 64,
        cuda_graphs: true,
        graph_steps: Arc::default(),
        graph_links: Arc::default(),
    };
    let w = WarmUp::new(&limits, [16, 8192], 4096, 128_256);
    assert_eq!(w.most, 8192);
    assert_eq!(w.prompt(8192).len(), 2);
}
