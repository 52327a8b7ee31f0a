//! A prompt's rows multiplied in F32 against quantized weights, the weights widened to F32 a
//! slice of rows at a time on the thread that multiplies them.
//!
//! Prompt tokens are multiplied in F32 against the weights as candle dequantizes them (see
//! `RowKinds`). Widening a whole matrix first writes it out at four bytes a weight: for the
//! default model's tied output projection (49,152 × 576, Q8_0) that is 113 MB, newly allocated
//! and faulted in at every prompt's last token, for one row of logits. Here each work item of
//! the CPU pool widens [`F32_ROWS`] weight rows into its own buffer, which stays in the core's
//! L2, and multiplies them by candle's GEMM on its own thread.
//!
//! A row's result must not depend on how many rows share the call (a prompt then gives the
//! same K and V however it is cut into chunks or batched), and the GEMM sums three ways: a
//! product of at most 16 × 16 outputs one way, one of at most 64 × 64 in blocks of 512 along
//! `cols`, a bigger one in blocks that follow from `cols` alone. So every slice is wider than 64
//! rows where the matrix is (the last takes the rest), and `x` is padded with copies of its
//! last row to more than `256 / width` rows: every call then takes the third way, as candle's
//! `matmul` of the whole widened matrix does, whose results these are bit for bit where the
//! slices are whole.
//!
//! Unsafe code: the GEMM's raw pointers, and the pool's threads writing disjoint columns of one
//! output buffer.
#![allow(unsafe_code)]

use candle_core::quantized::k_quants::{self, GgmlType};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};

#[cfg(test)]
mod tests;

/// Weight rows widened and multiplied by one work item: 128 rows of a 576-wide matrix are 288
/// KiB, which stay in the core's L2 for the GEMM that reads them. More than 64, which keeps the
/// GEMM on one way of summing (see the module's text).
pub(crate) const F32_ROWS: usize = 128;

/// `x @ wᵀ` in F32 for `x` of `[m, cols]` and a `rows × cols` weight `w` whose row `r`
/// `widen(r, out)` writes to `out` (`cols` values), as candle dequantizes it.
pub(crate) fn matmul(
    x: &Tensor,
    rows: usize,
    cols: usize,
    widen: impl Fn(usize, &mut [f32]) + Sync,
) -> candle_core::Result<Tensor> {
    let (m, k) = x.dims2()?;
    if k != cols {
        candle_core::bail!("a {m}×{k} input against a {rows}×{cols} matrix")
    }
    if m == 0 || rows == 0 {
        return Tensor::zeros((m, rows), candle_core::DType::F32, &Device::Cpu);
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
            for (j, row) in w.chunks_exact_mut(k).take(n).enumerate() {
                widen(first + j, row);
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

/// `x @ qᵀ` in F32 for a prompt's rows `x` and a 2-D GGUF block matrix `q` (Q4_0 … Q8_K), its
/// rows widened by candle's own `to_float` a slice at a time: the values candle's `dequantize`
/// gives, without the whole widened matrix. `None` for a type without blocks (F32, F16, BF16)
/// or storage not laid out as its blocks, which the caller multiplies as it is.
pub(crate) fn quantized(q: &QTensor, x: &Tensor) -> Option<candle_core::Result<Tensor>> {
    match q.dtype() {
        GgmlDType::Q4_0 => blocks::<k_quants::BlockQ4_0>(q, x),
        GgmlDType::Q4_1 => blocks::<k_quants::BlockQ4_1>(q, x),
        GgmlDType::Q5_0 => blocks::<k_quants::BlockQ5_0>(q, x),
        GgmlDType::Q5_1 => blocks::<k_quants::BlockQ5_1>(q, x),
        GgmlDType::Q8_0 => blocks::<k_quants::BlockQ8_0>(q, x),
        GgmlDType::Q8_1 => blocks::<k_quants::BlockQ8_1>(q, x),
        GgmlDType::Q2K => blocks::<k_quants::BlockQ2K>(q, x),
        GgmlDType::Q3K => blocks::<k_quants::BlockQ3K>(q, x),
        GgmlDType::Q4K => blocks::<k_quants::BlockQ4K>(q, x),
        GgmlDType::Q5K => blocks::<k_quants::BlockQ5K>(q, x),
        GgmlDType::Q6K => blocks::<k_quants::BlockQ6K>(q, x),
        GgmlDType::Q8K => blocks::<k_quants::BlockQ8K>(q, x),
        GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16 => None,
    }
}

/// [`quantized`] for blocks of type `T`.
fn blocks<T: GgmlType>(q: &QTensor, x: &Tensor) -> Option<candle_core::Result<Tensor>> {
    let (rows, cols) = q.shape().dims2().ok()?;
    let data = q.data().ok()?;
    let size = std::mem::size_of::<T>();
    let whole = cols.is_multiple_of(T::BLCK_SIZE) && data.len() == rows * (cols / T::BLCK_SIZE) * size;
    if !whole || !data.as_ptr().cast::<T>().is_aligned() {
        return None;
    }
    // SAFETY: candle's CPU storage of a `T` matrix is a `Vec<T>` of plain data (F16 scales and
    // bytes, every bit pattern valid), which these bytes are: their length is a whole number
    // of `T`s and their start is aligned for `T`, both checked above.
    let blocks: &[T] = unsafe { std::slice::from_raw_parts(data.as_ptr().cast::<T>(), data.len() / size) };
    let per_row = cols / T::BLCK_SIZE;
    Some(matmul(x, rows, cols, |r, out| T::to_float(&blocks[r * per_row..(r + 1) * per_row], out)))
}

/// The output buffer, written by the pool's threads at disjoint indices.
pub(crate) struct SharedOut(pub(crate) *mut f32);

// SAFETY: the threads write disjoint elements (each caller's work items own theirs), and the
// buffer outlives the pool's call.
unsafe impl Sync for SharedOut {}

impl SharedOut {
    /// A pointer to element `i`, for a writer that owns the elements it writes through it.
    ///
    /// # Safety
    /// `i` is inside the buffer.
    pub(crate) unsafe fn at(&self, i: usize) -> *mut f32 {
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
