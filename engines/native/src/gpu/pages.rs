//! The KV cache in device memory, and its canonical pages in and out.
//!
//! The cache is allocated region by region from the engine's [`LayoutDescriptor`], so it is
//! byte for byte what vLLM or SGLang would hold on the GPU, and the page conversion kernel of
//! [`GpuPages`] gathers pages out of it (to host memory, or to staging memory for a
//! GPU-to-GPU handoff) and scatters received pages into it straight from there.

use super::buffers::Buf;
use super::error::{GpuError, driver};
use super::plan::{page_bytes, pages_for, rows_aligned};
use cudarc::driver::DevicePtr;
use std::sync::Arc;
use xinf_engine::KvDtype;
use xinf_transfer::LayoutDescriptor;
use xinf_transfer::device::{DeviceLease, DevicePages, DeviceRoute};
use xinf_transfer::gpu::GpuPages;
use xinf_transfer::gpu_handoff::{GpuHandoff, Received};

/// The cache as the kernels address it: strides in elements, and each layer's K and V plane.
pub(super) struct CacheView {
    pub(super) block_size: i32,
    pub(super) s_blk: i64,
    pub(super) s_tok: i64,
    pub(super) s_head: i64,
    /// Device address of each `(layer, K/V)` plane.
    pub(super) planes: Vec<[u64; 2]>,
    /// Whether every K/V row can be read in whole 16-byte words (`plan::rows_aligned`).
    pub(super) aligned: bool,
}

/// The KV cache's device memory, and the page conversions in and out of it.
pub(super) struct KvMemory {
    desc: LayoutDescriptor,
    /// The cache's dtype.
    kdt: KvDtype,
    /// One buffer per region of `desc`, in `kdt`.
    regions: Vec<Buf>,
    /// The page conversion kernel, with the GPU's context and the model's stream it runs on.
    pages: GpuPages,
    /// Where the kernels find `regions`.
    view: CacheView,
    /// Staging and receiving for GPU-to-GPU handoffs.
    handoff: Arc<GpuHandoff>,
}

impl KvMemory {
    /// Allocates the zeroed cache of `desc` in `kdt` on `pages`' GPU, whose planes are at
    /// `planes` (`(region, byte offset)`, checked against the regions by the plan).
    pub(super) fn new(
        pages: GpuPages,
        desc: LayoutDescriptor,
        kdt: KvDtype,
        planes: &[[(usize, usize); 2]],
    ) -> Result<Self, GpuError> {
        let s = pages.stream();
        let es = kdt.size();
        let mut regions = Vec::with_capacity(desc.num_regions);
        for _ in 0..desc.num_regions {
            regions.push(s.alloc_zeros::<u8>(desc.region_len * es).map_err(driver)?);
        }
        let mut addresses = Vec::with_capacity(planes.len());
        for pair in planes {
            let mut at = [0u64; 2];
            for kv in 0..2 {
                let (region, offset) = pair[kv];
                let buf =
                    regions.get(region).ok_or_else(|| GpuError::Shape("a plane past the regions".into()))?;
                let (base, _sync) = buf.device_ptr(s);
                at[kv] = base + offset as u64;
            }
            addresses.push(at);
        }
        let aligned = rows_aligned(&addresses, [desc.s_blk, desc.s_tok, desc.s_head], desc.head_dim, es);
        let view = CacheView {
            aligned,
            block_size: desc.block_size() as i32,
            s_blk: desc.s_blk as i64,
            s_tok: desc.s_tok as i64,
            s_head: desc.s_head as i64,
            planes: addresses,
        };
        let handoff = Arc::new(GpuHandoff::new(pages.context())?);
        Ok(Self { desc, kdt, regions, pages, view, handoff })
    }

    /// Where the kernels find the cache.
    pub(super) fn view(&self) -> &CacheView {
        &self.view
    }

    /// The engine's GPU handoff side (its decode-side sink, and where it says its KV lives).
    pub(super) fn handoff(&self) -> Arc<GpuHandoff> {
        Arc::clone(&self.handoff)
    }

    /// Bytes of one canonical page in the cache's dtype.
    fn page_bytes(&self) -> usize {
        page_bytes(&self.desc, self.kdt)
    }

    /// Pages `first..first + count` of a `len`-token sequence, copied to host memory.
    pub(super) fn export_host(
        &self,
        table: &[u32],
        len: usize,
        first: usize,
        count: usize,
    ) -> Result<Vec<u8>, GpuError> {
        if count == 0 {
            return Ok(Vec::new());
        }
        let stream = self.pages.stream();
        self.pages.context().bind_to_thread().map_err(driver)?;
        let mut staging = stream.alloc_zeros::<u8>(count * self.page_bytes()).map_err(driver)?;
        let es = self.kdt.size();
        self.pages.gather(&self.desc, es, &self.regions, table, len, first..first + count, &mut staging)?;
        let host = stream.clone_dtoh(&staging).map_err(driver)?;
        stream.synchronize().map_err(driver)?;
        Ok(host)
    }

    /// Pages `first..first + count` of a `len`-token sequence, gathered into staging memory
    /// for `route` and complete before the lease exists.
    pub(super) fn export_device(
        &self,
        table: &[u32],
        len: usize,
        first: usize,
        count: usize,
        route: DeviceRoute,
    ) -> Result<DeviceLease, GpuError> {
        let bytes = count * self.page_bytes();
        if count == 0 {
            return Err(GpuError::Shape("an export of no pages".into()));
        }
        self.pages.context().bind_to_thread().map_err(driver)?;
        let mut staged = self.handoff.export_staging(route, bytes)?;
        let es = self.kdt.size();
        let dst = staged.slice_mut()?;
        self.pages.gather(&self.desc, es, &self.regions, table, len, first..first + count, dst)?;
        // The pages are complete before anyone may read them: an event after the gather,
        // waited for before the lease (and so the handle or address) exists.
        let done = self.pages.stream().record_event(None).map_err(driver)?;
        done.synchronize().map_err(driver)?;
        self.handoff.lease(route, staged, bytes).map_err(GpuError::from)
    }

    /// Scatters pages received into this GPU's memory, covering positions `0..len`.
    pub(super) fn import_device(
        &mut self,
        table: &[u32],
        len: usize,
        pages: &DevicePages,
    ) -> Result<(), GpuError> {
        let count = pages_for(len, pages.len(), self.page_bytes()).map_err(GpuError::Shape)?;
        if count == 0 {
            return Ok(());
        }
        let received = pages
            .get::<Received>()
            .ok_or_else(|| GpuError::Shape("pages received by another kind of engine".into()))?;
        let src = received.slice()?;
        self.pages.context().bind_to_thread().map_err(driver)?;
        let es = self.kdt.size();
        self.pages.scatter(&self.desc, es, &mut self.regions, table, len, 0..count, src)?;
        self.pages.stream().synchronize().map_err(driver)
    }

    /// Scatters pages in host memory, covering positions `0..len`.
    pub(super) fn import_host(&mut self, table: &[u32], len: usize, pages: &[u8]) -> Result<(), GpuError> {
        let page_bytes = self.page_bytes();
        let count = pages_for(len, pages.len(), page_bytes).map_err(GpuError::Shape)?;
        if count == 0 {
            return Ok(());
        }
        self.pages.context().bind_to_thread().map_err(driver)?;
        let staging = self.pages.stream().clone_htod(&pages[..count * page_bytes]).map_err(driver)?;
        let es = self.kdt.size();
        self.pages.scatter(&self.desc, es, &mut self.regions, table, len, 0..count, &staging)?;
        self.pages.stream().synchronize().map_err(driver)
    }
}
