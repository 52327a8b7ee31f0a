//! Where a provider can be reached, and which paths a fetch may take to it.
//!
//! These travel on the actors' control channel (serde), from the prefill replica that
//! published a room to the decode replica that fetches it.

use serde::{Deserialize, Serialize};

/// Where a provider can be reached: its process (for the in-process path), its id there, and
/// the TCP data address of that process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Endpoint {
    /// The [`process_nonce`](crate::transport::process_nonce) of the process holding the
    /// provider.
    pub process: u64,
    /// The provider's id in that process.
    pub provider: u64,
    /// The process's page server, `ip:port`.
    pub tcp: String,
}

/// Which path a fetch took.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TransportKind {
    /// A direct call inside one process.
    InProcess,
    /// The TCP data plane.
    Tcp,
    /// A NIXL read, with the TCP data plane as its side channel.
    Nixl,
    /// GPU to GPU inside one process.
    DeviceInProcess,
    /// GPU to GPU through a CUDA IPC mapping, with the TCP data plane as its side channel.
    CudaIpc,
    /// GPU to GPU by a NIXL read of VRAM, with the TCP data plane as its side channel.
    NixlVram,
}

/// How a fetch may travel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TransportPolicy {
    /// In-process when the provider is here, else TCP.
    #[default]
    Auto,
    /// Always TCP, even inside one process (tests, and measuring the data plane).
    Tcp,
    /// Always NIXL (never in process): the bytes move by NIXL's UCX backend. Needs the NIXL
    /// library in both processes (see [`crate::nixl::available`]).
    Nixl,
}
