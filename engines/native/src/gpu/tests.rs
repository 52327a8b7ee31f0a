use super::*;

fn chunk<'a>(tokens: &'a [u32], start: usize, table: &'a [u32], want: bool) -> Chunk<'a> {
    Chunk { tokens, start, block_table: table, want_logits: want }
}

#[test]
fn a_step_flattens_chunks_in_order() {
    let (a, b) = ([5u32, 6, 7], [9u32]);
    let (ta, tb) = ([3u32, 4], [8u32, 2, 6]);
    let chunks = [chunk(&a, 14, &ta, true), chunk(&b, 40, &tb, true)];
    let p = plan_step(&chunks, 16, 10, 100, 64).expect("plan");
    assert_eq!(p.ids, vec![5, 6, 7, 9]);
    assert_eq!(p.pos, vec![14, 15, 16, 40]);
    // Only the blocks the positions reach are kept: 17 tokens → 2 blocks, 41 tokens → 3.
    assert_eq!(p.tables, vec![3, 4, 8, 2, 6]);
    assert_eq!(p.tab_off, vec![0, 0, 0, 2]);
    assert_eq!(p.rows, vec![2, 3]);
}

#[test]
fn logits_rows_only_for_chunks_that_want_them() {
    let (a, b) = ([1u32, 2], [3u32]);
    let t = [1u32];
    let p = plan_step(&[chunk(&a, 0, &t, false), chunk(&b, 0, &t, true)], 64, 2, 10, 8).expect("plan");
    assert_eq!(p.rows, vec![2]);
}

#[test]
fn everything_a_kernel_indexes_with_is_checked() {
    let toks = [1u32, 2, 3];
    // The table does not cover position 16.
    let short = [1u32];
    let e = plan_step(&[chunk(&toks, 14, &short, true)], 16, 4, 10, 64).expect_err("short table");
    assert!(e.contains("block table"), "{e}");
    // A block past the cache.
    let far = [1u32, 4];
    let e = plan_step(&[chunk(&toks, 14, &far, true)], 16, 4, 10, 64).expect_err("far block");
    assert!(e.contains("block 4"), "{e}");
    // A token past the vocabulary.
    let bad = [1u32, 10];
    let e = plan_step(&[chunk(&bad, 0, &short, true)], 16, 4, 10, 64).expect_err("bad token");
    assert!(e.contains("token 10"), "{e}");
    // A position past the RoPE table.
    let e = plan_step(&[chunk(&toks, 62, &[1, 2, 3, 3], true)], 16, 4, 10, 64).expect_err("far position");
    assert!(e.contains("position 64"), "{e}");
}

#[test]
fn the_kernels_get_one_type_code_per_dtype() {
    assert_eq!([KvDtype::F32, KvDtype::F16, KvDtype::Bf16].map(type_code), [0, 1, 2]);
    assert_eq!([KvDtype::F32, KvDtype::F16, KvDtype::Bf16].map(elem_bytes), [4, 2, 2]);
    assert!(KERNELS.contains("#if WT == 0") && KERNELS.contains("#if KT == 0"));
    assert_eq!(xinf_transfer::gpu::nvrtc_arch(9, 0), "compute_90");
}
