//! The fetching side: [`fetch`] for host pages, [`fetch_device`] for pages that stay in GPU
//! memory, each picking its path from the provider's [`Endpoint`] and the caller's policy or
//! route.
//!
//! A staged fetch (NIXL, or a GPU route through the page server) runs its read or copy, and
//! the "done" after it, in a task of its own: should the caller's future be dropped (its
//! timeout), the server still keeps the staging memory until the read is over, never frees it
//! under a read that is still running.

use super::endpoint::{Endpoint, TransportKind, TransportPolicy};
use super::provider;
use super::wire::{self, AnswerHead, MAX_FRAME, Pages, Request};
use crate::device::{DeviceLease, DevicePages, DeviceRoute, DeviceSink};
use crate::error::TransferError;
use crate::nixl::{Node, RemoteStage};
use crate::process::process_nonce;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

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
    let timed_out = || timed_out(endpoint, timeout);
    if policy == TransportPolicy::Auto
        && endpoint.process == process_nonce()
        && let Some(p) = provider::lookup(endpoint.provider)
    {
        let pages = tokio::time::timeout(timeout, p.pages(room, first_page, count))
            .await
            .map_err(|_| timed_out())??;
        return Ok((pages, TransportKind::InProcess));
    }
    let pages = Pages { room, provider: endpoint.provider, first: first_page, count };
    if policy == TransportPolicy::Nixl {
        let pages = tokio::time::timeout(timeout, fetch_nixl(endpoint, pages, timeout))
            .await
            .map_err(|_| timed_out())??;
        return Ok((pages, TransportKind::Nixl));
    }
    let pages =
        tokio::time::timeout(timeout, fetch_tcp(endpoint, pages)).await.map_err(|_| timed_out())??;
    Ok((pages, TransportKind::Tcp))
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
    let deadline = Instant::now() + timeout;
    let pages = Pages { room, provider: endpoint.provider, first: first_page, count };
    let kind = match route {
        DeviceRoute::InProcess => TransportKind::DeviceInProcess,
        DeviceRoute::CudaIpc => TransportKind::CudaIpc,
        DeviceRoute::NixlVram => TransportKind::NixlVram,
    };
    let work = async {
        match route {
            DeviceRoute::InProcess => device_in_process(endpoint, pages, sink, deadline).await,
            _ => device_remote(endpoint, pages, route, sink, timeout, deadline).await,
        }
    };
    let pages = tokio::time::timeout(timeout, work).await.map_err(|_| timed_out(endpoint, timeout))??;
    Ok((pages, kind))
}

/// Frees `room` at `endpoint` (the decode side is done with it), within `timeout`: `true` when
/// the provider held it, `false` when it was gone already (freed by its lease, say).
pub async fn release(endpoint: &Endpoint, room: u64, timeout: Duration) -> Result<bool, TransferError> {
    if endpoint.process == process_nonce()
        && let Some(p) = provider::lookup(endpoint.provider)
    {
        return Ok(p.release(room));
    }
    let request = Request::Release(Pages { room, provider: endpoint.provider, first: 0, count: 0 });
    let (_, body) = tokio::time::timeout(timeout, request_answer(endpoint, &request))
        .await
        .map_err(|_| timed_out(endpoint, timeout))??;
    match body.as_slice() {
        [flag] => Ok(*flag == 1),
        other => Err(TransferError::Protocol(format!("a release answer of {} bytes", other.len()))),
    }
}

/// The in-process GPU route: the provider's lease holds the staging memory itself, dropped once
/// the sink's copy is over.
async fn device_in_process(
    endpoint: &Endpoint,
    pages: Pages,
    sink: Arc<dyn DeviceSink>,
    deadline: Instant,
) -> Result<DevicePages, TransferError> {
    if endpoint.process != process_nonce() {
        return Err(TransferError::Protocol("an in-process GPU fetch from another process".into()));
    }
    let provider = provider::lookup(pages.provider).ok_or(TransferError::UnknownRoom(pages.room))?;
    let lease = provider.device_pages(pages.room, pages.first, pages.count, DeviceRoute::InProcess).await?;
    receive(sink, lease, deadline).await
}

/// A GPU route through the provider's page server: the stage request, the sink's copy, then
/// "done".
async fn device_remote(
    endpoint: &Endpoint,
    pages: Pages,
    route: DeviceRoute,
    sink: Arc<dyn DeviceSink>,
    timeout: Duration,
    deadline: Instant,
) -> Result<DevicePages, TransferError> {
    let request = Request::Device { pages, timeout_ms: timeout_ms(timeout), route };
    let (mut stream, body) = request_answer(endpoint, &request).await?;
    let (stage, len) = wire::decode_device_stage(&body)?;
    // In a task of its own (see the module doc).
    let copy = tokio::spawn(async move {
        let pages = receive(sink, DeviceLease::remote(stage, len), deadline).await;
        // Best effort: if the server is gone, so is the memory it would free.
        let _ = stream.write_all(wire::DONE).await;
        pages
    });
    copy.await.unwrap_or_else(|e| Err(TransferError::Source(format!("receiving GPU pages stopped: {e}"))))
}

/// Runs `sink`'s blocking copy of `lease` on a blocking thread; the lease (in process: the
/// staging memory itself) is dropped once the copy is over.
async fn receive(
    sink: Arc<dyn DeviceSink>,
    lease: DeviceLease,
    deadline: Instant,
) -> Result<DevicePages, TransferError> {
    tokio::task::spawn_blocking(move || sink.receive(&lease, deadline))
        .await
        .unwrap_or_else(|e| Err(TransferError::Source(format!("receiving GPU pages stopped: {e}"))))
}

/// The TCP path: the pages are the answer.
async fn fetch_tcp(endpoint: &Endpoint, pages: Pages) -> Result<Vec<u8>, TransferError> {
    let (_, pages) = request_answer(endpoint, &Request::Host(pages)).await?;
    Ok(pages)
}

/// The NIXL path: the stage request on the side channel, one NIXL READ, then "done".
async fn fetch_nixl(endpoint: &Endpoint, pages: Pages, timeout: Duration) -> Result<Vec<u8>, TransferError> {
    let deadline = Instant::now() + timeout;
    let node = tokio::task::spawn_blocking(Node::process)
        .await
        .unwrap_or_else(|e| Err(TransferError::Nixl(format!("creating the NIXL agent stopped: {e}"))))?;
    let request = Request::Nixl { pages, timeout_ms: timeout_ms(timeout) };
    let (mut stream, body) = request_answer(endpoint, &request).await?;
    let stage = RemoteStage::decode(&body)?;
    // In a task of its own (see the module doc).
    let read = tokio::spawn(async move {
        let pages = tokio::task::spawn_blocking(move || node.read(&stage, deadline))
            .await
            .unwrap_or_else(|e| Err(TransferError::Nixl(format!("the NIXL read stopped: {e}"))));
        // Best effort: if the server is gone, so is the memory it would free.
        let _ = stream.write_all(wire::DONE).await;
        pages
    });
    read.await.unwrap_or_else(|e| Err(TransferError::Nixl(format!("the NIXL read stopped: {e}"))))
}

/// Sends `request` and reads its answer: the body of a success, else the error; with the
/// connection, which a staged fetch's "done" goes back on.
async fn request_answer(
    endpoint: &Endpoint,
    request: &Request,
) -> Result<(TcpStream, Vec<u8>), TransferError> {
    let io = |e: std::io::Error| TransferError::Io { endpoint: endpoint.tcp.clone(), detail: e.to_string() };
    let mut stream = TcpStream::connect(&endpoint.tcp).await.map_err(io)?;
    stream.set_nodelay(true).map_err(io)?;
    super::auth::connect(&mut stream, super::auth::process_key()).await.map_err(|e| match e {
        super::auth::HandshakeError::Io(e) => io(e),
        super::auth::HandshakeError::Refused(why) => {
            TransferError::Unauthenticated(format!("{}: {why}", endpoint.tcp))
        }
    })?;
    stream.write_all(&request.encode()).await.map_err(io)?;
    let mut head = [0u8; AnswerHead::LEN];
    stream.read_exact(&mut head).await.map_err(io)?;
    let AnswerHead { status, len } = AnswerHead::decode(head);
    if len > MAX_FRAME {
        return Err(TransferError::Protocol(format!("an answer of {len} bytes")));
    }
    // The buffer grows as bytes arrive: a length a peer states costs nothing until it sends.
    let mut body = Vec::with_capacity(len.min(wire::INITIAL_READ) as usize);
    let got = (&mut stream).take(len).read_to_end(&mut body).await.map_err(io)?;
    if got as u64 != len {
        return Err(io(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            format!("the answer ended after {got} of {len} bytes"),
        )));
    }
    wire::answer_result(status, body).map(|body| (stream, body))
}

/// How long the server keeps a staged range for a client that never says "done".
fn timeout_ms(timeout: Duration) -> u32 {
    u32::try_from(timeout.as_millis()).unwrap_or(u32::MAX)
}

fn timed_out(endpoint: &Endpoint, timeout: Duration) -> TransferError {
    TransferError::Timeout { endpoint: endpoint.tcp.clone(), after_ms: timeout.as_millis() as u64 }
}
