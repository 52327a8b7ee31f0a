//! The step's matrix products: cuBLAS gemms, and for steps of one or two rows with 16-bit
//! weights the `gemv` kernels, which stream the weights once (`gemv.cu`), among them the MLP's
//! gate/up product fused with SiLU·up, products that work out the norm before them and products
//! that add into the residual stream.

// Kernel launches and cuBLAS calls on raw device pointers; see the parent module's note.
#![allow(unsafe_code)]

use super::kernels::Resident;
use super::{Forward, Lane, cfg1, cuda_type};
use crate::gpu::buffers::Buf;
use crate::gpu::error::{GpuError, driver};
use crate::gpu::plan::{
    GEMV_ROWS, check_matmul, gemv_glu_fits, gemv_glu_groups, gemv_groups, gemv_kernel, gemv_split,
};
use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t};
use cudarc::driver::LaunchArgs;
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, PushKernelArg};
use xinf_engine::KvDtype;

/// A product's activation rows.
#[derive(Clone, Copy)]
pub(in crate::gpu) enum Rows<'a> {
    /// `[rows][inp]` in the weights' dtype.
    Plain(&'a Buf),
    /// `RMSNorm(res[0]) · w` of the residual stream's first row (`inp` its hidden size),
    /// which each `gemv_norm` block works out itself: `rmsnorm`'s output, without its launch.
    /// Products of one row only (`plan::norms_fused_fit`).
    Normed { res: &'a Buf, w: &'a Buf },
}

impl Rows<'_> {
    /// Bytes the rows stand for in the weights' dtype of `es` bytes (`check_matmul`'s `x`), for
    /// rows of `inp` values: the residual stream's values, where rows are of the `hidden` size
    /// the `_norm` kernels are compiled for and the norm's weight holds one (else none).
    fn bytes(&self, es: usize, inp: usize, hidden: usize) -> usize {
        match *self {
            Rows::Plain(x) => x.len(),
            Rows::Normed { res, w } if inp == hidden && w.len() >= inp * es => res.len(),
            Rows::Normed { .. } => 0,
        }
    }

    /// Pushes the rows as the kernel's `x` (plain), or as its `res, nw, eps` (`_norm` kernels).
    fn push<'b>(&'b self, b: &mut LaunchArgs<'b>, eps: &'b f32) {
        match self {
            Rows::Plain(x) => b.arg(*x),
            Rows::Normed { res, w } => b.arg(*res).arg(*w).arg(eps),
        };
    }
}

/// Where a product's output goes: `gemv`'s `mode`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(in crate::gpu) enum Out {
    /// f32 values.
    F32 = 0,
    /// Values in the weights' dtype.
    Narrow = 1,
    /// Added into the residual stream (of the weights' dtype, the sum rounded): by `gemv` after
    /// rounding the product to that dtype, as PyTorch's models round; by cuBLAS in f32
    /// (beta 1), so rounded once.
    AddRes = 2,
}

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
        self.gemm(lane, w, Rows::Plain(x), (yp, bytes, Out::F32), dims)
    }

    /// `res[t][o] += Σ_i x[t][i] · w[o][i]` into the residual stream `res` (the weights' dtype;
    /// [`Out::AddRes`] says how it is rounded): the products before a norm, so the norm only
    /// reads the stream, instead of a product's output and the stream and writing the stream.
    pub(super) fn matmul_add(
        &self,
        lane: Lane<'_>,
        w: &Buf,
        x: &Buf,
        res: &mut Buf,
        dims: [usize; 3],
    ) -> Result<(), GpuError> {
        let bytes = res.len();
        let (yp, _y) = res.device_ptr_mut(lane.stream);
        self.gemm(lane, w, Rows::Plain(x), (yp, bytes, Out::AddRes), dims)
    }

    /// [`Self::matmul`] with `y` in the weights' dtype: for outputs only an elementwise kernel
    /// reads (every product of a layer), whose f32 copy would be written and read again in
    /// full; the kernels reading them compute in f32.
    /// `x` may be [`Rows::Normed`] where the step's norms are fused.
    pub(super) fn matmul_narrow(
        &self,
        lane: Lane<'_>,
        w: &Buf,
        x: Rows<'_>,
        y: &mut Buf,
        dims: [usize; 3],
    ) -> Result<(), GpuError> {
        let bytes = y.len();
        let (yp, _y) = y.device_ptr_mut(lane.stream);
        self.gemm(lane, w, x, (yp, bytes, Out::Narrow), dims)
    }

    /// `gemv_glu` where it fits (`plan::gemv_glu_fits`): SiLU(gate) · up of `x`'s `rows` rows
    /// into the first `rows × inter` values of `y` (the gate/up product's buffer, `[rows][2 ·
    /// inter]`, of which the down product then reads `[rows][inter]`). `false`, with nothing
    /// enqueued, where it does not fit: the caller takes the product and `silu_mul` instead.
    pub(super) fn gate_up_silu(
        &self,
        lane: Lane<'_>,
        w: &Buf,
        x: Rows<'_>,
        y: &mut Buf,
        [inter, inp, rows]: [usize; 3],
    ) -> Result<bool, GpuError> {
        let glu = match x {
            Rows::Plain(_) => self.k.gemv_glu.as_ref().map(|k| (&k[gemv_kernel(rows)], u32::MAX)),
            Rows::Normed { .. } => self.k.gemv_glu_norm.as_ref().filter(|_| rows == 1).map(Resident::launch),
        };
        let Some((glu, most_blocks)) = glu.filter(|_| gemv_glu_fits(rows, inp)) else {
            return Ok(false);
        };
        let eb = self.wdt.size();
        check_matmul(
            [w.len(), x.bytes(eb, inp, self.cfg.hidden_size), y.len()],
            [eb, eb],
            [2 * inter, inp, rows],
        )
        .map_err(GpuError::Shape)?;
        let split = gemv_split(inp);
        let (inter_i, inp_i, rows_i, split_i) = (inter as i32, inp as i32, rows as i32, split as i32);
        let eps = self.cfg.rms_norm_eps as f32;
        let mut b = lane.stream.launch_builder(glu);
        b.arg(w);
        x.push(&mut b, &eps);
        b.arg(y).arg(&inter_i);
        if let Rows::Plain(_) = x {
            b.arg(&inp_i);
        }
        b.arg(&rows_i).arg(&split_i);
        // SAFETY: the buffers were checked above to hold the matrices (`w` [2 · inter][inp] and
        // the rows [rows][inp] in the weights' 16-bit dtype — or the residual rows and the
        // norm's weight of `inp`, the hidden size the `_norm` kernel is compiled for — the
        // kernel existing only for those; `y` [rows][2 · inter] of it, of which the kernel
        // writes [rows][inter]); the rows and `y` are different buffers, so no block reads
        // what another writes; rows of `inp`, a multiple of 8, are whole 16-byte words of
        // 16-byte aligned buffers; `split` ≤ 4 (`gemv_glu_fits`) gives each block a gate and an
        // up row at least, and the kernel indexes pairs below `inter` and rows below `rows` ≤
        // GEMV_ROWS.
        // (A grid below the pairs' groups is looped over by its blocks.)
        unsafe { b.launch(cfg1((gemv_glu_groups(inter, inp) as u32).min(most_blocks), 256)) }
            .map_err(driver)?;
        Ok(true)
    }

    /// The product of both: `y` is a device pointer, its buffer's bytes and what the product
    /// writes there. Steps of at most `GEMV_ROWS` rows with 16-bit weights take `gemv` (it
    /// streams the weights once; see `plan::GEMV_ROWS` for why so few); others a cuBLAS gemm,
    /// which takes plain rows only.
    fn gemm(
        &self,
        lane: Lane<'_>,
        w: &Buf,
        x: Rows<'_>,
        (yp, y_bytes, out_to): (u64, usize, Out),
        [out, inp, rows]: [usize; 3],
    ) -> Result<(), GpuError> {
        let ydt = if out_to == Out::F32 { KvDtype::F32 } else { self.wdt };
        let eb = self.wdt.size();
        check_matmul(
            [w.len(), x.bytes(eb, inp, self.cfg.hidden_size), y_bytes],
            [eb, ydt.size()],
            [out, inp, rows],
        )
        .map_err(GpuError::Shape)?;
        let gemv = match x {
            Rows::Plain(_) => self.k.gemv.as_ref().map(|k| (&k[gemv_kernel(rows)], u32::MAX)),
            Rows::Normed { .. } => self.k.gemv_norm.as_ref().filter(|_| rows == 1).map(Resident::launch),
        };
        if let Some((gemv, most_blocks)) = gemv.filter(|_| rows <= GEMV_ROWS && inp.is_multiple_of(8)) {
            let split = gemv_split(inp);
            let (out_i, inp_i, rows_i, split_i) = (out as i32, inp as i32, rows as i32, split as i32);
            let (mode, eps) = (out_to as i32, self.cfg.rms_norm_eps as f32);
            let mut b = lane.stream.launch_builder(gemv);
            b.arg(w);
            x.push(&mut b, &eps);
            b.arg(&yp).arg(&out_i);
            if let Rows::Plain(_) = x {
                b.arg(&inp_i);
            }
            b.arg(&rows_i).arg(&split_i).arg(&mode);
            // SAFETY: the buffers were checked above to hold the matrices (`w` [out][inp] and the
            // rows [rows][inp] in the weights' 16-bit dtype — or the residual rows and the norm's
            // weight of `inp`, the hidden size the `_norm` kernels are compiled for — the kernel
            // existing only for those; `yp` the caller's `y_bytes` for [rows][out] of f32, or of
            // the weights' dtype for `Out::Narrow` and `Out::AddRes`); rows of `inp`, a multiple of
            // 8, are whole 16-byte words of 16-byte aligned buffers; the kernel indexes outputs
            // below `out` and rows below `rows` ≤ GEMV_ROWS; `AddRes` reads and writes each output
            // once, in a buffer the rows are not read from.
            // (A grid below the rows' groups is looped over by its blocks.)
            unsafe { b.launch(cfg1((gemv_groups(out, inp) as u32).min(most_blocks), 256)) }
                .map_err(driver)?;
            return Ok(());
        }
        let Rows::Plain(x) = x else {
            return Err(GpuError::Shape(format!("a product of {rows} rows that only `gemv` computes")));
        };
        let ty = cuda_type(self.wdt);
        // Adding into the stream: cuBLAS reads its C (the stream) and writes the sum there.
        let (alpha, beta) = (1.0f32, if out_to == Out::AddRes { 1.0f32 } else { 0.0 });
        let (wp, _w) = w.device_ptr(lane.stream);
        let (xp, _x) = x.device_ptr(lane.stream);
        // Column-major view: Yᵀ[out, rows] = W[out, inp] (row-major Wᵀ, transposed) · Xᵀ[inp, rows].
        // SAFETY: the three buffers were checked above to hold the matrices the sizes, element
        // types and leading dimensions describe (`yp` points at the `y_bytes` the caller's
        // borrow of its buffer keeps alive); alpha and beta are f32 as CUBLAS_COMPUTE_32F
        // requires, and live until the call returns (cuBLAS reads host scalars before returning);
        // with beta 1 the output is also the input C, which a gemm reads and writes in place,
        // and never the rows' buffer (`act` or `gu`, not the stream).
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
