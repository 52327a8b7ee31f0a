//! The host side of the GPU backend: everything a launch relies on that can be computed and
//! checked before any kernel runs. A step's plan (token ids, positions, block tables, rows of
//! logits) is flattened and bounds-checked here; so are the model's shape against what the
//! kernels handle, the cache layout's reach into its regions, the sizes of the step buffers
//! and of every matmul. The kernels index memory with these values unchecked, which is what
//! the SAFETY comments of the launches point back to.
//!
//! Nothing here touches CUDA, so this module is compiled in every build and its tests run on
//! machines without a GPU.

use crate::model::{Chunk, inv_freq};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use xinf_engine::{KvDtype, PAGE_TOKENS};
use xinf_models::ModelConfig;
use xinf_transfer::LayoutDescriptor;

/// The kernels' source; compiled at run time with the type codes, warp count and head
/// dimension defined first.
const KERNELS: &str = include_str!("kernels.cu");

/// The small-batch product kernel (`gemv`), compiled with the others.
const GEMV: &str = include_str!("gemv.cu");

/// The tensor-core prefill attention kernel (`flash_prefill`), compiled with the others; it is
/// only defined where [`flash_fits`] holds.
const FLASH: &str = include_str!("flash.cu");

/// Its Hopper kernel, in place of `flash.cu`'s where that file says (`FLASH_SM90`).
const FLASH_SM90: &str = include_str!("flash_sm90.cu");

/// The decode attention on tensor cores (`flash_decode`), on `flash.cu`'s fragment helpers.
const DECODE: &str = include_str!("decode.cu");

/// Query tokens of one `flash_prefill` block (`flash_rows` in `flash.cu`, which the GPU code
/// checks against this at load): the K and V tiles it copies serve that many rows.
pub(super) const FLASH_TILE: usize = 128;
/// The most `flash_prefill` tiles a step launches: the grid's second dimension.
const FLASH_MAX_TILES: usize = 65_535;

/// Warps of one `attention` block (one query token, the heads of one [`attention_group`], one
/// split of its keys). Each warp
/// takes every `ATTENTION_WARPS × splits`-th group of 32 keys; the splits, not the warps, are
/// what grows with the work a step lacks (see [`attention_splits`]).
pub(super) const ATTENTION_WARPS: u32 = 4;

/// Most splits of one query's keys in `attention` (the partial buffer holds this many per row).
pub(super) const MAX_SPLITS: usize = 16;

/// `attention` blocks worth launching per SM: 16 blocks of 4 warps fill an SM's 64 warp slots
/// on sm_80/sm_90, so the key walks' load latencies overlap.
const BLOCKS_PER_SM: usize = 16;

/// Blocks of one head per SM from which a step's queries are enough to fill the GPU without
/// splitting their keys much: from there `attention` takes the GQA group's heads per block.
const HEAD_BLOCKS_PER_SM: usize = 4;

/// How many blocks share each query's keys in `attention`, for `queries` queries of `heads`
/// blocks of heads each on a GPU of `sms` SMs, when the partial buffer holds `part_rows` queries: enough
/// blocks to fill the GPU, up to [`MAX_SPLITS`], or 1 (no merge) when a step has more queries
/// than the buffer. Depends on the step's shape alone, so a captured graph stays valid.
pub(super) fn attention_splits(queries: usize, heads: usize, sms: usize, part_rows: usize) -> usize {
    fill_splits(queries, heads, sms * BLOCKS_PER_SM, part_rows)
}

/// Splits of each query's keys so that `queries × blocks` blocks reach `wanted`, up to
/// [`MAX_SPLITS`]; 1 (no merge) for no queries or more than the partial buffer's `part_rows`.
fn fill_splits(queries: usize, blocks: usize, wanted: usize, part_rows: usize) -> usize {
    if queries == 0 || queries > part_rows {
        return 1;
    }
    wanted.div_ceil(queries * blocks).clamp(1, MAX_SPLITS)
}

/// Query heads per `attention` block for a step of `queries` queries of `heads` heads, when the
/// model's GQA group allows `group` ([`attention_group`]): the group when blocks of one head
/// would already fill the GPU (many queries: the K/V reads, which a group shares, are what
/// bound the step), else 1 (few queries: the time is each warp's chain of loads, and blocks of
/// one head spread the keys over `group` times as many warps).
pub(super) fn attention_heads(queries: usize, heads: usize, group: usize, sms: usize) -> usize {
    if queries * heads >= sms * HEAD_BLOCKS_PER_SM { group } else { 1 }
}

/// Query heads of one `attention` block: the largest divisor of the GQA group (`heads /
/// kv_heads` query heads per KV head) up to 8, so each K and V row a block reads serves that
/// many heads (the registers per lane grow with it).
pub(super) fn attention_group(heads: usize, kv_heads: usize) -> usize {
    let group = heads / kv_heads.max(1);
    (1..=group.min(8)).rev().find(|g| group.is_multiple_of(*g)).unwrap_or(1)
}

/// Largest head dimension the attention kernels hold in registers (32 lanes × 8).
const MAX_HEAD_DIM: usize = 256;

/// Decode steps of at most this many sequences are replayed as CUDA graphs, one graph per batch
/// size: launch overhead dominates small batches, and this bounds the graphs kept to 64.
const MAX_GRAPH_BATCH: usize = 64;

/// The kernels' type code (`WT`/`KT`).
fn type_code(dt: KvDtype) -> u32 {
    match dt {
        KvDtype::F32 => 0,
        KvDtype::F16 => 1,
        KvDtype::Bf16 => 2,
    }
}

/// The kernels' source for weights in `wdt`, a cache in `kdt`, heads of `head_dim`, `group`
/// query heads per `attention` block ([`attention_group`]), `gqa` query heads per KV head and a
/// hidden size of `hidden`.
pub(super) fn kernel_source(
    wdt: KvDtype,
    kdt: KvDtype,
    [head_dim, group, gqa, hidden]: [usize; 4],
) -> String {
    format!(
        "#define WT {}\n#define KT {}\n#define WARPS {ATTENTION_WARPS}\n#define HD {head_dim}\n#define GB {group}\n\
         #define GQ {gqa}\n#define HID {hidden}\n#define MAX_SPLITS {MAX_SPLITS}\n#define DK {}\n\
         {KERNELS}\n{GEMV}\n{FLASH}\n{FLASH_SM90}\n{DECODE}",
        type_code(wdt),
        type_code(kdt),
        decode_tile_keys(head_dim)
    )
}

/// Whether `flash_prefill` exists for a cache in `kdt` with heads of `head_dim` on a GPU of
/// compute capability `major` (the conditions `flash.cu` is compiled under): 16-bit elements
/// for the tensor cores, whole 16-row k-steps, fragments that fit the registers, `mma.sync`
/// of sm_80.
pub(super) fn flash_fits(kdt: KvDtype, head_dim: usize, major: i32) -> bool {
    kdt != KvDtype::F32 && head_dim.is_multiple_of(16) && head_dim <= 128 && major >= 8
}

/// Whether `flash_decode` exists: where `flash_prefill` does ([`flash_fits`]) and a KV head's
/// `gqa` query heads fit one tensor-core tile (as its 8 columns up to 8, as its 16 rows up to 16).
pub(super) fn flash_decode_fits(kdt: KvDtype, head_dim: usize, major: i32, gqa: usize) -> bool {
    flash_fits(kdt, head_dim, major) && (1..=16).contains(&gqa)
}

/// Warps of one `flash_decode` block (`DW` in `decode.cu`).
pub(super) const DECODE_WARPS: u32 = 4;

/// Whether `flash_decode_qkv` exists beside `flash_decode` (the conditions `decode.cu` compiles it
/// under): `qkv_post`'s 16-byte form (heads of a multiple of 64, up to 512: `QKV_TPH` = a 16th of
/// the head threads a head), whose parts of a KV head's `gqa` query heads and its K and V heads
/// fit one block's threads.
pub(super) fn decode_qkv_fits(head_dim: usize, gqa: usize) -> bool {
    head_dim.is_multiple_of(64)
        && head_dim <= 512
        && (gqa + 2) * (head_dim / 16) <= 32 * DECODE_WARPS as usize
}

mod deal;
#[cfg_attr(not(feature = "cuda"), allow(unused_imports))]
pub(super) use deal::{deal_decode_blocks, decode_tile_keys};

/// `flash_decode` blocks per SM to launch at most, over all splits: one. Fewer splits give
/// each warp more 16-key tiles to walk, and what a block pays once (its block-table and Q
/// loads, the merge of its warps and of the splits) is spread over more keys. On an H100, for
/// the 8B shape's 16 queries of 1,000 keys (Nsight Compute, per layer): 2 splits (256 blocks)
/// 33.5 µs, 4 splits 42.3 µs; the GQA-row kernel this replaced took 53.8 µs at 5 splits.
const DECODE_BLOCKS_PER_SM: usize = 1;

/// How many blocks share each query's keys in `flash_decode`, for `queries` queries of
/// `kv_heads` blocks each on a GPU of `sms` SMs, when the partial buffer holds `part_rows`
/// queries: about a block per SM, up to [`MAX_SPLITS`], or 1 (no merge) past the buffer.
/// Depends on the step's shape alone, so a captured graph stays valid; it is the grid's, whose
/// blocks the host deals to the queries by length every step ([`deal_decode_blocks`]).
pub(super) fn decode_splits(queries: usize, kv_heads: usize, sms: usize, part_rows: usize) -> usize {
    fill_splits(queries, kv_heads, sms * DECODE_BLOCKS_PER_SM, part_rows)
}

/// Most rows of a product `gemv` takes (`GEMV_ROWS` in `gemv.cu`); steps of more sequences
/// multiply in cuBLAS. Timed against cuBLAS on an H200 (`doc/bench/gpu/gemv_bench.py`, each
/// product in a CUDA graph), `gemv` is as fast or faster for one row (the 0.5B shape's QKV 2.5
/// against 4.0 µs, the 8B shape's 1 GB head 230 against 239) and far slower from four rows on,
/// where every lane widens each activation row's words again for each weight word (the 8B
/// gate/up at four rows: 95 against 56 µs). At two rows it is slower on large weights alone,
/// and decode steps of two sequences were 3 % faster with it throughout than with cuBLAS past
/// 16 MB (0.5B shape; the 8B shape's within 1 %).
pub(super) const GEMV_ROWS: usize = 2;

/// Which `gemv` kernel takes a product of `rows` (1 to `GEMV_ROWS`): the index into `gemv1`,
/// `gemv2`. A kernel keeps a sum per row of its capacity, so one row needs fewer registers;
/// both sum a row in the same order, so the choice never changes a result.
pub(super) fn gemv_kernel(rows: usize) -> usize {
    rows.clamp(1, GEMV_ROWS) - 1
}

/// Whether a product of `rows` rows of `inp` values takes `gemv_glu` (the MLP's gate/up product
/// and SiLU·up in one kernel): where `gemv` would take it, and its rows are split over at most
/// 4 warps (`inp` up to 4,096), so a block of 8 warps holds a gate row and its up row.
pub(super) fn gemv_glu_fits(rows: usize, inp: usize) -> bool {
    (1..=GEMV_ROWS).contains(&rows) && inp.is_multiple_of(8) && gemv_split(inp) <= 4
}

/// Whether a decode step of `rows` sequences runs its layers' norms inside the products after
/// them (`gemv_norm`, `gemv_glu_norm`), the products before them adding into the residual
/// stream: a step of one sequence with 16-bit weights (the `gemv` kernels exist), every
/// product's input whole 16-byte words (`hidden`, the attention output's `heads_dim` and
/// `inter` multiples of 8), and a norm's row `rmsnorm`'s whole-register row (`hidden` at
/// most 8,192; `HID` and `ROW_VECS` in the kernels). Two kernels a layer fewer. On an H100, 0.5B
/// shape, a decode step of one sequence took 0.95× the unfused one's time, one of two 1.04×:
/// each block works both rows' norms out, one after the other, before its first product.
pub(super) fn norms_fused_fit(rows: usize, [hidden, heads_dim, inter]: [usize; 3]) -> bool {
    rows == 1 && [hidden, heads_dim, inter].iter().all(|d| d.is_multiple_of(8)) && hidden <= 8192
}

/// Row groups of a `gemv` product of `out` rows of `inp` values (a group is the 8 / S rows a
/// block takes at once, S = [`gemv_split`]), and of a `gemv_glu` product of `inter` gate/up row
/// pairs (4 / S pairs a group): the plain kernels' grids.
pub(super) fn gemv_groups(out: usize, inp: usize) -> usize {
    out.div_ceil(8 / gemv_split(inp))
}

pub(super) fn gemv_glu_groups(inter: usize, inp: usize) -> usize {
    inter.div_ceil(4 / gemv_split(inp))
}

/// Whether a `_norm` product of `groups` row groups is worth its fused norm on a GPU that
/// holds `resident` of its blocks at once: each block then takes at most
/// [`NORM_GROUPS_A_BLOCK`] groups in turn. A block's groups wait on their weights one after
/// another, where the plain kernel's blocks (half the registers, so twice as many an SM) keep
/// more of them in flight. On an H100 the 0.5B shape's products take up to 3 groups a block
/// and its batch-1 decode step is 0.95× the unfused one's; the 8B shape's take 8 and 36, and
/// its step was 1.06×.
pub(super) fn norm_groups_fit(groups: usize, resident: usize) -> bool {
    groups <= NORM_GROUPS_A_BLOCK * resident
}

/// See [`norm_groups_fit`].
const NORM_GROUPS_A_BLOCK: usize = 4;

/// Warps of one `gemv` block that share an output row (the rest of its 8 warps take other
/// rows): enough that each lane loads at most 4 of the row's 16-byte words (`inp` 16-bit values,
/// a multiple of 8), all in flight at once; a power of two up to 8.
pub(super) fn gemv_split(inp: usize) -> usize {
    let words = inp / 8;
    let mut s = 1;
    while s < 8 && words > 128 * s {
        s *= 2;
    }
    s
}

/// Whether every K/V row of a cache can be read in whole 16-byte words: each plane's address
/// and every stride (elements of `es` bytes) on 16-byte boundaries, and rows of whole words.
/// The tensor-core kernels that need this also take each stride as 32 bits (a cache block's
/// offset is one 32 × 32-bit product), so a stride past that counts as unaligned too.
pub(super) fn rows_aligned(planes: &[[u64; 2]], strides: [usize; 3], head_dim: usize, es: usize) -> bool {
    let word = 16 / es;
    planes.iter().flatten().all(|a| a.is_multiple_of(16))
        && strides.iter().all(|&s| s.is_multiple_of(word) && u32::try_from(s).is_ok())
        && head_dim.is_multiple_of(word)
}

/// Why a model or a cache layout cannot run on the GPU backend.
#[derive(Debug, PartialEq)]
pub(super) enum ShapeError {
    /// The model has a shape the kernels do not handle.
    Unsupported(String),
    /// The cache layout does not fit the model or its own regions.
    Layout(String),
}

/// Checks a model and its cache layout before anything is allocated: a head dimension the
/// attention kernel can hold, a layout made for this model, and every layer's K and V planes
/// inside their regions, as far as any block, token and head can reach. Returns each plane's
/// `(region, byte offset)` in the cache's dtype `kdt`, per layer, K then V.
pub(super) fn check_model(
    cfg: &ModelConfig,
    desc: &LayoutDescriptor,
    kdt: KvDtype,
) -> Result<Vec<[(usize, usize); 2]>, ShapeError> {
    if cfg.head_dim > MAX_HEAD_DIM {
        return Err(ShapeError::Unsupported(format!("head_dim {} (at most {MAX_HEAD_DIM})", cfg.head_dim)));
    }
    // The farthest element any row can reach in a plane.
    let reach = (desc.num_blocks - 1) * desc.s_blk
        + (desc.block_size() - 1) * desc.s_tok
        + (desc.kv_heads - 1) * desc.s_head
        + desc.head_dim;
    let es = kdt.size();
    let mut planes = Vec::with_capacity(desc.num_layers);
    for (layer, pl) in desc.planes.iter().enumerate() {
        let mut pair = [(0, 0); 2];
        for kv in 0..2 {
            let plane = pl[kv];
            if plane.region >= desc.num_regions || plane.offset + reach > desc.region_len {
                return Err(ShapeError::Layout(format!("layer {layer} reaches past its region")));
            }
            pair[kv] = (plane.region, plane.offset * es);
        }
        planes.push(pair);
    }
    if desc.num_layers != cfg.num_layers || desc.kv_heads != cfg.kv_heads || desc.head_dim != cfg.head_dim {
        return Err(ShapeError::Layout("the KV layout does not match the model".into()));
    }
    Ok(planes)
}

/// Bytes of one canonical page of `desc` in `dt`.
pub(super) fn page_bytes(desc: &LayoutDescriptor, dt: KvDtype) -> usize {
    2 * desc.num_layers * PAGE_TOKENS * desc.kv_heads * desc.head_dim * dt.size()
}

/// Checks that canonical pages of `have` bytes cover a `len`-token sequence; returns how many
/// pages that is.
pub(super) fn pages_for(len: usize, have: usize, page_bytes: usize) -> Result<usize, String> {
    let count = len.div_ceil(PAGE_TOKENS);
    let need = count * page_bytes;
    if have < need {
        return Err(format!("{have} bytes of pages for {len} tokens, {need} expected"));
    }
    Ok(count)
}

/// RoPE's cos and sin tables, `[max_positions][head_dim / 2]`: the same f32 angles as the CPU
/// backend, from Hugging Face's inverse frequencies. A plan's positions are checked below
/// `max_positions`, the rows these tables have.
pub(super) fn rope_tables(cfg: &ModelConfig, max_positions: usize) -> (Vec<f32>, Vec<f32>) {
    let inv = inv_freq(cfg);
    let mut cos = Vec::with_capacity(max_positions * inv.len());
    let mut sin = Vec::with_capacity(max_positions * inv.len());
    for p in 0..max_positions {
        for f in &inv {
            let a = p as f32 * f;
            cos.push(a.cos());
            sin.push(a.sin());
        }
    }
    (cos, sin)
}

/// Checks that buffers of `[w, x, y]` bytes hold the matrices of `y[rows][out] =
/// x[rows][inp] · w[out][inp]ᵀ` as cuBLAS will read and write them: `w` and `x` in `es`-byte
/// elements, `y` in `ys`-byte elements.
pub(super) fn check_matmul(
    [w, x, y]: [usize; 3],
    [es, ys]: [usize; 2],
    [out, inp, rows]: [usize; 3],
) -> Result<(), String> {
    if w < out * inp * es || x < rows * inp * es || y < rows * out * ys {
        return Err(format!("matmul [{rows}, {inp}] × [{out}, {inp}]ᵀ over short buffers"));
    }
    Ok(())
}

/// What one step computes, flattened for the kernels; built and checked on the host.
#[derive(Debug, PartialEq)]
pub(super) struct StepPlan {
    /// Token ids, all chunks back to back.
    pub(super) ids: Vec<u32>,
    /// Position of each token.
    pub(super) pos: Vec<i32>,
    /// Where each token's block table starts in `tables`.
    pub(super) tab_off: Vec<i32>,
    /// The chunks' block tables (the blocks they reach), back to back.
    pub(super) tables: Vec<u32>,
    /// Token rows whose logits are wanted, in chunk order (every row of a chunk that asks for
    /// all of them).
    pub(super) rows: Vec<i32>,
    /// For each of `rows`, whether its chunk asked for the argmax alone.
    pub(super) row_argmax: Vec<bool>,
    /// `flash_prefill`'s tiles, `(first token, tokens)` pairs flattened: the chunks of two
    /// tokens or more, `FLASH_TILE` tokens a tile, from the tile that attends to the fewest
    /// keys to the one that attends to the most (the kernel runs them the other way round).
    /// Empty when the step has none or flash is off; then `attention` runs over every token.
    pub(super) tiles: Vec<i32>,
    /// With tiles, the tokens `attention` runs over: those of one-token chunks.
    pub(super) singles: Vec<i32>,
}

/// The counts a step's launches depend on: tokens, rows of logits, `flash_prefill` tiles and
/// the tokens `attention` takes from its list (0: all of them); and whether every token is its
/// sequence's only one in the step (`solo`), so that no token attends to a key another token of
/// the step writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct StepShape {
    pub(super) tokens: usize,
    pub(super) rows: usize,
    pub(super) tiles: usize,
    pub(super) singles: usize,
    pub(super) solo: bool,
}

impl StepShape {
    /// A decode step of `t` sequences, as graphs capture it: one token and one row each.
    pub(super) fn decode(t: usize) -> Self {
        Self { tokens: t, rows: t, tiles: 0, singles: 0, solo: true }
    }
}

impl StepPlan {
    pub(super) fn shape(&self) -> StepShape {
        StepShape {
            tokens: self.ids.len(),
            rows: self.rows.len(),
            tiles: self.tiles.len() / 2,
            singles: self.singles.len(),
            // Each chunk's block table starts past the last one's (a chunk reaches at least one
            // block), so tokens of one chunk, and only they, share an offset.
            solo: self.tab_off.windows(2).all(|w| w[0] != w[1]),
        }
    }
}

/// Flattens a step and checks everything a kernel will index with: token ids below `vocab`,
/// positions below `max_positions` (the RoPE table), block tables that cover every position
/// with blocks below `num_blocks`. With `flash`, chunks of two tokens or more are cut into
/// `flash_prefill` tiles.
pub(super) fn plan_step(
    chunks: &[Chunk<'_>],
    block_size: usize,
    num_blocks: usize,
    vocab: usize,
    max_positions: usize,
    flash: bool,
) -> Result<StepPlan, String> {
    let mut p = StepPlan {
        ids: Vec::new(),
        pos: Vec::new(),
        tab_off: Vec::new(),
        tables: Vec::new(),
        rows: Vec::new(),
        row_argmax: Vec::new(),
        tiles: Vec::new(),
        singles: Vec::new(),
    };
    // (keys its last row attends to, first token, tokens) of each flash tile.
    let mut tiles: Vec<(usize, i32, i32)> = Vec::new();
    for c in chunks {
        let end = c.start + c.tokens.len();
        if end > max_positions {
            return Err(format!("position {} is past the model's {max_positions}", end - 1));
        }
        let blocks = end.div_ceil(block_size);
        let table = c
            .block_table
            .get(..blocks)
            .ok_or_else(|| format!("a block table of {} blocks for {end} tokens", c.block_table.len()))?;
        if let Some(b) = table.iter().find(|&&b| b as usize >= num_blocks) {
            return Err(format!("block {b} is outside the cache's {num_blocks}"));
        }
        if let Some(t) = c.tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(format!("token {t} is outside the vocabulary of {vocab}"));
        }
        let off = p.tables.len() as i32;
        p.tables.extend_from_slice(table);
        let first = p.ids.len();
        if c.tokens.len() == 1 {
            p.singles.push(first as i32);
        } else {
            for at in (0..c.tokens.len()).step_by(FLASH_TILE) {
                let n = FLASH_TILE.min(c.tokens.len() - at);
                tiles.push((c.start + at + n, (first + at) as i32, n as i32));
            }
        }
        for (i, &t) in c.tokens.iter().enumerate() {
            p.ids.push(t);
            p.pos.push((c.start + i) as i32);
            p.tab_off.push(off);
        }
        if c.all_logits {
            p.rows.extend(first as i32..p.ids.len() as i32);
            p.row_argmax.resize(p.rows.len(), false);
        } else if c.want_logits && !c.tokens.is_empty() {
            p.rows.push(p.ids.len() as i32 - 1);
            p.row_argmax.push(c.argmax);
        }
    }
    if p.tables.is_empty() {
        p.tables.push(0);
    }
    tiles.sort_by_key(|&(keys, ..)| keys);
    // Tiles are `flash_prefill`'s second grid dimension, at most 65,535 blocks: a step with more
    // (no configuration xinf ships makes one) runs `attention` over every token instead.
    let fits_grid = tiles.len() <= FLASH_MAX_TILES;
    p.tiles = tiles.into_iter().flat_map(|(_, first, n)| [first, n]).collect();
    if !flash || !fits_grid || p.tiles.is_empty() {
        p.tiles.clear();
        p.singles.clear();
    }
    Ok(p)
}

/// Whether a step may replay a graph: decode-only (one token per sequence, each wanting its
/// logits), the steps whose launches depend on the batch size alone, since everything else
/// about them (ids, positions, block tables, rows) is read from device memory.
pub(super) fn is_decode(chunks: &[Chunk<'_>]) -> bool {
    chunks.iter().all(|c| c.tokens.len() == 1 && c.want_logits)
}

/// The runs of consecutive rows whose logits the host needs (those not taken as an argmax):
/// each is copied from the device in one transfer, so a step of sampled requests costs one copy,
/// not one per row.
pub(super) fn logit_runs(row_argmax: &[bool]) -> Vec<std::ops::Range<usize>> {
    let mut runs: Vec<std::ops::Range<usize>> = Vec::new();
    for (r, _) in row_argmax.iter().enumerate().filter(|(_, argmax)| !**argmax) {
        match runs.last_mut() {
            Some(run) if run.end == r => run.end = r + 1,
            _ => runs.push(r..r + 1),
        }
    }
    runs
}

/// What the persistent step buffers are sized for, and whether decode steps replay CUDA graphs.
#[derive(Debug, Clone)]
pub(crate) struct StepLimits {
    /// Tokens of the largest step the engine forms (`max_batch_tokens`, at least
    /// `max_num_seqs`, since every running sequence gets its decode token).
    pub(crate) max_tokens: usize,
    /// Sequences of one step at most (`max_num_seqs`): the rows of logits a step returns.
    pub(crate) max_seqs: usize,
    /// Replay decode-only steps as CUDA graphs (engine option `cuda_graphs`).
    pub(crate) cuda_graphs: bool,
    /// Counts the steps computed by replaying a graph; the engine reads it for tests and
    /// benchmarks.
    pub(crate) graph_steps: Arc<AtomicU64>,
    /// Counts the programmatic edges put between kernels of captured graphs (`graphs.rs`).
    pub(crate) graph_links: Arc<AtomicU64>,
}

impl StepLimits {
    /// The room of the step buffers kept for the model's life, in a cache of `num_blocks`:
    /// every sequence's blocks are its own, so the tables of one step hold at most the cache's
    /// blocks (one stand-in entry when there are none).
    pub(super) fn capacity(&self, num_blocks: usize) -> StepCapacity {
        StepCapacity::new(self.max_tokens.max(self.max_seqs), num_blocks, self.max_seqs)
    }

    /// Graph slots to keep, indexed by batch size (`0..=` the largest graphed batch); none
    /// with graphs off.
    pub(super) fn graph_slots(&self) -> usize {
        if self.cuda_graphs { self.max_seqs.min(MAX_GRAPH_BATCH) + 1 } else { 0 }
    }
}

/// Bytes of the forward pass's buffers on a GPU for steps of up to `tokens` tokens and `seqs`
/// sequences, for weights in `wdt` and a cache in `kdt` (what `StepBufs::new` allocates):
/// per token Q in the cache's dtype, the residual stream, Q/K/V, the activations and the
/// gate/up projection in the weights'; per sequence a row of logits and attention's
/// partial results. Set aside with the weights, so a large `max_batch_tokens` takes its room
/// from the KV cache rather than failing at the first long prompt.
pub fn step_buffer_bytes(cfg: &ModelConfig, tokens: usize, seqs: usize, [wdt, kdt]: [KvDtype; 2]) -> u64 {
    let (h, kvh, d) = (cfg.num_heads, cfg.kv_heads, cfg.head_dim);
    let (hid, inter) = (cfg.hidden_size, cfg.intermediate_size);
    let es = wdt.size();
    let per_token =
        kdt.size() * h * d + es * (hid + (h + 2 * kvh) * d + hid.max(h * d).max(inter) + 2 * inter);
    let per_seq = 4 * (cfg.vocab_size + h * MAX_SPLITS * (d + 2));
    (tokens as u64)
        .saturating_mul(per_token as u64)
        .saturating_add((seqs as u64).saturating_mul(per_seq as u64))
}

/// Room in a set of step buffers: tokens, block-table entries and rows of logits, each at
/// least 1 (there are no empty device buffers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct StepCapacity {
    pub(super) tokens: usize,
    pub(super) tables: usize,
    pub(super) rows: usize,
}

impl StepCapacity {
    pub(super) fn new(tokens: usize, tables: usize, rows: usize) -> Self {
        Self { tokens: tokens.max(1), tables: tables.max(1), rows: rows.max(1) }
    }

    /// Just the room `plan` needs.
    pub(super) fn of(plan: &StepPlan) -> Self {
        Self::new(plan.ids.len(), plan.tables.len(), plan.rows.len())
    }

    /// Whether `plan` fits.
    pub(super) fn fits(&self, plan: &StepPlan) -> bool {
        plan.ids.len() <= self.tokens
            && plan.tables.len() <= self.tables
            && plan.rows.len() <= self.rows
            && plan.tiles.len() <= 2 * self.tokens
            && plan.singles.len() <= self.tokens
    }
}

#[cfg(test)]
mod tests;
