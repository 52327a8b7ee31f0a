//! Q8_0 weights multiplied against generated tokens' rows in tiles: the default model's tied
//! output projection (49,152 rows of 576), read once per token; and, for a prompt's rows, in
//! F32 a slice of widened weight rows at a time ([`Packed::matmul_f32`], [`crate::widened`]).
//!
//! candle multiplies Q8_0 one output at a time and reads a weight row again for every
//! activation row. [`Packed`] stores the blocks of [`GROUP`] weight rows side by side (their
//! eight F16 scales, then their eight rows of 32 bytes), the same bytes rearranged, so that the
//! weights stream from one place in order however many of a group's rows a tile takes. With
//! [`ACT_ROWS`] activation rows, tiles of [`WEIGHT_ROWS`] × [`ACT_ROWS`] share each weight
//! block loaded; a lone activation row (a decode step) meets a whole group at once, eight
//! independent chains of additions instead of one: its product with the 49,152 rows took 0.93 ms
//! against 1.43 for one weight row after another, on a 2-core Xeon. The arithmetic is candle's:
//! activations quantized as its `BlockQ8_0::from_float` does (F16 scale, rounded half away from
//! zero), per block the same eight integer lanes (four products each) scaled by `d_w·d_a` into
//! eight F32 lanes in block order, the lanes summed as its `hsum_float_8` sums them. So a logit is
//! candle's bit for bit, whichever tile computes it and however many rows share the step.
//!
//! Unsafe code: SIMD intrinsics (behind a run-time CPU check) and the pool's threads writing
//! disjoint elements of one output buffer.
#![allow(unsafe_code)]

use crate::grouped::{ACT_ROWS, GROUP};
use candle_core::Tensor;
use candle_core::quantized::{GgmlDType, QTensor};
use half::f16;
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Elements per block.
const QK: usize = 32;
/// Bytes per block: an F16 scale and 32 signed bytes.
const BLOCK_BYTES: usize = 34;
/// A tile's weight rows when there are [`ACT_ROWS`] activation rows; a lone activation row's
/// tile takes the whole group.
const WEIGHT_ROWS: usize = 2;
/// A group's bytes for one block column: [`GROUP`] F16 scales, then the rows' 32 bytes each.
const GROUP_BLOCK_BYTES: usize = GROUP * BLOCK_BYTES;

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

/// A Q8_0 matrix's blocks, [`GROUP`] rows side by side (see the module's text); the last
/// group's missing rows are zero.
pub(crate) struct Packed {
    bytes: Vec<u8>,
    rows: usize,
    cols: usize,
}

impl Packed {
    /// `q`'s blocks repacked; `q` must be a matrix that [`applies`].
    pub(crate) fn new(q: &QTensor) -> candle_core::Result<Self> {
        let (rows, cols, data) = crate::grouped::matrix_blocks(q, applies(q), "Q8_0", BLOCK_BYTES)?;
        let blocks = cols / QK;
        let row_bytes = blocks * BLOCK_BYTES;
        let mut bytes = vec![0u8; rows.div_ceil(GROUP) * blocks * GROUP_BLOCK_BYTES];
        for (at, to) in bytes.chunks_exact_mut(GROUP_BLOCK_BYTES).enumerate() {
            let (g, b) = (at / blocks, at % blocks);
            for r in (0..GROUP).take_while(|r| g * GROUP + r < rows) {
                let block = &data[(g * GROUP + r) * row_bytes + b * BLOCK_BYTES..][..BLOCK_BYTES];
                to[2 * r..2 * r + 2].copy_from_slice(&block[..2]);
                to[2 * GROUP + QK * r..2 * GROUP + QK * (r + 1)].copy_from_slice(&block[2..]);
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

    /// Group `g`'s bytes, every block column.
    fn group(&self, g: usize) -> &[u8] {
        let n = self.cols / QK * GROUP_BLOCK_BYTES;
        &self.bytes[g * n..(g + 1) * n]
    }

    /// `out = xs @ selfᵀ` for `m` rows of `xs`: `out` holds `m × rows` values.
    pub(crate) fn matmul_into(&self, xs: &[f32], m: usize, out: &mut [f32]) -> candle_core::Result<()> {
        let (rows, k) = (self.rows, self.cols);
        if xs.len() != m * k || out.len() != m * rows {
            candle_core::bail!(
                "{} inputs and {} outputs for a {m}×{k} by {k}×{rows} product",
                xs.len(),
                out.len()
            )
        }
        let acts = quantize(xs, k / QK);
        crate::grouped::by_groups(rows, m, out, |g, first, n, sums| {
            let w = self.group(g);
            // SAFETY: `Packed::new` checked that this CPU has AVX2, FMA and F16C (`applies`); `w`
            // is a whole group and activation rows `first..first + n` exist.
            unsafe {
                if n == ACT_ROWS {
                    for p in (0..GROUP).step_by(WEIGHT_ROWS) {
                        let mut tile_sums = [[0f32; ACT_ROWS]; WEIGHT_ROWS];
                        tile::<WEIGHT_ROWS, ACT_ROWS>(w, p, &acts, first, &mut tile_sums);
                        for (i, row) in tile_sums.iter().enumerate() {
                            for (r, &v) in row.iter().enumerate() {
                                sums[r][p + i] = v;
                            }
                        }
                    }
                } else {
                    for (r, s) in sums.iter_mut().enumerate().take(n) {
                        let mut tile_sums = [[0f32; 1]; GROUP];
                        tile::<GROUP, 1>(w, 0, &acts, first + r, &mut tile_sums);
                        for (s, t) in s.iter_mut().zip(tile_sums) {
                            *s = t[0];
                        }
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
    /// weights as candle dequantizes them (`d·q`), widened a slice of rows at a time
    /// ([`crate::widened`]).
    pub(crate) fn matmul_f32(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        crate::widened::matmul(x, self.rows, self.cols, |r, out| {
            let group = self.group(r / GROUP);
            let i = r % GROUP;
            for (b, out) in out.chunks_exact_mut(QK).enumerate() {
                let at = &group[b * GROUP_BLOCK_BYTES..][..GROUP_BLOCK_BYTES];
                let d = f16::from_le_bytes([at[2 * i], at[2 * i + 1]]).to_f32();
                let qs = &at[2 * GROUP + QK * i..][..QK];
                for (o, &q) in out.iter_mut().zip(qs) {
                    *o = f32::from(q as i8) * d;
                }
            }
        })
    }
}

/// `sums[i][r] = (row r0 + i of group w) · activation row (first + r)`, for `W` weight rows
/// and `A` activation rows, in candle's arithmetic (see the module's doc).
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; `w` is a whole group of `acts.blocks` block columns,
/// `r0 + W <= GROUP`, and `first + A` activation rows exist.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::needless_range_loop, reason = "the accumulators are indexed by both loops")]
unsafe fn tile<const W: usize, const A: usize>(
    w: &[u8],
    r0: usize,
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
        // Block column `b` of the group: the scales, then the rows' bytes.
        let at = &w[b * GROUP_BLOCK_BYTES..][..GROUP_BLOCK_BYTES];
        for i in 0..W {
            let r = r0 + i;
            dw[i] = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(u16::from_le_bytes([
                at[2 * r],
                at[2 * r + 1],
            ])))));
            let qs = &at[2 * GROUP + QK * r..][..QK];
            // SAFETY: `qs` has 32 bytes.
            wq[i] = unsafe { _mm256_loadu_si256(qs.as_ptr().cast()) };
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
unsafe fn tile<const W: usize, const A: usize>(
    _: &[u8],
    _: usize,
    _: &Acts,
    _: usize,
    _: &mut [[f32; A]; W],
) {
    unreachable!("`applies` is false off x86-64")
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// Every row of every batch size is candle's product bit for bit, through each tile shape
    /// (2 × 4 for four activation rows, 8 × 1 for the others), a last group of 5 rows among
    /// them; and a prompt's product is candle's product of the whole dequantized matrix.
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
        let packed = Packed::new(&q).expect("packed");
        assert_eq!(packed.block_bytes(), q.data().expect("data").len());
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for m in [1usize, 3, 4, 5, 9] {
            let xs: Vec<f32> =
                (0..m * k).map(|i| ((i as f32) * 0.37).cos() * (1.0 + (i % 7) as f32)).collect();
            let x = Tensor::from_vec(xs.clone(), (m, k), &Device::Cpu).expect("input");
            let values = |t: Tensor| t.flatten_all().expect("flat").to_vec1::<f32>().expect("values");
            let candle = values(x.apply_op1_no_bwd(&q).expect("candle"));
            let mut out = vec![0f32; m * rows];
            packed.matmul_into(&xs, m, &mut out).expect("product");
            assert_eq!(bits(&out), bits(&candle), "{m} rows");
            let widened = values(crate::widened::quantized(&q, &x).expect("a block type").expect("widened"));
            assert_eq!(bits(&values(packed.matmul_f32(&x).expect("f32"))), bits(&widened), "{m} prompt rows");
        }
    }
}
