//! This process's TCP page server: one per process, serving every provider registered with it
//! on a data port of its own, so that bulk bytes never travel on the actors' control channel.
//!
//! Each connection is served by a task of its own, one request after the other (see
//! [`super::wire`] for the frames). A host fetch is answered with the pages; a NIXL or GPU
//! fetch with where they are staged, and the staging memory is then held until the client says
//! that its read is over, or its deadline passes.

use super::admission::{Handshakes, Refusals, Slots, Ticket};
use super::fault::Fault;
use super::provider::{self, PageProvider, Registration};
use super::wire::{self, AnswerHead, BadRequest, FAILED, OK, Pages, Request};
use crate::device::DeviceRoute;
use crate::error::TransferError;
use crate::nixl::{Node, Staged};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

/// An address no agent registers, for the `nixl-error` fault.
const UNREGISTERED_ADDR: u64 = 0x1000;

/// This process's TCP page server: one per process, serving every registered provider.
#[derive(Debug)]
pub struct PageServer {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

/// How one page server serves: its fault, and the NIXL agent staging its pages (the process's
/// own unless tests give one, to have two agents in one process).
#[derive(Debug, Clone, Default)]
pub(crate) struct ServeOptions {
    pub(crate) fault: Fault,
    pub(crate) nixl: Option<Arc<Node>>,
    /// Connections served at once, past their handshake; `None`: [`MAX_CONNECTIONS`].
    pub(crate) max_connections: Option<usize>,
    /// Handshakes under way at once; `None`: [`MAX_HANDSHAKES`].
    pub(crate) max_handshakes: Option<usize>,
}

/// Connections one page server serves at once, past their handshake. Each holds a task and a
/// socket until its peer closes it or stays idle past [`wire::IDLE`]: without a cap, peers that
/// open connections and wait could take every file descriptor of the process. A fetch opens one
/// connection for its request, so this bounds the fetches served at once, far above what
/// handoffs need.
const MAX_CONNECTIONS: usize = 1024;

/// Connections whose handshake is under way at once (see [`super::admission`]): a peer holding
/// the key finishes its handshake in a round trip, so this many is room for a burst of fetches.
const MAX_HANDSHAKES: usize = 64;

impl Drop for PageServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl PageServer {
    /// Listens on `ip` (a free port) and serves fetches for providers registered in this
    /// process. Must be called inside a tokio runtime.
    pub async fn start(ip: IpAddr) -> std::io::Result<Self> {
        Self::start_with(ip, ServeOptions { fault: Fault::from_env(), ..ServeOptions::default() }).await
    }

    /// [`start`](Self::start) with explicit options instead of the environment's.
    pub(crate) async fn start_with(ip: IpAddr, options: ServeOptions) -> std::io::Result<Self> {
        let listener = TcpListener::bind(SocketAddr::new(ip, 0)).await?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(accept(listener, options));
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
        provider::register(provider, self.addr)
    }
}

/// Longest a staged range is kept for a client that never says it is done.
const MAX_HOLD: Duration = Duration::from_secs(600);

/// Accepts connections for as long as the server lives, each served by a task of its own: its
/// handshake among the pending ones, then, holding the key, in one of the slots. Past the slots'
/// cap a connection is closed after its handshake (its fetch fails and may retry).
async fn accept(listener: TcpListener, options: ServeOptions) {
    let handshakes = Handshakes::new(options.max_handshakes.unwrap_or(MAX_HANDSHAKES));
    let slots = Slots::new(options.max_connections.unwrap_or(MAX_CONNECTIONS));
    let refusals = Refusals::new();
    // Warned once each time handshakes start being ended, not once per connection of a flood.
    let mut crowded = false;
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                let (options, slots, refusals) = (options.clone(), slots.clone(), refusals.clone());
                let ended = handshakes.spawn(move |ticket| async move {
                    if let Err(e) = serve(stream, ticket, (&slots, &refusals), &options).await {
                        tracing::debug!(error = %e, "a page fetch connection failed");
                    }
                });
                if ended && !std::mem::replace(&mut crowded, true) {
                    tracing::warn!(%peer, "more connections await the page server's handshake than it keeps; the oldest are closed");
                }
                crowded &= ended;
            }
            Err(e) => {
                tracing::warn!(error = %e, "the page server cannot accept connections");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Serves the requests of one connection until the client closes it, once its peer proved it
/// holds the key and a slot was free.
async fn serve(
    mut stream: TcpStream,
    ticket: Ticket,
    (slots, refusals): (&Slots, &Refusals),
    options: &ServeOptions,
) -> std::io::Result<()> {
    stream.set_nodelay(true)?;
    let authenticated = super::auth::accept(&mut stream, super::auth::process_key()).await?;
    if !ticket.done() {
        return Ok(()); // ended for a newer connection
    }
    let peer = stream.peer_addr().ok();
    if !authenticated {
        refusals.note(peer);
        return Ok(());
    }
    let Some(_slot) = slots.take(peer) else {
        return Ok(());
    };
    while let Some(request) = Request::read(&mut stream).await? {
        let received = Instant::now();
        // A client's deadline, but never longer than MAX_HOLD: staging a peer never says it is
        // done with is freed in time.
        let keep_until =
            |timeout_ms: u32| received + Duration::from_millis(u64::from(timeout_ms)).min(MAX_HOLD);
        match request {
            Ok(Request::Host(pages)) => serve_host(&mut stream, options, pages).await?,
            Ok(Request::Release(pages)) => {
                let released = provider::lookup(pages.provider).is_some_and(|p| p.release(pages.room));
                write_answer(&mut stream, OK, &[u8::from(released)], Fault::None).await?;
            }
            Ok(Request::Nixl { pages, timeout_ms }) => {
                serve_nixl(&mut stream, options, pages, keep_until(timeout_ms)).await?;
            }
            Ok(Request::Device { pages, timeout_ms, route }) => {
                serve_device(&mut stream, options, pages, route, keep_until(timeout_ms)).await?;
            }
            // Where the next frame would start is unknown: answer, then close.
            Err(e @ BadRequest::Magic(_)) => {
                return write_answer(&mut stream, FAILED, e.to_string().as_bytes(), Fault::None).await;
            }
            Err(e) => write_error(&mut stream, &TransferError::Protocol(e.to_string())).await?,
        }
    }
    Ok(())
}

/// The pages a request names, from their provider.
async fn provider_pages(pages: Pages) -> Result<Vec<u8>, TransferError> {
    match provider::lookup(pages.provider) {
        Some(p) => p.pages(pages.room, pages.first, pages.count).await,
        None => Err(TransferError::UnknownRoom(pages.room)),
    }
}

/// `XKV1`: the pages in the answer.
async fn serve_host(stream: &mut TcpStream, options: &ServeOptions, pages: Pages) -> std::io::Result<()> {
    match provider_pages(pages).await {
        Ok(bytes) => write_answer(stream, OK, &bytes, options.fault).await,
        Err(e) => write_error(stream, &e).await,
    }
}

/// `XKN1`: the pages staged with the NIXL agent, held until the client's read is over.
async fn serve_nixl(
    stream: &mut TcpStream,
    options: &ServeOptions,
    pages: Pages,
    keep_until: Instant,
) -> std::io::Result<()> {
    let staged = match provider_pages(pages).await {
        Ok(bytes) => stage(bytes, options.nixl.clone()).await,
        Err(e) => Err(e),
    };
    let staged = match staged {
        Ok(staged) => staged,
        Err(e) => return write_error(stream, &e).await,
    };
    let mut remote = staged.remote().clone();
    if options.fault == Fault::NixlError {
        remote.addr = UNREGISTERED_ADDR;
    }
    write_answer(stream, OK, &remote.encode(), options.fault).await?;
    hold_until_done(stream, staged, keep_until).await
}

/// `XKG1`: the pages staged in GPU memory by their provider, held until the client's copy is
/// over.
async fn serve_device(
    stream: &mut TcpStream,
    options: &ServeOptions,
    pages: Pages,
    route: DeviceRoute,
    keep_until: Instant,
) -> std::io::Result<()> {
    let lease = match provider::lookup(pages.provider) {
        Some(p) => p.device_pages(pages.room, pages.first, pages.count, route).await,
        None => Err(TransferError::UnknownRoom(pages.room)),
    };
    let lease = match lease {
        Ok(lease) => lease,
        Err(e) => return write_error(stream, &e).await,
    };
    let answer = wire::device_stage_body(lease.stage(), lease.len());
    write_answer(stream, OK, &answer, options.fault).await?;
    hold_until_done(stream, lease, keep_until).await
}

/// Keeps `staged` (memory a peer is reading) until the peer's read is over: its "done", or its
/// deadline `keep_until` when the connection drops first (its read may still be running).
async fn hold_until_done<T: Send + 'static>(
    stream: &mut TcpStream,
    staged: T,
    keep_until: Instant,
) -> std::io::Result<()> {
    let mut done = [0u8; 4];
    match tokio::time::timeout_at(keep_until, stream.read_exact(&mut done)).await {
        Ok(Ok(_)) if &done == wire::DONE => {
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
fn linger<T: Send + 'static>(staged: T, until: Instant) {
    tokio::spawn(async move {
        tokio::time::sleep_until(until).await;
        drop(staged);
    });
}

async fn write_error(stream: &mut TcpStream, e: &TransferError) -> std::io::Result<()> {
    write_answer(stream, FAILED, &wire::error_body(e), Fault::None).await
}

/// Writes one answer; a successful one is cut short under [`Fault::CutAfter`].
async fn write_answer(stream: &mut TcpStream, status: u8, body: &[u8], fault: Fault) -> std::io::Result<()> {
    let head = AnswerHead { status, len: body.len() as u64 }.encode();
    if let (OK, Fault::CutAfter(n)) = (status, fault) {
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
