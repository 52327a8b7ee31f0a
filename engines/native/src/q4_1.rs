//! Q4_1 weights multiplied with AVX2 (its integer products by AVX-512 VNNI where the CPU has
//! it), a GGUF file's blocks repacked at load for it; and, for a prompt's rows, in F32 a slice
//! of widened weight rows at a time ([`Packed::matmul_f32`], [`crate::widened`]).
//!
//! candle has SIMD code for Q4_0, Q8_0 and the K-quants on x86 but multiplies Q4_1 with scalar
//! code, ten times slower; re-blocking Q4_1 as Q8_0 makes it fast but reads 8.5 bits a weight
//! where Q4_1 needs 5. Here each activation row is quantized to 8 bits per 32-element block
//! (its scale and its scaled sum kept in F32, where llama.cpp rounds them to F16), and each
//! output is `Σ d_w·d_a·Σq_w·q_a + Σ m_w·s_a` over the blocks.
//!
//! A block as the file stores it (F16 scale, F16 minimum, 16 bytes of nibbles) costs a dozen
//! instructions of unpacking and scalar scale arithmetic around its two multiply-adds, and a
//! lone activation row (a decode step) left the kernel bound by them, not by memory: ~2.3 ns a
//! block whether the matrix sat in L2 or not. So [`Packed`] stores the blocks of [`GROUP`]
//! weight rows side by side: their eight scales and eight minimums together (widened in one
//! instruction each and applied to eight outputs at once), then the rows' nibbles two rows to a
//! 256-bit register, each row's block sums reduced into one lane by three horizontal adds. The
//! same bytes, rearranged; ~0.7 ns a block in L2 and ~1.1 from memory on the same machine.
//!
//! Every output is summed in one order whatever else is multiplied with it: a block's integer
//! sum is exact, and the F32 sums run over the blocks in order, one fused multiply-add each for
//! the scaled sums and for the minimums, added at the end. So a row's result does not depend on
//! the other rows of the call. Weight groups are split over candle's CPU thread pool.
//!
//! Unsafe code: SIMD intrinsics (behind a run-time CPU check) and the pool's threads writing
//! disjoint elements of one output buffer.
#![allow(unsafe_code)]

use crate::grouped::{ACT_ROWS, GROUP};
use candle_core::Tensor;
use candle_core::quantized::{GgmlDType, QTensor};
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Elements per block.
const QK: usize = 32;
/// Bytes per block as a file stores it: F16 scale, F16 minimum, 16 bytes of nibbles.
const BLOCK_BYTES: usize = 20;
/// A group's bytes for one block column: [`GROUP`] F16 scales, as many F16 minimums (both in
/// [`ROW_OF_LANE`] order), then the rows' nibbles, rows `2p` and `2p + 1` in the `p`-th 32 bytes.
const GROUP_BLOCK_BYTES: usize = GROUP * BLOCK_BYTES;
/// The row of a group whose sum the kernel's reduction leaves in each lane (see [`group`]).
const ROW_OF_LANE: [usize; GROUP] = [0, 2, 4, 6, 1, 3, 5, 7];

/// Activation rows quantized per block: the 8-bit values, and per block its scale `d` and
/// `s = d·Σq`.
struct Q8Rows {
    qs: Vec<i8>,
    ds: Vec<[f32; 2]>,
    blocks: usize,
}

/// Whether this CPU runs the kernel.
pub(crate) fn supported() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether `q` is multiplied here: a 2-D Q4_1 matrix of whole blocks, on a CPU that runs the
/// kernel.
pub(crate) fn applies(q: &QTensor) -> bool {
    applies_to(q.dtype(), q.shape().dims())
}

/// [`applies`] for a tensor of `dtype` and `dims` not yet read (a GGUF file's index).
pub(crate) fn applies_to(dtype: GgmlDType, dims: &[usize]) -> bool {
    dtype == GgmlDType::Q4_1 && dims.len() == 2 && dims[1].is_multiple_of(QK) && supported()
}

/// A Q4_1 matrix, `[rows, cols]`, its blocks repacked for the kernel: for each group of
/// [`GROUP`] rows (the last padded with zero blocks) and each block column, the
/// [`GROUP_BLOCK_BYTES`] described there.
pub(crate) struct Packed {
    bytes: Vec<u8>,
    rows: usize,
    cols: usize,
}

impl Packed {
    /// `q`'s blocks repacked; `q` must be a matrix that [`applies`].
    pub(crate) fn new(q: &QTensor) -> candle_core::Result<Self> {
        let (rows, cols, data) = crate::grouped::matrix_blocks(q, applies(q), "Q4_1", BLOCK_BYTES)?;
        let blocks = cols / QK;
        let row_bytes = blocks * BLOCK_BYTES;
        let groups = rows.div_ceil(GROUP);
        let mut bytes = vec![0u8; groups * blocks * GROUP_BLOCK_BYTES];
        for (at, to) in bytes.chunks_exact_mut(GROUP_BLOCK_BYTES).enumerate() {
            let (g, b) = (at / blocks, at % blocks);
            for lane in 0..GROUP {
                let row = g * GROUP + ROW_OF_LANE[lane];
                if row < rows {
                    let block = &data[row * row_bytes + b * BLOCK_BYTES..][..BLOCK_BYTES];
                    to[2 * lane..2 * lane + 2].copy_from_slice(&block[0..2]);
                    to[16 + 2 * lane..16 + 2 * lane + 2].copy_from_slice(&block[2..4]);
                }
            }
            for r in 0..GROUP {
                let row = g * GROUP + r;
                if row < rows {
                    let block = &data[row * row_bytes + b * BLOCK_BYTES..][..BLOCK_BYTES];
                    to[32 + 16 * r..32 + 16 * (r + 1)].copy_from_slice(&block[4..]);
                }
            }
        }
        Ok(Self { bytes, rows, cols })
    }

    /// Rows of the matrix (outputs of a product).
    pub(crate) fn rows(&self) -> usize {
        self.rows
    }

    /// Its elements, `rows × cols`.
    pub(crate) fn elem_count(&self) -> usize {
        self.rows * self.cols
    }

    /// The bytes of its blocks as a file stores them (the padding of a last group aside).
    #[cfg(test)]
    pub(crate) fn block_bytes(&self) -> usize {
        self.rows * self.cols / QK * BLOCK_BYTES
    }

    fn blocks(&self) -> usize {
        self.cols / QK
    }

    /// Group `g`'s bytes, every block column.
    fn group(&self, g: usize) -> &[u8] {
        let n = self.blocks() * GROUP_BLOCK_BYTES;
        &self.bytes[g * n..(g + 1) * n]
    }

    /// Row `row`'s block `b` as a file stores it (see [`block_in`]).
    #[cfg(test)]
    fn block(&self, row: usize, b: usize) -> ([u8; 4], &[u8]) {
        block_in(self.group(row / GROUP), row % GROUP, b)
    }

    /// `xs @ selfᵀ`: `xs` holds `m` rows of `cols` values, `out` receives `m` rows of `rows`
    /// values.
    pub(crate) fn matmul_into(&self, xs: &[f32], m: usize, out: &mut [f32]) -> candle_core::Result<()> {
        let (rows, k) = (self.rows, self.cols);
        if xs.len() != m * k || out.len() != m * rows {
            candle_core::bail!(
                "{} inputs and {} outputs for a {m}×{k} by {k}×{rows} product",
                xs.len(),
                out.len()
            )
        }
        if m == 0 {
            return Ok(());
        }
        let acts = quantize_rows(xs, m, k);
        crate::grouped::by_groups(rows, m, out, |g, first, n, sums| {
            let w = self.group(g);
            // SAFETY: `Packed::new` checked that this CPU runs the kernel (`applies`); `w` is a
            // whole group and rows `first..first + n` exist. Both tile shapes sum each output in
            // the same order.
            unsafe {
                if n == ACT_ROWS {
                    group::<ACT_ROWS>(w, &acts, first, sums);
                } else {
                    for (r, s) in sums.iter_mut().enumerate().take(n) {
                        let mut one = [[0f32; GROUP]; 1];
                        group::<1>(w, &acts, first + r, &mut one);
                        *s = one[0];
                    }
                }
            }
        });
        Ok(())
    }

    /// [`matmul_into`](Self::matmul_into) of `x`, `[m, cols]`, as a tensor: the product
    /// generated tokens get.
    pub(crate) fn matmul(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        crate::grouped::as_tensor(x, self.rows, |xs, m, out| self.matmul_into(xs, m, out))
    }

    /// `x @ selfᵀ` in F32, for `x` of `[m, cols]`: the product a prompt's rows get, with the
    /// weights as candle dequantizes them, widened a slice of rows at a time
    /// ([`crate::widened`]).
    pub(crate) fn matmul_f32(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        crate::widened::matmul(x, self.rows, self.cols, |r, out| {
            let group = self.group(r / GROUP);
            for (b, out) in out.chunks_exact_mut(QK).enumerate() {
                let (dm, nibbles) = block_in(group, r % GROUP, b);
                // SAFETY: `Packed::new` checked the CPU; 16 bytes of nibbles, and room for the
                // block's values.
                unsafe { dequantize_block(dm, nibbles, out.as_mut_ptr()) };
            }
        })
    }
}

/// Row `r` of `group`'s block `b` as a file stores it: its F16 scale and minimum, and its
/// nibbles. Row `r` sits in lane `r / 2 + 4·(r % 2)` (the inverse of [`ROW_OF_LANE`]).
fn block_in(group: &[u8], r: usize, b: usize) -> ([u8; 4], &[u8]) {
    let at = &group[b * GROUP_BLOCK_BYTES..][..GROUP_BLOCK_BYTES];
    let lane = r / 2 + GROUP / 2 * (r % 2);
    let dm = [at[2 * lane], at[2 * lane + 1], at[16 + 2 * lane], at[16 + 2 * lane + 1]];
    (dm, &at[32 + 16 * r..32 + 16 * (r + 1)])
}

/// One block's 32 values, `q·d + m`, to `out`.
///
/// # Safety
/// The CPU has AVX2 and F16C; `dm` is the block's F16 scale and minimum, `nibbles` holds 16
/// bytes and `out` room for 32 values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
unsafe fn dequantize_block(dm: [u8; 4], nibbles: &[u8], out: *mut f32) {
    let dm = _mm_cvtph_ps(_mm_cvtsi32_si128(i32::from_le_bytes(dm)));
    let d = _mm256_broadcastss_ps(dm);
    let m = _mm256_broadcastss_ps(_mm_movehdup_ps(dm));
    // SAFETY: `nibbles` has 16 bytes.
    let packed = unsafe { _mm_loadu_si128(nibbles.as_ptr().cast()) };
    let low = _mm_set1_epi8(0x0F);
    // Elements 0..16 are the low nibbles, 16..32 the high ones.
    let halves = [_mm_and_si128(packed, low), _mm_and_si128(_mm_srli_epi16(packed, 4), low)];
    for (h, nibbles) in halves.into_iter().enumerate() {
        for (e, bytes) in [nibbles, _mm_srli_si128(nibbles, 8)].into_iter().enumerate() {
            let v = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes));
            // SAFETY: elements `16h + 8e .. + 8` of the block's 32.
            unsafe { _mm256_storeu_ps(out.add(16 * h + 8 * e), _mm256_add_ps(_mm256_mul_ps(v, d), m)) };
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn dequantize_block(_: [u8; 4], _: &[u8], _: *mut f32) {
    unreachable!("`applies` is false off x86-64")
}

/// Each `k`-wide row of `xs` quantized to 8 bits per block (llama.cpp's `quantize_row_q8_1`,
/// with the scale and sum kept in F32).
fn quantize_rows(xs: &[f32], m: usize, k: usize) -> Q8Rows {
    let blocks = k / QK;
    let mut qs = vec![0i8; m * k];
    let mut ds = vec![[0f32; 2]; m * blocks];
    for ((x, q), d) in xs.chunks_exact(QK).zip(qs.chunks_exact_mut(QK)).zip(ds.iter_mut()) {
        // SAFETY: only called where `applies` found AVX2 (through `matmul`, or by tests that
        // check `supported` first).
        *d = unsafe { quantize_block(x, q) };
    }
    Q8Rows { qs, ds, blocks }
}

/// One block of 32 values: `q = round(x · 127 / max|x|)`; returns `[max|x| / 127, d·Σq]`.
///
/// # Safety
/// The CPU has AVX2; `x` and `q` hold 32 values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn quantize_block(x: &[f32], q: &mut [i8]) -> [f32; 2] {
    // SAFETY: 32 values, read as four vectors of eight.
    let v = unsafe { [0, 8, 16, 24].map(|o| _mm256_loadu_ps(x.as_ptr().add(o))) };
    let sign = _mm256_set1_ps(-0.0);
    let abs = v.map(|v| _mm256_andnot_ps(sign, v));
    let max8 = _mm256_max_ps(_mm256_max_ps(abs[0], abs[1]), _mm256_max_ps(abs[2], abs[3]));
    let max4 = _mm_max_ps(_mm256_extractf128_ps(max8, 1), _mm256_castps256_ps128(max8));
    let max4 = _mm_max_ps(max4, _mm_movehl_ps(max4, max4));
    let amax = _mm_cvtss_f32(_mm_max_ss(max4, _mm_movehdup_ps(max4)));
    let d = amax / 127.0;
    let id = _mm256_set1_ps(if amax != 0.0 { 127.0 / amax } else { 0.0 });
    // Rounded to nearest, ties to even (the default rounding of the conversion).
    let i = v.map(|v| _mm256_cvtps_epi32(_mm256_mul_ps(v, id)));
    let total = _mm256_add_epi32(_mm256_add_epi32(i[0], i[1]), _mm256_add_epi32(i[2], i[3]));
    let total = _mm_add_epi32(_mm256_castsi256_si128(total), _mm256_extracti128_si256(total, 1));
    let total = _mm_add_epi32(total, _mm_shuffle_epi32(total, 0b01_00_11_10));
    let total = _mm_cvtsi128_si32(_mm_add_epi32(total, _mm_shuffle_epi32(total, 0b10_11_00_01)));
    // Packing works within 128-bit lanes; the permutation puts the 32 values back in order.
    let packed = _mm256_packs_epi16(_mm256_packs_epi32(i[0], i[1]), _mm256_packs_epi32(i[2], i[3]));
    let ordered = _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    // SAFETY: `q` holds 32 bytes.
    unsafe { _mm256_storeu_si256(q.as_mut_ptr().cast(), ordered) };
    [d, d * total as f32]
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn quantize_block(_: &[f32], _: &mut [i8]) -> [f32; 2] {
    unreachable!("`applies` is false off x86-64")
}

/// `sums[r][i]`: row `i` of the group in `w` times activation row `first + r`, for `A` rows.
///
/// Per block: the eight scales and minimums widened at once; each 32 bytes of nibbles (two
/// rows) split into low and high nibbles, which multiply the activations' first and second
/// 16 values (broadcast to both halves), giving each row's four partial sums in its half; three
/// horizontal adds leave row `ROW_OF_LANE[l]`'s block sum in lane `l`; then one multiply-add by
/// the scales times the activation block's scale, and one of the minimums by its scaled sum.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; `w` is a whole group of `acts.blocks` block columns; rows
/// `first..first + A` of `acts` exist.
#[cfg(target_arch = "x86_64")]
unsafe fn group<const A: usize>(w: &[u8], acts: &Q8Rows, first: usize, sums: &mut [[f32; GROUP]; A]) {
    // SAFETY: the caller's contract; VNNI is used where this CPU has it.
    unsafe {
        if vnni() { group_vnni::<A>(w, acts, first, sums) } else { group_avx2::<A>(w, acts, first, sums) }
    }
}

/// Whether this CPU has AVX-512 VNNI for 256-bit registers: one `vpdpbusd` then multiplies a
/// register of nibbles by the activations and sums each four products into a 32-bit lane,
/// where AVX2 takes two `vpmaddubsw`, a `vpaddw` and a `vpmaddwd` for two such registers (the
/// same integer sums).
#[cfg(target_arch = "x86_64")]
fn vnni() -> bool {
    static VNNI: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *VNNI.get_or_init(|| is_x86_feature_detected!("avx512vnni") && is_x86_feature_detected!("avx512vl"))
}

/// [`group`] with AVX2's integer products.
///
/// # Safety
/// [`group`]'s.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn group_avx2<const A: usize>(w: &[u8], acts: &Q8Rows, first: usize, sums: &mut [[f32; GROUP]; A]) {
    // SAFETY: the caller's contract.
    unsafe { group_body::<A, false>(w, acts, first, sums) }
}

/// [`group`] with AVX-512 VNNI's integer products.
///
/// # Safety
/// [`group`]'s, and the CPU has AVX-512 VNNI and VL.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
unsafe fn group_vnni<const A: usize>(w: &[u8], acts: &Q8Rows, first: usize, sums: &mut [[f32; GROUP]; A]) {
    // SAFETY: the caller's contract.
    unsafe { group_body::<A, true>(w, acts, first, sums) }
}

/// [`group`]'s work, inlined into a caller that enables the CPU features it uses (`VNNI`:
/// AVX-512 VNNI and VL besides AVX2, FMA and F16C).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn group_body<const A: usize, const VNNI: bool>(
    w: &[u8],
    acts: &Q8Rows,
    first: usize,
    sums: &mut [[f32; GROUP]; A],
) {
    // SAFETY: inlined only into `group_avx2` and `group_vnni`, whose features cover every
    // intrinsic here (`VNNI` only in the latter); `w` is a whole group and rows
    // `first..first + A` of `acts` exist (the caller's contract), so every read below is in bounds.
    unsafe {
        let (blocks, k) = (acts.blocks, acts.blocks * QK);
        debug_assert!(w.len() == blocks * GROUP_BLOCK_BYTES && (first + A) * k <= acts.qs.len());
        let low = _mm256_set1_epi8(0x0F);
        let ones = _mm256_set1_epi16(1);
        let mut acc = [_mm256_setzero_ps(); A];
        let mut mins = [_mm256_setzero_ps(); A];
        for b in 0..blocks {
            // Block column `b` of the group: 160 bytes from `base`.
            let base = w.as_ptr().add(b * GROUP_BLOCK_BYTES);
            let (d_w, m_w, lo, hi) = {
                let d_w = _mm256_cvtph_ps(_mm_loadu_si128(base.cast()));
                let m_w = _mm256_cvtph_ps(_mm_loadu_si128(base.add(16).cast()));
                let pairs = [0, 1, 2, 3].map(|p| _mm256_loadu_si256(base.add(32 + 32 * p).cast()));
                let lo = pairs.map(|x| _mm256_and_si256(x, low));
                let hi = pairs.map(|x| _mm256_and_si256(_mm256_srli_epi16(x, 4), low));
                (d_w, m_w, lo, hi)
            };
            for r in 0..A {
                let row = first + r;
                // Row `row` has `k` values, `b` is one of its blocks.
                let (a_lo, a_hi) = {
                    let a = acts.qs.as_ptr().add(row * k + b * QK);
                    (
                        _mm256_broadcastsi128_si256(_mm_loadu_si128(a.cast())),
                        _mm256_broadcastsi128_si256(_mm_loadu_si128(a.add(16).cast())),
                    )
                };
                // Each 32-bit lane: the products of four consecutive bytes of the low nibbles and
                // of the high ones. Nibbles are below 16 and activations within ±127, so AVX2's
                // 16-bit sums stay exact and both ways give the same integers.
                let pair = |p: usize| {
                    if VNNI {
                        let s = _mm256_dpbusd_epi32(_mm256_setzero_si256(), lo[p], a_lo);
                        _mm256_dpbusd_epi32(s, hi[p], a_hi)
                    } else {
                        let s = _mm256_add_epi16(
                            _mm256_maddubs_epi16(lo[p], a_lo),
                            _mm256_maddubs_epi16(hi[p], a_hi),
                        );
                        _mm256_madd_epi16(s, ones)
                    }
                };
                let total = _mm256_hadd_epi32(
                    _mm256_hadd_epi32(pair(0), pair(1)),
                    _mm256_hadd_epi32(pair(2), pair(3)),
                );
                let [d_a, s_a] = acts.ds[row * blocks + b];
                acc[r] = _mm256_fmadd_ps(
                    _mm256_cvtepi32_ps(total),
                    _mm256_mul_ps(d_w, _mm256_set1_ps(d_a)),
                    acc[r],
                );
                mins[r] = _mm256_fmadd_ps(m_w, _mm256_set1_ps(s_a), mins[r]);
            }
        }
        for r in 0..A {
            let mut lanes = [0f32; GROUP];
            // Eight values into eight.
            _mm256_storeu_ps(lanes.as_mut_ptr(), _mm256_add_ps(acc[r], mins[r]));
            for (lane, &v) in lanes.iter().enumerate() {
                sums[r][ROW_OF_LANE[lane]] = v;
            }
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn group<const A: usize>(_: &[u8], _: &Q8Rows, _: usize, _: &mut [[f32; GROUP]; A]) {
    unreachable!("`applies` is false off x86-64")
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(crate) fn horizontal_sum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

#[cfg(test)]
mod tests;
