use super::*;

async fn handshake(
    server_key: PageKey,
    client_key: PageKey,
) -> (std::io::Result<bool>, Result<(), HandshakeError>) {
    let (mut c, mut s) = tokio::io::duplex(256);
    let server = tokio::spawn(async move { accept(&mut s, &server_key).await });
    let client = connect(&mut c, &client_key).await;
    (server.await.expect("server task"), client)
}

#[tokio::test]
async fn peers_with_the_key_pass_and_others_are_refused_both_ways() {
    let k = PageKey::from_secret("cluster secret");
    let (s, c) = handshake(k.clone(), k.clone()).await;
    assert!(s.expect("io"));
    assert!(c.is_ok());
    // A client of another cluster: the server refuses and says why.
    let (s, c) = handshake(k.clone(), PageKey::from_secret("another")).await;
    assert!(!s.expect("io"));
    match c {
        Err(HandshakeError::Refused(why)) => {
            assert!(why.contains("does not hold this cluster's page key"), "{why}")
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_peer_that_skips_the_handshake_is_refused_or_timed_out() {
    let key = PageKey::random();
    // A fetch frame sent straight away (28 bytes, then nothing): no answer to the hello in time.
    let (mut c, mut s) = tokio::io::duplex(256);
    c.write_all(b"XKV1\xff\xff\xff\xff\xff\xff\xff\xff\x01\0\0\0\0\0\0\0\0\0\0\0\xff\xff\xff\xff")
        .await
        .expect("write");
    let e = accept(&mut s, &key).await.expect_err("timed out");
    assert_eq!(e.kind(), std::io::ErrorKind::TimedOut);
    // 48 bytes of garbage: a proof that does not match.
    let (mut c, mut s) = tokio::io::duplex(256);
    c.write_all(&[0x41; 48]).await.expect("write");
    assert!(!accept(&mut s, &key).await.expect("io"));
}

#[tokio::test]
async fn a_server_that_is_not_a_page_server_is_named() {
    let (mut c, mut s) = tokio::io::duplex(256);
    s.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n").await.expect("write");
    match connect(&mut c, &PageKey::random()).await {
        Err(HandshakeError::Refused(why)) => assert!(why.contains("not a page server"), "{why}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn keys_travel_as_hex_and_depend_on_the_secret() {
    let k = PageKey::from_secret("s1");
    assert_eq!(PageKey::from_hex(&k.to_hex()).expect("hex"), k);
    assert_ne!(PageKey::from_secret("s2"), k);
    assert!(PageKey::from_hex("abc").is_err());
    assert!(PageKey::from_hex(&"zz".repeat(32)).is_err());
    assert_eq!(format!("{k:?}"), "PageKey(..)", "the key is never printed");
}

/// A peer that sends `bytes`, then ends, and takes whatever it is sent.
type Scripted<'a> = tokio::io::Join<&'a [u8], tokio::io::Sink>;

/// Runs `side` against a peer that sends `bytes` and then ends.
fn against_bytes<T>(bytes: Vec<u8>, side: impl AsyncFnOnce(&mut Scripted<'_>) -> T) -> T {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().expect("runtime");
    runtime.block_on(async move {
        let mut peer = tokio::io::join(&bytes[..], tokio::io::sink());
        side(&mut peer).await
    })
}

proptest::proptest! {
    /// Whatever a client sends, the server's handshake ends (refused, or an I/O error) without
    /// a panic and without letting it in.
    #[test]
    fn any_client_bytes_are_refused(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..128)) {
        let key = PageKey::from_secret("cluster secret");
        let accepted = against_bytes(bytes, async |s| accept(s, &key).await);
        proptest::prop_assert!(!matches!(accepted, Ok(true)));
    }

    /// Whatever a server sends (a hello, then an answer stating any length), the client's
    /// handshake ends without a panic and without trusting it.
    #[test]
    fn any_server_bytes_are_refused(
        tail in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..256),
        hello in proptest::prelude::any::<bool>(),
    ) {
        let mut bytes = if hello { HELLO.to_vec() } else { Vec::new() };
        bytes.extend_from_slice(&tail);
        let key = PageKey::from_secret("cluster secret");
        let connected = against_bytes(bytes, async |s| connect(s, &key).await);
        proptest::prop_assert!(connected.is_err());
    }
}
