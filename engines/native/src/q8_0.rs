//! Q8_0 weights multiplied against generated tokens' rows in tiles: the default model's tied
//! output projection (49,152 rows of 576), read once per token.
//!
//! candle multiplies Q8_0 one output at a time and reads a weight row again for every
//! activation row. Here [`ACT_ROWS`] activation rows at a time share each weight block loaded,
//! with [`WEIGHT_ROWS`] × [`ACT_ROWS`] sums in flight. Rows left over (a lone decode row among
//! them) go against [`WIDE_ROWS`] weight rows at once: eight independent chains of additions
//! instead of one, which made a lone row's product over the 49,152 rows 1.5 times faster than
//! one weight row after another. The arithmetic is candle's: activations quantized as its
//! `BlockQ8_0::from_float` does (F16 scale, rounded half away from zero), per block the same
//! eight integer lanes (four products each) scaled by `d_w·d_a` into eight F32 lanes in block
//! order, the lanes summed as its `hsum_float_8` sums them. So a logit is candle's bit for bit,
//! whichever tile computes it and however many rows share the step.
//!
//! Unsafe code: SIMD intrinsics (behind a run-time CPU check) and the pool's threads writing
//! disjoint elements of one output buffer.
#![allow(unsafe_code)]

use candle_core::quantized::{GgmlDType, QTensor};
use half::f16;
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Elements per block.
const QK: usize = 32;
/// Bytes per block: an F16 scale and 32 signed bytes.
const BLOCK_BYTES: usize = 34;
/// A tile's weight rows and activation rows when there are [`ACT_ROWS`] activation rows.
const WEIGHT_ROWS: usize = 2;
const ACT_ROWS: usize = 4;
/// Weight rows of one work item of the CPU pool, and of a lone activation row's tile.
const WIDE_ROWS: usize = 8;

/// Whether `q` is multiplied here: a 2-D Q8_0 matrix of whole blocks, on a CPU with AVX2.
pub(crate) fn applies(q: &QTensor) -> bool {
    let dims = q.shape().dims();
    q.dtype() == GgmlDType::Q8_0 && dims.len() == 2 && dims[1].is_multiple_of(QK) && crate::q4_1::supported()
}

/// Activation rows quantized per block: the bytes, and each block's scale widened from F16.
struct Acts {
    qs: Vec<i8>,
    d: Vec<f32>,
    blocks: usize,
}

/// candle's `BlockQ8_0::from_float` on each 32-value block of `xs`.
fn quantize(xs: &[f32], blocks: usize) -> Acts {
    let mut qs = vec![0i8; xs.len()];
    let mut d = Vec::with_capacity(xs.len() / QK);
    for (x, q) in xs.chunks_exact(QK).zip(qs.chunks_exact_mut(QK)) {
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        let scale = amax / 127.0;
        let inverse = if scale != 0.0 { 1.0 / scale } else { 0.0 };
        d.push(f16::from_f32(scale).to_f32());
        for (q, &v) in q.iter_mut().zip(x) {
            *q = (v * inverse).round() as i8;
        }
    }
    Acts { qs, d, blocks }
}

/// `out = xs @ qᵀ` for `m` rows of `xs` and `q` a `[rows, cols]` matrix that [`applies`]:
/// `out` holds `m × rows` values.
pub(crate) fn matmul_into(q: &QTensor, xs: &[f32], m: usize, out: &mut [f32]) -> candle_core::Result<()> {
    let (rows, k) = q.shape().dims2()?;
    let data = q.data()?;
    let row_bytes = k / QK * BLOCK_BYTES;
    if !applies(q) || xs.len() != m * k || out.len() != m * rows || data.len() != rows * row_bytes {
        candle_core::bail!(
            "{} inputs, {} outputs and {} bytes for an {m}-row product with a {rows}×{k} {:?} matrix",
            xs.len(),
            out.len(),
            data.len(),
            q.dtype()
        )
    }
    let acts = quantize(xs, k / QK);
    let dst = crate::widened::SharedOut(out.as_mut_ptr());
    let weight_row = |j: usize| &data[j * row_bytes..(j + 1) * row_bytes];
    candle_core::utils::barrier_pool().execute_chunked(rows.div_ceil(WIDE_ROWS), |range| {
        for g in range {
            let j = g * WIDE_ROWS;
            let live = WIDE_ROWS.min(rows - j);
            let mut first = 0;
            while first < m {
                let n = if m - first >= ACT_ROWS { ACT_ROWS } else { 1 };
                let mut sums = [[0f32; ACT_ROWS]; WIDE_ROWS];
                // SAFETY: `applies(q)` checked that this CPU has AVX2, FMA and F16C; the weight
                // rows `j..j + live` and activation rows `first..first + n` exist.
                unsafe {
                    if n == ACT_ROWS && live == WIDE_ROWS {
                        for (p, pair) in sums.chunks_exact_mut(WEIGHT_ROWS).enumerate() {
                            let w = std::array::from_fn(|i| weight_row(j + p * WEIGHT_ROWS + i));
                            let mut tile_sums = [[0f32; ACT_ROWS]; WEIGHT_ROWS];
                            tile::<WEIGHT_ROWS, ACT_ROWS>(w, &acts, first, &mut tile_sums);
                            pair.copy_from_slice(&tile_sums);
                        }
                    } else if live == WIDE_ROWS {
                        for r in 0..n {
                            let w = std::array::from_fn(|i| weight_row(j + i));
                            let mut tile_sums = [[0f32; 1]; WIDE_ROWS];
                            tile::<WIDE_ROWS, 1>(w, &acts, first + r, &mut tile_sums);
                            for (s, t) in sums.iter_mut().zip(tile_sums) {
                                s[r] = t[0];
                            }
                        }
                    } else {
                        for (wi, s) in sums.iter_mut().enumerate().take(live) {
                            for (r, s) in s.iter_mut().enumerate().take(n) {
                                let mut one = [[0f32; 1]; 1];
                                tile::<1, 1>([weight_row(j + wi)], &acts, first + r, &mut one);
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

/// `sums[i][r] = w[i] · activation row (first + r)`, for `W` weight rows and `A` activation
/// rows, in candle's arithmetic (see the module's doc).
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; `first + A` activation rows exist.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::needless_range_loop, reason = "the accumulators are indexed by both loops")]
unsafe fn tile<const W: usize, const A: usize>(
    w: [&[u8]; W],
    acts: &Acts,
    first: usize,
    sums: &mut [[f32; A]; W],
) {
    let k = acts.blocks * QK;
    let ones = _mm256_set1_epi16(1);
    let mut acc = [[_mm256_setzero_ps(); A]; W];
    for b in 0..acts.blocks {
        let mut wq = [_mm256_setzero_si256(); W];
        let mut dw = [0f32; W];
        for i in 0..W {
            let block = &w[i][b * BLOCK_BYTES..(b + 1) * BLOCK_BYTES];
            dw[i] = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(u16::from_le_bytes([
                block[0], block[1],
            ])))));
            // SAFETY: `block` has 32 bytes after its F16 scale.
            wq[i] = unsafe { _mm256_loadu_si256(block.as_ptr().add(2).cast()) };
        }
        for r in 0..A {
            let row = first + r;
            // SAFETY: row `row` has `k` values, `b` is one of its blocks.
            let a = unsafe { _mm256_loadu_si256(acts.qs.as_ptr().add(row * k + b * QK).cast()) };
            let d_a = acts.d[row * acts.blocks + b];
            for i in 0..W {
                // candle's `mul_sum_i8_pairs_float(weights, activations)`.
                let unsigned = _mm256_sign_epi8(wq[i], wq[i]);
                let signed = _mm256_sign_epi8(a, wq[i]);
                let pairs = _mm256_maddubs_epi16(unsigned, signed);
                let q = _mm256_cvtepi32_ps(_mm256_madd_epi16(ones, pairs));
                acc[i][r] = _mm256_fmadd_ps(_mm256_set1_ps(dw[i] * d_a), q, acc[i][r]);
            }
        }
    }
    for (sums, acc) in sums.iter_mut().zip(acc) {
        for (s, acc) in sums.iter_mut().zip(acc) {
            *s = crate::q4_1::horizontal_sum(acc);
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn tile<const W: usize, const A: usize>(_: [&[u8]; W], _: &Acts, _: usize, _: &mut [[f32; A]; W]) {
    unreachable!("`applies` is false off x86-64")
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Tensor};

    /// Every row of every batch size is candle's product bit for bit, through each tile shape
    /// (2 × 4; 8 × 1 for lone rows; 1 × 1 for the weight rows past a multiple of 8).
    #[test]
    fn products_are_candles_bit_for_bit() {
        if !crate::q4_1::supported() {
            eprintln!("SKIPPED: this CPU has no AVX2");
            return;
        }
        let (rows, k) = (77, 576);
        let weights: Vec<f32> = (0..rows * k).map(|i| ((i as f32) * 0.731).sin() * 0.3).collect();
        let w = Tensor::from_vec(weights, (rows, k), &Device::Cpu).expect("weights");
        let q = QTensor::quantize(&w, GgmlDType::Q8_0).expect("quantize");
        assert!(applies(&q));
        for m in [1usize, 3, 4, 5, 9] {
            let xs: Vec<f32> =
                (0..m * k).map(|i| ((i as f32) * 0.37).cos() * (1.0 + (i % 7) as f32)).collect();
            let x = Tensor::from_vec(xs.clone(), (m, k), &Device::Cpu).expect("input");
            let candle: Vec<f32> = x
                .apply_op1_no_bwd(&q)
                .expect("candle")
                .flatten_all()
                .expect("flat")
                .to_vec1()
                .expect("values");
            let mut out = vec![0f32; m * rows];
            matmul_into(&q, &xs, m, &mut out).expect("product");
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&out), bits(&candle), "{m} rows");
        }
    }
}
