//! The step's matrix products: cuBLAS gemms, and for steps of one or two rows with 16-bit
//! weights the `gemv` kernels, which stream the weights once (`gemv.cu`), among them the MLP's
//! gate/up product fused with SiLU·up.

// Kernel launches and cuBLAS calls on raw device pointers; see the parent module's note.
#![allow(unsafe_code)]

use super::{Forward, Lane, cfg1, cuda_type};
use crate::gpu::buffers::Buf;
use crate::gpu::error::{GpuError, driver};
use crate::gpu::plan::{GEMV_ROWS, check_matmul, elem_bytes, gemv_glu_fits, gemv_kernel, gemv_split};
use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t};
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, PushKernelArg};
use xinf_engine::KvDtype;

impl Forward {
    /// `y[t][o] = Σ_i x[t][i] · w[o][i]` for `t < rows`: `w` is `[out, inp]` in the weights'
    /// dtype, `x` `[rows, inp]` in the weights' dtype, `y` `[rows, out]` f32, enqueued on `lane`.
    pub(super) fn matmul(
        &self,
        lane: Lane<'_>,
        w: &Buf,
        x: &Buf,
        y: &mut CudaSlice<f32>,
        dims: [usize; 3],
    ) -> Result<(), GpuError> {
        let bytes = y.len() * 4;
        let (yp, _y) = y.device_ptr_mut(lane.stream);
        self.gemm(lane, w, x, (yp, bytes, KvDtype::F32), dims)
    }

    /// [`Self::matmul`] with `y` in the weights' dtype: for outputs only an elementwise kernel
    /// reads (every product of a layer), whose f32 copy would be written and read again in
    /// full; the kernels reading them compute in f32.
    pub(super) fn matmul_narrow(
        &self,
        lane: Lane<'_>,
        w: &Buf,
        x: &Buf,
        y: &mut Buf,
        dims: [usize; 3],
    ) -> Result<(), GpuError> {
        let bytes = y.len();
        let (yp, _y) = y.device_ptr_mut(lane.stream);
        self.gemm(lane, w, x, (yp, bytes, self.wdt), dims)
    }

    /// `gemv_glu` where it fits (`plan::gemv_glu_fits`): SiLU(gate) · up of `x`'s `rows` rows
    /// into the first `rows × inter` values of `y` (the gate/up product's buffer, `[rows][2 ·
    /// inter]`, of which the down product then reads `[rows][inter]`). `false`, with nothing
    /// enqueued, where it does not fit: the caller takes the product and `silu_mul` instead.
    pub(super) fn gate_up_silu(
        &self,
        lane: Lane<'_>,
        w: &Buf,
        x: &Buf,
        y: &mut Buf,
        [inter, inp, rows]: [usize; 3],
    ) -> Result<bool, GpuError> {
        let Some(glu) = self.k.gemv_glu.as_ref().filter(|_| gemv_glu_fits(rows, inp)) else {
            return Ok(false);
        };
        let eb = elem_bytes(self.wdt);
        check_matmul([w.len(), x.len(), y.len()], [eb, eb], [2 * inter, inp, rows])
            .map_err(GpuError::Shape)?;
        let split = gemv_split(inp);
        let (inter_i, inp_i, rows_i, split_i) = (inter as i32, inp as i32, rows as i32, split as i32);
        let mut b = lane.stream.launch_builder(&glu[gemv_kernel(rows)]);
        b.arg(w).arg(x).arg(y).arg(&inter_i).arg(&inp_i).arg(&rows_i).arg(&split_i);
        // SAFETY: the buffers were checked above to hold the matrices (`w` [2 · inter][inp] and
        // `x` [rows][inp] in the weights' 16-bit dtype, the kernel existing only for those; `y`
        // [rows][2 · inter] of it, of which the kernel writes [rows][inter]); `x` and `y` are
        // different buffers, so no block reads what another writes; rows of `inp`, a multiple
        // of 8, are whole 16-byte words of 16-byte aligned buffers; `split` ≤ 4
        // (`gemv_glu_fits`) gives each block a gate and an up row at least, and the kernel
        // indexes pairs below `inter` and rows below `rows` ≤ GEMV_ROWS.
        unsafe { b.launch(cfg1(inter.div_ceil(4 / split) as u32, 256)) }.map_err(driver)?;
        Ok(true)
    }

    /// The product of both: `y` is a device pointer, its buffer's bytes and its dtype. Steps of
    /// at most `GEMV_ROWS` rows with 16-bit weights take `gemv` (it streams the weights once;
    /// see `plan::GEMV_ROWS` for why so few); others a cuBLAS gemm.
    fn gemm(
        &self,
        lane: Lane<'_>,
        w: &Buf,
        x: &Buf,
        (yp, y_bytes, ydt): (u64, usize, KvDtype),
        [out, inp, rows]: [usize; 3],
    ) -> Result<(), GpuError> {
        check_matmul([w.len(), x.len(), y_bytes], [elem_bytes(self.wdt), elem_bytes(ydt)], [out, inp, rows])
            .map_err(GpuError::Shape)?;
        if let Some(gemv) = self.k.gemv.as_ref().filter(|_| rows <= GEMV_ROWS && inp.is_multiple_of(8)) {
            let gemv = &gemv[gemv_kernel(rows)];
            let split = gemv_split(inp);
            let (out_i, inp_i, rows_i, split_i) = (out as i32, inp as i32, rows as i32, split as i32);
            let narrow = i32::from(ydt != KvDtype::F32);
            let mut b = lane.stream.launch_builder(gemv);
            b.arg(w).arg(x).arg(&yp).arg(&out_i).arg(&inp_i).arg(&rows_i).arg(&split_i).arg(&narrow);
            // SAFETY: the buffers were checked above to hold the matrices (`w` [out][inp] and
            // `x` [rows][inp] in the weights' 16-bit dtype, the kernel existing only for those;
            // `yp` the caller's `y_bytes` for [rows][out] of `ydt`, f32 unless `narrow`); rows
            // of `inp`, a multiple of 8, are whole 16-byte words of 16-byte aligned buffers; the
            // kernel indexes outputs below `out` and rows below `rows` ≤ GEMV_ROWS.
            unsafe { b.launch(cfg1(out.div_ceil(8 / split) as u32, 256)) }.map_err(driver)?;
            return Ok(());
        }
        let ty = cuda_type(self.wdt);
        let (alpha, beta) = (1.0f32, 0.0f32);
        let (wp, _w) = w.device_ptr(lane.stream);
        let (xp, _x) = x.device_ptr(lane.stream);
        // Column-major view: Yᵀ[out, rows] = W[out, inp] (row-major Wᵀ, transposed) · Xᵀ[inp, rows].
        // SAFETY: the three buffers were checked above to hold the matrices the sizes, element
        // types and leading dimensions describe (`yp` points at the `y_bytes` the caller's
        // borrow of its buffer keeps alive); alpha and beta are f32 as CUBLAS_COMPUTE_32F
        // requires, and live until the call returns (cuBLAS reads host scalars before returning).
        unsafe {
            cudarc::cublas::result::gemm_ex(
                *lane.blas.handle(),
                cublasOperation_t::CUBLAS_OP_T,
                cublasOperation_t::CUBLAS_OP_N,
                out as i32,
                rows as i32,
                inp as i32,
                (&alpha) as *const f32 as *const _,
                wp as *const _,
                ty,
                inp as i32,
                xp as *const _,
                ty,
                inp as i32,
                (&beta) as *const f32 as *const _,
                yp as *mut _,
                cuda_type(ydt),
                out as i32,
                cublasComputeType_t::CUBLAS_COMPUTE_32F,
                cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|e| GpuError::Blas(e.to_string()))
    }
}
