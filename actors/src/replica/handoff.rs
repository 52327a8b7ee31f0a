//! The replica's side of a P/D handoff (the place of the transfer actor): the prefill side
//! publishes rooms and serves their pages, the decode side fetches pages and imports them.
//!
//! Control (prefill done, release) travels as actor messages; the pages themselves travel on
//! the data plane of `xinf_transfer::transport`: in process when both replicas share one, else
//! over the TCP page server of the prefill replica's process.

use super::rooms::{HandoffStats, LatencyHistogram, Leases, RoomError, RoomTable};
use crate::error::ActorError;
use crate::sync::lock;
use futures::FutureExt;
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::OnceCell;
use xinf_engine::{Engine, EngineError, ModelContract};
use xinf_transfer::transport::{self, Endpoint, PageProvider, PageServer, TransferError, TransportKind};

#[cfg(test)]
mod tests;

/// What a prefill hands to a decode replica.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Handoff {
    /// The room holding the pinned prompt.
    pub(crate) room: u64,
    /// The prompt's token ids.
    pub(crate) prompt_ids: Vec<u32>,
    /// The prefill's first sampled token.
    pub(crate) first_token: u32,
    /// Canonical pages in the room: `ceil(prompt / 64)`.
    pub(crate) pages: u32,
    /// Where the pages are fetched from.
    pub(crate) endpoint: Endpoint,
    /// The prefill engine's model contract, checked by the decode side.
    pub(crate) contract: ModelContract,
}

/// Time limits and transport choice of handoffs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HandoffTimes {
    pub(crate) leases: Leases,
    /// Time limit of one page fetch.
    pub(crate) transfer: Duration,
    /// How pages may travel.
    pub(crate) policy: transport::TransportPolicy,
}

/// The process's page server, started by the first prefill replica of the process.
async fn page_server(ip: IpAddr) -> Result<&'static PageServer, ActorError> {
    static SERVER: OnceCell<PageServer> = OnceCell::const_new();
    SERVER
        .get_or_try_init(|| PageServer::start(ip))
        .await
        .map_err(|e| ActorError::Node(format!("starting the page server on {ip}: {e}")))
}

/// Serves the pages of a prefill replica's rooms out of its engine.
struct RoomPages {
    rooms: Arc<Mutex<RoomTable>>,
    engine: Arc<dyn Engine>,
}

impl PageProvider for RoomPages {
    fn pages(&self, room: u64, first: u32, count: u32) -> BoxFuture<'static, Result<Vec<u8>, TransferError>> {
        let claimed = lock(&self.rooms).claim(room, first, count, Instant::now());
        let engine = self.engine.clone();
        async move {
            let request_id = match claimed {
                Ok(id) => id,
                Err(RoomError::Unknown) => return Err(TransferError::UnknownRoom(room)),
                Err(RoomError::OutOfRange { pages }) => {
                    return Err(TransferError::Source(format!(
                        "pages {first}..{} of room {room}, which holds {pages}",
                        u64::from(first) + u64::from(count)
                    )));
                }
            };
            engine
                .export_pages(&request_id, first as usize, count as usize)
                .await
                .map_err(|e| TransferError::Source(e.to_string()))
        }
        .boxed()
    }
}

/// Counters of the decode side.
#[derive(Debug, Default)]
struct Received {
    pages: AtomicU64,
    bytes: AtomicU64,
    tcp: AtomicU64,
    in_process: AtomicU64,
    failed: AtomicU64,
    latency: Mutex<LatencyHistogram>,
}

/// A replica's handoff machinery.
pub(crate) struct HandoffSide {
    rooms: Arc<Mutex<RoomTable>>,
    engine: Arc<dyn Engine>,
    /// Set on prefill replicas: their provider's registration (unregistered on drop).
    registration: Option<(transport::Registration, Arc<dyn PageProvider>)>,
    received: Arc<Received>,
    times: HandoffTimes,
}

impl HandoffSide {
    /// The handoff side of a replica; a prefill replica also registers its rooms with the
    /// process's page server on `ip`.
    pub(crate) async fn new(
        engine: Arc<dyn Engine>,
        serve_pages: bool,
        ip: IpAddr,
        times: HandoffTimes,
    ) -> Result<Self, ActorError> {
        let rooms = Arc::new(Mutex::new(RoomTable::new(times.leases)));
        let registration = if serve_pages {
            let server = page_server(ip).await?;
            let provider: Arc<dyn PageProvider> =
                Arc::new(RoomPages { rooms: rooms.clone(), engine: engine.clone() });
            Some((server.register(&provider), provider))
        } else {
            None
        };
        Ok(Self { rooms, engine, registration, received: Arc::default(), times })
    }

    /// Computes a prompt (its first token too), pins its KV and publishes a room for it.
    pub(crate) fn prefill(
        &self,
        request: xinf_engine::GenerateRequest,
    ) -> BoxFuture<'static, Result<Handoff, ActorError>> {
        let endpoint = self.registration.as_ref().map(|(r, _)| r.endpoint().clone());
        let (engine, rooms) = (self.engine.clone(), self.rooms.clone());
        async move {
            let endpoint = endpoint.ok_or_else(|| {
                ActorError::Internal("a prefill was sent to a replica that does not serve pages".into())
            })?;
            let pinned = match engine.prefill_pinned(request).await {
                Ok(p) => p,
                Err(e) => {
                    lock(&rooms).fail();
                    return Err(e.into());
                }
            };
            let pages = xinf_transfer::pages_for(pinned.prompt_ids.len()) as u32;
            let room = rand::random::<u64>() >> 1;
            if !lock(&rooms).publish(room, &pinned.request_id, pages, Instant::now()) {
                engine.release_pinned(&pinned.request_id);
                return Err(ActorError::Engine(EngineError::Aborted));
            }
            Ok(Handoff {
                room,
                prompt_ids: pinned.prompt_ids,
                first_token: pinned.first_token,
                pages,
                endpoint,
                contract: engine.contract().clone(),
            })
        }
        .boxed()
    }

    /// Ends a room: the decode side is done with it. `false` when it was gone already.
    pub(crate) fn release(&self, room: u64) -> bool {
        let Some(request_id) = lock(&self.rooms).release(room) else { return false };
        self.engine.release_pinned(&request_id);
        true
    }

    /// Ends every room of an aborted request.
    pub(crate) fn abort(&self, request_id: &str) {
        if lock(&self.rooms).abort_request(request_id, Instant::now()) > 0 {
            self.engine.release_pinned(request_id);
        }
    }

    /// Whether an abort of this request arrived before it started here (the decode side
    /// checks after starting an imported request, whose start raced with the abort).
    pub(crate) fn was_aborted(&self, request_id: &str) -> bool {
        lock(&self.rooms).was_aborted(request_id)
    }

    /// Frees the rooms whose lease ran out.
    pub(crate) fn sweep(&self) {
        for request_id in lock(&self.rooms).expire(Instant::now()) {
            tracing::warn!(%request_id, "a handoff lease expired; freeing its pinned KV");
            self.engine.release_pinned(&request_id);
        }
    }

    /// Fetches a handoff's pages and checks them against this engine's contract: what the
    /// decode side imports.
    pub(crate) fn fetch(
        &self,
        handoff: &Handoff,
    ) -> BoxFuture<'static, Result<xinf_engine::ImportedKv, ActorError>> {
        let (engine, received, times) = (self.engine.clone(), self.received.clone(), self.times);
        let handoff = handoff.clone();
        async move {
            let result = async {
                if let Some(field) = engine.contract().first_difference(&handoff.contract) {
                    return Err(ActorError::Engine(EngineError::Import(format!(
                        "the prefill and decode replicas differ in {field}; their KV is not interchangeable"
                    ))));
                }
                // The page rule: an engine that recomputes the last prompt token may need one
                // page fewer; the prefill's last page then stays unread until its release.
                let need = xinf_transfer::pages_for(engine.import_len(handoff.prompt_ids.len())) as u32;
                if need > handoff.pages {
                    return Err(ActorError::Engine(EngineError::Import(format!(
                        "the decode engine needs {need} pages, the prefill published {}",
                        handoff.pages
                    ))));
                }
                let started = Instant::now();
                let (pages, kind) =
                    transport::fetch(&handoff.endpoint, handoff.room, 0, need, times.policy, times.transfer)
                        .await
                        .map_err(|e| ActorError::Engine(EngineError::Import(e.to_string())))?;
                lock(&received.latency).observe(started.elapsed().as_secs_f64());
                received.pages.fetch_add(u64::from(need), Ordering::Relaxed);
                received.bytes.fetch_add(pages.len() as u64, Ordering::Relaxed);
                match kind {
                    TransportKind::Tcp => received.tcp.fetch_add(1, Ordering::Relaxed),
                    TransportKind::InProcess => received.in_process.fetch_add(1, Ordering::Relaxed),
                };
                Ok(xinf_engine::ImportedKv {
                    prompt_ids: handoff.prompt_ids,
                    first_token: handoff.first_token,
                    pages,
                })
            }
            .await;
            if result.is_err() {
                received.failed.fetch_add(1, Ordering::Relaxed);
            }
            result
        }
        .boxed()
    }

    /// Counts a failed import.
    pub(crate) fn failed(&self) {
        self.received.failed.fetch_add(1, Ordering::Relaxed);
    }

    /// This replica's handoff figures.
    pub(crate) fn stats(&self) -> HandoffStats {
        let mut s = lock(&self.rooms).stats();
        let r = &self.received;
        s.pages_transferred = r.pages.load(Ordering::Relaxed);
        s.bytes_transferred = r.bytes.load(Ordering::Relaxed);
        s.tcp_transfers = r.tcp.load(Ordering::Relaxed);
        s.in_process_transfers = r.in_process.load(Ordering::Relaxed);
        s.failed += r.failed.load(Ordering::Relaxed);
        s.latency = *lock(&r.latency);
        s
    }
}
