//! Q4_1 weights multiplied as a GGUF file stores them, with AVX2 (AVX-512 VNNI where the CPU
//! has it, [`avx512`]), as llama.cpp does; and, for a prompt's rows, in F32 a slice of widened
//! weight rows at a time ([`matmul_f32`]).
//!
//! candle has SIMD code for Q4_0, Q8_0 and the K-quants on x86 but multiplies Q4_1 with scalar
//! code, ten times slower; re-blocking Q4_1 as Q8_0 makes it fast but reads 8.5 bits a weight
//! where Q4_1 needs 5, and a decode step is bound by those reads. Here each activation row is
//! quantized to 8 bits per 32-element block (its scale and its scaled sum kept in F32, where
//! llama.cpp rounds them to F16), and each output is `Σ d_w·d_a·Σq_w·q_a + m_w·s_a` over the
//! blocks, in tiles of [`WEIGHT_ROWS`] × [`ACT_ROWS`] outputs. Every output is summed in the same
//! order whatever tile computes it, so a row's result does not depend on the other rows.
//! Weight rows are split over candle's CPU thread pool.
//!
//! Unsafe code: SIMD intrinsics (behind a run-time CPU check) and the pool's threads writing
//! disjoint elements of one output buffer.
#![allow(unsafe_code)]

mod avx512;

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Elements per block.
const QK: usize = 32;
/// Bytes per block: F16 scale, F16 minimum, 16 bytes of nibbles.
const BLOCK_BYTES: usize = 20;
/// Weight rows whose blocks are widened together and multiplied against [`ACT_ROWS`] activation
/// rows: each activation block loaded is used [`WEIGHT_ROWS`] times, each widened weight block
/// [`ACT_ROWS`] times, and the `2 × 4` accumulators stay in registers. Fewer activation rows
/// (a decode step of one to three sequences) go one weight row after another, one stream of
/// weight bytes: with two rows' blocks interleaved the kernel took ~13% longer at batch 1.
const WEIGHT_ROWS: usize = 2;
/// See [`WEIGHT_ROWS`].
const ACT_ROWS: usize = 4;

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

/// `x @ qᵀ`'s shapes, checked, and `q`'s blocks.
struct Operands<'a> {
    data: std::borrow::Cow<'a, [u8]>,
    /// Rows of `x`.
    m: usize,
    /// Columns of `x` and of `q`.
    k: usize,
    /// Rows of `q`, and their bytes each.
    rows: usize,
    row_bytes: usize,
}

/// [`Operands`] of an `[m, k]` input against `q`, a `[rows, cols]` matrix that [`applies`].
fn operands(q: &QTensor, m: usize, k: usize) -> candle_core::Result<Operands<'_>> {
    let (rows, cols) = q.shape().dims2()?;
    if k != cols || !applies(q) {
        candle_core::bail!("a {m}×{k} input against a {rows}×{cols} {:?} matrix", q.dtype())
    }
    let data = q.data()?;
    let row_bytes = k / QK * BLOCK_BYTES;
    if data.len() != rows * row_bytes {
        candle_core::bail!("{} bytes of Q4_1 blocks for a {rows}×{cols} matrix", data.len())
    }
    Ok(Operands { data, m, k, rows, row_bytes })
}

/// `xs @ qᵀ` for `q` a `[rows, cols]` matrix that [`applies`]: `xs` holds `m` rows of `cols`
/// values, `out` receives `m` rows of `rows` values.
pub(crate) fn matmul_into(q: &QTensor, xs: &[f32], m: usize, out: &mut [f32]) -> candle_core::Result<()> {
    if m == 0 {
        return Ok(());
    }
    let Operands { data, m, k, rows, row_bytes } = operands(q, m, xs.len() / m)?;
    if xs.len() != m * k || out.len() != m * rows {
        candle_core::bail!(
            "{} inputs and {} outputs for a {m}×{k} by {k}×{rows} product",
            xs.len(),
            out.len()
        )
    }
    let acts = quantize_rows(xs, m, k);
    let vnni = acts.blocks.is_multiple_of(2) && avx512::supported();
    let dst = SharedOut(out.as_mut_ptr());
    let weight_row = |j: usize| &data[j * row_bytes..(j + 1) * row_bytes];
    let groups = rows.div_ceil(WEIGHT_ROWS);
    candle_core::utils::barrier_pool().execute_chunked(groups, |range| {
        for g in range {
            let j = g * WEIGHT_ROWS;
            let mut first = 0;
            while first < m {
                let n = ACT_ROWS.min(m - first);
                let mut sums = [[0f32; ACT_ROWS]; WEIGHT_ROWS];
                let live = WEIGHT_ROWS.min(rows - j);
                // SAFETY: `applies(q)` checked that this CPU runs the kernel, and `vnni` that it
                // runs the AVX-512 one on an even number of blocks; the rows asked for exist.
                // The tile shapes sum each output in the same order.
                unsafe {
                    if live == WEIGHT_ROWS && n == ACT_ROWS {
                        let w = std::array::from_fn(|i| weight_row(j + i));
                        tile_on::<WEIGHT_ROWS, ACT_ROWS>(vnni, w, &acts, first, &mut sums);
                    } else {
                        for (wi, s) in sums.iter_mut().enumerate().take(live) {
                            for (r, s) in s.iter_mut().enumerate().take(n) {
                                let mut one = [[0f32; 1]; 1];
                                tile_on::<1, 1>(vnni, [weight_row(j + wi)], &acts, first + r, &mut one);
                                *s = one[0][0];
                            }
                        }
                    }
                }
                for (wi, row) in sums.iter().enumerate().take(live) {
                    for (r, &v) in row[..n].iter().enumerate() {
                        // SAFETY: `(first + r, j + wi)` is inside the `m × rows` output, and each
                        // work item owns its weight rows, so no two threads write one element.
                        unsafe { dst.write((first + r) * rows + j + wi, v) };
                    }
                }
                first += n;
            }
        }
    });
    Ok(())
}

/// Weight rows widened to F32 and multiplied by one work item of [`matmul_f32`]: 128 rows of
/// a 576-wide matrix are 288 KiB, which stay in the core's L2 for the GEMM that reads them.
/// More than 64, which keeps the GEMM on one way of summing (below).
const F32_ROWS: usize = 128;

/// `x @ qᵀ` in F32, for `x` of `[m, cols]` and `q` a `[rows, cols]` matrix that [`applies`]: the
/// product a prompt's rows get, with the weights as candle dequantizes them. Each work item of
/// the CPU pool widens [`F32_ROWS`] weight rows into its own buffer and multiplies them by
/// candle's GEMM on its thread, so the widened matrix is never written out whole (7 MB per
/// projection per step, four times the Q4_1 bytes), and the GEMM runs on the pool the decode
/// kernels use instead of rayon's, whose threads the pool's would spin against.
///
/// A row's result must not depend on how many rows share the call (a prompt then gives the
/// same K and V however it is cut into chunks or batched), and the GEMM sums three ways: a
/// product of at most 16 × 16 outputs one way, one of at most 64 × 64 in blocks of 512 along
/// `cols`, a bigger one in blocks that follow from `cols` alone. So every slice is wider than
/// 64 rows where the matrix is (the last takes the rest), and `x` is padded with copies of its
/// last row to more than `256 / width` rows: every call then takes the third way, as candle's
/// `matmul` of the whole matrix does, whose results these are bit for bit where the slices
/// are whole.
pub(crate) fn matmul_f32(q: &QTensor, x: &Tensor) -> candle_core::Result<Tensor> {
    let (m, k) = x.dims2()?;
    let Operands { data, m, k, rows, row_bytes } = operands(q, m, k)?;
    if m == 0 {
        return Tensor::zeros((0, rows), candle_core::DType::F32, &Device::Cpu);
    }
    let mut xs = x.contiguous()?.flatten_all()?.to_vec1::<f32>()?;
    let slices = (rows / F32_ROWS).max(1);
    let narrowest = rows.clamp(1, F32_ROWS);
    let padded = m.max(256 / narrowest + 1);
    for _ in m..padded {
        xs.extend_from_within((m - 1) * k..m * k);
    }
    let mut out = vec![0f32; padded * rows];
    let dst = SharedOut(out.as_mut_ptr());
    candle_core::utils::barrier_pool().execute_chunked(slices, |range| {
        let mut w = vec![0f32; (2 * F32_ROWS - 1).min(rows) * k];
        for item in range {
            let first = item * F32_ROWS;
            let n = if item + 1 == slices { rows - first } else { F32_ROWS };
            let blocks = data[first * row_bytes..(first + n) * row_bytes].chunks_exact(BLOCK_BYTES);
            for (out, block) in w.chunks_exact_mut(QK).zip(blocks) {
                // SAFETY: `applies` checked the CPU; a whole block, and room for its values.
                unsafe { dequantize_block(block, out.as_mut_ptr()) };
            }
            // SAFETY: `out` is `padded × rows`, this item owns its columns `first..first + n`
            // (row stride `rows`); `xs` is `padded × k`, `w` holds `n` rows of `k`, read as the
            // `k × n` right-hand side.
            unsafe {
                gemm::gemm(
                    padded,
                    n,
                    k,
                    dst.at(first),
                    1,
                    rows as isize,
                    false,
                    xs.as_ptr(),
                    1,
                    k as isize,
                    w.as_ptr(),
                    k as isize,
                    1,
                    0.0,
                    1.0,
                    false,
                    false,
                    false,
                    gemm::Parallelism::None,
                )
            }
        }
    });
    out.truncate(m * rows);
    Tensor::from_vec(out, (m, rows), &Device::Cpu)
}

/// One block's 32 values, `q·d + m`, to `out`.
///
/// # Safety
/// The CPU has AVX2 and F16C; `block` holds 20 bytes and `out` room for 32 values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
unsafe fn dequantize_block(block: &[u8], out: *mut f32) {
    let dm = _mm_cvtph_ps(_mm_cvtsi32_si128(i32::from_le_bytes([block[0], block[1], block[2], block[3]])));
    let d = _mm256_broadcastss_ps(dm);
    let m = _mm256_broadcastss_ps(_mm_movehdup_ps(dm));
    // SAFETY: `block` has 16 bytes after its two F16 values.
    let packed = unsafe { _mm_loadu_si128(block.as_ptr().add(4).cast()) };
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
unsafe fn dequantize_block(_: &[u8], _: *mut f32) {
    unreachable!("`applies` is false off x86-64")
}

/// [`avx512::tile`] where `vnni`, [`tile`] otherwise.
///
/// # Safety
/// As [`tile`]; with `vnni`, as [`avx512::tile`].
unsafe fn tile_on<const W: usize, const A: usize>(
    vnni: bool,
    w: [&[u8]; W],
    acts: &Q8Rows,
    first: usize,
    sums: &mut [[f32; A]; W],
) {
    // SAFETY: as the caller promises.
    unsafe {
        if vnni { avx512::tile::<W, A>(w, acts, first, sums) } else { tile::<W, A>(w, acts, first, sums) }
    }
}

/// The output buffer, written by the pool's threads at disjoint indices.
pub(crate) struct SharedOut(pub(crate) *mut f32);

// SAFETY: the threads write disjoint elements (see `matmul_into`), and the buffer outlives the
// pool's call.
unsafe impl Sync for SharedOut {}

impl SharedOut {
    /// A pointer to element `i`, for a writer that owns the elements it writes through it.
    ///
    /// # Safety
    /// `i` is inside the buffer.
    unsafe fn at(&self, i: usize) -> *mut f32 {
        // SAFETY: as the caller promises.
        unsafe { self.0.add(i) }
    }

    /// # Safety
    /// `i` is inside the buffer and no other thread writes it.
    pub(crate) unsafe fn write(&self, i: usize, v: f32) {
        // SAFETY: as the caller promises.
        unsafe { *self.0.add(i) = v }
    }
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

/// `sums[i][r] = w[i] · activation row (first + r)` for `W` weight rows and `A` activation rows.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; `first + A` rows exist.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile<const W: usize, const A: usize>(
    w: [&[u8]; W],
    acts: &Q8Rows,
    first: usize,
    sums: &mut [[f32; A]; W],
) {
    let k = acts.blocks * QK;
    let low = _mm_set1_epi8(0x0F);
    let ones = _mm256_set1_epi16(1);
    // Even and odd blocks in two chains of FMAs, so that a lone row's product is not one
    // dependent chain, a block per FMA latency; added at the end, the same for every tile.
    let mut acc = [[[_mm256_setzero_ps(); A]; W]; 2];
    let mut mins = [[0f32; A]; W];
    for pair in (0..acts.blocks).step_by(2) {
        for (c, chain) in acc.iter_mut().enumerate() {
            let b = pair + c;
            if b == acts.blocks {
                break;
            }
            let mut wq = [_mm256_setzero_si256(); W];
            let mut dw = [0f32; W];
            let mut mw = [0f32; W];
            for i in 0..W {
                let block = &w[i][b * BLOCK_BYTES..(b + 1) * BLOCK_BYTES];
                // The block's F16 scale and minimum, widened together.
                let dm = _mm_cvtph_ps(_mm_cvtsi32_si128(i32::from_le_bytes([
                    block[0], block[1], block[2], block[3],
                ])));
                dw[i] = _mm_cvtss_f32(dm);
                mw[i] = _mm_cvtss_f32(_mm_movehdup_ps(dm));
                // SAFETY: `block` has 16 bytes after its two F16 values.
                let packed = unsafe { _mm_loadu_si128(block.as_ptr().add(4).cast()) };
                // Elements 0..16 are the low nibbles, 16..32 the high ones.
                let lo = _mm_and_si128(packed, low);
                let hi = _mm_and_si128(_mm_srli_epi16(packed, 4), low);
                wq[i] = _mm256_set_m128i(hi, lo);
            }
            for r in 0..A {
                let row = first + r;
                // SAFETY: row `row` has `k` values, `b` is one of its blocks.
                let a = unsafe { _mm256_loadu_si256(acts.qs.as_ptr().add(row * k + b * QK).cast()) };
                let [d_a, s_a] = acts.ds[row * acts.blocks + b];
                for i in 0..W {
                    let products = _mm256_madd_epi16(_mm256_maddubs_epi16(wq[i], a), ones);
                    chain[i][r] = _mm256_fmadd_ps(
                        _mm256_set1_ps(dw[i] * d_a),
                        _mm256_cvtepi32_ps(products),
                        chain[i][r],
                    );
                    mins[i][r] += mw[i] * s_a;
                }
            }
        }
    }
    for i in 0..W {
        for r in 0..A {
            sums[i][r] = horizontal_sum(_mm256_add_ps(acc[0][i][r], acc[1][i][r])) + mins[i][r];
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn tile<const W: usize, const A: usize>(_: [&[u8]; W], _: &Q8Rows, _: usize, _: &mut [[f32; A]; W]) {
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
mod tests {
    use super::*;

    /// `x @ qᵀ` as a tensor.
    fn matmul(q: &QTensor, x: &Tensor) -> candle_core::Result<Tensor> {
        let ((m, _), (rows, _)) = (x.dims2()?, q.shape().dims2()?);
        let xs = x.contiguous()?.flatten_all()?.to_vec1::<f32>()?;
        let mut out = vec![0f32; m * rows];
        matmul_into(q, &xs, m, &mut out)?;
        Tensor::from_vec(out, (m, rows), &Device::Cpu)
    }

    /// Against the block math in plain F32 on the same quantized activations: the kernel's
    /// only difference is the order of its sums.
    #[test]
    fn matches_the_block_math() {
        if !supported() {
            eprintln!("SKIPPED: this CPU has no AVX2/FMA/F16C");
            return;
        }
        let (rows, cols, m) = (37, 96, 6);
        let w = Tensor::randn(0f32, 1.0, (rows, cols), &Device::Cpu).expect("test tensor");
        let q = QTensor::quantize(&w, GgmlDType::Q4_1).expect("test tensor");
        assert!(applies(&q));
        let x = Tensor::randn(0f32, 1.0, (m, cols), &Device::Cpu).expect("test tensor");
        let got = matmul(&q, &x).expect("test tensor").to_vec2::<f32>().expect("test tensor");
        let xs = x.flatten_all().expect("test tensor").to_vec1::<f32>().expect("test tensor");
        let acts = quantize_rows(&xs, m, cols);
        let wd = q.dequantize(&Device::Cpu).expect("test tensor").to_vec2::<f32>().expect("test tensor");
        for (i, got_row) in got.iter().enumerate() {
            for (j, &g) in got_row.iter().enumerate() {
                // Σ over blocks of d_a·Σ (dequantized w)·q_a, i.e. the same product in F32.
                let mut want = 0f32;
                for b in 0..cols / QK {
                    let [d_a, _] = acts.ds[i * acts.blocks + b];
                    for e in 0..QK {
                        want += wd[j][b * QK + e] * d_a * acts.qs[i * cols + b * QK + e] as f32;
                    }
                }
                assert!((g - want).abs() <= 1e-3 * (1.0 + want.abs()), "({i}, {j}): {g} vs {want}");
            }
        }
        // And close to the F32 product of the dequantized weights (activation rounding only).
        let exact = x
            .matmul(&q.dequantize(&Device::Cpu).expect("test tensor").t().expect("test tensor"))
            .expect("test tensor");
        let exact = exact.to_vec2::<f32>().expect("test tensor");
        let spread = exact.iter().flatten().fold(0f32, |a, v| a.max(v.abs()));
        for (g, e) in got.iter().flatten().zip(exact.iter().flatten()) {
            assert!((g - e).abs() < 0.02 * spread, "{g} vs {e}");
        }
    }

    /// Bit for bit candle's F32 product of the dequantized weights where the weight rows come in
    /// whole work items, within rounding otherwise (the GEMM sums a wider slice in another
    /// order); each row the same whatever rows share the call, on both sides of 64 rows.
    #[test]
    fn f32_product_is_candles_on_the_dequantized_weights() {
        if !supported() {
            eprintln!("SKIPPED: this CPU has no AVX2/FMA/F16C");
            return;
        }
        let values = |t: &Tensor| -> Vec<f32> { t.flatten_all().expect("flat").to_vec1().expect("values") };
        let bits = |t: &Tensor| -> Vec<u32> { values(t).iter().map(|v| v.to_bits()).collect() };
        let cols = 1536;
        for rows in [2 * F32_ROWS, 300] {
            let w = Tensor::randn(0f32, 1.0, (rows, cols), &Device::Cpu).expect("test tensor");
            let q = QTensor::quantize(&w, GgmlDType::Q4_1).expect("test tensor");
            let wd = q.dequantize(&Device::Cpu).expect("dequantize");
            let x = Tensor::randn(0f32, 1.0, (80, cols), &Device::Cpu).expect("test tensor");
            let ours = matmul_f32(&q, &x).expect("product");
            let candle = x.matmul(&wd.t().expect("t")).expect("product");
            if rows.is_multiple_of(F32_ROWS) {
                assert_eq!(bits(&ours), bits(&candle));
            }
            for (a, b) in values(&ours).iter().zip(values(&candle)) {
                assert!((a - b).abs() <= 1e-4 * (1.0 + b.abs()), "{a} vs {b}");
            }
            for (first, n) in [(4, 1), (2, 3), (0, 6), (10, 64), (7, 70)] {
                let part = matmul_f32(&q, &x.narrow(0, first, n).expect("rows")).expect("product");
                assert_eq!(bits(&part), bits(&ours.narrow(0, first, n).expect("rows")), "{rows}: {n} rows");
            }
        }
    }

    /// A row's result is the same alone as among others (every tile shape sums an output in
    /// one order), with an even number of blocks (the AVX-512 tile where the CPU has it) and an
    /// odd one (the AVX2 tile); and the AVX-512 tile agrees with the AVX2 one within rounding.
    #[test]
    fn rows_do_not_depend_on_the_batch_and_the_tiles_agree() {
        if !supported() {
            eprintln!("SKIPPED: this CPU has no AVX2/FMA/F16C");
            return;
        }
        let bits = |t: &Tensor| -> Vec<u32> {
            t.flatten_all()
                .expect("flat")
                .to_vec1::<f32>()
                .expect("values")
                .iter()
                .map(|v| v.to_bits())
                .collect()
        };
        for cols in [128, 96] {
            let w = Tensor::randn(0f32, 1.0, (37, cols), &Device::Cpu).expect("test tensor");
            let q = QTensor::quantize(&w, GgmlDType::Q4_1).expect("test tensor");
            let x = Tensor::randn(0f32, 1.0, (7, cols), &Device::Cpu).expect("test tensor");
            let all = matmul(&q, &x).expect("product");
            for r in 0..7 {
                let alone = matmul(&q, &x.narrow(0, r, 1).expect("row")).expect("product");
                assert_eq!(bits(&alone), bits(&all.narrow(0, r, 1).expect("row")), "{cols} columns, row {r}");
            }
        }
        if !avx512::supported() {
            eprintln!("SKIPPED (in part): this CPU has no AVX-512 VNNI");
            return;
        }
        let w = Tensor::randn(0f32, 1.0, (3, 256), &Device::Cpu).expect("test tensor");
        let q = QTensor::quantize(&w, GgmlDType::Q4_1).expect("test tensor");
        let x = Tensor::randn(0f32, 1.0, (1, 256), &Device::Cpu).expect("test tensor");
        let acts = quantize_rows(&x.flatten_all().expect("flat").to_vec1::<f32>().expect("values"), 1, 256);
        let data = q.data().expect("blocks");
        let row_bytes = 256 / QK * BLOCK_BYTES;
        for j in 0..3 {
            let (mut two, mut five) = ([[0f32; 1]; 1], [[0f32; 1]; 1]);
            let row = [&data[j * row_bytes..(j + 1) * row_bytes]];
            // SAFETY: both kernels are supported here; one activation row of 8 blocks.
            unsafe {
                tile::<1, 1>(row, &acts, 0, &mut two);
                avx512::tile::<1, 1>(row, &acts, 0, &mut five);
            }
            let (a, b) = (two[0][0], five[0][0]);
            assert!((a - b).abs() <= 1e-4 * (1.0 + a.abs()), "row {j}: {a} vs {b}");
        }
    }

    #[test]
    fn other_block_types_are_left_to_candle() {
        let w = Tensor::randn(0f32, 1.0, (4, 64), &Device::Cpu).expect("test tensor");
        let q = QTensor::quantize(&w, GgmlDType::Q8_0).expect("test tensor");
        assert!(!applies(&q));
    }
}
