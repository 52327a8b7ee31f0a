//! Pages that stay in GPU memory from the prefill engine's cache to the decode engine's.
//!
//! A handoff between two engines whose KV caches are on GPUs need not pass through host memory:
//! the prefill engine gathers the pages into device staging memory and describes it
//! ([`DeviceStage`]); the decode side's [`DeviceSink`] copies them into memory of its own GPU
//! and hands them to its engine as [`DevicePages`], which its scatter kernel reads. The bytes
//! travel by one of three [`DeviceRoute`]s: a device-to-device copy inside one process, CUDA IPC
//! between processes of one host, or a NIXL read of VRAM (UCX's cuda_ipc between processes of
//! one host, GPUDirect RDMA between hosts). The page server's TCP connection carries the stage
//! description and the "done" that frees the staging memory (see [`crate::transport`]).
//!
//! This module holds only the route-independent types; the CUDA work is the engine's (it owns
//! the memory), with [`crate::gpu_ipc`] and [`crate::nixl::VramAgent`] under the `cuda` feature.

use crate::error::TransferError;
use serde::{Deserialize, Serialize};
use std::any::Any;
use std::time::Instant;

pub use crate::process::host_id;

/// Where an engine's KV cache lives when it is in GPU memory: told to the decode side with each
/// handoff, so it can pick a route that keeps the pages on the GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvDevice {
    /// The host, as [`host_id`] names it: CUDA IPC works only between processes of one host.
    pub host: String,
    /// The GPU's ordinal in the engine's process (for logs; ordinals are per process).
    pub ordinal: u32,
}

/// How pages move from one GPU's memory to another's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DeviceRoute {
    /// Both engines are in this process: one device-to-device copy.
    InProcess,
    /// Another process of this host: the decode side maps the staging memory (CUDA IPC handle)
    /// and copies out of it.
    CudaIpc,
    /// The decode side reads the staging memory with NIXL (VRAM segments).
    NixlVram,
}

impl DeviceRoute {
    /// The route's code on the wire.
    pub(crate) fn code(self) -> u8 {
        match self {
            Self::InProcess => 0,
            Self::CudaIpc => 1,
            Self::NixlVram => 2,
        }
    }

    pub(crate) fn from_code(code: u8) -> Option<Self> {
        match code {
            0 => Some(Self::InProcess),
            1 => Some(Self::CudaIpc),
            2 => Some(Self::NixlVram),
            _ => None,
        }
    }
}

/// Where staged pages can be read, as the prefill side describes them to the decode side.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DeviceStage {
    /// In this process: the staging memory travels inside the [`DeviceLease`] itself.
    InProcess,
    /// A CUDA IPC handle of the staged range, in `IpcHandle::to_hex` form.
    CudaIpc {
        /// The handle, hex.
        handle: String,
    },
    /// A NIXL VRAM range: `RemoteVram::encode`'s bytes (agent, metadata, address, length).
    NixlVram {
        /// The encoded remote range.
        remote: Vec<u8>,
    },
}

/// Staged pages held for a peer: what to tell it, how many bytes, and the staging memory, which
/// goes back to its engine when this is dropped — after the peer's copy is over.
pub struct DeviceLease {
    stage: DeviceStage,
    len: usize,
    hold: Box<dyn Any + Send + Sync>,
}

impl std::fmt::Debug for DeviceLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceLease").field("stage", &self.stage).field("len", &self.len).finish()
    }
}

impl DeviceLease {
    /// A lease of `len` staged bytes described by `stage`, keeping `hold` (the staging memory)
    /// alive until it is dropped.
    pub fn new(stage: DeviceStage, len: usize, hold: Box<dyn Any + Send + Sync>) -> Self {
        Self { stage, len, hold }
    }

    /// The decode side's view of a peer's lease: the description only.
    pub(crate) fn remote(stage: DeviceStage, len: usize) -> Self {
        Self { stage, len, hold: Box::new(()) }
    }

    /// Where the pages can be read.
    pub fn stage(&self) -> &DeviceStage {
        &self.stage
    }

    /// Bytes staged.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is staged.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The staging memory, when this lease was made in this process and holds a `T` (the
    /// in-process route copies straight out of it).
    pub fn held<T: Any>(&self) -> Option<&T> {
        self.hold.downcast_ref()
    }
}

/// Pages received into a GPU's memory by a [`DeviceSink`], waiting for the engine's scatter.
/// Opaque outside the engine that received them; the memory is freed (or pooled) on drop.
pub struct DevicePages {
    len: usize,
    inner: Box<dyn Any + Send + Sync>,
}

impl std::fmt::Debug for DevicePages {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DevicePages").field("len", &self.len).finish_non_exhaustive()
    }
}

impl DevicePages {
    /// `len` bytes of canonical pages held in `inner` (device memory of the receiving engine).
    pub fn new(len: usize, inner: Box<dyn Any + Send + Sync>) -> Self {
        Self { len, inner }
    }

    /// Bytes of pages.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are no pages.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The memory, as the engine that received it knows it.
    pub fn get<T: Any>(&self) -> Option<&T> {
        self.inner.downcast_ref()
    }
}

/// The decode side's GPU, receiving staged pages into its own memory.
pub trait DeviceSink: Send + Sync + 'static {
    /// Copies the pages `lease` describes into this GPU's memory by `deadline`. Blocking; when
    /// it returns the copy is over, so the peer may reuse its staging memory.
    fn receive(&self, lease: &DeviceLease, deadline: Instant) -> Result<DevicePages, TransferError>;
}
