//! The mock engine's KV cache: a real paged cache in any layout the transfer crate describes,
//! holding values that are a pure function of the prompt, so an imported page can be checked
//! against what the engine would have computed.

use xinf_engine::EngineError;
use xinf_transfer::{Direction, KvLayout, LayoutDescriptor, PAGE_TOKENS, PageShape, copy_pages, pages_for};

/// Transformer layers of the mock model.
pub(crate) const LAYERS: usize = 2;
/// KV heads.
pub(crate) const KV_HEADS: usize = 2;
/// Head dimension.
pub(crate) const HEAD_DIM: usize = 8;

/// The canonical page shape of the mock model.
pub(crate) const SHAPE: PageShape = PageShape { layers: LAYERS, kv_heads: KV_HEADS, head_dim: HEAD_DIM };

/// The 16-bit word the mock model's KV holds for token `id` at `pos`. Positions matter (the
/// same token twice has two values), as RoPE'd keys do.
fn value(id: u32, pos: usize, layer: usize, kv: usize, head: usize, d: usize) -> u16 {
    let mut x = u64::from(id) << 32 ^ (pos as u64) << 8 ^ (layer * 64 + kv * 32 + head * 8 + d) as u64;
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (x ^ (x >> 31)) as u16
}

/// Canonical pages `range` of the KV of prompt `ids`, computed (positions past the prompt zero).
pub(crate) fn computed_pages(ids: &[u32], range: std::ops::Range<usize>) -> Vec<u16> {
    let mut out = vec![0u16; range.len() * SHAPE.page_elems()];
    for (p, page) in range.enumerate() {
        for off in 0..PAGE_TOKENS {
            let t = page * PAGE_TOKENS + off;
            let Some(&id) = ids.get(t) else { continue };
            for layer in 0..LAYERS {
                for kv in 0..2 {
                    for head in 0..KV_HEADS {
                        let at = SHAPE.index(p, layer, kv, off, head);
                        for d in 0..HEAD_DIM {
                            out[at + d] = value(id, t, layer, kv, head, d);
                        }
                    }
                }
            }
        }
    }
    out
}

/// Little-endian bytes of 16-bit words, as canonical pages travel.
pub(crate) fn to_bytes(words: &[u16]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

/// 16-bit words of little-endian bytes.
pub(crate) fn from_bytes(bytes: &[u8]) -> Vec<u16> {
    bytes.chunks_exact(2).map(|b| u16::from_le_bytes([b[0], b[1]])).collect()
}

/// A paged KV cache with a free list; block 0 is reserved, as in the native engine.
pub(crate) struct KvCache {
    desc: LayoutDescriptor,
    regions: Vec<Vec<u16>>,
    free: Vec<u32>,
}

impl KvCache {
    /// A cache of `tokens` tokens in `layout`.
    pub(crate) fn new(layout: KvLayout, tokens: usize) -> Result<Self, EngineError> {
        let blocks = tokens.div_ceil(layout.block_size) + 1;
        let desc = layout
            .describe(LAYERS, KV_HEADS, HEAD_DIM, blocks)
            .map_err(|e| EngineError::invalid("engine_config.kv_layout", e.to_string()))?;
        let regions = vec![vec![0u16; desc.region_len]; desc.num_regions];
        let free = (1..blocks as u32).rev().collect();
        Ok(Self { desc, regions, free })
    }

    /// The layout descriptor.
    pub(crate) fn descriptor(&self) -> &LayoutDescriptor {
        &self.desc
    }

    /// Blocks in the cache, less the reserved block 0.
    pub(crate) fn total_blocks(&self) -> usize {
        self.desc.num_blocks - 1
    }

    /// Blocks in use.
    pub(crate) fn used_blocks(&self) -> usize {
        self.total_blocks() - self.free.len()
    }

    /// A block table for `tokens` tokens, or `None` when the cache is full.
    pub(crate) fn allocate(&mut self, tokens: usize) -> Option<Vec<u32>> {
        let n = tokens.div_ceil(self.desc.block_size()).max(1);
        if n > self.free.len() {
            return None;
        }
        Some(self.free.split_off(self.free.len() - n))
    }

    /// Gives blocks back.
    pub(crate) fn release(&mut self, table: Vec<u32>) {
        self.free.extend(table);
    }

    fn copy(
        &mut self,
        direction: Direction,
        table: &[u32],
        len: usize,
        range: std::ops::Range<usize>,
        pages: &mut [u16],
    ) {
        let mut regions: Vec<&mut [u16]> = self.regions.iter_mut().map(Vec::as_mut_slice).collect();
        copy_pages(direction, &self.desc, &mut regions, table, len, range, pages);
    }

    /// Computes the KV of prompt `ids` into its blocks.
    pub(crate) fn compute(&mut self, table: &[u32], ids: &[u32]) {
        let range = 0..pages_for(ids.len());
        let mut pages = computed_pages(ids, range.clone());
        self.copy(Direction::Scatter, table, ids.len(), range, &mut pages);
    }

    /// Canonical pages `range` of a sequence of `len` tokens in `table`.
    pub(crate) fn gather(&mut self, table: &[u32], len: usize, range: std::ops::Range<usize>) -> Vec<u16> {
        let mut pages = vec![0u16; range.len() * SHAPE.page_elems()];
        self.copy(Direction::Gather, table, len, range, &mut pages);
        pages
    }

    /// Writes canonical pages (from page 0) of the first `len` tokens into `table`.
    pub(crate) fn scatter(&mut self, table: &[u32], len: usize, pages: &mut [u16]) {
        self.copy(Direction::Scatter, table, len, 0..pages_for(len), pages);
    }
}
