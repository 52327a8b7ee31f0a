//! Moving canonical pages from a prefill replica to a decode replica.
//!
//! The prefill side owns a [`PageProvider`]: given a room and a page range it gathers those
//! pages out of its engine's KV cache. The decode side fetches them through a transport chosen
//! from the provider's [`Endpoint`]:
//!
//! - **in-process** when the provider lives in the same process (a registry keyed by a process
//!   nonce), a direct call with no copy beyond the gather;
//! - **TCP** otherwise: a [`PageServer`] per process serves every provider registered with it
//!   on a data port of its own, so bulk bytes never travel on the actor control channel. One
//!   fetch moves the whole range as one frame (pages are coalesced, not sent one by one).
//! - **NIXL** when asked for ([`TransportPolicy::Nixl`]): the page server's TCP connection is
//!   only the side channel (as in vLLM's NixlConnector). The server gathers the range into
//!   memory registered with its NIXL agent and answers with the agent's metadata and where the
//!   range lies; the fetching process reads it with one NIXL READ (UCX picks RDMA, shared
//!   memory or TCP) and then says so on the same connection, which frees the staging memory for
//!   the next fetch. See [`crate::nixl`] for loading the library and the agents.
//!
//! Wire format (little endian):
//! - TCP: request `b"XKV1" room:u64 provider:u64 first:u32 count:u32`; answer `status:u8
//!   len:u64` then `len` bytes: the pages (status 0) or an error (status 1, JSON of
//!   [`TransferError`], or UTF-8 text).
//! - NIXL: request `b"XKN1" room:u64 provider:u64 first:u32 count:u32 timeout_ms:u32`; answer
//!   as above, status 0 carrying the stage (agent name, metadata generation and blob, address,
//!   length, device); then the client sends `b"XKND"` once its read is over. The server keeps
//!   the staged range until then, or until `timeout_ms` after the request if the connection
//!   drops first (the client may still be reading).
//!
//! **Fault injection (a test knob).** `XINF_TRANSFER_FAULT`, read once by the serving process,
//! makes its page server misbehave so tests can check that clients fail promptly and typed:
//! - `cut-after:<N>`: close the connection after writing `N` bytes (header included) of a
//!   successful answer, i.e. a transfer cut mid-frame; the client gets [`TransferError::Io`];
//! - `nixl-error`: answer a NIXL request with a range that is not registered memory, so the
//!   client's NIXL read fails with [`TransferError::Nixl`].

use crate::device::{DeviceLease, DevicePages, DeviceRoute, DeviceSink, DeviceStage};
use crate::nixl::{Node, RemoteStage, Staged};
use crate::sync::lock;
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, OnceLock, Weak};

pub use crate::error::TransferError;
pub use crate::process::process_nonce;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const MAGIC: &[u8; 4] = b"XKV1";
const MAGIC_NIXL: &[u8; 4] = b"XKN1";
/// The client's "my NIXL read is over" on a NIXL fetch's connection.
const NIXL_DONE: &[u8; 4] = b"XKND";
const MAGIC_DEVICE: &[u8; 4] = b"XKG1";
/// An address no agent registers, for the `nixl-error` fault.
const UNREGISTERED_ADDR: u64 = 0x1000;
/// Largest answer accepted: a bound against a corrupt length, far above any real range.
const MAX_FRAME: u64 = 64 << 30;

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
}

/// Where a provider can be reached: its process (for the in-process path), its id there, and
/// the TCP data address of that process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Endpoint {
    /// The nonce of the process holding the provider.
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

type Registry = Mutex<HashMap<u64, Weak<dyn PageProvider>>>;

fn registry() -> &'static Registry {
    static R: OnceLock<Registry> = OnceLock::new();
    R.get_or_init(Registry::default)
}

fn lookup(provider: u64) -> Option<Arc<dyn PageProvider>> {
    lock(registry()).get(&provider).and_then(Weak::upgrade)
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

/// This process's TCP page server: one per process, serving every registered provider.
#[derive(Debug)]
pub struct PageServer {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

/// A misbehaviour of the page server, for tests (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Fault {
    /// Serve correctly.
    #[default]
    None,
    /// Close the connection after writing this many bytes of a successful answer.
    CutAfter(u64),
    /// Answer NIXL requests with a range that is not registered memory.
    NixlError,
}

impl Fault {
    /// `XINF_TRANSFER_FAULT` of this process, read once (an unknown value is logged, ignored).
    fn from_env() -> Self {
        static FAULT: OnceLock<Fault> = OnceLock::new();
        *FAULT.get_or_init(|| {
            let Ok(spec) = std::env::var("XINF_TRANSFER_FAULT") else { return Fault::None };
            match Fault::parse(&spec) {
                Some(f) => {
                    tracing::warn!(fault = spec, "the page server injects a fault (XINF_TRANSFER_FAULT)");
                    f
                }
                None => {
                    tracing::warn!(fault = spec, "unknown XINF_TRANSFER_FAULT, ignored");
                    Fault::None
                }
            }
        })
    }

    fn parse(spec: &str) -> Option<Self> {
        match spec.trim() {
            "" | "none" => Some(Fault::None),
            "nixl-error" => Some(Fault::NixlError),
            s => s.strip_prefix("cut-after:").and_then(|n| n.trim().parse().ok()).map(Fault::CutAfter),
        }
    }
}

/// How one page server serves: its fault, and the NIXL agent staging its pages (the process's
/// own unless tests give one, to have two agents in one process).
#[derive(Debug, Clone, Default)]
pub(crate) struct ServeOptions {
    pub(crate) fault: Fault,
    pub(crate) nixl: Option<Arc<Node>>,
}

impl Drop for PageServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl PageServer {
    /// Listens on `ip` (a free port) and serves fetches for providers registered in this
    /// process. Must be called inside a tokio runtime.
    pub async fn start(ip: IpAddr) -> std::io::Result<Self> {
        Self::start_with(ip, ServeOptions { fault: Fault::from_env(), nixl: None }).await
    }

    /// [`start`](Self::start) with explicit options instead of the environment's.
    pub(crate) async fn start_with(ip: IpAddr, options: ServeOptions) -> std::io::Result<Self> {
        let listener = TcpListener::bind(SocketAddr::new(ip, 0)).await?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(async move {
            loop {
                match listener.accept().await {
                    Ok((stream, _)) => {
                        let options = options.clone();
                        tokio::spawn(async move {
                            if let Err(e) = serve(stream, &options).await {
                                tracing::debug!(error = %e, "a page fetch connection failed");
                            }
                        });
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "the page server cannot accept connections");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }
        });
        tracing::debug!(%addr, "page server listening");
        Ok(Self { addr, task })
    }

    /// The address fetches connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Registers `provider` in this process and returns its endpoint. The registry holds it
    /// weakly: it is served while the caller keeps the `Arc` and the registration.
    pub fn register(&self, provider: &Arc<dyn PageProvider>) -> Registration {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let id = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        lock(registry()).insert(id, Arc::downgrade(provider));
        Registration {
            id,
            endpoint: Endpoint { process: process_nonce(), provider: id, tcp: self.addr.to_string() },
        }
    }
}

async fn serve(mut stream: TcpStream, options: &ServeOptions) -> std::io::Result<()> {
    stream.set_nodelay(true)?;
    loop {
        let mut magic = [0u8; 4];
        match stream.read_exact(&mut magic).await {
            Ok(_) => {}
            // The client closed the connection between requests.
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        }
        #[derive(PartialEq)]
        enum Kind {
            Host,
            Nixl,
            Device,
        }
        let kind = match &magic {
            MAGIC => Kind::Host,
            MAGIC_NIXL => Kind::Nixl,
            MAGIC_DEVICE => Kind::Device,
            _ => return write_answer(&mut stream, 1, b"not a page fetch (bad magic)", Fault::None).await,
        };
        let mut head = [0u8; 29];
        let head = &mut head[..match kind {
            Kind::Host => 24,
            Kind::Nixl => 28,
            Kind::Device => 29,
        }];
        stream.read_exact(head).await?;
        let word = |at: usize| u64::from_le_bytes(head[at..at + 8].try_into().unwrap_or_default());
        let half = |at: usize| u32::from_le_bytes(head[at..at + 4].try_into().unwrap_or_default());
        let (room, provider, first, count) = (word(0), word(8), half(16), half(20));
        let received = tokio::time::Instant::now();
        if kind == Kind::Device {
            let keep_until = received + Duration::from_millis(u64::from(half(24)));
            let lease = match DeviceRoute::from_code(head[28]) {
                None => Err(TransferError::Protocol(format!("device route {}", head[28]))),
                Some(route) => match lookup(provider) {
                    Some(p) => p.device_pages(room, first, count, route).await,
                    None => Err(TransferError::UnknownRoom(room)),
                },
            };
            let lease = match lease {
                Ok(lease) => lease,
                Err(e) => {
                    write_error(&mut stream, &e).await?;
                    continue;
                }
            };
            let answer = serde_json::to_vec(&(lease.stage(), lease.len())).unwrap_or_default();
            write_answer(&mut stream, 0, &answer, options.fault).await?;
            hold_until_done(&mut stream, lease, keep_until).await?;
            continue;
        }
        let result = match lookup(provider) {
            Some(p) => p.pages(room, first, count).await,
            None => Err(TransferError::UnknownRoom(room)),
        };
        if kind == Kind::Host {
            match result {
                Ok(bytes) => write_answer(&mut stream, 0, &bytes, options.fault).await?,
                Err(e) => write_error(&mut stream, &e).await?,
            }
            continue;
        }
        let staged = match result {
            Ok(pages) => stage(pages, options.nixl.clone()).await,
            Err(e) => Err(e),
        };
        let staged = match staged {
            Ok(staged) => staged,
            Err(e) => {
                write_error(&mut stream, &e).await?;
                continue;
            }
        };
        let mut remote = staged.remote().clone();
        if options.fault == Fault::NixlError {
            remote.addr = UNREGISTERED_ADDR;
        }
        write_answer(&mut stream, 0, &remote.encode(), options.fault).await?;
        hold_until_done(&mut stream, staged, received + Duration::from_millis(u64::from(half(24)))).await?;
    }
}

/// Keeps `staged` (memory a peer is reading) until the peer's read is over: its "done", or its
/// deadline `keep_until` when the connection drops first (its read may still be running).
async fn hold_until_done<T: Send + 'static>(
    stream: &mut TcpStream,
    staged: T,
    keep_until: tokio::time::Instant,
) -> std::io::Result<()> {
    let mut done = [0u8; 4];
    match tokio::time::timeout_at(keep_until, stream.read_exact(&mut done)).await {
        Ok(Ok(_)) if &done == NIXL_DONE => {
            drop(staged);
            Ok(())
        }
        Ok(Ok(_)) => {
            linger(staged, keep_until);
            Err(std::io::Error::other("not the end of a read"))
        }
        Ok(Err(e)) => {
            linger(staged, keep_until);
            Err(e)
        }
        // Past the client's deadline: it has given up reading.
        Err(_) => {
            drop(staged);
            Err(std::io::Error::other("no end of a read before its deadline"))
        }
    }
}

/// Copies `pages` into staging memory of `node` (default: this process's agent).
async fn stage(pages: Vec<u8>, node: Option<Arc<Node>>) -> Result<Staged, TransferError> {
    tokio::task::spawn_blocking(move || {
        let node = match node {
            Some(node) => node,
            // Said as the serving side's, or the fetching side would look for its own fault.
            None => Node::process().map_err(|e| match e {
                TransferError::NixlUnavailable(why) => {
                    TransferError::NixlUnavailable(format!("in the page server's process: {why}"))
                }
                e => e,
            })?,
        };
        node.stage(&pages)
    })
    .await
    .unwrap_or_else(|e| Err(TransferError::Nixl(format!("staging the pages stopped: {e}"))))
}

/// Keeps `staged` until `until`, then frees it.
fn linger<T: Send + 'static>(staged: T, until: tokio::time::Instant) {
    tokio::spawn(async move {
        tokio::time::sleep_until(until).await;
        drop(staged);
    });
}

async fn write_error(stream: &mut TcpStream, e: &TransferError) -> std::io::Result<()> {
    let text = serde_json::to_vec(e).unwrap_or_default();
    write_answer(stream, 1, &text, Fault::None).await
}

/// Writes one answer; a successful one is cut short under [`Fault::CutAfter`].
async fn write_answer(stream: &mut TcpStream, status: u8, body: &[u8], fault: Fault) -> std::io::Result<()> {
    let mut head = [0u8; 9];
    head[0] = status;
    head[1..].copy_from_slice(&(body.len() as u64).to_le_bytes());
    if let (0, Fault::CutAfter(n)) = (status, fault) {
        let n = usize::try_from(n).unwrap_or(usize::MAX);
        let frame = [&head[..], body].concat();
        stream.write_all(&frame[..n.min(frame.len())]).await?;
        stream.flush().await?;
        return Err(std::io::Error::other("connection cut (XINF_TRANSFER_FAULT)"));
    }
    stream.write_all(&head).await?;
    stream.write_all(body).await?;
    stream.flush().await
}

/// Fetches pages `first_page .. first_page + count` of `room` from `endpoint`, in process
/// when `policy` allows and the provider is here, over NIXL when `policy` says so, else over
/// TCP; within `timeout`.
pub async fn fetch(
    endpoint: &Endpoint,
    room: u64,
    first_page: u32,
    count: u32,
    policy: TransportPolicy,
    timeout: Duration,
) -> Result<(Vec<u8>, TransportKind), TransferError> {
    let timed_out =
        || TransferError::Timeout { endpoint: endpoint.tcp.clone(), after_ms: timeout.as_millis() as u64 };
    if policy == TransportPolicy::Auto && endpoint.process == process_nonce() {
        if let Some(p) = lookup(endpoint.provider) {
            let pages = tokio::time::timeout(timeout, p.pages(room, first_page, count))
                .await
                .map_err(|_| timed_out())??;
            return Ok((pages, TransportKind::InProcess));
        }
    }
    if policy == TransportPolicy::Nixl {
        let pages = tokio::time::timeout(timeout, fetch_nixl(endpoint, room, first_page, count, timeout))
            .await
            .map_err(|_| timed_out())??;
        return Ok((pages, TransportKind::Nixl));
    }
    let pages = tokio::time::timeout(timeout, fetch_tcp(endpoint, room, first_page, count))
        .await
        .map_err(|_| timed_out())??;
    Ok((pages, TransportKind::Tcp))
}

fn io_error(endpoint: &Endpoint) -> impl Fn(std::io::Error) -> TransferError + '_ {
    |e| TransferError::Io { endpoint: endpoint.tcp.clone(), detail: e.to_string() }
}

/// Sends a request head and reads the answer: the body of a success, else the error.
async fn request(endpoint: &Endpoint, head: &[u8]) -> Result<(TcpStream, Vec<u8>), TransferError> {
    let io = io_error(endpoint);
    let mut stream = TcpStream::connect(&endpoint.tcp).await.map_err(&io)?;
    stream.set_nodelay(true).map_err(&io)?;
    stream.write_all(head).await.map_err(&io)?;
    let mut answer = [0u8; 9];
    stream.read_exact(&mut answer).await.map_err(&io)?;
    let len = u64::from_le_bytes(answer[1..].try_into().unwrap_or_default());
    if len > MAX_FRAME {
        return Err(TransferError::Protocol(format!("an answer of {len} bytes")));
    }
    let mut body = vec![0u8; len as usize];
    stream.read_exact(&mut body).await.map_err(&io)?;
    match answer[0] {
        0 => Ok((stream, body)),
        1 => Err(serde_json::from_slice(&body)
            .unwrap_or_else(|_| TransferError::Source(String::from_utf8_lossy(&body).into_owned()))),
        s => Err(TransferError::Protocol(format!("status {s}"))),
    }
}

fn request_head(magic: &[u8; 4], endpoint: &Endpoint, room: u64, first_page: u32, count: u32) -> Vec<u8> {
    let mut head = Vec::with_capacity(32);
    head.extend_from_slice(magic);
    head.extend_from_slice(&room.to_le_bytes());
    head.extend_from_slice(&endpoint.provider.to_le_bytes());
    head.extend_from_slice(&first_page.to_le_bytes());
    head.extend_from_slice(&count.to_le_bytes());
    head
}

/// The NIXL path: the stage request on the side channel, one NIXL READ, then "done".
async fn fetch_nixl(
    endpoint: &Endpoint,
    room: u64,
    first_page: u32,
    count: u32,
    timeout: Duration,
) -> Result<Vec<u8>, TransferError> {
    let deadline = std::time::Instant::now() + timeout;
    let node = tokio::task::spawn_blocking(Node::process)
        .await
        .unwrap_or_else(|e| Err(TransferError::Nixl(format!("creating the NIXL agent stopped: {e}"))))?;
    let mut head = request_head(MAGIC_NIXL, endpoint, room, first_page, count);
    head.extend_from_slice(&u32::try_from(timeout.as_millis()).unwrap_or(u32::MAX).to_le_bytes());
    let (mut stream, body) = request(endpoint, &head).await?;
    let stage = RemoteStage::decode(&body)?;
    // The read and the "done" after it run in a task of their own: should this future be
    // dropped (the caller's timeout), the server still keeps its staging memory until the
    // read is over.
    let read = tokio::spawn(async move {
        let pages = tokio::task::spawn_blocking(move || node.read(&stage, deadline))
            .await
            .unwrap_or_else(|e| Err(TransferError::Nixl(format!("the NIXL read stopped: {e}"))));
        // Best effort: if the server is gone, so is the memory it would free.
        let _ = stream.write_all(NIXL_DONE).await;
        pages
    });
    read.await.unwrap_or_else(|e| Err(TransferError::Nixl(format!("the NIXL read stopped: {e}"))))
}

async fn fetch_tcp(
    endpoint: &Endpoint,
    room: u64,
    first_page: u32,
    count: u32,
) -> Result<Vec<u8>, TransferError> {
    let (_, pages) = request(endpoint, &request_head(MAGIC, endpoint, room, first_page, count)).await?;
    Ok(pages)
}

/// Fetches pages `first_page .. first_page + count` of `room` GPU to GPU by `route`: the
/// provider gathers them into device staging memory, `sink` copies them into its own GPU's
/// memory, and the staging is freed once that copy is over. Within `timeout`.
///
/// [`DeviceRoute::InProcess`] needs the provider in this process; the other routes ask the
/// provider's page server, whose connection carries the stage description and the "done".
pub async fn fetch_device(
    endpoint: &Endpoint,
    room: u64,
    first_page: u32,
    count: u32,
    route: DeviceRoute,
    sink: Arc<dyn DeviceSink>,
    timeout: Duration,
) -> Result<(DevicePages, TransportKind), TransferError> {
    let timed_out =
        || TransferError::Timeout { endpoint: endpoint.tcp.clone(), after_ms: timeout.as_millis() as u64 };
    let deadline = std::time::Instant::now() + timeout;
    let receive = move |sink: Arc<dyn DeviceSink>, lease: DeviceLease| async move {
        // The lease (in process: the staging memory itself) is dropped once the copy is over.
        tokio::task::spawn_blocking(move || sink.receive(&lease, deadline))
            .await
            .unwrap_or_else(|e| Err(TransferError::Source(format!("receiving GPU pages stopped: {e}"))))
    };
    if route == DeviceRoute::InProcess {
        if endpoint.process != process_nonce() {
            return Err(TransferError::Protocol("an in-process GPU fetch from another process".into()));
        }
        let provider = lookup(endpoint.provider).ok_or(TransferError::UnknownRoom(room))?;
        let work = async {
            let lease = provider.device_pages(room, first_page, count, route).await?;
            receive(sink, lease).await
        };
        let pages = tokio::time::timeout(timeout, work).await.map_err(|_| timed_out())??;
        return Ok((pages, TransportKind::DeviceInProcess));
    }
    let kind = if route == DeviceRoute::CudaIpc { TransportKind::CudaIpc } else { TransportKind::NixlVram };
    let mut head = request_head(MAGIC_DEVICE, endpoint, room, first_page, count);
    head.extend_from_slice(&u32::try_from(timeout.as_millis()).unwrap_or(u32::MAX).to_le_bytes());
    head.push(route.code());
    let work = async {
        let (mut stream, body) = request(endpoint, &head).await?;
        let (stage, len): (DeviceStage, usize) = serde_json::from_slice(&body)
            .map_err(|e| TransferError::Protocol(format!("a GPU stage answer: {e}")))?;
        // The copy and the "done" after it run in a task of their own: should this future be
        // dropped (the caller's timeout), the server still keeps its staging memory until the
        // copy is over.
        let copy = tokio::spawn(async move {
            let pages = receive(sink, DeviceLease::remote(stage, len)).await;
            // Best effort: if the server is gone, so is the memory it would free.
            let _ = stream.write_all(NIXL_DONE).await;
            pages
        });
        copy.await.unwrap_or_else(|e| Err(TransferError::Source(format!("receiving GPU pages stopped: {e}"))))
    };
    let pages = tokio::time::timeout(timeout, work).await.map_err(|_| timed_out())??;
    Ok((pages, kind))
}

#[cfg(test)]
mod tests;
