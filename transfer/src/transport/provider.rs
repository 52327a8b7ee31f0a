//! The prefill side's [`PageProvider`]s and this process's registry of them.
//!
//! A provider is registered once, through the process's [`PageServer`](super::PageServer), and
//! found again by its id: by the page server for a fetch that came over the wire, and by the
//! fetch itself when the provider is in the fetching process (no copy beyond the gather). The
//! registry holds providers weakly, so an engine that is gone stops serving even if its
//! [`Registration`] is still around.

use super::endpoint::Endpoint;
use crate::device::{DeviceLease, DeviceRoute};
use crate::error::TransferError;
use crate::process::process_nonce;
use crate::sync::lock;
use futures::future::BoxFuture;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

/// Gathers pages of a room on the prefill side.
pub trait PageProvider: Send + Sync + 'static {
    /// Pages `first_page .. first_page + count` of `room`, back to back.
    fn pages(
        &self,
        room: u64,
        first_page: u32,
        count: u32,
    ) -> BoxFuture<'static, Result<Vec<u8>, TransferError>>;

    /// The same pages gathered into GPU staging memory for `route` (see [`crate::device`]);
    /// only a provider whose engine keeps its KV on a GPU can.
    fn device_pages(
        &self,
        room: u64,
        first_page: u32,
        count: u32,
        route: DeviceRoute,
    ) -> BoxFuture<'static, Result<DeviceLease, TransferError>> {
        let _ = (room, first_page, count, route);
        Box::pin(async { Err(TransferError::Source("the prefill replica's KV is not in GPU memory".into())) })
    }

    /// Frees `room` at its holder's request (a provider whose rooms are freed by the holder's
    /// own calls, not over the wire, keeps the default); `false` when it was gone already.
    fn release(&self, room: u64) -> bool {
        let _ = room;
        false
    }
}

type Registry = Mutex<HashMap<u64, Weak<dyn PageProvider>>>;

fn registry() -> &'static Registry {
    static R: OnceLock<Registry> = OnceLock::new();
    R.get_or_init(Registry::default)
}

/// The provider registered here as `provider`, while it is registered and alive.
pub(super) fn lookup(provider: u64) -> Option<Arc<dyn PageProvider>> {
    lock(registry()).get(&provider).and_then(Weak::upgrade)
}

/// Registers `provider` (weakly) under a new id, reachable over the page server at `tcp`.
pub(super) fn register(provider: &Arc<dyn PageProvider>, tcp: SocketAddr) -> Registration {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let id = NEXT.fetch_add(1, Ordering::Relaxed);
    lock(registry()).insert(id, Arc::downgrade(provider));
    Registration { id, endpoint: Endpoint { process: process_nonce(), provider: id, tcp: tcp.to_string() } }
}

/// A provider registered in this process; unregistered when dropped.
pub struct Registration {
    id: u64,
    endpoint: Endpoint,
}

impl std::fmt::Debug for Registration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registration").field("endpoint", &self.endpoint).finish()
    }
}

impl Registration {
    /// Where decode replicas reach this provider.
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        lock(registry()).remove(&self.id);
    }
}
