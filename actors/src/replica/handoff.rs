//! The replica's side of a P/D handoff (what DESIGN.md calls the transfer actor lives here, in
//! the replica, not as an actor of its own): the prefill side publishes rooms and serves their
//! pages, the decode side (`receive`) fetches pages and imports them.
//!
//! Control (prefill done, release) travels as actor messages; the pages themselves travel on
//! the data plane of `xinf_transfer::transport`: in process when both replicas share one, GPU
//! to GPU (CUDA IPC, NIXL VRAM) where both engines' KV is on a GPU, else over the TCP (or
//! NIXL) page server of the prefill replica's process.

use super::rooms::{Leases, RoomError, RoomTable};
use super::snapshot::{Inserted, SnapshotStore, chain_keys};
use crate::block_tracker::{BlockTrackerHandle, BlockTrackerMsg};
use crate::error::ActorError;
use crate::view::HandoffStats;
use futures::FutureExt;
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use tokio::sync::OnceCell;
use xinf_engine::{Engine, EngineError, ModelContract, PromptReport, TokenLogprobs};
use xinf_transfer::device::{DeviceLease, DeviceRoute, KvDevice};
use xinf_transfer::sync::lock;
use xinf_transfer::transport::{self, Endpoint, PageProvider, PageServer, TransferError};

mod local;
mod receive;
#[cfg(test)]
mod tests;

pub(crate) use local::Prefilled;
use local::leaves_to_decode;
use receive::Received;

/// What a prefill hands to a decode replica.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Handoff {
    /// The room holding the pinned prompt.
    pub(crate) room: u64,
    /// The prompt's token ids.
    pub(crate) prompt_ids: Vec<u32>,
    /// The prefill's first sampled token.
    pub(crate) first_token: u32,
    /// Its text when it may be shown before the decode side answers ([`PinnedPrefill`]'s); the
    /// caller clears it when it does not show it, so the decode side knows which it is.
    ///
    /// [`PinnedPrefill`]: xinf_engine::PinnedPrefill
    pub(crate) first_text: Option<String>,
    /// The first token's log-probabilities, when the request asked for them.
    pub(crate) first_logprobs: Option<Box<TokenLogprobs>>,
    /// The prompt as the prefill engine took it, when the request asked for it: the caller
    /// shows it and clears it.
    pub(crate) prompt: Option<Box<PromptReport>>,
    /// Canonical pages in the room: `ceil(prompt / 64)`.
    pub(crate) pages: u32,
    /// Where the pages are fetched from.
    pub(crate) endpoint: Endpoint,
    /// The prefill engine's model contract, checked by the decode side.
    pub(crate) contract: ModelContract,
    /// Where the prefill engine's KV lives when on a GPU: the decode side then fetches GPU to
    /// GPU if it can.
    pub(crate) device: Option<KvDevice>,
}

/// Time limits, transport choice, snapshot budget and local prefill of handoffs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HandoffTimes {
    pub(crate) leases: Leases,
    /// Time limit of one page fetch.
    pub(crate) transfer: Duration,
    /// How pages may travel.
    pub(crate) policy: transport::TransportPolicy,
    /// Bytes of the prefill replica's snapshot cache; 0 keeps no snapshots.
    pub(crate) snapshot_budget: usize,
    /// A prompt of at most this many tokens is left to the decode replica (0: none is).
    pub(crate) local_prefill_tokens: usize,
}

impl HandoffTimes {
    /// The node's handoff settings with a model's launch choices applied.
    pub(crate) fn with_model(mut self, model: &crate::spec::ModelHandoff) -> Self {
        if model.nixl {
            self.policy = xinf_transfer::transport::TransportPolicy::Nixl;
        }
        if let Some(bytes) = model.snapshot_cache_bytes {
            self.snapshot_budget = usize::try_from(bytes).unwrap_or(usize::MAX);
        }
        self.local_prefill_tokens = model.local_prefill_tokens as usize;
        self
    }
}

/// The transport for pages at `endpoint`: NIXL moves pages between processes; inside one
/// process (one NIXL agent, which cannot read from itself) they move in process.
fn policy_for(endpoint: &Endpoint, policy: transport::TransportPolicy) -> transport::TransportPolicy {
    if policy == transport::TransportPolicy::Nixl && endpoint.process == transport::process_nonce() {
        transport::TransportPolicy::Auto
    } else {
        policy
    }
}

/// The GPU-to-GPU route for pages at `endpoint` (prefill KV on `from`) into a decode engine
/// on a GPU, if there is one: in process, else NIXL when asked for, else CUDA IPC within one
/// host. `None`: the pages go through host memory (`TransportPolicy::Tcp` forces that too).
fn device_route(
    endpoint: &Endpoint,
    from: Option<&KvDevice>,
    policy: transport::TransportPolicy,
) -> Option<DeviceRoute> {
    let from = from?;
    if endpoint.process == transport::process_nonce() {
        return (policy != transport::TransportPolicy::Tcp).then_some(DeviceRoute::InProcess);
    }
    match policy {
        transport::TransportPolicy::Nixl => Some(DeviceRoute::NixlVram),
        transport::TransportPolicy::Auto if from.host == xinf_transfer::device::host_id() => {
            Some(DeviceRoute::CudaIpc)
        }
        _ => None,
    }
}

/// How long a prefill waits for the block tracker's answer before computing on its own.
const TRACKER_WAIT: Duration = Duration::from_secs(2);

/// The process's page server, started by the first prefill replica of the process. It lives
/// as long as the process, so it runs on a runtime of its own: a server spawned on the runtime
/// of whoever started it first would stop with that runtime (an embedding application's, or
/// one of several clusters in one process).
async fn page_server(ip: IpAddr) -> Result<&'static PageServer, ActorError> {
    static SERVER: OnceCell<PageServer> = OnceCell::const_new();
    static RUNTIME: std::sync::OnceLock<std::io::Result<tokio::runtime::Runtime>> =
        std::sync::OnceLock::new();
    let failed = |e: String| ActorError::Node(format!("starting the page server on {ip}: {e}"));
    SERVER
        .get_or_try_init(|| async {
            let rt = RUNTIME.get_or_init(|| {
                tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .thread_name("xinf-pages")
                    .enable_all()
                    .build()
            });
            let rt = rt.as_ref().map_err(|e| failed(e.to_string()))?;
            rt.spawn(PageServer::start(ip))
                .await
                .map_err(|e| failed(e.to_string()))?
                .map_err(|e| failed(e.to_string()))
        })
        .await
}

/// Serves the pages of a prefill replica's rooms out of its engine, and keeps the complete
/// ones in the snapshot cache as they go by.
struct RoomPages {
    rooms: Arc<Mutex<RoomTable>>,
    engine: Arc<dyn Engine>,
    snapshots: Option<Arc<Snapshots>>,
}

/// A claimed room range: the pinned request's id and the room's content keys.
type Claim = (String, Option<Arc<[u64]>>);

impl RoomPages {
    /// Claims pages `first..first + count` of `room` for a fetch: the pinned request's id and
    /// the room's content keys, or the fetch's error.
    fn claim(&self, room: u64, first: u32, count: u32) -> Result<Claim, TransferError> {
        let mut rooms = lock(&self.rooms);
        match rooms.claim(room, first, count, Instant::now()) {
            Ok(id) => Ok((id, rooms.keys(room))),
            Err(RoomError::Unknown) => Err(TransferError::UnknownRoom(room)),
            Err(RoomError::OutOfRange { pages }) => Err(TransferError::Source(format!(
                "pages {first}..{} of room {room}, which holds {pages}",
                u64::from(first) + u64::from(count)
            ))),
        }
    }
}

impl PageProvider for RoomPages {
    fn pages(&self, room: u64, first: u32, count: u32) -> BoxFuture<'static, Result<Vec<u8>, TransferError>> {
        let claimed = self.claim(room, first, count);
        let (engine, snapshots) = (self.engine.clone(), self.snapshots.clone());
        async move {
            let (request_id, keys) = claimed?;
            let pages = engine
                .export_pages(&request_id, first as usize, count as usize)
                .await
                .map_err(|e| TransferError::Source(e.to_string()))?;
            if let (Some(snapshots), Some(keys)) = (snapshots, keys) {
                snapshots.keep(&keys, first as usize, &pages, engine.contract().page_bytes());
            }
            Ok(pages)
        }
        .boxed()
    }

    fn device_pages(
        &self,
        room: u64,
        first: u32,
        count: u32,
        route: DeviceRoute,
    ) -> BoxFuture<'static, Result<DeviceLease, TransferError>> {
        let claimed = self.claim(room, first, count);
        let engine = self.engine.clone();
        async move {
            let (request_id, _) = claimed?;
            engine
                .export_pages_device(&request_id, first as usize, count as usize, route)
                .await
                .map_err(|e| TransferError::Source(e.to_string()))
        }
        .boxed()
    }
}

/// A prefill replica's snapshot cache, its page provider, and its place in the block tracker.
struct Snapshots {
    store: Arc<Mutex<SnapshotStore>>,
    /// Serves chains of snapshot pages to other replicas (kept alive with the registration).
    _provider: Arc<dyn PageProvider>,
    registration: transport::Registration,
    /// The replica's uid and its model's tracker group, once the replica knows them.
    tracker: OnceLock<(String, String)>,
    hits: AtomicU64,
    remote_hits: AtomicU64,
}

impl Snapshots {
    fn tracker(&self) -> Option<(&str, BlockTrackerHandle)> {
        let (uid, group) = self.tracker.get()?;
        let cell = ractor::pg::get_members(group).into_iter().next()?;
        let actor: ractor::ActorRef<BlockTrackerMsg> = cell.into();
        Some((uid.as_str(), BlockTrackerHandle::new(actor, TRACKER_WAIT)))
    }

    /// Keeps the complete pages among `pages` (page `first` onwards) and tells the tracker.
    fn keep(&self, keys: &[u64], first: usize, pages: &[u8], page_bytes: usize) {
        if page_bytes == 0 || first >= keys.len() {
            return;
        }
        let chunks: Vec<&[u8]> = pages.chunks_exact(page_bytes).take(keys.len() - first).collect();
        let Inserted { added, evicted } = lock(&self.store).insert(keys, first, &chunks);
        if added.is_empty() && evicted.is_empty() {
            return;
        }
        if let Some((uid, tracker)) = self.tracker() {
            let sent = tracker
                .unregister(uid, evicted)
                .and_then(|()| tracker.register_at(uid, Some(self.registration.endpoint().clone()), added));
            if let Err(e) = sent {
                tracing::debug!(error = %e, "the block tracker did not take snapshot pages");
            }
        }
    }

    /// The KV of the longest known prefix of `keys`: from this cache, then from the replica
    /// the tracker names for the pages that follow. Returns the pages and their keys leased
    /// here (unlease them once imported).
    async fn lookup(&self, keys: &[u64], times: HandoffTimes) -> (Vec<u8>, usize, Vec<u64>) {
        let (mut prefix, leased) = {
            let mut store = lock(&self.store);
            let n = store.longest_prefix(keys);
            let leased = keys[..n].to_vec();
            let pages = store.lease(&leased).unwrap_or_default();
            (pages.iter().flat_map(|p| p.iter().copied()).collect::<Vec<u8>>(), leased)
        };
        let mut n = leased.len();
        if n < keys.len()
            && let Some((uid, tracker)) = self.tracker()
        {
            let rest = &keys[n..];
            match tracker.query(rest.to_vec(), Some(uid)).await {
                Ok(found) => {
                    let by_hash: std::collections::HashMap<u64, _> =
                        found.iter().map(|l| (l.hash, l)).collect();
                    let holder = by_hash
                        .get(&rest[0])
                        .and_then(|l| l.endpoint.clone().map(|e| (l.replica_uid.clone(), e)));
                    if let Some((holder, endpoint)) = holder {
                        let run = rest
                            .iter()
                            .take_while(|h| by_hash.get(h).is_some_and(|l| l.replica_uid == holder))
                            .count();
                        let last = rest[run - 1];
                        match transport::fetch(
                            &endpoint,
                            last,
                            0,
                            run as u32,
                            policy_for(&endpoint, times.policy),
                            times.transfer,
                        )
                        .await
                        {
                            Ok((pages, _)) => {
                                prefix.extend_from_slice(&pages);
                                n += run;
                                self.remote_hits.fetch_add(run as u64, Ordering::Relaxed);
                            }
                            Err(e) => {
                                tracing::debug!(error = %e, %holder, "snapshot pages could not be fetched; computing them")
                            }
                        }
                    }
                }
                Err(e) => {
                    tracing::debug!(error = %e, "the block tracker did not answer; computing the prompt")
                }
            }
        }
        self.hits.fetch_add(n as u64, Ordering::Relaxed);
        (prefix, n, leased)
    }
}

/// Serves chains of snapshot pages: "room" is the key of a prefix's last page, `count` how
/// many pages of the prefix to return (ending with that one).
struct ChainPages {
    store: Arc<Mutex<SnapshotStore>>,
}

impl PageProvider for ChainPages {
    fn pages(&self, last: u64, first: u32, count: u32) -> BoxFuture<'static, Result<Vec<u8>, TransferError>> {
        let chain = if first == 0 { lock(&self.store).chain(last, count as usize) } else { None };
        async move {
            let pages = chain.ok_or(TransferError::UnknownRoom(last))?;
            Ok(pages.iter().flat_map(|p| p.iter().copied()).collect())
        }
        .boxed()
    }
}

/// A replica's handoff machinery.
pub(crate) struct HandoffSide {
    rooms: Arc<Mutex<RoomTable>>,
    engine: Arc<dyn Engine>,
    /// Set on prefill replicas: their provider's registration (unregistered on drop).
    registration: Option<(transport::Registration, Arc<dyn PageProvider>)>,
    /// Set on prefill replicas with a snapshot budget.
    snapshots: Option<Arc<Snapshots>>,
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
        let (registration, snapshots) = if serve_pages {
            let server = page_server(ip).await?;
            let snapshots = (times.snapshot_budget > 0).then(|| {
                let store = Arc::new(Mutex::new(SnapshotStore::new(times.snapshot_budget)));
                let provider: Arc<dyn PageProvider> = Arc::new(ChainPages { store: store.clone() });
                Arc::new(Snapshots {
                    store,
                    registration: server.register(&provider),
                    _provider: provider,
                    tracker: OnceLock::new(),
                    hits: AtomicU64::new(0),
                    remote_hits: AtomicU64::new(0),
                })
            });
            let provider: Arc<dyn PageProvider> = Arc::new(RoomPages {
                rooms: rooms.clone(),
                engine: engine.clone(),
                snapshots: snapshots.clone(),
            });
            (Some((server.register(&provider), provider)), snapshots)
        } else {
            (None, None)
        };
        Ok(Self { rooms, engine, registration, snapshots, received: Arc::default(), times })
    }

    /// Publishes this replica's snapshot pages in its model's block tracker (found through
    /// the process group `tracker_group`) and looks up other replicas' pages there.
    pub(crate) fn join_tracker(&self, replica_uid: &str, tracker_group: &str) {
        if let Some(s) = &self.snapshots {
            let _ = s.tracker.set((replica_uid.to_owned(), tracker_group.to_owned()));
        }
    }

    /// Computes a prompt (its first token too), pins its KV and publishes a room for it. Called
    /// when the replica takes the request's message: the aborts that apply to it are those
    /// taken after this call.
    pub(crate) fn prefill(
        &self,
        mut request: xinf_engine::GenerateRequest,
    ) -> BoxFuture<'static, Result<Prefilled, ActorError>> {
        let endpoint = self.registration.as_ref().map(|(r, _)| r.endpoint().clone());
        let (engine, rooms, snapshots, times) =
            (self.engine.clone(), self.rooms.clone(), self.snapshots.clone(), self.times);
        let since = self.epoch();
        async move {
            let endpoint = endpoint.ok_or_else(|| {
                ActorError::Internal("a prefill was sent to a replica that does not serve pages".into())
            })?;
            if leaves_to_decode(engine.as_ref(), &mut request, times.local_prefill_tokens)
                .inspect_err(|e| lock(&rooms).fail_on(e))?
            {
                lock(&rooms).local();
                return Ok(Prefilled::Local);
            }
            let mut keys: Arc<[u64]> = Arc::default();
            let mut leased = Vec::new();
            let computed = async {
                // Prompt log-probabilities need every prompt position computed: no prefix.
                let usable_snapshots = snapshots.as_ref().filter(|_| request.sampling.prompt_logprobs.is_none());
                let Some(snapshots) = usable_snapshots else { return engine.prefill_pinned(request).await };
                let ids = engine.prompt_token_ids(&request.prompt)?;
                keys = chain_keys(engine.contract(), &ids, ids.len() / xinf_engine::PAGE_TOKENS).into();
                // At least one prompt token is computed: the first output token comes from it.
                let usable = ids.len().saturating_sub(1) / xinf_engine::PAGE_TOKENS;
                // The engine takes the ids, not the text again: tokenizing costs about a
                // microsecond a token, on the way to the first token.
                request.prompt = xinf_engine::Prompt::Tokens(ids);
                let (prefix, n, held) = snapshots.lookup(&keys[..usable], times).await;
                leased = held;
                if n == 0 {
                    return engine.prefill_pinned(request).await;
                }
                tracing::debug!(request_id = %request.request_id, pages = n, "prompt prefix from the snapshot cache");
                engine.prefill_pinned_with_prefix(request, prefix).await
            }
            .await;
            if let Some(s) = &snapshots {
                lock(&s.store).unlease(&leased);
            }
            let pinned = match computed {
                Ok(p) => p,
                Err(e) => {
                    lock(&rooms).fail_on(&e);
                    return Err(e.into());
                }
            };
            let pages = xinf_transfer::pages_for(pinned.prompt_ids.len()) as u32;
            // An engine server published the room itself, in its own process; the table here
            // still holds it, for its lease and its release.
            let (room, endpoint, device) = match pinned.remote {
                Some(r) => (r.room, r.endpoint, r.device),
                None => (rand::random::<u64>() >> 1, endpoint, engine.kv_device()),
            };
            if !lock(&rooms).publish(room, &pinned.request_id, pages, keys, Instant::now(), since) {
                engine.release_pinned(&pinned.request_id);
                return Err(ActorError::Engine(EngineError::Aborted));
            }
            Ok(Prefilled::Room(Box::new(Handoff {
                room,
                prompt_ids: pinned.prompt_ids,
                first_token: pinned.first_token,
                first_text: pinned.first_text,
                first_logprobs: pinned.first_logprobs,
                prompt: pinned.prompt,
                pages,
                endpoint,
                contract: engine.contract().clone(),
                device,
            })))
        }
        .boxed()
    }

    /// Ends a room: the decode side is done with it. `false` when it was gone already.
    pub(crate) fn release(&self, room: u64) -> bool {
        let Some(request_id) = lock(&self.rooms).release(room) else { return false };
        self.engine.release_pinned(&request_id);
        true
    }

    /// Ends every room of an aborted request; `true` when it had one here.
    pub(crate) fn abort(&self, request_id: &str) -> bool {
        if lock(&self.rooms).abort_request(request_id, Instant::now()) > 0 {
            self.engine.release_pinned(request_id);
            return true;
        }
        false
    }

    /// The abort clock now ([`RoomTable::epoch`]): what a request's attempt notes when the
    /// replica takes its message.
    pub(crate) fn epoch(&self) -> u64 {
        lock(&self.rooms).epoch()
    }

    /// Whether an abort of this request's attempt that started at `since` ([`epoch`](Self::epoch))
    /// arrived before it started here (the decode side checks after starting an imported
    /// request, whose start raced with the abort).
    pub(crate) fn was_aborted(&self, request_id: &str, since: u64) -> bool {
        lock(&self.rooms).was_aborted(request_id, since)
    }

    /// Frees the rooms whose lease ran out.
    pub(crate) fn sweep(&self) {
        for request_id in lock(&self.rooms).expire(Instant::now()) {
            tracing::warn!(%request_id, "a handoff lease expired; freeing its pinned KV");
            self.engine.release_pinned(&request_id);
        }
    }

    /// What an engine that loads a handoff's KV itself is told of it, after the same checks as
    /// a fetch (the contracts agree, the room holds the pages the engine needs).
    pub(crate) fn remote_kv(&self, handoff: &Handoff) -> Result<xinf_engine::RemoteKv, ActorError> {
        receive::pages_needed(self.engine.as_ref(), handoff)?;
        Ok(xinf_engine::RemoteKv {
            prompt_ids: handoff.prompt_ids.clone(),
            first_token: handoff.first_token,
            first_text: handoff.first_text.clone(),
            first_logprobs: handoff.first_logprobs.clone(),
            room: handoff.room,
            endpoint: handoff.endpoint.clone(),
            device: handoff.device.clone(),
            pages: handoff.pages,
        })
    }

    /// Fetches a handoff's pages and checks them against this engine's contract: what the
    /// decode side imports.
    pub(crate) fn fetch(
        &self,
        handoff: &Handoff,
    ) -> BoxFuture<'static, Result<xinf_engine::ImportedKv, ActorError>> {
        receive::fetch(self.engine.clone(), self.received.clone(), self.times, handoff.clone()).boxed()
    }

    /// Counts a prompt this decode replica computed itself: a short one left to it, or a whole
    /// request while the model had no prefill replica to use.
    pub(crate) fn computed_own_prompt(&self) {
        self.received.own_prompts.fetch_add(1, Ordering::Relaxed);
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
        s.nixl_transfers = r.nixl.load(Ordering::Relaxed);
        s.gpu_in_process_transfers = r.gpu_in_process.load(Ordering::Relaxed);
        s.cuda_ipc_transfers = r.cuda_ipc.load(Ordering::Relaxed);
        s.nixl_vram_transfers = r.nixl_vram.load(Ordering::Relaxed);
        s.gpu_bytes_transferred = r.gpu_bytes.load(Ordering::Relaxed);
        s.gpu_fallbacks = r.gpu_fallbacks.load(Ordering::Relaxed);
        s.failed += r.failed.load(Ordering::Relaxed);
        s.decode_prompts = r.own_prompts.load(Ordering::Relaxed);
        s.latency = *lock(&r.latency);
        if let Some(snap) = &self.snapshots {
            s.snapshot_hits = snap.hits.load(Ordering::Relaxed);
            s.snapshot_remote_hits = snap.remote_hits.load(Ordering::Relaxed);
            let store = lock(&snap.store).stats();
            (s.snapshot_pages, s.snapshot_bytes, s.snapshot_evictions) =
                (store.pages, store.bytes, store.evictions);
        }
        s
    }
}
