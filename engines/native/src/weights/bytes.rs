//! A weight tensor's bytes, as the GPU backend uploads them.

use candle_core::{CpuStorage, DType, Storage, Tensor};

/// Calls `f` with the little-endian bytes of `t`'s elements in `dtype` (F32, F16 or BF16), in
/// row-major order. Where `t` is already in `dtype` and its elements lie in one run of CPU
/// memory, `f` reads them where they are; only other tensors are converted into a copy first.
/// An 8B model's 16 GB of weights are loaded in their own dtype, so the upload reads them in
/// place instead of copying them twice more on the way.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn with_le_bytes<R>(
    t: &Tensor,
    dtype: DType,
    f: impl FnOnce(&[u8]) -> R,
) -> candle_core::Result<R> {
    if cfg!(target_endian = "little") && t.dtype() == dtype {
        let (storage, layout) = t.storage_and_layout();
        if let (Storage::Cpu(cpu), Some((start, end))) = (&*storage, layout.contiguous_offsets()) {
            let bytes: Option<&[u8]> = match cpu {
                CpuStorage::F32(v) => v.get(start..end).map(bytemuck::cast_slice),
                CpuStorage::F16(v) => v.get(start..end).map(bytemuck::cast_slice),
                CpuStorage::BF16(v) => v.get(start..end).map(bytemuck::cast_slice),
                _ => None,
            };
            if let Some(bytes) = bytes {
                return Ok(f(bytes));
            }
        }
    }
    Ok(f(&converted(t, dtype)?))
}

/// `t`'s elements converted to `dtype`, as little-endian bytes in a new buffer.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
fn converted(t: &Tensor, dtype: DType) -> candle_core::Result<Vec<u8>> {
    let flat = t.flatten_all()?.to_dtype(dtype)?;
    Ok(match dtype {
        DType::F16 => flat.to_vec1::<half::f16>()?.iter().flat_map(|v| v.to_le_bytes()).collect(),
        DType::BF16 => flat.to_vec1::<half::bf16>()?.iter().flat_map(|v| v.to_le_bytes()).collect(),
        DType::F32 => flat.to_vec1::<f32>()?.iter().flat_map(|v| v.to_le_bytes()).collect(),
        other => candle_core::bail!("weights are uploaded as F32, F16 or BF16, not {other:?}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn bytes(t: &Tensor, dtype: DType) -> Vec<u8> {
        with_le_bytes(t, dtype, <[u8]>::to_vec).expect("bytes")
    }

    #[test]
    fn tensors_read_in_place_give_the_bytes_a_conversion_gives() {
        let values: Vec<f32> = (0..6 * 10).map(|i| i as f32 * 0.37 - 9.0).collect();
        let base = Tensor::from_vec(values, (6, 10), &Device::Cpu).expect("tensor");
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let t = base.to_dtype(dtype).expect("dtype");
            // Whole, a run of rows past the start (an offset into the storage), and a
            // transposed view (not one run of memory, so converted).
            let rows = t.narrow(0, 2, 3).expect("rows");
            let cols = t.t().expect("transposed");
            for (what, v) in [("whole", &t), ("rows", &rows), ("transposed", &cols)] {
                let want = converted(v, dtype).expect("converted");
                assert_eq!(bytes(v, dtype), want, "{what} in {dtype:?}");
                assert_eq!(want.len(), v.elem_count() * dtype.size_in_bytes(), "{what} in {dtype:?}");
            }
            // In another dtype than the one asked for: converted.
            let other = if dtype == DType::F32 { DType::F16 } else { DType::F32 };
            assert_eq!(bytes(&t, other), converted(&t, other).expect("converted"), "{dtype:?} as {other:?}");
        }
        // The first element of the rows' view is row 2's first.
        let rows = base.narrow(0, 2, 3).expect("rows");
        assert_eq!(bytes(&rows, DType::F32)[..4], (2.0 * 10.0 * 0.37f32 - 9.0).to_le_bytes());
        assert!(with_le_bytes(&base, DType::U8, |_| ()).is_err());
    }
}
