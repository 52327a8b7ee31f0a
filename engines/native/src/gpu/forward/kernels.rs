//! The forward pass's kernels: NVRTC compiles them once per model and pair of dtypes.

use crate::gpu::error::{GpuError, driver};
use crate::gpu::flash::Flash;
use crate::gpu::plan::{GEMV_ROWS, decode_qkv_fits, flash_decode_fits, kernel_source, norms_fused_fit};
use cudarc::driver::{CudaFunction, CudaStream};
use std::sync::Arc;
use xinf_engine::KvDtype;
use xinf_transfer::gpu::nvrtc_arch;

/// The forward pass's kernels, compiled for one pair of weight and cache dtypes.
pub(super) struct Kernels {
    pub(super) embed: CudaFunction,
    pub(super) rmsnorm: CudaFunction,
    pub(super) qkv_post: CudaFunction,
    /// `attention` with blocks of the GQA group's heads, and with blocks of one head
    /// (`plan::attention_heads` picks per step).
    pub(super) attention: CudaFunction,
    pub(super) attention_one: CudaFunction,
    /// The tensor-core prefill attention, where `plan::flash_fits` says it exists and the GPU
    /// gives its shared memory.
    pub(super) flash: Option<Flash>,
    /// The tensor-core decode attention (one walk over the keys for a GQA group's heads), where
    /// `plan::flash_decode_fits` says it exists; it then takes every token `flash` does not.
    pub(super) flash_decode: Option<CudaFunction>,
    /// `flash_decode` doing `qkv_post`'s work too, for steps of one token a sequence, where
    /// `flash_decode` exists and `plan::decode_qkv_fits`.
    pub(super) flash_decode_qkv: Option<CudaFunction>,
    pub(super) silu_mul: CudaFunction,
    pub(super) argmax_rows: CudaFunction,
    /// Products of one or two rows with 16-bit weights (absent for f32 weights): one kernel per
    /// row capacity, `plan::gemv_kernel` picks.
    pub(super) gemv: Option<[CudaFunction; GEMV_ROWS]>,
    /// The MLP's gate/up product and SiLU·up in one kernel for the same steps, where
    /// `plan::gemv_glu_fits` (absent for f32 weights).
    pub(super) gemv_glu: Option<[CudaFunction; GEMV_ROWS]>,
    /// `gemv1` and `gemv_glu1` with the norm before them worked out by each block, where
    /// `plan::norms_fused_fit` the hidden size (absent for f32 weights).
    pub(super) gemv_norm: Option<Resident>,
    pub(super) gemv_glu_norm: Option<Resident>,
}

/// A kernel of 256-thread blocks that loop over their work, launched with no more blocks than
/// the GPU holds at once, so that each block pays what it does once (a `_norm` product's rows)
/// once only.
pub(super) struct Resident {
    f: CudaFunction,
    /// Blocks resident at once on the whole GPU.
    blocks: u32,
}

impl Resident {
    fn new(f: CudaFunction, sms: usize) -> Result<Self, GpuError> {
        let per_sm = f.occupancy_max_active_blocks_per_multiprocessor(256, 0, None).map_err(driver)?;
        Ok(Self { f, blocks: (per_sm.max(1) as usize * sms).min(u32::MAX as usize) as u32 })
    }

    /// The kernel and the most blocks to launch it with.
    pub(super) fn launch(&self) -> (&CudaFunction, u32) {
        (&self.f, self.blocks)
    }

    /// Its blocks resident at once on the whole GPU.
    pub(super) fn blocks(&self) -> usize {
        self.blocks as usize
    }
}

impl Kernels {
    /// Compiles the kernels for weights in `wdt`, a cache in `kdt` and a model of `shape`
    /// (heads of `head_dim`, `attention` blocks of `group` heads, `gqa` query heads per KV
    /// head, the hidden size), for the GPU of `s` (which reads `flash_prefill`'s launch
    /// constants).
    pub(super) fn compile(
        s: &Arc<CudaStream>,
        (wdt, kdt): (KvDtype, KvDtype),
        shape: [usize; 4],
    ) -> Result<Self, GpuError> {
        let [head_dim, _, gqa, hidden] = shape;
        let ctx = s.context();
        let (major, minor) = ctx.compute_capability().map_err(driver)?;
        let opts =
            cudarc::nvrtc::CompileOptions { arch: Some(nvrtc_arch(major, minor)), ..Default::default() };
        let ptx = cudarc::nvrtc::compile_ptx_with_opts(kernel_source(wdt, kdt, shape), opts)
            .map_err(|e| GpuError::Compile(e.to_string()))?;
        let module = ctx.load_module(ptx).map_err(driver)?;
        let f = |name: &str| module.load_function(name).map_err(driver);
        // `gemv.cu` compiles them for rows any product's input may be (a whole-register row).
        let norm_kernels = wdt != KvDtype::F32 && norms_fused_fit(1, [hidden; 3]);
        let sms = sm_count(s)?;
        let resident = |name: &str| Resident::new(f(name)?, sms);
        let decode = flash_decode_fits(kdt, head_dim, major, gqa);
        Ok(Self {
            embed: f("embed")?,
            rmsnorm: f("rmsnorm")?,
            qkv_post: f("qkv_post")?,
            attention: f("attention")?,
            attention_one: f("attention_one")?,
            flash: Flash::load(s, &module, kdt, head_dim, major)?,
            flash_decode: decode.then(|| f("flash_decode")).transpose()?,
            flash_decode_qkv: (decode && decode_qkv_fits(head_dim, gqa))
                .then(|| f("flash_decode_qkv"))
                .transpose()?,
            silu_mul: f("silu_mul")?,
            argmax_rows: f("argmax_rows")?,
            gemv: (wdt != KvDtype::F32).then(|| Ok::<_, GpuError>([f("gemv1")?, f("gemv2")?])).transpose()?,
            gemv_glu: (wdt != KvDtype::F32)
                .then(|| Ok::<_, GpuError>([f("gemv_glu1")?, f("gemv_glu2")?]))
                .transpose()?,
            gemv_norm: norm_kernels.then(|| resident("gemv_norm")).transpose()?,
            gemv_glu_norm: norm_kernels.then(|| resident("gemv_glu_norm")).transpose()?,
        })
    }
}

impl Kernels {
    /// Every kernel, by the address of its `CUfunction` (how a captured graph names it).
    pub(super) fn ids(&self) -> Vec<usize> {
        let mut all = vec![&self.embed, &self.rmsnorm, &self.qkv_post, &self.attention, &self.attention_one];
        all.extend([&self.silu_mul, &self.argmax_rows]);
        all.extend(self.flash.iter().map(|f| &f.f).chain(&self.flash_decode).chain(&self.flash_decode_qkv));
        all.extend(self.gemv.iter().chain(&self.gemv_glu).flatten());
        all.extend(self.gemv_norm.iter().chain(&self.gemv_glu_norm).map(|r| &r.f));
        all.into_iter().map(|f| f.cu_function() as usize).collect()
    }
}

/// The SMs of the GPU of `s`.
pub(super) fn sm_count(s: &Arc<CudaStream>) -> Result<usize, GpuError> {
    let n = s
        .context()
        .attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        .map_err(driver)?;
    Ok(n.max(1) as usize)
}
