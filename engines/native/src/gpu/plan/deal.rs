//! How `flash_decode`'s blocks go to a step's queries.
//!
//! The kernel's grid comes from the step's shape alone (queries × KV heads × splits, see
//! [`super::decode_splits`]), so a captured graph replays it whatever the lengths. Dealing the
//! same number of splits to every query would leave a serving batch, whose contexts run from 40
//! to 2,833 tokens, waiting on its longest query's blocks while the short ones' sit idle. So the
//! host deals each KV head's `queries × splits` blocks afresh every step, by length, and uploads
//! the deal with the step's positions.

use super::{DECODE_WARPS, MAX_SPLITS};

// A deal entry packs a split and the query's split count in 4 bits each.
const _: () = assert!(MAX_SPLITS <= 16);

/// Keys of a `flash_decode` warp's tile (`DK`, which the kernels' source defines from here): 16
/// for heads above 64, else 32 (a tile's K and V row segments stay in a lane's registers).
pub(in crate::gpu) fn decode_tile_keys(head_dim: usize) -> usize {
    if head_dim > 64 { 16 } else { 32 }
}

/// The deal of one KV head's `lens.len() × splits` `flash_decode` blocks to queries of `lens`
/// keys (tiles of `tile_keys`): entry `f` is what the block `blockIdx.z × queries + blockIdx.x`
/// of every KV head works on, `slot << 8 | split << 4 | splits − 1` (the query's slot, which of
/// its splits, how many it has), or −1 (nothing).
///
/// A query of `n` tiles takes `ceil(n / c)` splits for the least `c` (tiles a split, at least a
/// warp's tile for each of the block's warps and a [`MAX_SPLITS`]-th of the longest query's)
/// with which every query's splits fit the blocks. A query's splits deal its tiles round robin,
/// so no split walks more than `c` of them. The longest queries' splits come first: the GPU
/// starts blocks in that order, and the last ones to start are then the shortest.
pub(in crate::gpu) fn deal_decode_blocks(lens: &[usize], splits: usize, tile_keys: usize) -> Vec<i32> {
    let queries = lens.len();
    let blocks = queries * splits.max(1);
    let tiles: Vec<usize> = lens.iter().map(|&l| l.max(1).div_ceil(tile_keys)).collect();
    let longest = tiles.iter().copied().max().unwrap_or(0);
    let fits = |c: usize| tiles.iter().map(|t| t.div_ceil(c)).sum::<usize>() <= blocks;
    // The least c that fits: at the longest query's tiles every query takes one split.
    let mut lo = (DECODE_WARPS as usize).max(longest.div_ceil(MAX_SPLITS));
    let mut hi = lo.max(longest);
    while lo < hi {
        let mid = (lo + hi) / 2;
        if fits(mid) { hi = mid } else { lo = mid + 1 }
    }
    let mut order: Vec<usize> = (0..queries).collect();
    order.sort_by_key(|&q| std::cmp::Reverse(tiles[q]));
    let mut deal = Vec::with_capacity(blocks);
    for q in order {
        let n = tiles[q].div_ceil(lo);
        deal.extend((0..n).map(|z| ((q << 8) | (z << 4) | (n - 1)) as i32));
    }
    deal.resize(blocks, -1);
    deal
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (slot, split, splits) of each working block.
    fn entries(deal: &[i32]) -> Vec<(usize, usize, usize)> {
        deal.iter()
            .filter(|&&e| e >= 0)
            .map(|&e| ((e >> 8) as usize, ((e >> 4) & 15) as usize, (e & 15) as usize + 1))
            .collect()
    }

    /// Every query gets each of its splits once, no more than MAX_SPLITS or its tiles allow,
    /// within the grid; returns each query's splits.
    fn check(lens: &[usize], splits: usize, tk: usize) -> Vec<usize> {
        let deal = deal_decode_blocks(lens, splits, tk);
        assert_eq!(deal.len(), lens.len() * splits, "one entry a block");
        let mut got = vec![Vec::new(); lens.len()];
        for (q, z, n) in entries(&deal) {
            assert!(q < lens.len() && z < n && n <= MAX_SPLITS, "entry ({q}, {z}, {n})");
            got[q].push((z, n));
        }
        got.iter()
            .enumerate()
            .map(|(q, s)| {
                let n = s.first().expect("every query has a split").1;
                let mut zs: Vec<usize> =
                    s.iter().map(|&(z, m)| if m == n { z } else { usize::MAX }).collect();
                zs.sort_unstable();
                assert_eq!(zs, (0..n).collect::<Vec<_>>(), "query {q}: splits 0..{n} once each");
                let tiles = lens[q].max(1).div_ceil(tk);
                assert!(
                    n == 1 || n <= tiles.div_ceil(DECODE_WARPS as usize),
                    "query {q}: {n} splits of {tiles} tiles"
                );
                n
            })
            .collect()
    }

    #[test]
    fn equal_lengths_take_the_grids_splits() {
        // 16 queries of 1,000 keys in tiles of 16: two splits each, as the grid has.
        assert_eq!(check(&[1000; 16], 2, 16), vec![2; 16]);
        // One query alone takes as many as its tiles fill, one tile a warp, up to the grid's.
        assert_eq!(check(&[1000], 16, 16), vec![16]);
        assert_eq!(check(&[40], 16, 16), vec![1]);
        assert_eq!(check(&[100], 16, 16), vec![2]);
    }

    #[test]
    fn long_queries_take_the_splits_short_ones_leave() {
        // The serving mix, 4 of each length, 2 splits a query in the grid: the 2,833-key
        // queries walk 45 tiles a split instead of 89.
        let lens: Vec<usize> = [40, 173, 733, 2833].iter().cycle().take(16).copied().collect();
        let got = check(&lens, 2, 16);
        assert_eq!(&got[..4], &[1, 1, 2, 4]);
        let deal = deal_decode_blocks(&lens, 2, 16);
        let first = entries(&deal)[0];
        assert_eq!(lens[first.0], 2833, "the longest queries' blocks come first");
        // The most tiles any split walks, against an even deal's.
        let walk = |n: usize, l: usize| l.div_ceil(16).div_ceil(n);
        let most = lens.iter().zip(&got).map(|(&l, &n)| walk(n, l)).max();
        assert_eq!(most, Some(45));
        assert_eq!(walk(2, 2833), 89);
    }

    #[test]
    fn one_split_a_query_when_the_grid_has_no_more() {
        let lens = [3000, 5, 700, 64];
        assert_eq!(check(&lens, 1, 32), vec![1; 4]);
    }

    #[test]
    fn no_query_takes_more_than_max_splits() {
        let got = check(&[100_000, 10], 16, 16);
        assert_eq!(got, vec![MAX_SPLITS, 1]);
        assert!(deal_decode_blocks(&[], 3, 16).is_empty());
    }
}
