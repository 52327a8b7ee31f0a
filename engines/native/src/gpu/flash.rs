//! The tensor-core prefill attention kernel (`flash_prefill` in `flash.cu`) as the forward pass
//! launches it: its block shape differs by head dimension and is stated once, in `flash.cu`,
//! whose module constants the host reads here; its K/V (and Q) tiles live in dynamic shared
//! memory, which a function must be allowed past 48 KB before its first launch.

use super::error::{GpuError, driver};
use super::plan::{FLASH_TILE, flash_fits};
use cudarc::driver::sys::{CUdevice_attribute, CUfunction_attribute};
use cudarc::driver::{CudaFunction, CudaModule, CudaStream};
use std::sync::Arc;
use xinf_engine::KvDtype;

/// `flash_prefill` and how it is launched.
pub(super) struct Flash {
    pub(super) f: CudaFunction,
    /// Threads of a block (`flash_threads`).
    pub(super) threads: u32,
    /// Dynamic shared memory of a block (`flash_smem_bytes`).
    pub(super) smem: u32,
    /// Whether its blocks stay resident and walk the step's (head, tile) items
    /// (`flash_persistent`): it is then launched with a block an SM, at most one per item, and
    /// takes the tiles' count as a last argument.
    pub(super) persistent: bool,
}

impl Flash {
    /// `flash_prefill` from `module`, allowed the dynamic shared memory it takes, where it exists
    /// (`plan::flash_fits`) and the GPU gives a block that much (consumer GPUs of sm_86/sm_89 give
    /// 99 KB, data-centre ones 163–227 KB); `None` leaves prompt chunks to `attention`. Its block
    /// shape is `flash.cu`'s, read from the module's constants.
    pub(super) fn load(
        s: &Arc<CudaStream>,
        module: &Arc<CudaModule>,
        kdt: KvDtype,
        head_dim: usize,
        major: i32,
    ) -> Result<Option<Self>, GpuError> {
        if !flash_fits(kdt, head_dim, major) {
            return Ok(None);
        }
        let constant = |name: &str| -> Result<u32, GpuError> {
            let view = module.get_global(name, s).map_err(driver)?;
            let bytes = s.clone_dtoh(&view).map_err(driver)?;
            let word = bytes.get(..4).and_then(|b| <[u8; 4]>::try_from(b).ok());
            word.map(u32::from_le_bytes)
                .ok_or_else(|| GpuError::Compile(format!("flash.cu's {name} is not an int")))
        };
        let (threads, rows, smem) =
            (constant("flash_threads")?, constant("flash_rows")?, constant("flash_smem_bytes")?);
        // Only `flash_sm90.cu`'s kernel states it.
        let persistent = constant("flash_persistent").is_ok_and(|v| v != 0);
        if rows as usize != FLASH_TILE {
            return Err(GpuError::Compile(format!(
                "flash_prefill takes {rows} rows a block, the plan {FLASH_TILE}"
            )));
        }
        let optin = s
            .context()
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
            .map_err(driver)?;
        if i64::from(optin) < i64::from(smem) {
            tracing::info!(
                smem,
                optin,
                "prefill attention on tensor cores needs more shared memory than this GPU gives"
            );
            return Ok(None);
        }
        let f = module.load_function("flash_prefill").map_err(driver)?;
        f.set_attribute(CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem as i32)
            .map_err(driver)?;
        Ok(Some(Self { f, threads, smem, persistent }))
    }
}
