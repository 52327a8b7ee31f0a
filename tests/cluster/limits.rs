//! Xinference's `request_limits` on a real local cluster: a model launched with a limit of one
//! refuses a second request while the first streams (429, Xinference's words, `Retry-After`),
//! and serves again once the first is over, whether it finished or its client went away. A call
//! of several choices or prompts takes one place.

use crate::util::http;
use crate::util::procs::{local, poll};
use serde_json::json;
use std::io::Read;
use std::time::Duration;

#[test]
fn requests_over_the_launch_limit_are_refused_until_a_place_frees() {
    let (_server, addr) = local("unlimited", &[]);
    let launch = json!({"model_name": "smollm2-instruct", "model_uid": "limited", "request_limits": 1});
    let res = http::post(addr, "/v1/models", &launch);
    assert_eq!(res.status, 200, "{}", res.text());
    let ask = |stream: bool, max_tokens: u32| {
        json!({"model": "limited", "prompt": "Count from 1 to 500:", "max_tokens": max_tokens,
               "temperature": 0, "ignore_eos": true, "stream": stream})
    };
    // One after another, each finished before the next: no refusal.
    for _ in 0..3 {
        let res = http::post(addr, "/v1/completions", &ask(false, 4));
        assert_eq!(res.status, 200, "{}", res.text());
    }

    // One call of three choices, or of two prompts, is one request under the limit.
    let res = http::post(
        addr,
        "/v1/completions",
        &json!({"model": "limited", "prompt": "Hi", "max_tokens": 2, "n": 3}),
    );
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(res.json()["choices"].as_array().map(Vec::len), Some(3));
    let res = http::post(
        addr,
        "/v1/completions",
        &json!({"model": "limited", "prompt": ["Hi", "Yo"], "max_tokens": 2}),
    );
    assert_eq!(res.status, 200, "{}", res.text());

    // A long stream holds the one place: its first bytes show it runs.
    let body = serde_json::to_vec(&ask(true, 4000)).expect("json");
    let mut held = http::send(addr, "POST", "/v1/completions", &[], &body);
    let mut first = [0u8; 256];
    let n = held.read(&mut first).expect("the stream starts");
    assert!(String::from_utf8_lossy(&first[..n]).starts_with("HTTP/1.1 200"));
    for stream in [false, true] {
        let res = http::post(addr, "/v1/completions", &ask(stream, 4));
        assert_eq!(res.status, 429, "{}", res.text());
        let err = res.json()["error"].clone();
        assert_eq!(err["code"], "rate_limited", "{err}");
        let msg = err["message"].as_str().unwrap_or_default();
        assert!(
            msg.contains("Rate limit reached for the model. Request limit 1 for the model: limited"),
            "{msg}"
        );
        assert_eq!(res.header("retry-after"), Some("1"));
    }
    // The model's figures show the limit, the place taken and the two refusals.
    let stats = http::get(addr, "/v1/models/limited/stats").json();
    assert_eq!(stats["request_limit"], json!({"limit": 1, "running": 1, "refused": 2}), "{stats}");
    let metrics = http::get(addr, "/metrics").text();
    let labels = r#"{model_uid="limited",model_name="smollm2-instruct"}"#;
    for line in [format!("xinf_request_limit{labels} 1"), format!("xinf_requests_refused_total{labels} 2")] {
        assert!(metrics.lines().any(|l| l == line), "{line} not in\n{metrics}");
    }
    assert!(!metrics.contains(r#"xinf_request_limit{model_uid="unlimited""#), "{metrics}");
    // Another model of the cluster is not limited by it.
    let other = json!({"model": "unlimited", "prompt": "Hi", "max_tokens": 2});
    assert_eq!(http::post(addr, "/v1/completions", &other).status, 200);

    // The client goes away: its request is aborted and the place comes free.
    drop(held);
    poll(Duration::from_secs(30), "the place to come free", || {
        http::post(addr, "/v1/completions", &ask(false, 4)).status == 200
    });
    // Refused launches name the key.
    for bad in [json!(0), json!(-1), json!("4"), json!(1.5), json!(5_000_000_000u64)] {
        let body = json!({"model_name": "smollm2-instruct", "request_limits": bad});
        let res = http::post(addr, "/v1/models", &body);
        assert_eq!(res.status, 400, "{bad} → {}", res.text());
        assert_eq!(res.json()["error"]["param"], "request_limits", "{bad} → {}", res.text());
    }
}
