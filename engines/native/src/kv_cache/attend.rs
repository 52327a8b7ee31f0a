//! Decode attention on the CPU: one query token per sequence, reading K and V straight from
//! the cache through the layout's strides, block by block (an F32 cache in place, F16/BF16 a row
//! at a time), all of a step's sequences at once.
//!
//! The work is split into one item per (sequence, KV head, [`CHUNK`] positions): the GQA group
//! of query heads that share a KV head reads each K and V row once, and a long context is
//! spread over the threads even at batch 1 (one item per KV head left a 3-KV-head model's step
//! on two cores two items long on one of them, one on the other). Each item leaves its heads'
//! maximum score, sum of weights and unnormalised output; the chunks of a head are then merged
//! in position order on the calling thread, as split-K flash decoding does on a GPU. Items run
//! on candle's CPU thread pool (the one the quantized products use). Each item's arithmetic is
//! fixed (dot products in eight lanes summed in a fixed order) and the chunks are fixed by
//! position, so a sequence's result does not depend on how many others share the step.
//!
//! Unsafe code: the item's loops compiled a second time for AVX2 (eight lanes to a register
//! where the baseline target has four), called behind a run-time CPU check. Neither build fuses
//! a multiply with its add, so both give the same bits.
#![allow(unsafe_code)]

use super::{KvCache, KvElem, Regions};
use std::sync::Mutex;
use xinf_transfer::LayoutDescriptor;

/// One sequence's query in a decode step.
pub(crate) struct DecodeQuery<'a> {
    /// The sequence's blocks.
    pub(crate) table: &'a [u32],
    /// Positions `0..len` are attended (the query token's own K and V already written).
    pub(crate) len: usize,
}

/// Lanes of the dot products: independent partial sums, so a dot product is not one chain of
/// dependent additions, and the compiler can keep them in vector registers.
const LANES: usize = 8;

/// Positions of one work item: small enough that a context of a few hundred tokens fills two
/// or more cores at batch 1, large enough that an item's merge and hand-off are a small part
/// of its work (a multiple of every block size, so an item starts at a block's first row).
const CHUNK: usize = 128;

/// Score rows (query heads × positions) below which the items run on the calling thread: the
/// pool's hand-off costs more than it saves.
const POOL_FROM_SCORES: usize = 512;

/// One work item: a sequence's KV head over positions `from..from + CHUNK` (or its end).
#[derive(Clone, Copy)]
struct Item {
    query: usize,
    kv_head: usize,
    from: usize,
}

impl KvCache {
    /// Attention of one query token for each of `queries` at `layer`.
    ///
    /// `q` is `[queries][num_heads][head_dim]` (after RoPE); `out` receives the same shape.
    /// Query heads are grouped over KV heads as in GQA.
    pub(crate) fn attend_decode(
        &self,
        layer: usize,
        queries: &[DecodeQuery<'_>],
        q: &[f32],
        num_heads: usize,
        scale: f32,
        out: &mut [f32],
    ) {
        self.attend_decode_on(layer, queries, q, num_heads, scale, out, avx2());
    }

    /// [`attend_decode`](Self::attend_decode) with the items' loops built for AVX2 (`wide`,
    /// which this CPU must have) or for the baseline target.
    #[allow(clippy::too_many_arguments, reason = "attend_decode's, and which build of the loops")]
    pub(super) fn attend_decode_on(
        &self,
        layer: usize,
        queries: &[DecodeQuery<'_>],
        q: &[f32],
        num_heads: usize,
        scale: f32,
        out: &mut [f32],
        wide: bool,
    ) {
        let (kvh, d) = (self.desc.kv_heads, self.desc.head_dim);
        let group = num_heads / kvh * d;
        // The items of (sequence `b`, KV head `kh`) are contiguous, in position order; they own
        // query heads `kh * g..(kh + 1) * g` of sequence `b`, contiguous in `q` and `out`.
        let items: Vec<Item> = queries
            .iter()
            .enumerate()
            .flat_map(|(query, s)| {
                (0..kvh).flat_map(move |kv_head| {
                    (0..s.len.div_ceil(CHUNK)).map(move |c| Item { query, kv_head, from: c * CHUNK })
                })
            })
            .collect();
        let partials: Vec<Mutex<Partial>> = items.iter().map(|_| Mutex::default()).collect();
        let desc = &self.desc;
        let work = |i: usize, scratch: &mut Scratch| {
            let Item { query, kv_head, from } = items[i];
            let s = &queries[query];
            let at = Head { desc, layer, table: s.table, kv_head, from, to: s.len.min(from + CHUNK) };
            let qg = &q[(query * kvh + kv_head) * group..][..group];
            let mut part = partials[i].lock().unwrap_or_else(|e| e.into_inner());
            match &self.regions {
                Regions::F32(r) => at.attend_on(r, qg, scale, scratch, &mut part, wide),
                Regions::F16(r) => at.attend_on(r, qg, scale, scratch, &mut part, wide),
                Regions::Bf16(r) => at.attend_on(r, qg, scale, scratch, &mut part, wide),
                Regions::Elsewhere => {}
            }
        };
        let score_rows: usize = queries.iter().map(|s| s.len * num_heads).sum();
        if score_rows < POOL_FROM_SCORES || items.len() < 2 {
            let mut scratch = Scratch::default();
            (0..items.len()).for_each(|i| work(i, &mut scratch));
        } else {
            candle_core::utils::barrier_pool().execute_chunked(items.len(), |range| {
                let mut scratch = Scratch::default();
                range.for_each(|i| work(i, &mut scratch));
            });
        }
        let parts: Vec<Partial> =
            partials.into_iter().map(|p| p.into_inner().unwrap_or_else(|e| e.into_inner())).collect();
        let mut at = 0;
        for (o, s) in out.chunks_mut(group).zip(queries.iter().flat_map(|s| std::iter::repeat_n(s, kvh))) {
            let n = s.len.div_ceil(CHUNK);
            merge(&parts[at..at + n], d, o);
            at += n;
        }
    }
}

/// One item's result for each query head of its group: the largest score, the sum of
/// `exp(score − max)` and the values weighted by it (`[g][head_dim]`, not yet divided).
#[derive(Default)]
struct Partial {
    max: Vec<f32>,
    sum: Vec<f32>,
    out: Vec<f32>,
}

/// The chunks of a group of heads merged in position order into `out` (`[g][head_dim]`); no
/// chunks (no positions) leave it zero.
fn merge(chunks: &[Partial], d: usize, out: &mut [f32]) {
    for (h, o) in out.chunks_exact_mut(d).enumerate() {
        let max = chunks.iter().map(|c| c.max[h]).fold(f32::NEG_INFINITY, f32::max);
        o.fill(0.0);
        let mut sum = 0.0f32;
        for c in chunks {
            let w = (c.max[h] - max).exp();
            sum += c.sum[h] * w;
            for (acc, x) in o.iter_mut().zip(&c.out[h * d..(h + 1) * d]) {
                *acc += w * x;
            }
        }
        let inv = if sum > 0.0 { 1.0 / sum } else { 0.0 };
        o.iter_mut().for_each(|x| *x *= inv);
    }
}

/// Where one item reads: a KV head of a sequence at a layer, positions `from..to`.
struct Head<'a> {
    desc: &'a LayoutDescriptor,
    layer: usize,
    table: &'a [u32],
    kv_head: usize,
    from: usize,
    to: usize,
}

impl Head<'_> {
    /// [`attend`](Self::attend) built for AVX2 where `wide` (this CPU has it), else for the
    /// baseline.
    fn attend_on<T: KvElem>(
        &self,
        regions: &[Vec<T>],
        q: &[f32],
        scale: f32,
        scratch: &mut Scratch,
        part: &mut Partial,
        wide: bool,
    ) {
        #[cfg(target_arch = "x86_64")]
        if wide {
            // SAFETY: `wide` only where this CPU has AVX2 (`attend_decode_on`'s contract).
            return unsafe { self.attend_avx2(regions, q, scale, scratch, part) };
        }
        let _ = wide;
        self.attend(regions, q, scale, scratch, part)
    }

    /// [`attend`](Self::attend) with AVX2's registers.
    ///
    /// # Safety
    /// The CPU has AVX2.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn attend_avx2<T: KvElem>(
        &self,
        regions: &[Vec<T>],
        q: &[f32],
        scale: f32,
        scratch: &mut Scratch,
        part: &mut Partial,
    ) {
        self.attend(regions, q, scale, scratch, part)
    }

    /// Softmax attention of the query heads in `q` (`[g][head_dim]`) over this item's
    /// positions, left unnormalised in `part`.
    #[inline(always)]
    fn attend<T: KvElem>(
        &self,
        regions: &[Vec<T>],
        q: &[f32],
        scale: f32,
        scratch: &mut Scratch,
        part: &mut Partial,
    ) {
        let (d, len) = (self.desc.head_dim, self.to - self.from);
        let g = q.len() / d;
        // Each K or V row is read as F32: in place where the cache holds F32, widened into
        // `row` otherwise. All `g` query heads use it once it is read.
        let Scratch { scores, row } = scratch;
        row.resize(d, 0.0);
        scores.clear();
        scores.resize(g * len, 0.0);
        for (t, k) in self.rows(regions, 0).enumerate() {
            let k = as_f32(k, row);
            for (h, qh) in q.chunks_exact(d).enumerate() {
                scores[h * len + t] = dot(qh, k) * scale;
            }
        }
        part.max.clear();
        part.sum.clear();
        for head in scores.chunks_exact_mut(len) {
            let max = head.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut sum = 0.0f32;
            for x in head.iter_mut() {
                *x = (*x - max).exp();
                sum += *x;
            }
            part.max.push(max);
            part.sum.push(sum);
        }
        part.out.clear();
        part.out.resize(g * d, 0.0);
        for (t, v) in self.rows(regions, 1).enumerate() {
            let v = as_f32(v, row);
            for (h, oh) in part.out.chunks_exact_mut(d).enumerate() {
                let p = scores[h * len + t];
                for (acc, x) in oh.iter_mut().zip(v) {
                    *acc += p * x;
                }
            }
        }
    }

    /// The K (`kv` 0) or V rows of positions `from..to` in order, walked block by block: one
    /// table entry and one offset per block, where looking each position up divides by the
    /// block size and multiplies out every stride again.
    fn rows<'r, T>(&self, regions: &'r [Vec<T>], kv: usize) -> impl Iterator<Item = &'r [T]> {
        let desc = self.desc;
        let (block_size, d) = (desc.layout.block_size, desc.head_dim);
        let plane = desc.planes[self.layer][kv];
        let region = &regions[plane.region];
        let head = plane.offset + self.kv_head * desc.s_head;
        self.table[self.from / block_size..]
            .iter()
            .flat_map(move |&block| {
                let base = head + block as usize * desc.s_blk;
                (0..block_size).map(move |off| &region[base + off * desc.s_tok..][..d])
            })
            .skip(self.from % block_size)
            .take(self.to - self.from)
    }
}

/// `src` as F32: itself where it is F32, else widened into `buf` (as long as `src`).
fn as_f32<'a, T: KvElem>(src: &'a [T], buf: &'a mut [f32]) -> &'a [f32] {
    match T::as_f32(src) {
        Some(values) => values,
        None => {
            T::to_f32_slice(src, buf);
            buf
        }
    }
}

/// Whether this CPU has AVX2.
pub(super) fn avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static AVX2: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *AVX2.get_or_init(|| is_x86_feature_detected!("avx2"))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// One thread's scratch space, kept across its items: the scores of a group of heads, and a K
/// or V row widened to F32.
#[derive(Default)]
struct Scratch {
    scores: Vec<f32>,
    row: Vec<f32>,
}

/// `a · b` in [`LANES`] partial sums, added pairwise at the end (a fixed order).
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    let mut chunks = a.chunks_exact(LANES).zip(b.chunks_exact(LANES));
    for (x, y) in &mut chunks {
        for i in 0..LANES {
            acc[i] += x[i] * y[i];
        }
    }
    let tail = a.len() / LANES * LANES;
    for (i, (x, y)) in a[tail..].iter().zip(&b[tail..]).enumerate() {
        acc[i] += x * y;
    }
    ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]))
}
