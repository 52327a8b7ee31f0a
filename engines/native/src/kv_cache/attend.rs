//! Decode attention on the CPU: one query token per sequence, reading K and V straight from
//! the cache through the layout's strides, block by block (an F32 cache in place, F16/BF16 a row
//! at a time), all of a step's sequences at once.
//!
//! The work is split into one item per (sequence, KV head): the GQA group of query heads that
//! share a KV head reads each K and V row once. Items run on candle's CPU thread pool (the one
//! the quantized products use), so a decode step's attention is not serial on one core while
//! the others wait. Each item's arithmetic is fixed (dot products in eight lanes summed in a
//! fixed order), so a sequence's result does not depend on how many others share the step.

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

/// Score rows (query heads × positions) below which the items run on the calling thread: the
/// pool's hand-off costs more than it saves.
const POOL_FROM_SCORES: usize = 512;

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
        let (kvh, d) = (self.desc.kv_heads, self.desc.head_dim);
        let group = num_heads / kvh * d;
        // Item `b * kvh + kh` owns query heads `kh * g..(kh + 1) * g` of sequence `b`, which
        // are contiguous in `q` and `out`.
        let outs: Vec<Mutex<&mut [f32]>> = out.chunks_mut(group).map(Mutex::new).collect();
        let desc = &self.desc;
        let item = |i: usize, scratch: &mut Scratch| {
            let (query, kh) = (&queries[i / kvh], i % kvh);
            let qg = &q[i * group..(i + 1) * group];
            let mut o = outs[i].lock().unwrap_or_else(|e| e.into_inner());
            let at = Head { desc, layer, table: query.table, len: query.len, kv_head: kh };
            match &self.regions {
                Regions::F32(r) => at.attend(r, qg, scale, scratch, &mut o),
                Regions::F16(r) => at.attend(r, qg, scale, scratch, &mut o),
                Regions::Bf16(r) => at.attend(r, qg, scale, scratch, &mut o),
                Regions::Elsewhere => {}
            }
        };
        let items = queries.len() * kvh;
        let score_rows: usize = queries.iter().map(|s| s.len * num_heads).sum();
        if score_rows < POOL_FROM_SCORES || items < 2 {
            let mut scratch = Scratch::default();
            (0..items).for_each(|i| item(i, &mut scratch));
            return;
        }
        candle_core::utils::barrier_pool().execute_chunked(items, |range| {
            let mut scratch = Scratch::default();
            range.for_each(|i| item(i, &mut scratch));
        });
    }
}

/// Where one item reads: a KV head of a sequence at a layer.
struct Head<'a> {
    desc: &'a LayoutDescriptor,
    layer: usize,
    table: &'a [u32],
    len: usize,
    kv_head: usize,
}

impl Head<'_> {
    /// Softmax attention of the query heads in `q` (`[g][head_dim]`) over this KV head's
    /// positions, into `out` (same shape).
    fn attend<T: KvElem>(
        &self,
        regions: &[Vec<T>],
        q: &[f32],
        scale: f32,
        scratch: &mut Scratch,
        out: &mut [f32],
    ) {
        let (d, len) = (self.desc.head_dim, self.len);
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
        for head in scores.chunks_exact_mut(len) {
            let max = head.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut sum = 0.0f32;
            for x in head.iter_mut() {
                *x = (*x - max).exp();
                sum += *x;
            }
            let inv = 1.0 / sum;
            for x in head.iter_mut() {
                *x *= inv;
            }
        }
        out.fill(0.0);
        for (t, v) in self.rows(regions, 1).enumerate() {
            let v = as_f32(v, row);
            for (h, oh) in out.chunks_exact_mut(d).enumerate() {
                let p = scores[h * len + t];
                for (acc, x) in oh.iter_mut().zip(v) {
                    *acc += p * x;
                }
            }
        }
    }

    /// The K (`kv` 0) or V rows of positions `0..len` in order, walked block by block: one
    /// table entry and one offset per block, where looking each position up divides by the
    /// block size and multiplies out every stride again.
    fn rows<'r, T>(&self, regions: &'r [Vec<T>], kv: usize) -> impl Iterator<Item = &'r [T]> {
        let desc = self.desc;
        let (block_size, d) = (desc.layout.block_size, desc.head_dim);
        let plane = desc.planes[self.layer][kv];
        let region = &regions[plane.region];
        let head = plane.offset + self.kv_head * desc.s_head;
        self.table
            .iter()
            .flat_map(move |&block| {
                let base = head + block as usize * desc.s_blk;
                (0..block_size).map(move |off| &region[base + off * desc.s_tok..][..d])
            })
            .take(self.len)
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

/// One thread's scratch space: the scores of a group of heads, and a K or V row widened to F32.
#[derive(Default)]
struct Scratch {
    scores: Vec<f32>,
    row: Vec<f32>,
}

/// `a · b` in [`LANES`] partial sums, added pairwise at the end (a fixed order).
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
