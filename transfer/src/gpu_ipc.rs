//! Moving canonical pages between two processes on NVIDIA GPUs with CUDA IPC (feature `cuda`).
//!
//! The prefill side gathers a handoff into a [`DeviceBuffer`] and exports it with
//! [`DeviceBuffer::export_ipc`]: an [`IpcHandle`] of 64 opaque bytes plus the range, small enough
//! for any control message. The decode side opens it with [`IpcMapping::open`] and copies the
//! pages device to device into its own memory ([`IpcMapping::copy_into`]), then scatters them
//! into its engine's layout; the bytes never touch the host.
//!
//! **Why a buffer of its own.** Legacy CUDA IPC (`cuIpcGetMemHandle`) names memory from
//! `cuMemAlloc` only: cudarc allocates from the device's stream-ordered pool
//! (`cuMemAllocAsync`) when there is one, and pool or VMM memory (PyTorch's expandable segments)
//! cannot be exported this way. [`DeviceBuffer`] allocates with `cuMemAlloc` and still lends
//! itself as a [`CudaSlice`] to [`GpuPages`](crate::gpu::GpuPages); the same kind of memory is
//! what NIXL's UCX backend registers for GPU-to-GPU reads (see [`crate::nixl::VramAgent`]).
//! An engine's own KV cache (a PyTorch caching-allocator segment, from `cudaMalloc`) can be
//! exported too, by address: [`IpcHandle::export`].
//!
//! **Ownership.** A handle names the exporter's memory, not a copy of it: the exporter must keep
//! the memory (and not overwrite the range) until the peer's copy is over, which the peer says
//! on the control channel; [`IpcMapping::copy_into`] returns only once its copy is done for that
//! reason. A process cannot open its own handles (the driver refuses).

// Raw CUDA driver calls for IPC and plain allocations, which cudarc has no safe wrapper for;
// each call says why it is sound.
#![allow(unsafe_code)]

use crate::gpu::GpuError;
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, result, sys};
use serde::{Deserialize, Serialize};
use std::mem::ManuallyDrop;
use std::ops::Range;
use std::sync::Arc;

/// Bytes of a CUDA IPC memory handle.
pub const IPC_HANDLE_BYTES: usize = sys::CU_IPC_HANDLE_SIZE as usize;

/// A failed driver call, said with what was being done.
fn cuda(what: &'static str) -> impl FnOnce(result::DriverError) -> GpuError {
    move |e| GpuError::Driver(format!("{what}: {e}"))
}

/// Device memory from `cuMemAlloc`: exportable with CUDA IPC and registrable with NIXL/UCX,
/// unlike cudarc's pool allocations (see the module doc). Used through [`slice`](Self::slice)
/// like any other device buffer; freed on drop, after the work queued on it.
pub struct DeviceBuffer {
    /// The memory as cudarc sees it. Never dropped as a `CudaSlice` (that would free it with
    /// `cuMemFreeAsync`, which is for pool memory): leaked and freed with `cuMemFree` in `Drop`.
    slice: ManuallyDrop<CudaSlice<u8>>,
    /// The allocation's address, fixed for its life.
    ptr: sys::CUdeviceptr,
    stream: Arc<CudaStream>,
}

impl std::fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("ordinal", &self.ordinal())
            .field("len", &self.len())
            .finish_non_exhaustive()
    }
}

impl DeviceBuffer {
    /// Allocates `len` bytes (more than 0) on `stream`'s GPU and zeroes them. The buffer's own
    /// work (zeroing, waiting before it is freed) is ordered on `stream`.
    pub fn zeroed(stream: &Arc<CudaStream>, len: usize) -> Result<Self, GpuError> {
        if len == 0 {
            return Err(GpuError::Shape("a device buffer of 0 bytes".into()));
        }
        stream.context().bind_to_thread().map_err(cuda("binding the context"))?;
        // SAFETY: a plain allocation in the context just made current; its pointer is owned by
        // the buffer built below and freed once, in `Drop`.
        let ptr = unsafe { result::malloc_sync(len) }.map_err(cuda("cuMemAlloc"))?;
        // SAFETY: `ptr` is a live allocation of exactly `len` bytes, zeroed right below before
        // anything reads it; the slice is never dropped as such (see the field).
        let slice = unsafe { stream.upgrade_device_ptr::<u8>(ptr, len) };
        let mut buffer = Self { slice: ManuallyDrop::new(slice), ptr, stream: Arc::clone(stream) };
        stream.memset_zeros(&mut *buffer.slice).map_err(cuda("zeroing a device buffer"))?;
        // Zeroed before any other stream may write into it.
        stream.synchronize().map_err(cuda("zeroing a device buffer"))?;
        Ok(buffer)
    }

    /// The memory, for kernels and copies (e.g. [`GpuPages::gather`](crate::gpu::GpuPages::gather)).
    pub fn slice(&self) -> &CudaSlice<u8> {
        &self.slice
    }

    /// The memory, writable. Swapping another slice in is not supported: registrations and
    /// handles name this buffer's address.
    pub fn slice_mut(&mut self) -> &mut CudaSlice<u8> {
        &mut self.slice
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.slice.len()
    }

    /// Whether it holds no bytes (never: a buffer is at least one byte).
    pub fn is_empty(&self) -> bool {
        self.slice.is_empty()
    }

    /// Its device address, as NIXL registers it.
    pub fn device_addr(&self) -> u64 {
        self.ptr
    }

    /// The ordinal of its GPU in this process.
    pub fn ordinal(&self) -> usize {
        self.stream.context().ordinal()
    }

    /// The context it was allocated in.
    pub fn context(&self) -> &Arc<CudaContext> {
        self.stream.context()
    }

    /// Whether the slice is still the buffer's own memory (not swapped out through
    /// [`slice_mut`](Self::slice_mut)), as registrations of its address assume.
    pub(crate) fn keeps_its_memory(&self) -> bool {
        let (ptr, _record) = self.slice.device_ptr(&self.stream);
        ptr == self.ptr
    }

    /// A handle another process opens with [`IpcMapping::open`] to read bytes `range` of this
    /// buffer. The buffer must outlive every peer's use (see the module doc).
    pub fn export_ipc(&self, range: Range<usize>) -> Result<IpcHandle, GpuError> {
        if range.start > range.end || range.end > self.len() {
            return Err(GpuError::Shape(format!(
                "bytes {range:?} of a device buffer of {} bytes",
                self.len()
            )));
        }
        IpcHandle::export(self.context(), self.ptr + range.start as u64, range.len())
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // Errors cannot be returned from a drop: the memory is freed anyway (a failing driver
        // reports its sticky error to the next call).
        let _ = self.stream.context().bind_to_thread();
        // SAFETY: the slice is taken once, here, and not used again.
        let slice = unsafe { ManuallyDrop::take(&mut self.slice) };
        // The stream waits for the work recorded on the slice; then everything queued is
        // waited for before the memory goes.
        let ptr = slice.leak();
        let _ = self.stream.synchronize();
        if ptr != self.ptr {
            // The slice was swapped for another through `slice_mut`: this buffer's memory is
            // owned (and freed) by the slice that took its place, and the other one is leaked.
            return;
        }
        // SAFETY: `ptr` came from `cuMemAlloc` in `zeroed` and is freed exactly once; no work
        // on it is queued any more (synchronized above), and peers' IPC mappings keep their
        // own reference to the allocation until they close it.
        let _ = unsafe { result::free_sync(ptr) };
    }
}

/// What a peer process needs to map a range of device memory: the CUDA IPC handle of the
/// allocation holding it and where the range lies in that allocation.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct IpcHandle {
    /// `cuIpcGetMemHandle`'s 64 opaque bytes, naming the whole allocation.
    pub bytes: Vec<u8>,
    /// Where the range starts in the allocation.
    pub offset: u64,
    /// Bytes in the range.
    pub size: u64,
    /// The exporting process's ordinal of the GPU. Informational: ordinals differ between
    /// processes under `CUDA_VISIBLE_DEVICES`, and the handle itself names the device.
    pub device: u32,
}

impl IpcHandle {
    /// Exports `len` bytes at device address `addr` (in `ctx`'s GPU) for other processes.
    ///
    /// The address must lie in memory from `cuMemAlloc`/`cudaMalloc` (a [`DeviceBuffer`], or a
    /// segment of PyTorch's caching allocator without expandable segments); the driver checks
    /// it, and this reads none of the memory. The memory must outlive every peer's use.
    pub fn export(ctx: &Arc<CudaContext>, addr: u64, len: usize) -> Result<Self, GpuError> {
        ctx.bind_to_thread().map_err(cuda("binding the context"))?;
        let (mut base, mut alloc_len): (sys::CUdeviceptr, usize) = (0, 0);
        // SAFETY: a query of the allocation holding `addr`; the driver validates the address
        // and writes the two outputs, which live on this stack.
        unsafe { sys::cuMemGetAddressRange_v2(&mut base, &mut alloc_len, addr) }
            .result()
            .map_err(cuda("cuMemGetAddressRange (not device memory of this context?)"))?;
        let offset = addr - base;
        if offset as usize + len > alloc_len {
            return Err(GpuError::Shape(format!(
                "{len} bytes at offset {offset} of an allocation of {alloc_len} bytes"
            )));
        }
        let mut handle = sys::CUipcMemHandle { reserved: [0; IPC_HANDLE_BYTES] };
        // SAFETY: `base` is the start of a live allocation (queried above); the driver writes
        // the 64-byte handle into `handle`, which lives on this stack.
        unsafe { sys::cuIpcGetMemHandle(&mut handle, base) }.result().map_err(cuda(
            "cuIpcGetMemHandle (memory from a stream-ordered pool or VMM cannot be exported)",
        ))?;
        Ok(Self {
            bytes: handle.reserved.iter().map(|&b| b as u8).collect(),
            offset,
            size: len as u64,
            device: ctx.ordinal() as u32,
        })
    }

    /// A compact text form (lowercase hex of the handle, offset, size and device), for
    /// environment variables and command lines.
    pub fn to_hex(&self) -> String {
        let mut raw = self.bytes.clone();
        raw.extend_from_slice(&self.offset.to_le_bytes());
        raw.extend_from_slice(&self.size.to_le_bytes());
        raw.extend_from_slice(&self.device.to_le_bytes());
        crate::hex::encode(&raw)
    }

    /// Parses [`to_hex`](Self::to_hex)'s form.
    pub fn from_hex(text: &str) -> Result<Self, GpuError> {
        let bad = || GpuError::Ipc(format!("not an IPC handle: {text:?}"));
        let text = text.trim();
        let raw =
            crate::hex::decode(text).filter(|raw| raw.len() == IPC_HANDLE_BYTES + 20).ok_or_else(bad)?;
        let (bytes, rest) = raw.split_at(IPC_HANDLE_BYTES);
        let word = |at: usize| u64::from_le_bytes(rest[at..at + 8].try_into().unwrap_or_default());
        let device = u32::from_le_bytes(rest[16..20].try_into().unwrap_or_default());
        Ok(Self { bytes: bytes.to_vec(), offset: word(0), size: word(8), device })
    }
}

/// A peer's range of device memory, mapped into this process from its [`IpcHandle`]; closed on
/// drop (the peer's memory stays the peer's).
pub struct IpcMapping {
    ctx: Arc<CudaContext>,
    /// The peer's allocation as mapped here (its base: the handle names the whole allocation).
    base: sys::CUdeviceptr,
    offset: u64,
    len: usize,
}

impl std::fmt::Debug for IpcMapping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IpcMapping")
            .field("ordinal", &self.ctx.ordinal())
            .field("offset", &self.offset)
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

impl IpcMapping {
    /// Maps `handle` (exported by another process) into `ctx`. Peer access between two GPUs is
    /// enabled lazily, so the exporter's GPU may differ from this one.
    pub fn open(ctx: &Arc<CudaContext>, handle: &IpcHandle) -> Result<Self, GpuError> {
        let bytes: [u8; IPC_HANDLE_BYTES] = handle.bytes.as_slice().try_into().map_err(|_| {
            GpuError::Ipc(format!("a handle of {} bytes, not {IPC_HANDLE_BYTES}", handle.bytes.len()))
        })?;
        let len = usize::try_from(handle.size)
            .map_err(|_| GpuError::Ipc(format!("a range of {} bytes", handle.size)))?;
        let mut raw = sys::CUipcMemHandle { reserved: [0; IPC_HANDLE_BYTES] };
        for (dst, src) in raw.reserved.iter_mut().zip(bytes) {
            *dst = src as _;
        }
        ctx.bind_to_thread().map_err(cuda("binding the context"))?;
        let mut base: sys::CUdeviceptr = 0;
        let flags = sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32;
        // SAFETY: the driver validates the handle (refusing one of this very process, or of
        // freed memory) and writes the mapped address into `base`, which lives on this stack.
        unsafe { sys::cuIpcOpenMemHandle_v2(&mut base, raw, flags) }
            .result()
            .map_err(cuda("cuIpcOpenMemHandle (a handle of this same process, or of freed memory?)"))?;
        let mapping = Self { ctx: Arc::clone(ctx), base, offset: handle.offset, len };
        // The range must lie in the allocation the handle names.
        let (mut alloc_base, mut alloc_len): (sys::CUdeviceptr, usize) = (0, 0);
        // SAFETY: a query of the allocation just mapped; outputs on this stack.
        unsafe { sys::cuMemGetAddressRange_v2(&mut alloc_base, &mut alloc_len, base) }
            .result()
            .map_err(cuda("cuMemGetAddressRange of the mapped memory"))?;
        if handle.offset.saturating_add(handle.size) > alloc_len as u64 {
            return Err(GpuError::Ipc(format!(
                "a range of {} bytes at offset {} of an allocation of {alloc_len} bytes",
                handle.size, handle.offset
            )));
        }
        Ok(mapping)
    }

    /// Bytes in the mapped range.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the range is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Copies bytes `src` of the peer's range into the start of `dst`, device to device on
    /// `stream` (after the work queued there), and returns once the copy is done: only then may
    /// the peer reuse its memory, and the copy may not outlive this mapping.
    pub fn copy_into(
        &self,
        stream: &Arc<CudaStream>,
        src: Range<usize>,
        dst: &mut CudaSlice<u8>,
    ) -> Result<(), GpuError> {
        if src.start > src.end || src.end > self.len || src.len() > dst.len() {
            return Err(GpuError::Shape(format!(
                "bytes {src:?} of a peer range of {} into {} bytes",
                self.len,
                dst.len()
            )));
        }
        if src.is_empty() {
            return Ok(());
        }
        self.ctx.bind_to_thread().map_err(cuda("binding the context"))?;
        let from = self.base + self.offset + src.start as u64;
        {
            let (to, _record) = dst.device_ptr_mut(stream);
            // SAFETY: `from .. from + src.len()` lies in the peer's mapped allocation (checked
            // against the range at `open` and above), `to` in `dst` (checked above), which this
            // call borrows mutably; the copy is waited for below, before the borrows end and
            // before this mapping can be closed.
            unsafe { result::memcpy_dtod_async(to, from, src.len(), stream.cu_stream()) }
                .map_err(cuda("cuMemcpyDtoDAsync from the peer's memory"))?;
        }
        stream.synchronize().map_err(cuda("waiting for the copy from the peer's memory"))
    }
}

impl Drop for IpcMapping {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: `base` was returned by `cuIpcOpenMemHandle` and is closed once; every copy
        // out of it was waited for in `copy_into`.
        let _ = unsafe { sys::cuIpcCloseMemHandle(self.base) };
    }
}
