//! The paged KV cache: memory in an engine layout, a block allocator, and row copies through
//! the layout descriptor.
//!
//! Memory is one buffer per region of the [`LayoutDescriptor`] (a layer for paged layouts, a
//! layer's K or V pool for the token pool), so the cache is byte for byte what vLLM or SGLang
//! would hold; attention reads it through the descriptor's strides. Block 0 is never handed
//! out, as in vLLM (null block) and SGLang (dummy slot).
//!
//! With a GPU backend the memory lives on the device, laid out by the same descriptor, and this
//! cache only keeps the block accounting ([`KvCache::accounting_only`]); the backend then does
//! the reads, writes and page conversions itself.

pub(crate) use blocks::Blocks;
use half::{bf16, f16, slice::HalfFloatSliceExt};
use xinf_engine::{KvDtype, PAGE_TOKENS};
use xinf_transfer::{Direction, LayoutDescriptor, copy_pages};

pub(crate) use attend::DecodeQuery;

/// An element type the cache can hold.
pub(crate) trait KvElem: Copy + Default + Send + Sync + 'static {
    fn from_f32(v: f32) -> Self;
    /// `src` widened into `dst` (same length), with SIMD where the type has it.
    fn to_f32_slice(src: &[Self], dst: &mut [f32]);
    /// `src` itself where the type is F32, so that a reader need not copy it.
    fn as_f32(_src: &[Self]) -> Option<&[f32]> {
        None
    }
    fn write_le(self, out: &mut Vec<u8>);
    fn read_le(bytes: &[u8]) -> Self;
}

impl KvElem for f32 {
    fn from_f32(v: f32) -> Self {
        v
    }
    fn to_f32_slice(src: &[Self], dst: &mut [f32]) {
        dst.copy_from_slice(src);
    }
    fn as_f32(src: &[Self]) -> Option<&[f32]> {
        Some(src)
    }
    fn write_le(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_le_bytes());
    }
    fn read_le(b: &[u8]) -> Self {
        f32::from_le_bytes([b[0], b[1], b[2], b[3]])
    }
}

impl KvElem for f16 {
    fn from_f32(v: f32) -> Self {
        f16::from_f32(v)
    }
    fn to_f32_slice(src: &[Self], dst: &mut [f32]) {
        src.convert_to_f32_slice(dst);
    }
    fn write_le(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_bits().to_le_bytes());
    }
    fn read_le(b: &[u8]) -> Self {
        f16::from_bits(u16::from_le_bytes([b[0], b[1]]))
    }
}

impl KvElem for bf16 {
    fn from_f32(v: f32) -> Self {
        bf16::from_f32(v)
    }
    fn to_f32_slice(src: &[Self], dst: &mut [f32]) {
        src.convert_to_f32_slice(dst);
    }
    fn write_le(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_bits().to_le_bytes());
    }
    fn read_le(b: &[u8]) -> Self {
        bf16::from_bits(u16::from_le_bytes([b[0], b[1]]))
    }
}

/// The regions of the cache, in one element type.
enum Regions {
    F32(Vec<Vec<f32>>),
    F16(Vec<Vec<f16>>),
    Bf16(Vec<Vec<bf16>>),
    /// No host memory: the backend holds the cache (on a GPU).
    Elsewhere,
}

macro_rules! with_regions {
    ($self:expr, $r:ident => $body:expr) => {
        match &$self.regions {
            Regions::F32($r) => $body,
            Regions::F16($r) => $body,
            Regions::Bf16($r) => $body,
            Regions::Elsewhere => {}
        }
    };
    (mut $self:expr, $r:ident => $body:expr) => {
        match &mut $self.regions {
            Regions::F32($r) => $body,
            Regions::F16($r) => $body,
            Regions::Bf16($r) => $body,
            Regions::Elsewhere => {}
        }
    };
}

/// KV memory plus its allocator.
pub(crate) struct KvCache {
    desc: LayoutDescriptor,
    dtype: KvDtype,
    regions: Regions,
    blocks: Blocks,
}

impl KvCache {
    /// Allocates a zeroed cache for `desc`.
    pub(crate) fn new(desc: LayoutDescriptor, dtype: KvDtype) -> Self {
        let (n, len) = (desc.num_regions, desc.region_len);
        let regions = match dtype {
            KvDtype::F32 => Regions::F32(vec![vec![0.0; len]; n]),
            KvDtype::F16 => Regions::F16(vec![vec![f16::ZERO; len]; n]),
            KvDtype::Bf16 => Regions::Bf16(vec![vec![bf16::ZERO; len]; n]),
        };
        let blocks = Blocks::new(desc.num_blocks, desc.layout.block_size, false);
        Self { desc, dtype, regions, blocks }
    }

    /// Block accounting for a cache whose memory a backend holds elsewhere (a GPU): the row
    /// and page methods of this type do nothing on it.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn accounting_only(desc: LayoutDescriptor, dtype: KvDtype) -> Self {
        let blocks = Blocks::new(desc.num_blocks, desc.layout.block_size, false);
        Self { desc, dtype, regions: Regions::Elsewhere, blocks }
    }

    /// Keeps full blocks of computed tokens for later prompts that begin with the same tokens
    /// ([`blocks`]), keyed by their row kinds too where those decide the K and V (quantized
    /// weights on the CPU); set before the cache is used.
    pub(crate) fn with_prefix_caching(mut self, on: bool, by_row_kind: bool) -> Self {
        self.blocks = Blocks::new(self.desc.num_blocks, self.desc.layout.block_size, on);
        self.blocks.set_by_row_kind(by_row_kind);
        self
    }

    /// Tokens per block.
    pub(crate) fn block_size(&self) -> usize {
        self.desc.layout.block_size
    }

    /// Blocks that can be handed out (all but block 0).
    pub(crate) fn capacity_blocks(&self) -> usize {
        self.desc.num_blocks - 1
    }

    /// Blocks that can be handed out now, cached blocks nobody holds included.
    pub(crate) fn free_blocks(&self) -> usize {
        self.blocks.free_blocks()
    }

    /// Blocks needed to hold `tokens` tokens.
    pub(crate) fn blocks_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.block_size())
    }

    /// Grows `table` to cover `tokens` tokens; `false` (and no change) when memory is short.
    pub(crate) fn ensure(&mut self, table: &mut Vec<u32>, tokens: usize) -> bool {
        let need = self.blocks_for(tokens).saturating_sub(table.len());
        self.blocks.take(table, need)
    }

    /// Returns a sequence's blocks.
    pub(crate) fn release(&mut self, table: &mut Vec<u32>) {
        self.blocks.release(table);
    }

    /// The allocator, for what the prefix cache does beyond handing out and taking back
    /// blocks (taking cached blocks, caching computed ones).
    pub(crate) fn blocks(&mut self) -> &mut Blocks {
        &mut self.blocks
    }

    /// The block size when full blocks are kept for later prompts; `None` when they are not.
    pub(crate) fn prefix_block_size(&self) -> Option<usize> {
        self.blocks.caching().then(|| self.block_size())
    }

    /// Writes `n` tokens of K (`kv = 0`) or V (`kv = 1`) for `layer`, starting at position
    /// `start`; `rows` is `[n][kv_heads][head_dim]`.
    pub(crate) fn write(&mut self, layer: usize, kv: usize, table: &[u32], start: usize, rows: &[f32]) {
        let (h, d) = (self.desc.kv_heads, self.desc.head_dim);
        let desc = &self.desc;
        with_regions!(mut self, regions => {
            for (i, row) in rows.chunks_exact(h * d).enumerate() {
                for head in 0..h {
                    let (r, o) = desc.token_offset(table, layer, kv, start + i, head);
                    let dst = &mut regions[r][o..o + d];
                    for (x, y) in dst.iter_mut().zip(&row[head * d..(head + 1) * d]) {
                        *x = KvElem::from_f32(*y);
                    }
                }
            }
        })
    }

    /// Reads positions `0..len` of `layer`'s K or V into `out` as `[kv_heads][len][head_dim]`.
    pub(crate) fn gather(&self, layer: usize, kv: usize, table: &[u32], len: usize, out: &mut Vec<f32>) {
        let (h, d) = (self.desc.kv_heads, self.desc.head_dim);
        out.clear();
        out.resize(h * len * d, 0.0);
        let desc = &self.desc;
        with_regions!(self, regions => {
            for head in 0..h {
                for t in 0..len {
                    let (r, o) = desc.token_offset(table, layer, kv, t, head);
                    let dst = &mut out[(head * len + t) * d..(head * len + t + 1) * d];
                    KvElem::to_f32_slice(&regions[r][o..o + d], dst);
                }
            }
        })
    }

    /// Copies canonical pages (`[layers][K, V][64][kv_heads][head_dim]`, raw little-endian
    /// words) of a sequence of `len` tokens out of the cache. Positions past `len` are zero.
    pub(crate) fn export_pages(
        &mut self,
        table: &[u32],
        len: usize,
        first_page: usize,
        count: usize,
    ) -> Vec<u8> {
        let desc = &self.desc;
        let elems = count * page_elems(desc);
        let mut out = Vec::with_capacity(elems * self.dtype.size());
        with_regions!(mut self, regions => {
            let mut views: Vec<&mut [_]> = regions.iter_mut().map(|r| r.as_mut_slice()).collect();
            let mut words = vec![Default::default(); elems];
            copy_pages(Direction::Gather, desc, &mut views, table, len, first_page..first_page + count, &mut words);
            for w in words {
                w.write_le(&mut out);
            }
        });
        out
    }

    /// Scatters canonical pages covering positions `0..len` into the sequence's blocks.
    pub(crate) fn import_pages(&mut self, table: &[u32], len: usize, pages: &[u8]) {
        let desc = &self.desc;
        let es = self.dtype.size();
        let count = len.div_ceil(PAGE_TOKENS);
        with_regions!(mut self, regions => {
            let mut views: Vec<&mut [_]> = regions.iter_mut().map(|r| r.as_mut_slice()).collect();
            let mut words: Vec<_> = pages.chunks_exact(es).map(KvElem::read_le).collect();
            copy_pages(Direction::Scatter, desc, &mut views, table, len, 0..count, &mut words);
        })
    }
}

/// Elements of one canonical page.
fn page_elems(desc: &LayoutDescriptor) -> usize {
    desc.num_layers * 2 * PAGE_TOKENS * desc.kv_heads * desc.head_dim
}

mod attend;
mod blocks;
#[cfg(test)]
mod tests;
