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
