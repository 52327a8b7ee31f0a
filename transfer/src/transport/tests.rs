use super::fault::Fault;
use super::server::ServeOptions;
use super::{
    Endpoint, PageProvider, PageServer, TransferError, TransportKind, TransportPolicy, fetch, process_nonce,
};
use futures::FutureExt;
use futures::future::BoxFuture;
use std::sync::Arc;
use std::time::Duration;

mod device;
mod nixl;

/// Serves room 7 only: page `i` is 1000 bytes of `i as u8`.
struct Pattern;

impl PageProvider for Pattern {
    fn pages(
        &self,
        room: u64,
        first_page: u32,
        count: u32,
    ) -> BoxFuture<'static, Result<Vec<u8>, TransferError>> {
        let r = if room == 7 {
            Ok((first_page..first_page + count).flat_map(|i| vec![i as u8; 1000]).collect())
        } else {
            Err(TransferError::UnknownRoom(room))
        };
        futures::future::ready(r).boxed()
    }
}

/// Never answers in time.
struct Slow;

impl PageProvider for Slow {
    fn pages(&self, _: u64, _: u32, _: u32) -> BoxFuture<'static, Result<Vec<u8>, TransferError>> {
        async {
            tokio::time::sleep(Duration::from_secs(30)).await;
            Ok(Vec::new())
        }
        .boxed()
    }
}

const T: Duration = Duration::from_secs(5);

/// Holds rooms 1 and 2 until they are released.
#[derive(Default)]
struct Held(std::sync::Mutex<Vec<u64>>);

impl PageProvider for Held {
    fn pages(&self, room: u64, _: u32, _: u32) -> BoxFuture<'static, Result<Vec<u8>, TransferError>> {
        futures::future::ready(Err(TransferError::UnknownRoom(room))).boxed()
    }

    fn release(&self, room: u64) -> bool {
        let mut rooms = self.0.lock().expect("rooms");
        let before = rooms.len();
        rooms.retain(|&r| r != room);
        rooms.len() < before
    }
}

#[tokio::test]
async fn a_release_frees_the_room_once_in_process_and_over_tcp() {
    let server = PageServer::start("127.0.0.1".parse().expect("ip")).await.expect("server");
    let held = Arc::new(Held(std::sync::Mutex::new(vec![1, 2])));
    let provider: Arc<dyn PageProvider> = held.clone();
    let reg = server.register(&provider);
    assert!(super::release(reg.endpoint(), 1, T).await.expect("in process"));
    assert!(!super::release(reg.endpoint(), 1, T).await.expect("again"));
    let remote = Endpoint { process: process_nonce() ^ 1, ..reg.endpoint().clone() };
    assert!(super::release(&remote, 2, T).await.expect("over tcp"));
    assert!(!super::release(&remote, 2, T).await.expect("again over tcp"));
    assert!(held.0.lock().expect("rooms").is_empty());
    // A provider that is gone releases nothing, and says so.
    let gone = Endpoint { provider: 9999, ..remote };
    assert!(!super::release(&gone, 3, T).await.expect("unknown provider"));
}

#[tokio::test]
async fn both_paths_move_the_same_bytes() {
    let server = PageServer::start("127.0.0.1".parse().expect("ip")).await.expect("server");
    let provider: Arc<dyn PageProvider> = Arc::new(Pattern);
    let reg = server.register(&provider);
    let want: Vec<u8> = (2..5u8).flat_map(|i| vec![i; 1000]).collect();
    let (local, kind) = fetch(reg.endpoint(), 7, 2, 3, TransportPolicy::Auto, T).await.expect("in process");
    assert_eq!(kind, TransportKind::InProcess);
    assert_eq!(local, want);
    let (tcp, kind) = fetch(reg.endpoint(), 7, 2, 3, TransportPolicy::Tcp, T).await.expect("tcp");
    assert_eq!(kind, TransportKind::Tcp);
    assert_eq!(tcp, want);
    // An endpoint of another process goes over TCP even under Auto.
    let other = Endpoint { process: process_nonce() ^ 1, ..reg.endpoint().clone() };
    let (_, kind) = fetch(&other, 7, 0, 1, TransportPolicy::Auto, T).await.expect("tcp");
    assert_eq!(kind, TransportKind::Tcp);
}

#[tokio::test]
async fn failures_are_typed() {
    let server = PageServer::start("127.0.0.1".parse().expect("ip")).await.expect("server");
    let provider: Arc<dyn PageProvider> = Arc::new(Pattern);
    let reg = server.register(&provider);
    for policy in [TransportPolicy::Auto, TransportPolicy::Tcp] {
        let e = fetch(reg.endpoint(), 8, 0, 1, policy, T).await.expect_err("unknown room");
        assert_eq!(e, TransferError::UnknownRoom(8), "{policy:?}");
    }
    // A provider that went away: its rooms are gone.
    let endpoint = reg.endpoint().clone();
    drop(reg);
    let e = fetch(&endpoint, 7, 0, 1, TransportPolicy::Tcp, T).await.expect_err("unregistered");
    assert_eq!(e, TransferError::UnknownRoom(7));
    // A slow provider hits the deadline.
    let slow: Arc<dyn PageProvider> = Arc::new(Slow);
    let reg = server.register(&slow);
    let e = fetch(reg.endpoint(), 1, 0, 1, TransportPolicy::Tcp, Duration::from_millis(200))
        .await
        .expect_err("slow");
    assert!(matches!(e, TransferError::Timeout { .. }), "{e}");
    // A server that is gone: the connection fails.
    drop(server);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let e = fetch(&endpoint, 7, 0, 1, TransportPolicy::Tcp, T).await.expect_err("no server");
    assert!(matches!(e, TransferError::Io { .. }), "{e}");
}

#[tokio::test]
async fn a_cut_connection_fails_fast_with_an_io_error() {
    let options = ServeOptions { fault: Fault::CutAfter(1000), ..ServeOptions::default() };
    let server = PageServer::start_with("127.0.0.1".parse().expect("ip"), options).await.expect("server");
    let provider: Arc<dyn PageProvider> = Arc::new(Pattern);
    let reg = server.register(&provider);
    let started = std::time::Instant::now();
    let e =
        fetch(reg.endpoint(), 7, 0, 5, TransportPolicy::Tcp, Duration::from_secs(30)).await.expect_err("cut");
    assert!(matches!(e, TransferError::Io { .. }), "{e}");
    assert!(started.elapsed() < Duration::from_secs(5), "took {:?}", started.elapsed());
    // Errors are not cut: only the page answers.
    let e = fetch(reg.endpoint(), 8, 0, 1, TransportPolicy::Tcp, T).await.expect_err("unknown room");
    assert_eq!(e, TransferError::UnknownRoom(8));
}

/// A peer that states a huge answer and sends a little: the fetch fails naming the shortfall,
/// without reserving what the peer stated.
#[tokio::test]
async fn an_answer_longer_than_what_arrives_fails_without_reserving_its_length() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.expect("accept");
        assert!(super::auth::accept(&mut s, super::auth::process_key()).await.expect("handshake"));
        let mut request = [0u8; 28];
        s.read_exact(&mut request).await.expect("request");
        let mut head = vec![0u8];
        head.extend_from_slice(&(60u64 << 30).to_le_bytes());
        s.write_all(&head).await.expect("head");
        s.write_all(&[7u8; 10]).await.expect("body");
    });
    let endpoint = Endpoint { process: 0, provider: 1, tcp: addr.to_string() };
    let e = fetch(&endpoint, 3, 0, 1, TransportPolicy::Tcp, T).await.expect_err("short");
    assert!(e.to_string().contains("ended after 10 of 64424509440 bytes"), "{e}");
}

/// Past its connection cap the page server closes new connections after their handshake; once
/// a held connection goes, fetches are served again.
#[tokio::test]
async fn connections_past_the_cap_are_closed_and_the_server_keeps_serving() {
    use tokio::io::AsyncReadExt;
    let options = ServeOptions { max_connections: Some(2), ..ServeOptions::default() };
    let server = PageServer::start_with("127.0.0.1".parse().expect("ip"), options).await.expect("server");
    let provider: Arc<dyn PageProvider> = Arc::new(Pattern);
    let reg = server.register(&provider);
    // Two peers that hold the key, connect and then say nothing each hold a slot.
    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(authenticated(server.addr()).await);
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut third = authenticated(server.addr()).await;
    let mut got = Vec::new();
    let n = tokio::time::timeout(T, third.read_to_end(&mut got)).await.expect("closed in time");
    assert!(n.is_err() || got.is_empty(), "a connection past the cap was served: {got:?}");
    let e = fetch(reg.endpoint(), 7, 0, 1, TransportPolicy::Tcp, T).await.expect_err("at the cap");
    assert!(matches!(e, TransferError::Io { .. }), "{e}");
    held.pop();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (pages, _) = fetch(reg.endpoint(), 7, 0, 2, TransportPolicy::Tcp, T).await.expect("served again");
    assert_eq!(pages.len(), 2000);
}

/// Connections that open and never answer the hello take no slot and cannot keep a client that
/// holds the key out: past the handshakes' cap each new one ends the oldest.
#[tokio::test]
async fn silent_connections_cannot_keep_clients_out() {
    use tokio::io::AsyncReadExt;
    let options =
        ServeOptions { max_connections: Some(2), max_handshakes: Some(4), ..ServeOptions::default() };
    let server = PageServer::start_with("127.0.0.1".parse().expect("ip"), options).await.expect("server");
    let provider: Arc<dyn PageProvider> = Arc::new(Pattern);
    let reg = server.register(&provider);
    let mut silent = Vec::new();
    for _ in 0..40 {
        let mut s = tokio::net::TcpStream::connect(server.addr()).await.expect("connect");
        let mut hello = [0u8; 20]; // "XKA1" and the server's nonce
        tokio::time::timeout(T, s.read_exact(&mut hello)).await.expect("hello in time").expect("hello");
        silent.push(s);
    }
    // The oldest were closed (long before the handshake's own deadline), the newest wait.
    let mut rest = Vec::new();
    let n =
        tokio::time::timeout(T, silent[0].read_to_end(&mut rest)).await.expect("the oldest closed in time");
    assert!(n.is_err() || rest.is_empty(), "{rest:?}");
    for _ in 0..3 {
        let (pages, _) = fetch(reg.endpoint(), 7, 0, 2, TransportPolicy::Tcp, T).await.expect("served");
        assert_eq!(pages.len(), 2000);
    }
}

/// A connection to `addr` that completed the page plane's handshake with this process's key.
async fn authenticated(addr: std::net::SocketAddr) -> tokio::net::TcpStream {
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let key = super::auth::process_key();
    tokio::time::timeout(T, super::auth::connect(&mut s, key)).await.expect("in time").expect("handshake");
    s
}
