//! Decode attention on the CPU: one query token per sequence, reading K and V straight from
//! the cache through the layout's strides, block by block (an F32 cache in place, F16/BF16 four
//! rows at a time), all of a step's sequences at once.
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
//! Within an item, four rows at a time: each head's four dot products, and each output
//! element's four terms of P · V, are independent of one another, so the CPU overlaps them
//! where one dot product at a time was a chain of additions each waiting on the last. The
//! exponentials are a polynomial the compiler vectorizes, not a libm call per score. A layer's
//! K and V come from memory each step (a model's whole cache is far past the CPU's own caches),
//! in rows of a few hundred bytes scattered over the cache's blocks that the hardware's
//! prefetchers do not follow, so an item asks for its rows ahead of reading them. At a
//! 1,000-token context on SmolLM2's shape this took a layer's attention from about 260 to 140 µs
//! on two cores.
//!
//! Unsafe code: the item's loops compiled a second time for AVX2 (eight lanes to a register
//! where the baseline target has four), called behind a run-time CPU check (neither build fuses
//! a multiply with its add, so both give the same bits); and the prefetch hint.
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

/// K or V rows an item reads at a time (see [`dot4`] and [`weigh`]).
const QUAD: usize = 4;

/// Rows an item asks for ahead of the one it reads (see [`prefetch`]).
const AHEAD: usize = 8;

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
        // K and V rows are read as F32 [`QUAD`] at a time: in place where the cache holds F32,
        // widened into `rows` otherwise. Each head's four dot products, and its four terms of
        // P · V per output element, are independent chains the CPU overlaps (one at a time,
        // each addition waited on the one before); every sum keeps its own order.
        let Scratch { scores, rows } = scratch;
        rows.resize(QUAD * d, 0.0);
        scores.clear();
        scores.resize(g * len, 0.0);
        let mut ks = self.rows(regions, 0);
        let (mut ks_ahead, mut vs_ahead) = (self.rows(regions, 0).skip(AHEAD), self.rows(regions, 1));
        for t in (0..len).step_by(QUAD) {
            ks_ahead.by_ref().take(QUAD).for_each(prefetch);
            vs_ahead.by_ref().take(QUAD).for_each(prefetch);
            let (k, n) = quad(&mut ks, rows, d);
            for (h, qh) in q.chunks_exact(d).enumerate() {
                let s = dot4(qh, k);
                for (i, &x) in s.iter().take(n).enumerate() {
                    scores[h * len + t + i] = x * scale;
                }
            }
        }
        part.max.clear();
        part.sum.clear();
        for head in scores.chunks_exact_mut(len) {
            let max = head.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            head.iter_mut().for_each(|x| *x = exp_le0(*x - max));
            let sum = head.iter().sum();
            part.max.push(max);
            part.sum.push(sum);
        }
        part.out.clear();
        part.out.resize(g * d, 0.0);
        let mut vs = self.rows(regions, 1);
        for t in (0..len).step_by(QUAD) {
            let (v, n) = quad(&mut vs, rows, d);
            for (h, oh) in part.out.chunks_exact_mut(d).enumerate() {
                let p = &scores[h * len + t..][..n];
                weigh(oh, p, v);
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

/// `e^x` for `x ≤ 0` (a score less its row's maximum), in a form the compiler vectorizes where
/// libm's `expf` is a call per value (Cephes' `expf`): `x = n·ln 2 + r` with `n` an integer
/// and `|r| ≤ ½ ln 2` (`n·ln 2` taken off in two parts, so `r` is exact), `e^r` by a degree-7
/// polynomial, and `2^n` put into the exponent bits. Below `2^-126` it gives `2^-126` rather than
/// 0: beside the row's largest term, 1, nothing an f32 sum keeps. NaN stays NaN.
#[inline(always)]
fn exp_le0(x: f32) -> f32 {
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    const P: [f32; 6] = [1.987_569_1e-4, 1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 0.166_666_65, 0.5];
    const FLOOR: f32 = -126.0 * std::f32::consts::LN_2;
    let x = if x < FLOOR { FLOOR } else { x };
    let n = (x * std::f32::consts::LOG2_E).round_ties_even();
    let r = x - n * LN2_HI - n * LN2_LO;
    let p = ((((P[0] * r + P[1]) * r + P[2]) * r + P[3]) * r + P[4]) * r + P[5];
    let e = p * r * r + r + 1.0;
    // `n` is an integer in [-126, 0], so `n + 127` is a normal exponent (NaN casts to 0).
    e * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

/// Asks for `row`'s cache lines ahead of its use: an item's rows are a few hundred bytes each,
/// scattered over the cache's blocks, which the hardware's prefetchers do not follow (a layer's
/// keys and values, read once a step, come from memory).
#[inline(always)]
fn prefetch<T>(row: &[T]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        let bytes = std::mem::size_of_val(row);
        let p = row.as_ptr().cast::<i8>();
        for line in (0..bytes).step_by(64) {
            // SAFETY: a prefetch is a hint that reads nothing; `line` is within `row` anyway.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(line)) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = row;
}

/// The next [`QUAD`] rows of `rows` (fewer at the end: how many is the second value) as F32:
/// in place where they are F32, else widened into `buf` (`QUAD` rows of `d`). The missing ones
/// repeat the first, so that callers may compute on all four and keep the first `n`.
#[inline(always)]
fn quad<'r: 'b, 'b, T: KvElem>(
    rows: &mut impl Iterator<Item = &'r [T]>,
    buf: &'b mut [f32],
    d: usize,
) -> ([&'b [f32]; QUAD], usize) {
    let mut out: [&[f32]; QUAD] = [&[]; QUAD];
    let mut n = 0;
    for (slot, dst) in buf.chunks_exact_mut(d).enumerate() {
        let Some(src) = rows.next() else { break };
        out[slot] = match T::as_f32(src) {
            Some(values) => values,
            None => {
                T::to_f32_slice(src, dst);
                dst
            }
        };
        n += 1;
    }
    for slot in n..QUAD {
        out[slot] = out[0];
    }
    (out, n)
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

/// One thread's scratch space, kept across its items: the scores of a group of heads, and
/// [`QUAD`] K or V rows widened to F32.
#[derive(Default)]
struct Scratch {
    scores: Vec<f32>,
    rows: Vec<f32>,
}

/// `a · b[r]` for each of the four rows, each in [`LANES`] partial sums added pairwise at the
/// end (a fixed order, the same for every row and however many rows are real).
#[inline(always)]
fn dot4(a: &[f32], b: [&[f32]; QUAD]) -> [f32; QUAD] {
    let mut acc = [[0f32; LANES]; QUAD];
    let (xs, x_tail) = a.as_chunks::<LANES>();
    let ys = b.map(|row| row.as_chunks::<LANES>().0);
    for (c, x) in xs.iter().enumerate() {
        for (acc, y) in acc.iter_mut().zip(ys) {
            let Some(y) = y.get(c) else { continue };
            for i in 0..LANES {
                acc[i] += x[i] * y[i];
            }
        }
    }
    let whole = a.len() - x_tail.len();
    for (acc, row) in acc.iter_mut().zip(b) {
        for (i, (x, y)) in x_tail.iter().zip(&row[whole..]).enumerate() {
            acc[i] += x * y;
        }
    }
    acc.map(|a| ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7])))
}

/// `out += Σ p[i] · v[i]` over the first `p.len()` rows, each element's terms added in row
/// order, one load and one store of it per call instead of per row.
#[inline(always)]
fn weigh(out: &mut [f32], p: &[f32], v: [&[f32]; QUAD]) {
    match *p {
        [p0, p1, p2, p3] => {
            for ((((acc, a), b), c), e) in out.iter_mut().zip(v[0]).zip(v[1]).zip(v[2]).zip(v[3]) {
                *acc = *acc + p0 * a + p1 * b + p2 * c + p3 * e;
            }
        }
        _ => {
            for (&p, row) in p.iter().zip(v) {
                for (acc, x) in out.iter_mut().zip(row) {
                    *acc += p * x;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::exp_le0;

    #[test]
    fn the_exponential_is_within_a_few_units_of_the_last_place() {
        let mut worst = 0f64;
        for i in 0..200_000 {
            let x = -(i as f32) * 0.000_5; // 0 down to -100, past f32's normal range
            let want = (x as f64).exp();
            let got = exp_le0(x) as f64;
            if want >= f32::MIN_POSITIVE as f64 {
                worst = worst.max((got - want).abs() / want);
            } else {
                assert!(got <= f32::MIN_POSITIVE as f64 * 1.000_01, "{x}: {got}");
            }
        }
        assert!(worst < 4e-7, "relative error {worst}");
        assert_eq!(exp_le0(0.0), 1.0);
        assert!(exp_le0(f32::NAN).is_nan());
        let floor = exp_le0(f32::NEG_INFINITY);
        assert!((floor / f32::MIN_POSITIVE - 1.0).abs() < 1e-5, "{floor}");
    }
}
