//! Q4_1 weights multiplied as a GGUF file stores them, with AVX2, as llama.cpp does.
//!
//! candle has SIMD code for Q4_0, Q8_0 and the K-quants on x86 but multiplies Q4_1 with scalar
//! code, ten times slower; re-blocking Q4_1 as Q8_0 makes it fast but reads 8.5 bits a weight
//! where Q4_1 needs 5, and a decode step is bound by those reads. Here each activation row is
//! quantized to 8 bits per 32-element block (its scale and its scaled sum kept in F32, where
//! llama.cpp rounds them to F16), and each output is `Σ d_w·d_a·Σq_w·q_a + m_w·s_a` over the
//! blocks: the nibbles are widened once per block and multiplied against up to [`TILE`]
//! activation rows. Output rows are split over candle's CPU thread pool.
//!
//! Unsafe code: SIMD intrinsics (behind a run-time CPU check) and the pool's threads writing
//! disjoint elements of one output buffer.
#![allow(unsafe_code)]

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Elements per block.
const QK: usize = 32;
/// Bytes per block: F16 scale, F16 minimum, 16 bytes of nibbles.
const BLOCK_BYTES: usize = 20;
/// Activation rows multiplied against one widened weight block.
const TILE: usize = 4;

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
    let dims = q.shape().dims();
    q.dtype() == GgmlDType::Q4_1 && dims.len() == 2 && dims[1].is_multiple_of(QK) && supported()
}

/// `x @ qᵀ` for `x` of `[m, cols]` F32 and `q` a `[rows, cols]` matrix that [`applies`]:
/// `[m, rows]`.
pub(crate) fn matmul(q: &QTensor, x: &Tensor) -> candle_core::Result<Tensor> {
    let (m, k) = x.dims2()?;
    let (rows, cols) = q.shape().dims2()?;
    if k != cols || !applies(q) {
        candle_core::bail!("a {m}×{k} input against a {rows}×{cols} {:?} matrix", q.dtype())
    }
    let data = q.data()?;
    let row_bytes = k / QK * BLOCK_BYTES;
    if data.len() != rows * row_bytes {
        candle_core::bail!("{} bytes of Q4_1 blocks for a {rows}×{cols} matrix", data.len())
    }
    let xs = x.contiguous()?.flatten_all()?.to_vec1::<f32>()?;
    let acts = quantize_rows(&xs, m, k);
    let mut out = vec![0f32; m * rows];
    let dst = SharedOut(out.as_mut_ptr());
    candle_core::utils::barrier_pool().execute_chunked(rows, |range| {
        for j in range {
            let w = &data[j * row_bytes..(j + 1) * row_bytes];
            for first in (0..m).step_by(TILE) {
                let n = TILE.min(m - first);
                let mut sums = [0f32; TILE];
                // SAFETY: `applies(q)` checked that this CPU runs the kernel.
                unsafe { dot_tile(w, &acts, first, n, &mut sums) };
                for (r, &v) in sums[..n].iter().enumerate() {
                    // SAFETY: `(first + r, j)` is inside the `m × rows` output, and each work
                    // item owns its `j`, so no two threads write one element.
                    unsafe { dst.write((first + r) * rows + j, v) };
                }
            }
        }
    });
    Tensor::from_vec(out, (m, rows), &Device::Cpu)
}

/// The output buffer, written by the pool's threads at disjoint indices.
struct SharedOut(*mut f32);

// SAFETY: the threads write disjoint elements (see `matmul`), and the buffer outlives the
// pool's call.
unsafe impl Sync for SharedOut {}

impl SharedOut {
    /// # Safety
    /// `i` is inside the buffer and no other thread writes it.
    unsafe fn write(&self, i: usize, v: f32) {
        // SAFETY: as the caller promises.
        unsafe { *self.0.add(i) = v }
    }
}

/// Each `k`-wide row of `xs` quantized to 8 bits per block (llama.cpp's `quantize_row_q8_1`,
/// with the scale and sum kept in F32).
fn quantize_rows(xs: &[f32], m: usize, k: usize) -> Q8Rows {
    let blocks = k / QK;
    let mut qs = vec![0i8; m * k];
    let mut ds = Vec::with_capacity(m * blocks);
    for (x, q) in xs.chunks_exact(QK).zip(qs.chunks_exact_mut(QK)) {
        let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut sum = 0i32;
        for (v, q) in x.iter().zip(q.iter_mut()) {
            *q = (v * id).round() as i8;
            sum += *q as i32;
        }
        ds.push([d, d * sum as f32]);
    }
    Q8Rows { qs, ds, blocks }
}

/// `sums[r] = w · row (first + r)` for `r < n`, `w` one weight row's blocks.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_tile(w: &[u8], acts: &Q8Rows, first: usize, n: usize, sums: &mut [f32; TILE]) {
    let k = acts.blocks * QK;
    let low = _mm_set1_epi8(0x0F);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); TILE];
    let mut mins = [0f32; TILE];
    for (b, block) in w.chunks_exact(BLOCK_BYTES).enumerate() {
        // The block's F16 scale and minimum, widened together.
        let dm =
            _mm_cvtph_ps(_mm_cvtsi32_si128(i32::from_le_bytes([block[0], block[1], block[2], block[3]])));
        let d_w = _mm_cvtss_f32(dm);
        let m_w = _mm_cvtss_f32(_mm_movehdup_ps(dm));
        // SAFETY: `block` has 16 bytes after its two F16 values.
        let packed = unsafe { _mm_loadu_si128(block.as_ptr().add(4).cast()) };
        // Elements 0..16 are the low nibbles, 16..32 the high ones.
        let lo = _mm_and_si128(packed, low);
        let hi = _mm_and_si128(_mm_srli_epi16(packed, 4), low);
        let wq = _mm256_set_m128i(hi, lo);
        for r in 0..n {
            let row = first + r;
            let at = row * k + b * QK;
            // SAFETY: row `row` has `k` values, `b` is one of its blocks.
            let a = unsafe { _mm256_loadu_si256(acts.qs.as_ptr().add(at).cast()) };
            let [d_a, s_a] = acts.ds[row * acts.blocks + b];
            let products = _mm256_madd_epi16(_mm256_maddubs_epi16(wq, a), ones);
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d_w * d_a), _mm256_cvtepi32_ps(products), acc[r]);
            mins[r] += m_w * s_a;
        }
    }
    for r in 0..n {
        sums[r] = horizontal_sum(acc[r]) + mins[r];
    }
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn dot_tile(_: &[u8], _: &Q8Rows, _: usize, _: usize, _: &mut [f32; TILE]) {
    unreachable!("`applies` is false off x86-64")
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn horizontal_sum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn other_block_types_are_left_to_candle() {
        let w = Tensor::randn(0f32, 1.0, (4, 64), &Device::Cpu).expect("test tensor");
        let q = QTensor::quantize(&w, GgmlDType::Q8_0).expect("test tensor");
        assert!(!applies(&q));
    }
}
