//! Addresses, secrets and names; joining a node: late peers, silent ones, and why a join fails.

use super::*;
use std::time::Instant;

#[test]
fn wildcard_hosts_are_refused() {
    for host in ["0.0.0.0", "::", "[::]"] {
        let e = listen_ip(host).expect_err("wildcard");
        assert_eq!(e.code(), "invalid_cluster_config");
        assert!(e.to_string().contains("no address other nodes can reach"), "{e}");
    }
    assert!(listen_ip("").is_err());
    assert_eq!(listen_ip("127.0.0.1"), Ok(IpAddr::from([127, 0, 0, 1])));
    assert_eq!(listen_ip("[::1]"), Ok("::1".parse().expect("ip")));
    assert_eq!(listen_ip("localhost").map(|ip| ip.is_loopback()), Ok(true));
}

#[test]
fn a_short_or_empty_secret_is_refused() {
    assert!(check_secret("").is_err());
    assert!(check_secret("s3cret").is_err(), "6 characters");
    assert!(check_secret("sécrets!").is_ok(), "8 characters, counted as characters");
    assert!(check_secret("s3cret-long-enough").is_ok());
}

#[test]
fn namespaces_follow_the_secret() {
    assert_eq!(Namespace::from_secret("a"), Namespace::from_secret("a"));
    assert_ne!(Namespace::from_secret("a"), Namespace::from_secret("b"));
    assert_ne!(Namespace::local(), Namespace::local());
    let ns = Namespace::from_secret("a");
    assert!(ns.owns(&ns.replica_name("m-0")));
    assert!(ns.owns(&ns.supervisor_name()));
    assert!(!Namespace::from_secret("b").owns(&ns.router_name("m")));
    assert!(!ns.owns("xinf-other/replica/m-0"));
}

#[test]
fn worker_ids_are_checked() {
    for good in ["gpu-box-1", "10.0.0.2:4000", "[::1]:4000", "rack_3.node-7"] {
        assert_eq!(check_worker_id(good).ok(), Some(good));
    }
    for bad in ["", "a b", "a/b", "ü", &"x".repeat(129)] {
        let e = check_worker_id(bad).expect_err(bad);
        assert!(matches!(&e, ActorError::InvalidConfig { field, .. } if field == "worker_id"), "{e}");
    }
}

/// A node of the test's own, listening on a free loopback port.
async fn test_node(name: &str, secret: &str) -> (ActorRef<NodeServerMessage>, u16) {
    let ip = IpAddr::from([127, 0, 0, 1]);
    let port = free_port(ip).expect("port");
    (start_node(name, ip, port, secret).await.expect("node"), port)
}

#[tokio::test]
async fn a_supervisor_that_comes_up_late_still_gets_its_whole_handshake() {
    let (server, server_port) = test_node("late-supervisor", "late-secret-1").await;
    let (client, _) = test_node("late-worker", "late-secret-1").await;
    // Nothing listens at `addr` for the first 800 ms of the join's second; then a relay takes
    // the connection and holds its bytes 400 ms before passing them on: the handshake ends
    // after the first second, within the second one the handshake has of its own.
    let ip = IpAddr::from([127, 0, 0, 1]);
    let port = free_port(ip).expect("port");
    let relay = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(800)).await;
        let listener = tokio::net::TcpListener::bind((ip, port)).await.expect("bind");
        let (mut inbound, _) = listener.accept().await.expect("accept");
        tokio::time::sleep(Duration::from_millis(400)).await;
        let mut outbound = tokio::net::TcpStream::connect((ip, server_port)).await.expect("connect");
        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
    });
    let joined = connect(&client, &format!("127.0.0.1:{port}"), Duration::from_secs(1)).await;
    assert!(joined.is_ok(), "{joined:?}");
    assert!(has_outbound_session(&client).await);
    assert!(!has_outbound_session(&server).await, "the supervisor's session is an inbound one");
    client.stop(None);
    server.stop(None);
    relay.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_that_gives_up_closes_its_connection() {
    let (client, _) = test_node("silent-peer-worker", "silent-secret-1").await;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    let e = connect(&client, &addr, Duration::from_millis(300)).await.expect_err("a silent peer");
    assert!(e.to_string().contains("the handshake did not finish within 300 ms"), "{e}");
    assert!(e.to_string().contains("--cluster-port"), "{e}");
    // The connection the join opened is closed: it cannot authenticate later, beside the next.
    let (mut accepted, _) = listener.accept().expect("accept");
    accepted.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
    let mut buf = [0u8; 4096];
    loop {
        match std::io::Read::read(&mut accepted, &mut buf) {
            Ok(0) => break,
            Ok(_) => continue,
            Err(e) => panic!("the joining node kept the connection open: {e}"),
        }
    }
    assert!(!has_outbound_session(&client).await);
    client.stop(None);
}

#[tokio::test]
async fn join_failures_name_their_cause() {
    let (client, _) = test_node("causes-worker", "causes-secret-1").await;
    // Nothing listening.
    let port = free_port(IpAddr::from([127, 0, 0, 1])).expect("port");
    let e =
        connect(&client, &format!("127.0.0.1:{port}"), Duration::from_millis(300)).await.expect_err("nobody");
    assert!(e.to_string().contains("nothing accepted a connection there within 300 ms"), "{e}");
    // A peer that hangs up at once (not a cluster port).
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    let hang_up = tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            drop(stream);
        }
    });
    let e = connect(&client, &addr, Duration::from_secs(2)).await.expect_err("hung up");
    assert!(e.to_string().contains("closed the connection before the handshake's challenge"), "{e}");
    hang_up.abort();
    // A supervisor of another secret.
    let (other, other_port) = test_node("causes-supervisor", "another-secret-2").await;
    let e = connect(&client, &format!("127.0.0.1:{other_port}"), Duration::from_secs(2))
        .await
        .expect_err("secret");
    assert!(e.to_string().contains("the cluster secrets differ"), "{e}");
    other.stop(None);
    client.stop(None);
}

/// Whether the peer closed `stream` within 5 s (end of stream, or reset).
async fn closed_by_peer(stream: &mut tokio::net::TcpStream) -> bool {
    use tokio::io::AsyncReadExt;
    let mut buf = [0u8; 4096];
    let read = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => continue,
            }
        }
    });
    read.await.is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_that_do_not_authenticate_in_time_are_closed_and_nodes_that_do_stay() {
    use tokio::io::AsyncWriteExt;
    let ip = IpAddr::from([127, 0, 0, 1]);
    let port = free_port(ip).expect("port");
    let handshake = Duration::from_millis(500);
    let server = start_guarded_node("guarded", ip, port, "guard-secret-1", handshake).await.expect("node");
    // One silent connection; one that sends a frame's length and half of it.
    let mut silent = tokio::net::TcpStream::connect((ip, port)).await.expect("connect");
    let mut partial = tokio::net::TcpStream::connect((ip, port)).await.expect("connect");
    partial.write_all(&[0, 0, 0, 0, 0, 0, 1, 0, 7, 7, 7]).await.expect("write");
    // A node with the secret joins and stays past the deadline.
    let (client, _) = test_node("guarded-worker", "guard-secret-1").await;
    connect(&client, &format!("127.0.0.1:{port}"), Duration::from_secs(2)).await.expect("join");
    let opened = Instant::now();
    assert!(closed_by_peer(&mut silent).await, "the silent connection is closed");
    assert!(closed_by_peer(&mut partial).await, "the half-sent frame's connection is closed");
    assert!(opened.elapsed() < Duration::from_secs(3), "closed by the deadline: {:?}", opened.elapsed());
    tokio::time::sleep(handshake).await;
    assert!(has_outbound_session(&client).await, "the authenticated node is still connected");
    client.stop(None);
    server.stop(None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_host_cannot_hold_more_than_its_share_of_handshakes() {
    let ip = IpAddr::from([127, 0, 0, 1]);
    let port = free_port(ip).expect("port");
    // A deadline far off: what closes connections here is the cap.
    let server = start_guarded_node("capped", ip, port, "guard-secret-2", Duration::from_secs(60))
        .await
        .expect("node");
    let mut held = Vec::new();
    for _ in 0..24 {
        held.push(tokio::net::TcpStream::connect((ip, port)).await.expect("connect"));
    }
    let mut closed = 0;
    for stream in &mut held {
        let mut buf = [0u8; 1];
        let read =
            tokio::time::timeout(Duration::from_millis(300), tokio::io::AsyncReadExt::read(stream, &mut buf));
        if matches!(read.await, Ok(Ok(0) | Err(_))) {
            closed += 1;
        }
    }
    assert_eq!(closed, 24 - 16, "16 handshakes from one host are held, the rest closed at once");
    server.stop(None);
}
