//! Garbage on every port a cluster listens on — the REST port, the supervisor's cluster port,
//! the worker's node port and the worker's page servers: random bytes, frames that state huge
//! lengths, half frames left hanging and a crowd of idle connections. Nothing crashes, the
//! worker stays in the cluster, and the P/D model keeps answering the same greedy text.

use super::{SECRET, supervisor, worker_with_env};
use crate::util::http;
use serde_json::json;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// The addresses after `addr=` in lines that mention `what`, colour codes aside.
fn logged_addrs(log: &str, what: &str) -> Vec<SocketAddr> {
    let plain: String =
        log.split('\x1b').map(|part| part.split_once('m').map_or(part, |(_, rest)| rest)).collect();
    plain
        .lines()
        .filter(|l| l.contains(what))
        .filter_map(|l| l.split("addr=").nth(1)?.split_whitespace().next()?.parse().ok())
        .collect()
}

/// Byte strings no server expects: noise, frames stating huge lengths, half an HTTP request.
fn payloads() -> Vec<Vec<u8>> {
    let mut noise = Vec::with_capacity(65_536);
    let mut x: u32 = 0x2545_f491;
    for _ in 0..65_536 {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        noise.push((x >> 24) as u8);
    }
    let mut xkv = b"XKV1".to_vec();
    xkv.extend_from_slice(&[0xff; 24]);
    vec![
        vec![0],
        noise[..7].to_vec(),
        noise.clone(),
        vec![0xff; 65_536],
        u64::MAX.to_be_bytes().to_vec(),
        (16u64 << 20).to_be_bytes().iter().chain(&[0u8; 100]).copied().collect(),
        xkv,
        b"XKA1".iter().chain(&[0u8; 40]).copied().collect(),
        b"GET / HTTP/1.1\r\nHost: x\r\nX-Long: ".iter().chain(&[b'a'; 20_000]).copied().collect(),
        b"POST /v1/completions HTTP/1.1\r\nContent-Length: 99999999999\r\n\r\n{".to_vec(),
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03".to_vec(),
    ]
}

/// Sends `bytes` to `addr` and reads whatever comes back for a moment; a refused or reset
/// connection is as good as any answer.
fn throw(addr: SocketAddr, bytes: &[u8]) {
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_secs(5)) else { return };
    let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
    let _ = s.set_write_timeout(Some(Duration::from_secs(5)));
    let _ = s.write_all(bytes);
    let _ = s.read(&mut [0u8; 4096]);
}

/// The greedy answer of the P/D model.
pub(super) fn answer(addr: SocketAddr) -> String {
    let body =
        json!({"model": "pd", "prompt": "The capital of France is", "max_tokens": 6, "temperature": 0});
    let res = http::post(addr, "/v1/completions", &body);
    assert_eq!(res.status, 200, "{}", res.text());
    res.json()["choices"][0]["text"].as_str().unwrap_or_default().to_owned()
}

#[test]
fn garbage_on_every_port_leaves_the_cluster_serving() {
    let (_sup, rest, cluster) = supervisor();
    let (w, worker_id) = worker_with_env(&cluster, SECRET, &[("XINF_LOG", "warn,xinf_transfer=debug")]);
    let body = json!({"model_name": "smollm2-instruct", "model_uid": "pd", "replica_config": [
        {"role": "prefill", "devices": [{"worker_ip": worker_id, "n_gpu": 0}]},
        {"role": "decode", "devices": [{"worker_ip": worker_id, "n_gpu": 0}]}]});
    let res = http::post(rest, "/v1/models", &body);
    assert_eq!(res.status, 200, "{}", res.text());
    let want = answer(rest);
    let cluster_addr: SocketAddr = cluster.parse().expect("cluster address");
    let worker_addr: SocketAddr = worker_id.parse().expect("the worker id is its address");
    let page_servers = logged_addrs(&w.log(), "page server listening");
    assert!(!page_servers.is_empty(), "no page server in the worker's log:\n{}", w.log());
    let mut ports = vec![rest, cluster_addr, worker_addr];
    ports.extend(page_servers);

    for &port in &ports {
        for bytes in payloads() {
            throw(port, &bytes);
        }
        // Half frames left hanging and idle connections, held while the model answers.
        let crowd: Vec<TcpStream> = (0..64)
            .filter_map(|i| {
                let mut s = TcpStream::connect_timeout(&port, Duration::from_secs(5)).ok()?;
                if i % 2 == 0 {
                    let _ = s.write_all(&[0, 0, 0, 0, 0, 0, 1]);
                }
                Some(s)
            })
            .collect();
        assert_eq!(answer(rest), want, "after garbage on {port}");
        drop(crowd);
    }
    let workers = http::get(rest, "/v1/workers").json();
    assert_eq!(workers[0]["alive"], true, "{workers}");
    let model = http::get(rest, "/v1/models/pd").json();
    assert_eq!(model["xinf"]["status"], "ready", "{model}");
    assert_eq!(answer(rest), want);
}
