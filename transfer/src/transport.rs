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
//!
//! Wire format (little endian): request `b"XKV1" room:u64 provider:u64 first:u32 count:u32`;
//! answer `status:u8 len:u64` then `len` bytes: the pages (status 0) or a UTF-8 message.

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const MAGIC: &[u8; 4] = b"XKV1";
/// Largest answer accepted: a bound against a corrupt length, far above any real range.
const MAX_FRAME: u64 = 64 << 30;

/// Why a transfer failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[non_exhaustive]
pub enum TransferError {
    /// The source holds no such room (never published, released, aborted or expired).
    #[error("room {0} is not held by the prefill replica (released, aborted or expired)")]
    UnknownRoom(u64),
    /// The source could not produce the pages.
    #[error("the prefill replica could not read the pages: {0}")]
    Source(String),
    /// The connection failed.
    #[error("page transfer from {endpoint} failed: {detail}")]
    Io {
        /// Where the pages were fetched from.
        endpoint: String,
        /// What failed.
        detail: String,
    },
    /// The transfer did not finish in time.
    #[error("page transfer from {endpoint} did not finish within {after_ms} ms")]
    Timeout {
        /// Where the pages were fetched from.
        endpoint: String,
        /// The limit.
        after_ms: u64,
    },
    /// The peer answered something that is not this protocol.
    #[error("page transfer protocol error: {0}")]
    Protocol(String),
}

/// Gathers pages of a room on the prefill side.
pub trait PageProvider: Send + Sync + 'static {
    /// Pages `first_page .. first_page + count` of `room`, back to back.
    fn pages(
        &self,
        room: u64,
        first_page: u32,
        count: u32,
    ) -> BoxFuture<'static, Result<Vec<u8>, TransferError>>;
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
}

/// A random number fixed for the life of this process.
pub fn process_nonce() -> u64 {
    static NONCE: OnceLock<u64> = OnceLock::new();
    *NONCE.get_or_init(|| {
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        // Distinct across processes started in the same nanosecond too.
        (t.as_nanos() as u64) ^ (u64::from(std::process::id()) << 32) ^ 0x9e37_79b9_7f4a_7c15
    })
}

type Registry = Mutex<HashMap<u64, Weak<dyn PageProvider>>>;

fn registry() -> &'static Registry {
    static R: OnceLock<Registry> = OnceLock::new();
    R.get_or_init(Registry::default)
}

fn lookup(provider: u64) -> Option<Arc<dyn PageProvider>> {
    registry().lock().unwrap_or_else(|p| p.into_inner()).get(&provider).and_then(Weak::upgrade)
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
        registry().lock().unwrap_or_else(|p| p.into_inner()).remove(&self.id);
    }
}

/// This process's TCP page server: one per process, serving every registered provider.
#[derive(Debug)]
pub struct PageServer {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
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
        let listener = TcpListener::bind(SocketAddr::new(ip, 0)).await?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(async move {
            loop {
                match listener.accept().await {
                    Ok((stream, _)) => {
                        tokio::spawn(async move {
                            if let Err(e) = serve(stream).await {
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
        registry().lock().unwrap_or_else(|p| p.into_inner()).insert(id, Arc::downgrade(provider));
        Registration {
            id,
            endpoint: Endpoint { process: process_nonce(), provider: id, tcp: self.addr.to_string() },
        }
    }
}

async fn serve(mut stream: TcpStream) -> std::io::Result<()> {
    stream.set_nodelay(true)?;
    loop {
        let mut head = [0u8; 28];
        match stream.read_exact(&mut head).await {
            Ok(_) => {}
            // The client closed the connection between requests.
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        }
        if &head[..4] != MAGIC {
            return write_answer(&mut stream, 1, b"not a page fetch (bad magic)").await;
        }
        let word = |at: usize| u64::from_le_bytes(head[at..at + 8].try_into().unwrap_or_default());
        let half = |at: usize| u32::from_le_bytes(head[at..at + 4].try_into().unwrap_or_default());
        let (room, provider, first, count) = (word(4), word(12), half(20), half(24));
        let result = match lookup(provider) {
            Some(p) => p.pages(room, first, count).await,
            None => Err(TransferError::UnknownRoom(room)),
        };
        match result {
            Ok(bytes) => write_answer(&mut stream, 0, &bytes).await?,
            Err(e) => {
                let text = serde_json::to_vec(&e).unwrap_or_default();
                write_answer(&mut stream, 1, &text).await?;
            }
        }
    }
}

async fn write_answer(stream: &mut TcpStream, status: u8, body: &[u8]) -> std::io::Result<()> {
    let mut head = [0u8; 9];
    head[0] = status;
    head[1..].copy_from_slice(&(body.len() as u64).to_le_bytes());
    stream.write_all(&head).await?;
    stream.write_all(body).await?;
    stream.flush().await
}

/// Fetches pages `first_page .. first_page + count` of `room` from `endpoint`, in process
/// when `policy` allows and the provider is here, else over TCP; within `timeout`.
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
    let pages = tokio::time::timeout(timeout, fetch_tcp(endpoint, room, first_page, count))
        .await
        .map_err(|_| timed_out())??;
    Ok((pages, TransportKind::Tcp))
}

async fn fetch_tcp(
    endpoint: &Endpoint,
    room: u64,
    first_page: u32,
    count: u32,
) -> Result<Vec<u8>, TransferError> {
    let io = |e: std::io::Error| TransferError::Io { endpoint: endpoint.tcp.clone(), detail: e.to_string() };
    let mut stream = TcpStream::connect(&endpoint.tcp).await.map_err(io)?;
    stream.set_nodelay(true).map_err(io)?;
    let mut head = Vec::with_capacity(28);
    head.extend_from_slice(MAGIC);
    head.extend_from_slice(&room.to_le_bytes());
    head.extend_from_slice(&endpoint.provider.to_le_bytes());
    head.extend_from_slice(&first_page.to_le_bytes());
    head.extend_from_slice(&count.to_le_bytes());
    stream.write_all(&head).await.map_err(io)?;
    let mut answer = [0u8; 9];
    stream.read_exact(&mut answer).await.map_err(io)?;
    let len = u64::from_le_bytes(answer[1..].try_into().unwrap_or_default());
    if len > MAX_FRAME {
        return Err(TransferError::Protocol(format!("an answer of {len} bytes")));
    }
    let mut body = vec![0u8; len as usize];
    stream.read_exact(&mut body).await.map_err(io)?;
    match answer[0] {
        0 => Ok(body),
        1 => Err(serde_json::from_slice(&body)
            .unwrap_or_else(|_| TransferError::Source(String::from_utf8_lossy(&body).into_owned()))),
        s => Err(TransferError::Protocol(format!("status {s}"))),
    }
}

#[cfg(test)]
mod tests;
