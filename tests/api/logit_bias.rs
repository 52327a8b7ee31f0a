//! `logit_bias` through both generation APIs on the real default model: a bias of +100 forces a
//! token, -100 bans it, and malformed or out-of-range maps are refused naming the field.

use super::{assert_error, chat, completion, shared};
use crate::util::{self, http};
use serde_json::json;

#[test]
fn logit_bias_forces_and_bans_tokens() {
    let a = shared().addr();
    let paris = util::shared_smollm2().tokenizer().encode(" Paris", false).expect("encode");
    assert_eq!(paris.len(), 1, "\" Paris\" is one token of SmolLM2's vocabulary: {paris:?}");
    let key = paris[0].to_string();
    let text = |body: serde_json::Value| {
        let res = http::post(a, "/v1/completions", &body);
        assert_eq!(res.status, 200, "{}", res.text());
        res.json()["choices"][0]["text"].as_str().expect("text").to_owned()
    };
    let greedy = json!({"max_tokens": 3, "temperature": 0, "ignore_eos": true});
    let plain = text(completion(greedy.clone()));
    assert!(plain.starts_with(" Paris"), "the unbiased answer: {plain:?}");
    let forced = text(completion(json!({"max_tokens": 3, "temperature": 0, "logit_bias": {&key: 100}})));
    assert_eq!(forced, " Paris Paris Paris");
    let mut banned = completion(greedy);
    banned["logit_bias"] = json!({&key: -100});
    let banned = text(banned);
    assert!(!banned.starts_with(" Paris"), "banned, yet: {banned:?}");
    // Chat takes it too; an empty map biases nothing.
    let res = http::post(a, "/v1/chat/completions", &chat(json!({"max_tokens": 2, "logit_bias": {}})));
    assert_eq!(res.status, 200, "{}", res.text());

    for (bias, needle) in [
        (json!({"abc": 1}), "between -100 and 100"),
        (json!({&key: 101}), "between -100 and 100"),
        (json!({&key: "high"}), "between -100 and 100"),
        (json!([1, 2]), "between -100 and 100"),
        (json!({"999999999": 1}), "outside the vocabulary"),
    ] {
        let res = http::post(a, "/v1/completions", &completion(json!({"logit_bias": bias})));
        assert_error(&res, 400, Some("logit_bias"), needle);
    }
}
