//! The canonical KV page `LKNHD-v1` and the one routine that copies pages out of and into
//! any engine layout.
//!
//! Page `p` of a sequence holds token positions `[64p, 64p + 64)` as C-contiguous
//! `[layers][2 (K, V)][64][kv_heads][head_dim]` elements of the model's KV dtype. Tokens past the
//! sequence are zero. Elements are copied bit for bit, never converted.

use crate::LayoutDescriptor;
use serde::{Deserialize, Serialize};

/// Tokens per canonical page.
pub const PAGE_TOKENS: usize = 64;

/// Version of the page layout, carried in every header.
pub const PAGE_LAYOUT_VERSION: u16 = 1;

/// Element type of KV pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PageDtype {
    /// IEEE half.
    F16,
    /// bfloat16.
    Bf16,
    /// 32-bit float (CPU engines computing in F32).
    F32,
}

impl PageDtype {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Self::F16 | Self::Bf16 => 2,
            Self::F32 => 4,
        }
    }
}

/// The shape of a model's KV pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PageShape {
    /// Transformer layers.
    pub layers: usize,
    /// KV heads.
    pub kv_heads: usize,
    /// Head dimension.
    pub head_dim: usize,
}

impl PageShape {
    /// Elements of one page.
    pub fn page_elems(&self) -> usize {
        self.layers * 2 * PAGE_TOKENS * self.kv_heads * self.head_dim
    }

    /// Element index of `(page, layer, kv, token offset, head, 0)` in a run of pages.
    #[inline]
    pub fn index(&self, page: usize, layer: usize, kv: usize, off: usize, head: usize) -> usize {
        page * self.page_elems()
            + (((layer * 2 + kv) * PAGE_TOKENS + off) * self.kv_heads + head) * self.head_dim
    }
}

/// What travels with every page: enough to refuse a page that does not belong.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PageHeader {
    /// Contract fingerprint of the sending engine.
    pub fingerprint: String,
    /// Element type.
    pub dtype: PageDtype,
    /// Shape.
    pub shape: PageShape,
    /// [`PAGE_LAYOUT_VERSION`].
    pub layout_version: u16,
    /// The request the page belongs to.
    pub request_id: String,
    /// Index of the page in the sequence.
    pub page_index: u32,
    /// Valid tokens in the page (1..=64).
    pub valid: u16,
}

/// Pages that cover `tokens` tokens.
pub fn pages_for(tokens: usize) -> usize {
    tokens.div_ceil(PAGE_TOKENS)
}

/// Which way [`copy_pages`] copies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Engine memory → canonical pages.
    Gather,
    /// Canonical pages → engine memory.
    Scatter,
}

/// Copies pages `range` of a sequence of `len` tokens between engine memory (`regions`,
/// addressed through `desc` and the sequence's `block_table`) and a run of canonical pages
/// (`pages`, `range.len()` pages long).
///
/// One routine serves both directions, so gather and scatter cannot disagree on an index.
/// Gathering zero-fills positions past `len`; scattering writes only positions `< len` and
/// leaves every other engine element untouched.
///
/// # Panics
/// If `pages` is shorter than `range.len()` pages, or the block table does not cover `len` tokens
/// (both are caller bugs: callers size them from the same numbers).
pub fn copy_pages<T: Copy + Default>(
    direction: Direction,
    desc: &LayoutDescriptor,
    regions: &mut [&mut [T]],
    block_table: &[u32],
    len: usize,
    range: std::ops::Range<usize>,
    pages: &mut [T],
) {
    copy_token_pages(direction, desc, regions, block_table, 0..len, range, pages);
}

/// [`copy_pages`] for the tokens `tokens` of the sequence only: a gather zero-fills every other
/// position, a scatter leaves every other position of the engine untouched (a prefix the decode
/// engine holds already, say).
///
/// # Panics
/// As [`copy_pages`], for a block table that does not cover `tokens.end` tokens.
pub fn copy_token_pages<T: Copy + Default>(
    direction: Direction,
    desc: &LayoutDescriptor,
    regions: &mut [&mut [T]],
    block_table: &[u32],
    tokens: std::ops::Range<usize>,
    range: std::ops::Range<usize>,
    pages: &mut [T],
) {
    let (first_page, count) = (range.start, range.len());
    let shape = PageShape { layers: desc.num_layers, kv_heads: desc.kv_heads, head_dim: desc.head_dim };
    let d = desc.head_dim;
    assert!(pages.len() >= count * shape.page_elems(), "page buffer too small");
    for p in 0..count {
        let page = first_page + p;
        for off in 0..PAGE_TOKENS {
            let t = page * PAGE_TOKENS + off;
            for layer in 0..desc.num_layers {
                for kv in 0..2 {
                    for head in 0..desc.kv_heads {
                        let c = shape.index(p, layer, kv, off, head);
                        let canon = &mut pages[c..c + d];
                        if !tokens.contains(&t) {
                            if direction == Direction::Gather {
                                canon.fill(T::default());
                            }
                            continue;
                        }
                        let (r, o) = desc.token_offset(block_table, layer, kv, t, head);
                        let engine = &mut regions[r][o..o + d];
                        match direction {
                            Direction::Gather => canon.copy_from_slice(engine),
                            Direction::Scatter => engine.copy_from_slice(canon),
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
