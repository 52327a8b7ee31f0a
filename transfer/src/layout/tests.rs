use super::*;
use std::collections::HashSet;

fn all_layouts() -> Vec<KvLayout> {
    KvLayout::all_supported()
}

/// Every element of every layout maps to a distinct in-bounds address: the strides describe a
/// dense tensor with no overlap.
#[test]
fn addresses_are_a_bijection() {
    let (l, h, d, nb) = (3, 2, 8, 5);
    for layout in all_layouts() {
        let desc = layout.describe(l, h, d, nb).expect("valid layout");
        let mut seen = HashSet::new();
        for layer in 0..l {
            for kv in 0..2 {
                for blk in 0..nb {
                    for off in 0..layout.block_size {
                        for head in 0..h {
                            let (r, o) = desc.row_offset(layer, kv, blk, off, head);
                            assert!(r < desc.num_regions);
                            for e in 0..d {
                                assert!(o + e < desc.region_len, "{layout}: out of bounds");
                                assert!(seen.insert((r, o + e)), "{layout}: overlap");
                            }
                        }
                    }
                }
            }
        }
        assert_eq!(seen.len(), desc.num_regions * desc.region_len, "{layout}: not dense");
    }
}

#[test]
fn vllm_flash_attention_hnd_strides() {
    // (2, NB, H, B, D) physical.
    let layout = KvLayout { kind: KvLayoutKind::PagedKvFirst, order: KvOrder::Hnd, block_size: 16 };
    let d = layout.describe(2, 4, 64, 10).expect("valid");
    assert_eq!((d.s_blk, d.s_tok, d.s_head), (4 * 16 * 64, 64, 16 * 64));
    assert_eq!(d.planes[1][1], Plane { region: 1, offset: 10 * 4 * 16 * 64 });
}

#[test]
fn vllm_0_26_packed_strides() {
    // What vLLM 0.26 hands a connector on the H200: logical (NB, H, B, 2·D) = (NB, 2, 16, 128)
    // with strides (4096, 128, 256, 1) for NHD; K is the first D of each head's 2·D, V the rest.
    let layout = KvLayout { kind: KvLayoutKind::PagedPacked, order: KvOrder::Nhd, block_size: 16 };
    let d = layout.describe(24, 2, 64, 10).expect("valid");
    assert_eq!((d.s_blk, d.s_tok, d.s_head), (4096, 256, 128));
    assert_eq!(d.planes[3], [Plane { region: 3, offset: 0 }, Plane { region: 3, offset: 64 }]);
    assert_eq!((d.num_regions, d.region_len), (24, 10 * 4096));
    let hnd = KvLayout { order: KvOrder::Hnd, ..layout }.describe(24, 2, 64, 10).expect("valid");
    assert_eq!((hnd.s_blk, hnd.s_tok, hnd.s_head), (4096, 128, 16 * 128));
    assert_eq!("paged-packed".parse::<KvLayoutKind>(), Ok(KvLayoutKind::PagedPacked));
}

#[test]
fn bad_combinations_are_refused() {
    let bad = KvLayout { kind: KvLayoutKind::TokenPool, order: KvOrder::Hnd, block_size: 1 };
    assert_eq!(bad.validate(), Err(LayoutError::PoolOrder));
    let bad = KvLayout { kind: KvLayoutKind::PagedKvFirst, order: KvOrder::Nhd, block_size: 8 };
    assert!(matches!(bad.validate(), Err(LayoutError::BlockSize { block_size: 8, .. })));
    assert!(matches!("paged".parse::<KvLayoutKind>(), Err(LayoutError::UnknownLayout(_))));
}
