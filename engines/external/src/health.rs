//! A running server's liveness. A server that dies is noticed at once (its process exits). One
//! that hangs, its process alive but its HTTP server no longer answering, would hold its
//! replica's requests until their idle limit (ten minutes) while the router kept sending it
//! new ones. So xinf asks the server's `/health` every few seconds, and a server that has
//! answered none for `health_timeout_s` is stopped and its replica dies with that reason.
//! Both engines answer `/health` from their HTTP process without touching the GPU (vLLM checks
//! that its engine core is alive; SGLang answers at once unless told to generate), so a busy
//! server still answers.

use std::time::{Duration, Instant};

/// `health_timeout_s` when the launch gives none.
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);
/// The longest pause between two health checks.
const MAX_INTERVAL: Duration = Duration::from_secs(10);

/// Resolves once the server at `url` has answered no health check for `timeout`, with what
/// the last check got; never when `timeout` is zero.
pub(crate) async fn unresponsive(client: reqwest::Client, url: String, timeout: Duration) -> String {
    if timeout.is_zero() {
        return std::future::pending().await;
    }
    // A few checks fit in the timeout, so one slow answer never stops a server.
    let interval = (timeout / 4).clamp(Duration::from_millis(50), MAX_INTERVAL);
    let mut answered = Instant::now();
    loop {
        tokio::time::sleep(interval).await;
        let last = match client.get(&url).timeout(interval).send().await {
            Ok(r) if r.status().is_success() => {
                answered = Instant::now();
                continue;
            }
            Ok(r) => format!("it answered {}", r.status()),
            Err(e) if e.is_timeout() => format!("no answer within {} ms", interval.as_millis()),
            Err(e) => format!("{e}"),
        };
        let silent = answered.elapsed();
        if silent >= timeout {
            return format!(
                "no health check answered for {:.1} s (the last: {last}; engine_config.health_timeout_s sets \
                 the limit)",
                silent.as_secs_f64()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpListener;

    /// A loopback server whose `/health` answers 200 while `healthy` says so and never after.
    fn server(healthy: std::sync::Arc<std::sync::atomic::AtomicBool>) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { continue };
                let healthy = healthy.clone();
                std::thread::spawn(move || {
                    let mut buf = [0u8; 1024];
                    let _ = conn.read(&mut buf);
                    if healthy.load(std::sync::atomic::Ordering::SeqCst) {
                        let _ = conn
                            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
                    } else {
                        // Hung: the connection stays open, unanswered.
                        std::thread::sleep(Duration::from_secs(30));
                    }
                });
            }
        });
        format!("http://{addr}/health")
    }

    #[test]
    fn a_server_that_stops_answering_is_found_unresponsive_and_one_that_answers_is_not() {
        let rt = xinf_test_util::runtime();
        let _in_runtime = rt.enter();
        let healthy = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let url = server(healthy.clone());
        let client = reqwest::Client::new();
        let timeout = Duration::from_millis(400);
        // Answering: nothing to report for many times the timeout.
        let quiet = rt.block_on(tokio::time::timeout(
            Duration::from_millis(1500),
            unresponsive(client.clone(), url.clone(), timeout),
        ));
        assert!(quiet.is_err(), "a healthy server was reported: {quiet:?}");
        // Hung: reported once the timeout has passed without an answer, not before.
        healthy.store(false, std::sync::atomic::Ordering::SeqCst);
        let started = Instant::now();
        let why = rt.block_on(unresponsive(client.clone(), url, timeout));
        assert!(started.elapsed() >= timeout, "{:?}", started.elapsed());
        assert!(why.contains("no health check answered") && why.contains("health_timeout_s"), "{why}");
        // Nothing listening: refused connections count as unanswered.
        let closed = {
            let l = TcpListener::bind("127.0.0.1:0").expect("bind");
            format!("http://{}/health", l.local_addr().expect("addr"))
        };
        let why = rt.block_on(unresponsive(client.clone(), closed, timeout));
        assert!(why.contains("no health check answered"), "{why}");
        // A timeout of zero turns the watch off.
        let off = rt.block_on(tokio::time::timeout(
            Duration::from_millis(300),
            unresponsive(client, "http://127.0.0.1:1/health".into(), Duration::ZERO),
        ));
        assert!(off.is_err());
    }
}
