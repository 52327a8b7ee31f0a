//! A model terminated while it loads: the launch is cancelled, its caller hears so, and
//! nothing of it stays.

use crate::util::http;
use crate::util::procs::{bare_local, poll};
use serde_json::json;
use std::time::Duration;

#[test]
fn a_model_terminated_while_it_loads_is_cancelled() {
    let _ = crate::util::smollm2();
    let (_p, addr) = bare_local(&[]);
    let launching = std::thread::spawn(move || {
        http::post(addr, "/v1/models", &json!({"model_name": "smollm2-instruct", "model_uid": "m"}))
    });
    poll(Duration::from_secs(30), "the model loading", || {
        http::get(addr, "/v1/models/m").json()["xinf"]["status"] == "loading"
    });
    let res = http::request(addr, "DELETE", "/v1/models/m", &[], b"");
    assert_eq!(res.status, 200, "{}", res.text());
    // Asked again while it winds down: the same answer, not "not ready".
    let res = http::request(addr, "DELETE", "/v1/models/m", &[], b"");
    assert!(res.status == 200 || res.status == 404, "{}", res.text());
    let res = launching.join().expect("the launch call");
    assert_eq!(res.status, 409, "{}", res.text());
    assert_eq!(res.json()["error"]["code"], "launch_cancelled", "{}", res.text());
    assert!(res.text().contains("terminated while it loaded"), "{}", res.text());
    poll(Duration::from_secs(30), "the cancelled model gone", || {
        http::get(addr, "/v1/models/m").status == 404
    });
    let workers = http::get(addr, "/v1/workers").json();
    assert_eq!(workers[0]["replicas"], json!([]), "{workers}");
    // The uid is free again, and the model launches and serves under it.
    let res = http::post(addr, "/v1/models", &json!({"model_name": "smollm2-instruct", "model_uid": "m"}));
    assert_eq!(res.status, 200, "{}", res.text());
    let body = json!({"model": "m", "prompt": "The capital of France is", "max_tokens": 4, "temperature": 0});
    assert_eq!(http::post(addr, "/v1/completions", &body).status, 200);
    // Xinference's `cancel_launch_model` route: a model that serves has no launch to cancel.
    let res = http::post(addr, "/v1/models/m/cancel", &json!({}));
    assert_eq!(
        (res.status, res.json()["error"]["code"].clone()),
        (400, json!("model_not_loading")),
        "{}",
        res.text()
    );
    assert!(res.text().contains("the model is ready"), "{}", res.text());
    // One that loads is cancelled by it as by DELETE.
    let launching = std::thread::spawn(move || {
        http::post(addr, "/v1/models", &json!({"model_name": "smollm2-instruct", "model_uid": "c"}))
    });
    poll(Duration::from_secs(30), "the second model loading", || {
        http::get(addr, "/v1/models/c").json()["xinf"]["status"] == "loading"
    });
    let res = http::post(addr, "/v1/models/c/cancel", &json!({}));
    assert_eq!((res.status, res.text()), (200, "null".to_owned()));
    assert_eq!(launching.join().expect("the launch call").status, 409);
    assert_eq!(http::post(addr, "/v1/models/nope/cancel", &json!({})).status, 404);
}
