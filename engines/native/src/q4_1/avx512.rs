//! The Q4_1 × Q8 tile with AVX-512 VNNI: two blocks per 512-bit register, each block's 32
//! products summed by one `vpdpbusd` (where AVX2 needs `vpmaddubsw` and `vpmaddwd`), and the
//! scales applied to sixteen lanes at once instead of one block at a time. The integer sums
//! are the AVX2 tile's (nibbles times 8-bit values cannot overflow either way); the F32 sums
//! run in another order, the same for every tile shape, so a row's result still does not
//! depend on the other rows.

use super::{BLOCK_BYTES, Q8Rows, QK};
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Whether this CPU runs [`tile`].
pub(super) fn supported() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        super::supported()
            && is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx512vnni")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `sums[i][r] = w[i] · activation row (first + r)`, as [`super::tile`] computes them, for an
/// even number of blocks per row.
///
/// Register layout of a block pair `(b, b + 1)`: 128-bit lanes hold `b`'s low nibbles, `b + 1`'s
/// low nibbles, `b`'s high nibbles, `b + 1`'s high nibbles; the activations are shuffled to
/// match, and each 32-bit lane's scale is its block's. A block's minimum term `m_w · s_a` is
/// spread over its eight lanes as `m_w · s_a / 8` (exact: a power of two).
///
/// # Safety
/// The CPU runs [`supported`]; `first + A` rows exist; `acts.blocks` is even.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[allow(clippy::needless_range_loop)] // accumulators indexed [weight row][activation row], as in the AVX2 tile
pub(super) unsafe fn tile<const W: usize, const A: usize>(
    w: [&[u8]; W],
    acts: &Q8Rows,
    first: usize,
    sums: &mut [[f32; A]; W],
) {
    let k = acts.blocks * QK;
    let low = _mm256_set1_epi8(0x0F);
    // Lane i of a pair takes the scale of lane i / 4's block: [b, b+1, b, b+1] by quarters.
    let first_of = _mm512_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2, 0, 0, 0, 0, 2, 2, 2, 2);
    let second_of = _mm512_setr_epi32(1, 1, 1, 1, 3, 3, 3, 3, 1, 1, 1, 1, 3, 3, 3, 3);
    let eighth = _mm512_set1_ps(0.125);
    let mut acc = [[_mm512_setzero_ps(); A]; W];
    for b in (0..acts.blocks).step_by(2) {
        let mut wq = [_mm512_setzero_si512(); W];
        let mut dw = [_mm512_setzero_ps(); W];
        let mut mw = [_mm512_setzero_ps(); W];
        for i in 0..W {
            let pair = &w[i][b * BLOCK_BYTES..(b + 2) * BLOCK_BYTES];
            // SAFETY: each block of the pair has 16 bytes of nibbles after its two F16 values.
            let packed = unsafe {
                _mm256_loadu2_m128i(pair.as_ptr().add(BLOCK_BYTES + 4).cast(), pair.as_ptr().add(4).cast())
            };
            let lo = _mm256_and_si256(packed, low);
            let hi = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low);
            wq[i] = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
            // [d_b, m_b, d_b+1, m_b+1] widened from F16.
            let dm = u64::from(u32::from_le_bytes([pair[0], pair[1], pair[2], pair[3]]))
                | u64::from(u32::from_le_bytes([pair[20], pair[21], pair[22], pair[23]])) << 32;
            let dm = _mm512_castps128_ps512(_mm_cvtph_ps(_mm_cvtsi64_si128(dm as i64)));
            dw[i] = _mm512_permutexvar_ps(first_of, dm);
            mw[i] = _mm512_permutexvar_ps(second_of, dm);
        }
        for r in 0..A {
            let row = first + r;
            // SAFETY: row `row` has `k` values; `b` and `b + 1` are two of its blocks.
            let a = unsafe { _mm512_loadu_si512(acts.qs.as_ptr().add(row * k + b * QK).cast()) };
            // [b low, b high, b+1 low, b+1 high] → [b low, b+1 low, b high, b+1 high].
            let a = _mm512_shuffle_i64x2(a, a, 0b11_01_10_00);
            // SAFETY: `ds` holds `[d, s]` for blocks `b` and `b + 1` of the row, adjacent.
            let ds = unsafe { _mm_loadu_ps(acts.ds.as_ptr().add(row * acts.blocks + b).cast()) };
            let ds = _mm512_castps128_ps512(ds);
            let da = _mm512_permutexvar_ps(first_of, ds);
            let sa = _mm512_mul_ps(_mm512_permutexvar_ps(second_of, ds), eighth);
            for i in 0..W {
                let products = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wq[i], a);
                let scaled = _mm512_mul_ps(_mm512_cvtepi32_ps(products), da);
                acc[i][r] = _mm512_fmadd_ps(mw[i], sa, _mm512_fmadd_ps(scaled, dw[i], acc[i][r]));
            }
        }
    }
    for i in 0..W {
        for r in 0..A {
            sums[i][r] = _mm512_reduce_add_ps(acc[i][r]);
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
pub(super) unsafe fn tile<const W: usize, const A: usize>(
    _: [&[u8]; W],
    _: &Q8Rows,
    _: usize,
    _: &mut [[f32; A]; W],
) {
    unreachable!("`supported` is false off x86-64")
}
