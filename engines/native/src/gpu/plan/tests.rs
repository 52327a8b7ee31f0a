use super::*;
use xinf_transfer::KvLayout;

fn chunk<'a>(tokens: &'a [u32], start: usize, table: &'a [u32], want: bool) -> Chunk<'a> {
    Chunk {
        tokens,
        start,
        block_table: table,
        want_logits: want,
        all_logits: false,
        prompt_len: tokens.len(),
        argmax: false,
    }
}

#[test]
fn a_step_flattens_chunks_in_order() {
    let (a, b) = ([5u32, 6, 7], [9u32]);
    let (ta, tb) = ([3u32, 4], [8u32, 2, 6]);
    let chunks = [chunk(&a, 14, &ta, true), chunk(&b, 40, &tb, true)];
    let p = plan_step(&chunks, 16, 10, 100, 64, false).expect("plan");
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
    let p = plan_step(&[chunk(&a, 0, &t, false), chunk(&b, 0, &t, true)], 64, 2, 10, 8, false).expect("plan");
    assert_eq!(p.rows, vec![2]);
}

#[test]
fn everything_a_kernel_indexes_with_is_checked() {
    let toks = [1u32, 2, 3];
    // The table does not cover position 16.
    let short = [1u32];
    let e = plan_step(&[chunk(&toks, 14, &short, true)], 16, 4, 10, 64, false).expect_err("short table");
    assert!(e.contains("block table"), "{e}");
    // A block past the cache.
    let far = [1u32, 4];
    let e = plan_step(&[chunk(&toks, 14, &far, true)], 16, 4, 10, 64, false).expect_err("far block");
    assert!(e.contains("block 4"), "{e}");
    // A token past the vocabulary.
    let bad = [1u32, 10];
    let e = plan_step(&[chunk(&bad, 0, &short, true)], 16, 4, 10, 64, false).expect_err("bad token");
    assert!(e.contains("token 10"), "{e}");
    // A position past the RoPE table.
    let e =
        plan_step(&[chunk(&toks, 62, &[1, 2, 3, 3], true)], 16, 4, 10, 64, false).expect_err("far position");
    assert!(e.contains("position 64"), "{e}");
}

#[test]
fn an_empty_step_still_uploads_one_table_entry() {
    let p = plan_step(&[], 16, 4, 10, 64, false).expect("plan");
    assert_eq!((p.ids.len(), &p.tables[..], p.rows.len()), (0, &[0][..], 0));
    assert!(StepCapacity::new(0, 0, 0).fits(&p));
}

#[test]
fn the_kernels_get_one_type_code_per_dtype() {
    assert_eq!([KvDtype::F32, KvDtype::F16, KvDtype::Bf16].map(type_code), [0, 1, 2]);
    assert!(KERNELS.contains("#if WT == 0") && KERNELS.contains("#if KT == 0"));
    let src = kernel_source(KvDtype::F16, KvDtype::Bf16, [64, 7, 7, 896]);
    assert!(
        src.starts_with(&format!(
            "#define WT 1\n#define KT 2\n#define WARPS {ATTENTION_WARPS}\n#define HD 64\n#define GB 7\n\
             #define GQ 7\n#define HID 896\n#define MAX_SPLITS {MAX_SPLITS}\n"
        )),
        "{src}"
    );
    assert!(src.contains(KERNELS) && src.contains(GEMV) && src.contains(FLASH) && src.ends_with(DECODE));
}

#[test]
fn flash_prefill_runs_where_its_source_is_compiled() {
    // The conditions of `flash.cu`'s `#if`, on the host.
    assert!(FLASH.contains("#if KT != 0 && HD % 16 == 0 && HD <= 128 && __CUDA_ARCH__ >= 800"));
    assert!(
        flash_fits(KvDtype::F16, 64, 9)
            && flash_fits(KvDtype::Bf16, 128, 8)
            && flash_fits(KvDtype::F16, 16, 8)
    );
    assert!(!flash_fits(KvDtype::F32, 64, 9), "f32 caches have no tensor-core path here");
    assert!(!flash_fits(KvDtype::F16, 72, 9) && !flash_fits(KvDtype::F16, 256, 9));
    assert!(!flash_fits(KvDtype::F16, 64, 7), "mma.sync.m16n8k16 needs sm_80");
    // `flash_decode` also needs a KV head's query heads within one tile (16 rows at most).
    assert!(DECODE.contains("#if KT != 0 && HD % 16 == 0 && HD <= 128 && __CUDA_ARCH__ >= 800 && GQ <= 16"));
    assert!(flash_decode_fits(KvDtype::F16, 64, 9, 7) && flash_decode_fits(KvDtype::Bf16, 128, 9, 16));
    assert!(!flash_decode_fits(KvDtype::F16, 64, 9, 17) && !flash_decode_fits(KvDtype::F32, 64, 9, 7));
    assert!(rows_aligned(&[[256, 4096]], [1024, 128, 64], 64, 2));
    assert!(!rows_aligned(&[[256, 4098]], [1024, 128, 64], 64, 2), "a plane off a 16-byte boundary");
    assert!(!rows_aligned(&[[256, 4096]], [1024, 132, 64], 64, 2), "a stride off");
    assert!(rows_aligned(&[[0, 16]], [64, 16, 4], 4, 4) && !rows_aligned(&[[0, 16]], [64, 16, 4], 2, 4));
    assert!(!rows_aligned(&[[0, 16]], [1 << 32, 128, 64], 64, 2), "a stride past 32 bits");
}

#[test]
fn prompt_chunks_are_cut_into_flash_tiles_and_decode_tokens_listed() {
    let long: Vec<u32> = (0..150).collect();
    let (one, two) = ([7u32], [8u32, 9]);
    let table: Vec<u32> = (0..12).collect();
    let chunks =
        [chunk(&one, 30, &table, true), chunk(&long, 10, &table, true), chunk(&two, 0, &table, false)];
    let p = plan_step(&chunks, 16, 12, 200, 512, true).expect("plan");
    // Tokens 1..151 are the long chunk (positions 10..160): tiles of 128 and 22; the two-token
    // chunk (positions 0..2) is a tile. They are listed by the keys their last row attends to:
    // 2, 138, 160.
    assert_eq!(p.tiles, vec![151, 2, 1, 128, 129, 22]);
    assert_eq!(p.singles, vec![0]);
    assert!(p.tiles.len() <= 2 * p.ids.len() && p.singles.len() <= p.ids.len());
    // Without flash, or with decode tokens only, `attention` takes every token.
    let off = plan_step(&chunks, 16, 12, 200, 512, false).expect("plan");
    assert!(off.tiles.is_empty() && off.singles.is_empty());
    let decode =
        plan_step(&[chunk(&one, 30, &table, true), chunk(&[3], 5, &table, true)], 16, 12, 200, 512, true)
            .expect("plan");
    assert!(decode.tiles.is_empty() && decode.singles.is_empty());
    // Only a step of one token a sequence is `solo` (the decode attention then writes each
    // token's K and V itself): not one that has a chunk of two tokens, tiles or not.
    assert!(decode.shape().solo && StepShape::decode(3).solo);
    assert!(!p.shape().solo && !off.shape().solo);
    let pair = plan_step(&[chunk(&two, 0, &table, true)], 16, 12, 200, 512, false).expect("plan");
    assert!(pair.tiles.is_empty() && !pair.shape().solo);
}

#[test]
fn the_decode_attention_does_qkv_posts_work_where_a_kv_heads_parts_fit_its_block() {
    // Qwen2.5-0.5B: 7 query heads a KV head of 64 (4 threads each); Llama-3.1-8B: 4 of 128 (8).
    assert!(decode_qkv_fits(64, 7) && decode_qkv_fits(128, 4));
    // 14 + 2 heads of 128 are the block's 128 threads; 16 + 2 are more.
    assert!(decode_qkv_fits(128, 14) && !decode_qkv_fits(128, 16));
    // Heads of 96 or 80 have no 16-byte `qkv_post`.
    assert!(!decode_qkv_fits(96, 4) && !decode_qkv_fits(80, 1));
}

/// A small Llama: 2 layers, 4 heads, 2 KV heads of 16.
fn config() -> ModelConfig {
    crate::test_support::small_llama()
}

fn layout_of(cfg: &ModelConfig, layout: KvLayout, blocks: usize) -> LayoutDescriptor {
    layout.describe(cfg.num_layers, cfg.kv_heads, cfg.head_dim, blocks).expect("a valid layout")
}

#[test]
fn every_supported_layout_of_the_model_passes_and_its_planes_stay_in_their_regions() {
    let cfg = config();
    for layout in KvLayout::all_supported() {
        let desc = layout_of(&cfg, layout, 9);
        let planes = check_model(&cfg, &desc, KvDtype::Bf16).expect("a layout made for the model");
        assert_eq!(planes.len(), cfg.num_layers);
        for (pair, want) in planes.iter().zip(&desc.planes) {
            for (&got, p) in pair.iter().zip(want) {
                assert_eq!(got, (p.region, p.offset * 2), "byte offsets in the cache's dtype");
            }
        }
    }
}

#[test]
fn a_head_dimension_past_the_attention_kernel_is_refused() {
    let mut cfg = config();
    let desc = layout_of(&cfg, KvLayout::all_supported()[0], 9);
    cfg.head_dim = MAX_HEAD_DIM * 2;
    let e = check_model(&cfg, &desc, KvDtype::F32).expect_err("too wide");
    assert_eq!(e, ShapeError::Unsupported("head_dim 512 (at most 256)".into()));
}

#[test]
fn a_layout_for_another_model_is_refused() {
    let cfg = config();
    let mut other = cfg.clone();
    other.kv_heads = 1;
    let desc = layout_of(&other, KvLayout::all_supported()[0], 9);
    let e = check_model(&cfg, &desc, KvDtype::F32).expect_err("another model's layout");
    assert_eq!(e, ShapeError::Layout("the KV layout does not match the model".into()));
}

#[test]
fn a_plane_reaching_past_its_region_is_refused() {
    let cfg = config();
    for layout in KvLayout::all_supported() {
        let mut desc = layout_of(&cfg, layout, 9);
        // The last element a row can reach is one past the region's end.
        desc.region_len -= 1;
        let e = check_model(&cfg, &desc, KvDtype::F32).expect_err("short region");
        assert!(matches!(&e, ShapeError::Layout(m) if m.contains("reaches past its region")), "{e:?}");
        let mut desc = layout_of(&cfg, layout, 9);
        desc.planes[1][1].region = desc.num_regions;
        assert!(check_model(&cfg, &desc, KvDtype::F32).is_err(), "a region that does not exist");
    }
}

#[test]
fn a_page_is_every_layers_k_and_v_of_64_tokens() {
    let cfg = config();
    let desc = layout_of(&cfg, KvLayout::all_supported()[0], 9);
    // 2 layers × K and V × 64 tokens × 2 heads × 16 × 2 bytes.
    assert_eq!(page_bytes(&desc, KvDtype::F16), 2 * 2 * 64 * 2 * 16 * 2);
    assert_eq!(page_bytes(&desc, KvDtype::F32), 2 * page_bytes(&desc, KvDtype::Bf16));
}

#[test]
fn imported_pages_must_cover_the_sequence() {
    assert_eq!(pages_for(0, 0, 100), Ok(0));
    assert_eq!(pages_for(64, 100, 100), Ok(1));
    assert_eq!(pages_for(65, 250, 100), Ok(2));
    assert_eq!(pages_for(65, 199, 100), Err("199 bytes of pages for 65 tokens, 200 expected".into()));
}

#[test]
fn rope_tables_have_a_row_per_position() {
    let cfg = config();
    let (cos, sin) = rope_tables(&cfg, 10);
    assert_eq!((cos.len(), sin.len()), (10 * 8, 10 * 8));
    // Position 0 turns nothing; the first frequency of Hugging Face's is 1.
    assert!(cos[..8].iter().all(|&c| c == 1.0) && sin[..8].iter().all(|&s| s == 0.0));
    assert_eq!((cos[8], sin[8]), (1f32.cos(), 1f32.sin()));
}

#[test]
fn matmuls_over_short_buffers_are_refused() {
    let (es, ys) = (2, 4);
    let (out, inp, rows) = (8, 4, 3);
    let fit = [out * inp * es, rows * inp * es, rows * out * ys];
    assert_eq!(check_matmul(fit, [es, ys], [out, inp, rows]), Ok(()));
    for short in 0..3 {
        let mut lens = fit;
        lens[short] -= 1;
        assert!(check_matmul(lens, [es, ys], [out, inp, rows]).is_err(), "buffer {short} short");
    }
    // An output in the weights' 16-bit type needs half the bytes.
    assert_eq!(check_matmul([fit[0], fit[1], rows * out * es], [es, es], [out, inp, rows]), Ok(()));
}

fn limits(max_tokens: usize, max_seqs: usize, cuda_graphs: bool) -> StepLimits {
    StepLimits { max_tokens, max_seqs, cuda_graphs, graph_steps: Arc::default(), graph_links: Arc::default() }
}

#[test]
fn step_buffers_hold_the_largest_step_the_engine_forms() {
    // A budget below the sequence count is raised to it: every sequence decodes a token.
    assert_eq!(limits(4, 8, false).capacity(100), StepCapacity { tokens: 8, tables: 100, rows: 8 });
    assert_eq!(limits(512, 8, false).capacity(100), StepCapacity { tokens: 512, tables: 100, rows: 8 });
    let cap = limits(8, 2, false).capacity(10);
    let (a, b) = ([1u32, 2, 3, 4], [5u32]);
    let t = [1u32, 2];
    let two = [chunk(&a, 0, &t, true), chunk(&b, 20, &t, true)];
    assert!(cap.fits(&plan_step(&two, 16, 10, 10, 64, false).expect("plan")));
    // One row of logits too many: the step gets buffers of its own.
    let three = [chunk(&a, 0, &t, true), chunk(&b, 20, &t, true), chunk(&b, 3, &t, true)];
    let p = plan_step(&three, 16, 10, 10, 64, false).expect("plan");
    assert!(!cap.fits(&p));
    assert!(StepCapacity::of(&p).fits(&p));
}

#[test]
fn graphs_are_kept_per_batch_size_up_to_the_largest_graphed_batch() {
    assert_eq!(limits(512, 8, false).graph_slots(), 0);
    assert_eq!(limits(512, 8, true).graph_slots(), 9);
    assert_eq!(limits(512, 1000, true).graph_slots(), MAX_GRAPH_BATCH + 1);
}

#[test]
fn only_decode_steps_may_replay_a_graph() {
    let (one, two) = ([1u32], [1u32, 2]);
    let t = [1u32];
    assert!(is_decode(&[chunk(&one, 5, &t, true), chunk(&one, 9, &t, true)]));
    assert!(!is_decode(&[chunk(&one, 5, &t, true), chunk(&two, 0, &t, true)]), "a prompt chunk");
    assert!(!is_decode(&[chunk(&one, 5, &t, false)]), "no logits wanted");
}

#[test]
fn logits_are_copied_in_runs_of_sampled_rows() {
    assert_eq!(logit_runs(&[false, false, false]), vec![0..3]);
    assert_eq!(logit_runs(&[true, true]), Vec::<std::ops::Range<usize>>::new());
    assert_eq!(logit_runs(&[false, true, false, false, true, false]), vec![0..1, 2..4, 5..6]);
    assert_eq!(logit_runs(&[]), Vec::<std::ops::Range<usize>>::new());
}

#[test]
fn an_attention_block_takes_the_largest_gqa_divisor_up_to_eight() {
    // (heads, kv_heads) of Qwen2.5-0.5B, Llama-3.1-8B, Qwen2.5-3B, SmolLM2-1.7B (MHA),
    // a group of 12 and one of 14.
    let cases =
        [((14, 2), 7), ((32, 8), 4), ((16, 2), 8), ((32, 32), 1), ((24, 2), 6), ((28, 2), 7), ((14, 1), 7)];
    for ((h, kvh), want) in cases {
        assert_eq!(attention_group(h, kvh), want, "{h} heads over {kvh}");
    }
}

#[test]
fn few_queries_take_a_block_per_head_and_many_the_gqa_group() {
    // Qwen2.5-0.5B (14 heads, groups of 7) on 132 SMs: blocks of one head up to 37 queries
    // (518 blocks), then of 7.
    assert_eq!(attention_heads(1, 14, 7, 132), 1);
    assert_eq!(attention_heads(16, 14, 7, 132), 1);
    assert_eq!(attention_heads(37, 14, 7, 132), 1);
    assert_eq!(attention_heads(38, 14, 7, 132), 7);
    assert_eq!(attention_heads(2048, 14, 7, 132), 7);
    // Without GQA there is nothing to group.
    assert_eq!(attention_heads(2048, 32, 1, 132), 1);
}

#[test]
fn attention_splits_fill_the_gpu_within_the_partials() {
    // One query of 14 heads on 132 SMs: as many splits as allowed.
    assert_eq!(attention_splits(1, 14, 132, 64), MAX_SPLITS);
    // 16 queries: 2,112 blocks wanted over 224 → 10 splits; 64 queries → 3; 64 queries of 2
    // blocks of 7 heads → 17, as many as allowed.
    assert_eq!(attention_splits(16, 14, 132, 64), 10);
    assert_eq!(attention_splits(64, 14, 132, 64), 3);
    assert_eq!(attention_splits(64, 2, 132, 64), MAX_SPLITS);
    // More queries than the partial buffer holds, or a step that fills the GPU alone: no split.
    assert_eq!(attention_splits(65, 14, 132, 64), 1);
    assert_eq!(attention_splits(2048, 14, 132, 4096), 1);
    assert_eq!(attention_splits(0, 14, 132, 64), 1);
}

#[test]
fn decode_splits_give_about_a_block_per_sm_within_the_partials() {
    // One query of 2 KV heads on 132 SMs wants 66 splits: as many as allowed. 64 queries of 2
    // → 128 blocks a split → 2 splits; of 8 → 1; the 8B shape's 16 queries of 8 → 2; past the
    // partial buffer, none.
    assert_eq!(decode_splits(1, 2, 132, 64), MAX_SPLITS);
    assert_eq!(decode_splits(64, 2, 132, 64), 2);
    assert_eq!(decode_splits(64, 8, 132, 64), 1);
    assert_eq!(decode_splits(16, 8, 132, 64), 2);
    assert_eq!(decode_splits(65, 2, 132, 64), 1);
    assert_eq!(decode_splits(0, 2, 132, 64), 1);
}

#[test]
fn gemv_rows_are_split_so_each_lane_loads_four_words() {
    // 896 values = 112 words: one warp a row; 4,864 = 608 words: 8 warps (76 each);
    // 4,096 = 512: 4 warps; 14,336 = 1,792: 8 warps, the most (224 each, two rounds of loads).
    assert_eq!([896, 4864, 4096, 14_336, 8].map(gemv_split), [1, 8, 4, 8, 1]);
    assert!(GEMV.contains(&format!("#define GEMV_ROWS {GEMV_ROWS}")));
}

#[test]
fn gemv_kernels_hold_their_rows() {
    // The smallest of gemv1/2 that holds the rows; each exists in gemv.cu.
    let caps = [1, 2];
    for rows in 1..=GEMV_ROWS {
        let k = gemv_kernel(rows);
        assert!(caps[k] >= rows && (k == 0 || caps[k - 1] < rows), "{rows} rows took gemv{}", caps[k]);
    }
    for cap in caps {
        assert!(GEMV.contains(&format!("GEMV_KERNEL(gemv{cap}, {cap})")));
        assert!(GEMV.contains(&format!("GEMV_GLU_KERNEL(gemv_glu{cap}, {cap})")));
    }
    // The kernels that work a norm out take one row (`norms_fused_fit`).
    assert!(
        GEMV.contains("GEMV_NORM_KERNEL(gemv_norm, 1)")
            && GEMV.contains("GEMV_GLU_NORM_KERNEL(gemv_glu_norm, 1)")
    );
}

#[test]
fn decode_steps_of_one_row_fuse_their_norms_where_rows_are_whole_words() {
    // The 0.5B (896, 14 × 64, 4,864) and 8B (4,096, 32 × 128, 14,336) shapes fit at one row
    // (the 8B shape's products then have too many groups: `norm_groups_fit`).
    for dims in [[896, 896, 4864], [4096, 4096, 14336]] {
        assert!(norms_fused_fit(1, dims), "{dims:?}");
        assert!(!norms_fused_fit(2, dims) && !norms_fused_fit(0, dims), "{dims:?}");
    }
    // A norm row past the kernels' registers (`ROW_VECS`), or any product's rows not whole words.
    assert!(norms_fused_fit(1, [8192, 8192, 28672]) && !norms_fused_fit(1, [8200, 8192, 28672]));
    assert!(!norms_fused_fit(1, [900, 896, 4864]) && !norms_fused_fit(1, [896, 900, 4864]));
    assert!(!norms_fused_fit(1, [896, 896, 4868]));
}

#[test]
fn gate_up_and_silu_share_a_kernel_where_a_block_holds_a_row_pair() {
    // Hidden sizes of the 0.5B (896) and 8B (4,096) shapes: 1 and 4 warps a row, so 4 and 1
    // gate rows a block with their up rows. 8,192 (8 warps a row) and steps past GEMV_ROWS
    // take the product and `silu_mul`.
    assert!(gemv_glu_fits(1, 896) && gemv_glu_fits(2, 4096));
    assert!(!gemv_glu_fits(1, 8192) && !gemv_glu_fits(GEMV_ROWS + 1, 896) && !gemv_glu_fits(0, 896));
    assert!(!gemv_glu_fits(1, 900), "rows of whole 16-byte words only");
}

#[test]
fn fused_norms_stop_where_a_resident_block_would_take_many_groups() {
    // The 0.5B shape at batch 1 on an H100 (132 SMs, 4 blocks an SM): QKV 144 groups, gate/up
    // 1,216 pairs' groups: at most 3 a block, fused.
    assert_eq!((gemv_groups(1152, 896), gemv_glu_groups(4864, 896)), (144, 1216));
    assert!(norm_groups_fit(144, 528) && norm_groups_fit(1216, 528));
    // The 8B shape (3 blocks an SM): QKV 3,072 and gate/up 14,336 groups, 8 and 36 a block.
    assert_eq!((gemv_groups(6144, 4096), gemv_glu_groups(14336, 4096)), (3072, 14336));
    assert!(!norm_groups_fit(3072, 396) && !norm_groups_fit(14336, 396));
}
