//! Engine KV layouts and their stride math.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Which family of memory layout an engine uses for its KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum KvLayoutKind {
    /// vLLM FlashAttention: per layer `(2, NB, B, H, D)`, all K blocks then all V blocks.
    PagedKvFirst,
    /// vLLM FlashInfer / Triton: per layer `(NB, 2, B, H, D)`, each block holds K then V.
    PagedBlockFirst,
    /// SGLang: per layer one K buffer and one V buffer of `[slots, H, D]`, slots grouped in
    /// pages of `B` tokens (`B = 1` is SGLang's default).
    TokenPool,
    /// vLLM 0.26 (FlashAttention, Triton, FlashInfer): per layer logical `(NB, H, B, 2·D)`,
    /// K and V packed in each head's `2·D` (K first); physically `(NB, B, H, 2·D)` in NHD (the
    /// default), `(NB, H, B, 2·D)` in HND.
    PagedPacked,
}

impl KvLayoutKind {
    /// The name used in `engine_config.kv_layout`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::PagedKvFirst => "paged-kv-first",
            Self::PagedBlockFirst => "paged-block-first",
            Self::TokenPool => "token-pool",
            Self::PagedPacked => "paged-packed",
        }
    }
}

impl fmt::Display for KvLayoutKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for KvLayoutKind {
    type Err = LayoutError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "paged-kv-first" => Ok(Self::PagedKvFirst),
            "paged-block-first" => Ok(Self::PagedBlockFirst),
            "token-pool" => Ok(Self::TokenPool),
            "paged-packed" => Ok(Self::PagedPacked),
            other => Err(LayoutError::UnknownLayout(other.to_owned())),
        }
    }
}

/// Physical order of the token and head axes inside a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum KvOrder {
    /// `[B][H][D]`: rows of `H * D` per token (vLLM's default, SGLang's only order).
    #[serde(rename = "NHD")]
    Nhd,
    /// `[H][B][D]`: per head runs of `B * D` (what vLLM's NIXL connector asks for).
    #[serde(rename = "HND")]
    Hnd,
}

impl fmt::Display for KvOrder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Nhd => "NHD",
            Self::Hnd => "HND",
        })
    }
}

impl FromStr for KvOrder {
    type Err = LayoutError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "NHD" | "nhd" => Ok(Self::Nhd),
            "HND" | "hnd" => Ok(Self::Hnd),
            other => Err(LayoutError::UnknownOrder(other.to_owned())),
        }
    }
}

/// A complete choice of KV layout: family, order and block (page) size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct KvLayout {
    /// Layout family.
    pub kind: KvLayoutKind,
    /// Token/head order inside a block; the token pool is always NHD.
    pub order: KvOrder,
    /// Tokens per block (or per page of the token pool).
    pub block_size: usize,
}

impl Default for KvLayout {
    fn default() -> Self {
        Self { kind: KvLayoutKind::PagedKvFirst, order: KvOrder::Nhd, block_size: 16 }
    }
}

impl fmt::Display for KvLayout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/B={}", self.kind, self.order, self.block_size)
    }
}

/// Why a layout cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LayoutError {
    /// `kv_layout` names no known layout.
    #[error(
        "unknown kv_layout `{0}` (expected paged-kv-first, paged-block-first, paged-packed or token-pool)"
    )]
    UnknownLayout(String),
    /// `kv_order` is neither NHD nor HND.
    #[error("unknown kv_order `{0}` (expected NHD or HND)")]
    UnknownOrder(String),
    /// The block size is not allowed for this layout.
    #[error("block_size {block_size} is not allowed for {kind} (allowed: {allowed})")]
    BlockSize {
        /// The layout family.
        kind: KvLayoutKind,
        /// The requested size.
        block_size: usize,
        /// The allowed sizes, for the message.
        allowed: &'static str,
    },
    /// SGLang's token pool has no HND variant.
    #[error("kv_order HND is not available for the token-pool layout")]
    PoolOrder,
    /// A shape dimension is zero.
    #[error("KV shape dimension `{0}` must be positive")]
    ZeroDim(&'static str),
}

impl KvLayout {
    /// Checks the combination the way an engine would: paged layouts take 16, 32 or 64 tokens
    /// per block, the token pool takes pages of 1 or 64 tokens and only NHD.
    pub fn validate(&self) -> Result<(), LayoutError> {
        match self.kind {
            KvLayoutKind::PagedKvFirst | KvLayoutKind::PagedBlockFirst | KvLayoutKind::PagedPacked => {
                if ![16, 32, 64].contains(&self.block_size) {
                    return Err(LayoutError::BlockSize {
                        kind: self.kind,
                        block_size: self.block_size,
                        allowed: "16, 32, 64",
                    });
                }
            }
            KvLayoutKind::TokenPool => {
                if self.order != KvOrder::Nhd {
                    return Err(LayoutError::PoolOrder);
                }
                if ![1, 64].contains(&self.block_size) {
                    return Err(LayoutError::BlockSize {
                        kind: self.kind,
                        block_size: self.block_size,
                        allowed: "1, 64",
                    });
                }
            }
        }
        Ok(())
    }

    /// Every layout [`validate`](Self::validate) accepts: the three paged families in NHD and HND
    /// with blocks of 16, 32 and 64 tokens, and the token pool with pages of 1 and 64.
    pub fn all_supported() -> Vec<Self> {
        let mut v = Vec::new();
        for kind in [KvLayoutKind::PagedKvFirst, KvLayoutKind::PagedBlockFirst, KvLayoutKind::PagedPacked] {
            for order in [KvOrder::Nhd, KvOrder::Hnd] {
                for block_size in [16, 32, 64] {
                    v.push(Self { kind, order, block_size });
                }
            }
        }
        for block_size in [1, 64] {
            v.push(Self { kind: KvLayoutKind::TokenPool, order: KvOrder::Nhd, block_size });
        }
        v
    }

    /// Builds the descriptor of a cache of `num_blocks` blocks for the given model shape.
    pub fn describe(
        &self,
        num_layers: usize,
        kv_heads: usize,
        head_dim: usize,
        num_blocks: usize,
    ) -> Result<LayoutDescriptor, LayoutError> {
        self.validate()?;
        for (name, v) in [
            ("num_layers", num_layers),
            ("kv_heads", kv_heads),
            ("head_dim", head_dim),
            ("num_blocks", num_blocks),
        ] {
            if v == 0 {
                return Err(LayoutError::ZeroDim(name));
            }
        }
        let (b, h, d, nb) = (self.block_size, kv_heads, head_dim, num_blocks);
        // A token's row of one head: `D` elements, or `2·D` where K and V are packed together.
        let w = if self.kind == KvLayoutKind::PagedPacked { 2 * d } else { d };
        let (tok, head) = match self.order {
            KvOrder::Nhd => (h * w, w),
            KvOrder::Hnd => (w, b * w),
        };
        let block_elems = b * h * d;
        let (s_blk, v_offset, region_len, regions_per_layer) = match self.kind {
            KvLayoutKind::PagedKvFirst => (block_elems, nb * block_elems, 2 * nb * block_elems, 1),
            KvLayoutKind::PagedBlockFirst => (2 * block_elems, block_elems, 2 * nb * block_elems, 1),
            KvLayoutKind::TokenPool => (block_elems, 0, nb * block_elems, 2),
            KvLayoutKind::PagedPacked => (2 * block_elems, d, 2 * nb * block_elems, 1),
        };
        let planes = (0..num_layers)
            .map(|l| {
                if regions_per_layer == 1 {
                    [Plane { region: l, offset: 0 }, Plane { region: l, offset: v_offset }]
                } else {
                    [Plane { region: 2 * l, offset: 0 }, Plane { region: 2 * l + 1, offset: 0 }]
                }
            })
            .collect();
        Ok(LayoutDescriptor {
            layout: *self,
            num_layers,
            kv_heads,
            head_dim,
            num_blocks,
            region_len,
            num_regions: num_layers * regions_per_layer,
            planes,
            s_blk,
            s_tok: tok,
            s_head: head,
        })
    }
}

/// Where one `(layer, K|V)` plane starts: a memory region (one engine tensor) and an element
/// offset inside it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plane {
    /// Index of the region (tensor) that holds the plane.
    pub region: usize,
    /// Element offset of block 0, token 0, head 0 inside that region.
    pub offset: usize,
}

/// Planes and strides of an engine KV cache, in elements.
///
/// This is what a transfer needs to address an engine's memory without knowing the engine:
/// the native engine builds its cache from it, and the attention kernels read through it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayoutDescriptor {
    /// The layout this describes.
    pub layout: KvLayout,
    /// Transformer layers.
    pub num_layers: usize,
    /// KV heads.
    pub kv_heads: usize,
    /// Head dimension.
    pub head_dim: usize,
    /// Blocks (pages) in the cache, including the reserved block 0.
    pub num_blocks: usize,
    /// Elements per region.
    pub region_len: usize,
    /// Regions (tensors): one per layer for paged layouts, K and V per layer for the pool.
    pub num_regions: usize,
    /// `planes[layer][kv]`.
    pub planes: Vec<[Plane; 2]>,
    /// Stride between blocks.
    pub s_blk: usize,
    /// Stride between tokens of one block.
    pub s_tok: usize,
    /// Stride between heads.
    pub s_head: usize,
}

impl LayoutDescriptor {
    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.layout.block_size
    }

    /// Element offset inside the plane's region of `(block, offset in block, head)`; the
    /// `head_dim` elements of that head follow contiguously.
    #[inline]
    pub fn row_offset(
        &self,
        layer: usize,
        kv: usize,
        block: usize,
        off: usize,
        head: usize,
    ) -> (usize, usize) {
        let p = self.planes[layer][kv];
        (p.region, p.offset + block * self.s_blk + off * self.s_tok + head * self.s_head)
    }

    /// Same as [`row_offset`](Self::row_offset) for token `t` of a sequence with `block_table`.
    #[inline]
    pub fn token_offset(
        &self,
        block_table: &[u32],
        layer: usize,
        kv: usize,
        t: usize,
        head: usize,
    ) -> (usize, usize) {
        let b = self.layout.block_size;
        self.row_offset(layer, kv, block_table[t / b] as usize, t % b, head)
    }
}

#[cfg(test)]
mod tests;
