//! Request bodies the server refuses: too large (413), or stalled mid-way (408).

use super::{ApiConfig, Server, assert_error, chat, shared};
use crate::util::{self, http};
use serde_json::json;
use std::io::Read;
use std::time::Duration;

#[test]
fn oversize_bodies_get_413() {
    let s = shared();
    let big = "x".repeat(2 << 20);
    let body = chat(json!({"messages": [{"role": "user", "content": big}]})).to_string();
    let res = http::request(s.addr(), "POST", "/v1/chat/completions", &[], body.as_bytes());
    assert_error(&res, 413, None, "1048576");
    assert_eq!(res.json()["error"]["code"], "payload_too_large");
    let res = http::post(s.addr(), "/v1/chat/completions", &chat(json!({"max_tokens": 2})));
    assert_eq!(res.status, 200, "{}", res.text());
}

/// A body that stops arriving gets 408 once `body_idle` passes without a byte, and the
/// connection is let go: a client cannot hold it (and its descriptors) by stalling mid-body.
#[test]
fn a_body_that_stalls_gets_408() {
    let s = Server::start(
        util::shared_smollm2(),
        ApiConfig { body_idle: Duration::from_secs(1), ..ApiConfig::default() },
    );
    // The head declares 100 bytes of body; 9 follow, then nothing.
    let mut stream = std::net::TcpStream::connect(s.addr()).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(30))).expect("read timeout");
    let head = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
                Content-Length: 100\r\n\r\n{\"model\":";
    std::io::Write::write_all(&mut stream, head.as_bytes()).expect("write");
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).expect("the server answers and closes");
    let res = http::parse(&raw);
    assert_error(&res, 408, None, "1 s");
    assert_eq!(res.json()["error"]["code"], "request_timeout");
    let res = http::post(s.addr(), "/v1/chat/completions", &chat(json!({"max_tokens": 2})));
    assert_eq!(res.status, 200, "{}", res.text());
}
