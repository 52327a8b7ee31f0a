use super::*;
use crate::KvLayout;
use proptest::prelude::*;

fn layouts() -> Vec<KvLayout> {
    KvLayout::all_supported()
}

/// An engine cache filled with poison, a shuffled block table for `len` tokens, and the
/// sequence's values written through the layout.
struct Engine {
    desc: LayoutDescriptor,
    regions: Vec<Vec<u16>>,
    table: Vec<u32>,
}

const POISON: u16 = 0xDEAD;

impl Engine {
    fn new(layout: KvLayout, shape: PageShape, len: usize, seed: u64) -> Self {
        let blocks = len.div_ceil(layout.block_size) + 3;
        let desc = layout.describe(shape.layers, shape.kv_heads, shape.head_dim, blocks).expect("valid");
        let regions = vec![vec![POISON; desc.region_len]; desc.num_regions];
        // Blocks 1.. in a seed-dependent order (never block 0).
        let mut ids: Vec<u32> = (1..blocks as u32).collect();
        let mut x = seed | 1;
        for i in (1..ids.len()).rev() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ids.swap(i, (x % (i as u64 + 1)) as usize);
        }
        ids.truncate(len.div_ceil(layout.block_size));
        Self { desc, regions, table: ids }
    }

    fn copy(&mut self, dir: Direction, len: usize, first: usize, count: usize, pages: &mut [u16]) {
        let mut views: Vec<&mut [u16]> = self.regions.iter_mut().map(|r| r.as_mut_slice()).collect();
        copy_pages(dir, &self.desc, &mut views, &self.table, len, first..first + count, pages);
    }
}

fn value(layer: usize, kv: usize, t: usize, head: usize, e: usize) -> u16 {
    ((layer * 7919 + kv * 104_729 + t * 31 + head * 1009 + e * 3) % 65_000) as u16 + 1
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// gather → scatter into another layout → gather again is bitwise exact, the destination's
    /// elements outside the sequence stay untouched, and each element lands where the other
    /// layout addresses the same (layer, K/V, token, head, d).
    #[test]
    fn round_trip_between_every_layout_pair(
        layers in 1usize..3,
        kv_heads in 1usize..4,
        half_dim in 1usize..5,
        len in 1usize..=300,
        seed in any::<u64>(),
    ) {
        let shape = PageShape { layers, kv_heads, head_dim: half_dim * 2 };
        let n_pages = pages_for(len);
        for src_layout in layouts() {
            let mut src = Engine::new(src_layout, shape, len, seed);
            let mut pages = vec![0u16; n_pages * shape.page_elems()];
            // Write the sequence through the source layout (scatter of synthetic pages).
            for p in 0..n_pages {
                for off in 0..PAGE_TOKENS {
                    for layer in 0..layers {
                        for kv in 0..2 {
                            for head in 0..kv_heads {
                                for e in 0..shape.head_dim {
                                    let t = p * PAGE_TOKENS + off;
                                    let v = if t < len { value(layer, kv, t, head, e) } else { 0 };
                                    pages[shape.index(p, layer, kv, off, head) + e] = v;
                                }
                            }
                        }
                    }
                }
            }
            let reference = pages.clone();
            src.copy(Direction::Scatter, len, 0, n_pages, &mut pages);
            let mut out = vec![7u16; pages.len()];
            src.copy(Direction::Gather, len, 0, n_pages, &mut out);
            prop_assert_eq!(&out, &reference, "{} gather after scatter", src_layout);
            for dst_layout in layouts() {
                let mut dst = Engine::new(dst_layout, shape, len, seed ^ 0x5555);
                let mut moved = out.clone();
                dst.copy(Direction::Scatter, len, 0, n_pages, &mut moved);
                // Elements not addressed by the sequence keep the poison.
                let touched = len * layers * 2 * kv_heads * shape.head_dim;
                let poisoned: usize = dst.regions.iter().map(|r| r.iter().filter(|&&x| x == POISON).count()).sum();
                let total: usize = dst.regions.iter().map(Vec::len).sum();
                prop_assert_eq!(poisoned, total - touched, "{} -> {}: stray writes", src_layout, dst_layout);
                // Page by page, starting anywhere, gives the same bytes.
                let mut again = vec![9u16; pages.len()];
                for p in 0..n_pages {
                    let e = shape.page_elems();
                    dst.copy(Direction::Gather, len, p, 1, &mut again[p * e..(p + 1) * e]);
                }
                prop_assert_eq!(&again, &reference, "{} -> {}", src_layout, dst_layout);
            }
        }
    }
}

#[test]
fn page_counts_follow_the_page_rule() {
    for (p, pages) in [(1, 1), (63, 1), (64, 1), (65, 2), (128, 2), (129, 3), (193, 4)] {
        assert_eq!(pages_for(p), pages, "{p} tokens");
    }
}
