//! The decode side of a handoff: fetch the pages (GPU to GPU where both engines can, else
//! through host memory), check them against this engine, and count what moved.

use super::{Handoff, HandoffTimes, device_route, policy_for};
use crate::error::ActorError;
use crate::view::LatencyHistogram;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;
use xinf_engine::{Engine, EngineError, ImportedKv, KvPages};
use xinf_transfer::device::DeviceRoute;
use xinf_transfer::sync::lock;
use xinf_transfer::transport::{self, TransferError, TransportKind};

/// Counters of the decode side.
#[derive(Debug, Default)]
pub(super) struct Received {
    pub(super) pages: AtomicU64,
    pub(super) bytes: AtomicU64,
    pub(super) tcp: AtomicU64,
    pub(super) in_process: AtomicU64,
    pub(super) nixl: AtomicU64,
    pub(super) gpu_in_process: AtomicU64,
    pub(super) cuda_ipc: AtomicU64,
    pub(super) nixl_vram: AtomicU64,
    pub(super) gpu_bytes: AtomicU64,
    pub(super) gpu_fallbacks: AtomicU64,
    pub(super) failed: AtomicU64,
    /// Prompts this decode replica computed itself (no handoff).
    pub(super) own_prompts: AtomicU64,
    pub(super) latency: Mutex<LatencyHistogram>,
}

/// The pages the decode engine needs of a handoff, or why it cannot import them.
pub(super) fn pages_needed(engine: &dyn Engine, handoff: &Handoff) -> Result<u32, ActorError> {
    if let Some(field) = engine.contract().first_difference(&handoff.contract) {
        return Err(ActorError::Engine(EngineError::Import(format!(
            "the prefill and decode replicas differ in {field}; their KV is not interchangeable"
        ))));
    }
    // The page rule: an engine that recomputes the last prompt token may need one page fewer;
    // the prefill's last page then stays unread until its release.
    let need = xinf_transfer::pages_for(engine.import_len(handoff.prompt_ids.len())) as u32;
    if need > handoff.pages {
        return Err(ActorError::Engine(EngineError::Import(format!(
            "the decode engine needs {need} pages, the prefill published {}",
            handoff.pages
        ))));
    }
    Ok(need)
}

/// Fetches GPU to GPU when both engines' KV is on a GPU and a route joins them; `None` when
/// the pages must go through host memory.
async fn fetch_on_device(
    engine: &dyn Engine,
    received: &Received,
    times: HandoffTimes,
    handoff: &Handoff,
    need: u32,
) -> Option<Result<(KvPages, TransportKind), TransferError>> {
    let (sink, route) =
        engine.device_sink().zip(device_route(&handoff.endpoint, handoff.device.as_ref(), times.policy))?;
    let fetched =
        transport::fetch_device(&handoff.endpoint, handoff.room, 0, need, route, sink, times.transfer).await;
    match fetched {
        // CUDA IPC can be refused by the platform (containers without a shared IPC namespace,
        // GPUs without peer access): the pages then go through host memory, once, and the
        // fallback is counted.
        Err(TransferError::Source(why)) if route == DeviceRoute::CudaIpc => {
            tracing::warn!(%why, "CUDA IPC handoff failed; moving the pages through host memory");
            received.gpu_fallbacks.fetch_add(1, Ordering::Relaxed);
            None
        }
        fetched => Some(fetched.map(|(pages, kind)| (KvPages::Device(pages), kind))),
    }
}

impl Received {
    /// Counts one fetch of `need` pages that took `secs`.
    fn count(&self, need: u32, pages: &KvPages, kind: TransportKind, secs: f64) {
        lock(&self.latency).observe(secs);
        self.pages.fetch_add(u64::from(need), Ordering::Relaxed);
        self.bytes.fetch_add(pages.len() as u64, Ordering::Relaxed);
        if let KvPages::Device(_) = pages {
            self.gpu_bytes.fetch_add(pages.len() as u64, Ordering::Relaxed);
        }
        match kind {
            TransportKind::Tcp => &self.tcp,
            TransportKind::InProcess => &self.in_process,
            TransportKind::Nixl => &self.nixl,
            TransportKind::DeviceInProcess => &self.gpu_in_process,
            TransportKind::CudaIpc => &self.cuda_ipc,
            TransportKind::NixlVram => &self.nixl_vram,
        }
        .fetch_add(1, Ordering::Relaxed);
    }
}

/// Fetches a handoff's pages and checks them against this engine's contract; a failure is
/// counted.
pub(super) async fn fetch(
    engine: Arc<dyn Engine>,
    received: Arc<Received>,
    times: HandoffTimes,
    handoff: Handoff,
) -> Result<ImportedKv, ActorError> {
    let result = async {
        let need = pages_needed(engine.as_ref(), &handoff)?;
        let started = Instant::now();
        let (pages, kind) = match fetch_on_device(engine.as_ref(), &received, times, &handoff, need).await {
            Some(fetched) => fetched,
            None => {
                let policy = policy_for(&handoff.endpoint, times.policy);
                transport::fetch(&handoff.endpoint, handoff.room, 0, need, policy, times.transfer)
                    .await
                    .map(|(pages, kind)| (KvPages::Host(pages), kind))
            }
        }
        .map_err(|e| ActorError::Transfer(e.to_string()))?;
        received.count(need, &pages, kind, started.elapsed().as_secs_f64());
        Ok(ImportedKv {
            prompt_ids: handoff.prompt_ids,
            first_token: handoff.first_token,
            first_logprobs: handoff.first_logprobs,
            pages,
        })
    }
    .await;
    if result.is_err() {
        received.failed.fetch_add(1, Ordering::Relaxed);
    }
    result
}
