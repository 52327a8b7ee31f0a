//! Products of generated tokens' rows with weights packed [`GROUP`] rows together (Q4_1 and
//! Q8_0, [`crate::q4_1::Packed`] and [`crate::q8_0::Packed`]): the walk over the groups on the
//! CPU pool and the writing of the sums, which both kernels share; each computes a tile of a
//! group's rows against up to [`ACT_ROWS`] activation rows in its own arithmetic.
//!
//! Unsafe code: the pool's threads writing disjoint elements of one output buffer.
#![allow(unsafe_code)]

use candle_core::quantized::QTensor;
use candle_core::{Device, Tensor};
use std::borrow::Cow;

/// Weight rows packed together: one work item of the CPU pool.
pub(crate) const GROUP: usize = 8;
/// Activation rows a tile takes at most: each weight block loaded serves that many.
pub(crate) const ACT_ROWS: usize = 4;

/// A tile's sums, `[activation row][weight row of the group]`.
pub(crate) type Sums = [[f32; GROUP]; ACT_ROWS];

/// A block matrix's `(rows, cols, bytes)` as read for packing, once checked: it is one the
/// kernel `applies` to, and it holds `block_bytes` per block of 32 columns in every row (the
/// block type's `name` in the errors).
pub(crate) fn matrix_blocks<'q>(
    q: &'q QTensor,
    applies: bool,
    name: &str,
    block_bytes: usize,
) -> candle_core::Result<(usize, usize, Cow<'q, [u8]>)> {
    let (rows, cols) = q.shape().dims2()?;
    if !applies {
        candle_core::bail!("a {rows}×{cols} {:?} matrix is not packed as {name}", q.dtype())
    }
    let data = q.data()?;
    if data.len() != rows * cols / 32 * block_bytes {
        candle_core::bail!("{} bytes of {name} blocks for a {rows}×{cols} matrix", data.len())
    }
    Ok((rows, cols, data))
}

/// `out` (`m × rows`) gets the product of `m` activation rows with a `rows`-row matrix packed
/// in groups: `tile(g, first, n, sums)` fills `sums[r][i]` for row `g·GROUP + i` and activation
/// row `first + r` (`r < n`, `n` up to [`ACT_ROWS`]). Rows past `rows` in the last group are
/// not written.
pub(crate) fn by_groups(
    rows: usize,
    m: usize,
    out: &mut [f32],
    tile: impl Fn(usize, usize, usize, &mut Sums) + Sync,
) {
    debug_assert_eq!(out.len(), m * rows);
    let dst = crate::widened::SharedOut(out.as_mut_ptr());
    candle_core::utils::barrier_pool().execute_chunked(rows.div_ceil(GROUP), |range| {
        for g in range {
            let live = GROUP.min(rows - g * GROUP);
            let mut first = 0;
            while first < m {
                let n = ACT_ROWS.min(m - first);
                let mut sums = [[0f32; GROUP]; ACT_ROWS];
                tile(g, first, n, &mut sums);
                for (r, row) in sums[..n].iter().enumerate() {
                    for (i, &v) in row[..live].iter().enumerate() {
                        // SAFETY: `(first + r, g·GROUP + i)` is inside the `m × rows` output,
                        // and each work item owns its groups' columns.
                        unsafe { dst.write((first + r) * rows + g * GROUP + i, v) };
                    }
                }
                first += n;
            }
        }
    });
}

/// `product(xs, m, out)` of `x`'s `m` rows into a `[m, rows]` tensor: the product generated
/// tokens get, on slices.
pub(crate) fn as_tensor(
    x: &Tensor,
    rows: usize,
    product: impl FnOnce(&[f32], usize, &mut [f32]) -> candle_core::Result<()>,
) -> candle_core::Result<Tensor> {
    let (m, _) = x.dims2()?;
    let xs = x.contiguous()?.flatten_all()?.to_vec1::<f32>()?;
    let mut out = vec![0f32; m * rows];
    product(&xs, m, &mut out)?;
    Tensor::from_vec(out, (m, rows), &Device::Cpu)
}
