//! `max_local_prefill_tokens`: a P/D model leaves its short prompts to the decode replica,
//! which computes them as an ordinary replica would; longer ones are handed off as before.

use super::{complete, launch, pages, prompt, stats};
use crate::util::procs::local;
use crate::util::{self, http};
use serde_json::json;

/// Prompts of at most 64 tokens run on the decode replica alone (counted by the prefill
/// replica that left them, no page moved), longer ones are handed off; every output equals
/// the ordinary replica's. A 1-token prompt, which a decode engine that recomputes the last
/// prompt token cannot take as a handoff, is served.
#[test]
fn short_prompts_are_computed_by_the_decode_replica() {
    let _ = util::smollm2();
    let (_server, addr) = local("hybrid", &[]);
    let replicas = json!([
        {"role": "prefill", "engine_config": {"kv_layout": "paged-block-first", "block_size": 64}},
        {"role": "decode", "engine_config": {"kv_layout": "paged-kv-first", "block_size": 32, "recompute_last_token": true}},
    ]);
    launch(
        addr,
        json!({"model_name": "smollm2-instruct", "model_uid": "pd", "replica_config": replicas,
               "max_local_prefill_tokens": 64}),
    );
    // The model's description shows the key; an ordinary model's has neither P/D key.
    let described = http::get(addr, "/v1/models/pd").json();
    assert_eq!(described["xinf"]["max_local_prefill_tokens"], 64, "{described}");
    assert_eq!(described["xinf"].get("prefill_fallback"), None, "{described}");
    assert!(described["context_length"].as_u64().is_some_and(|n| n > 0), "{described}");
    assert_eq!(described["xinf"]["context_length"], described["context_length"], "{described}");
    let hybrid = http::get(addr, "/v1/models/hybrid").json();
    assert_eq!(hybrid["xinf"].get("max_local_prefill_tokens"), None, "{hybrid}");

    let (short, long) = ([1, 2, 63, 64], [65, 130]);
    for (i, &n) in short.iter().chain(&long).enumerate() {
        let ids = prompt(n);
        let want = complete(addr, "hybrid", &ids, false);
        assert_eq!(complete(addr, "pd", &ids, i % 2 == 1), want, "{n}-token prompt");
    }
    // A prompt with a token id out of the vocabulary is refused as invalid, short or long: the
    // client's mistake, not a failed handoff.
    for n in [2, 100] {
        let mut ids = prompt(n);
        ids[n / 2] = 1 << 30;
        let body = json!({"model": "pd", "prompt": ids, "max_tokens": 2});
        let res = http::post(addr, "/v1/completions", &body);
        assert_eq!(res.status, 400, "{n} tokens: {}", res.text());
    }
    // A short prompt whose request no engine takes is refused before it is left to the decode
    // replica, and not counted as left.
    let refused = [json!({"max_tokens": 100_000}), json!({"max_tokens": 2, "logit_bias": {"1073741824": 1}})];
    for extra in refused {
        let mut body = json!({"model": "pd", "prompt": prompt(2)});
        if let Some(b) = body.as_object_mut() {
            b.extend(extra.as_object().cloned().unwrap_or_default());
        }
        let res = http::post(addr, "/v1/completions", &body);
        assert_eq!(res.status, 400, "{body}: {}", res.text());
    }
    // A chat request's prompt is counted after its template.
    let chat = json!({"model": "pd", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3});
    let res = http::post(addr, "/v1/chat/completions", &chat);
    assert_eq!(res.status, 200, "{}", res.text());

    let s = stats(addr, "pd");
    let h = &s["handoff"];
    let local_prompts = short.len() as u64 + 1;
    assert_eq!(h["local_prefills"], local_prompts, "{s}");
    assert_eq!(h["decode_prompts"], local_prompts, "{s}");
    assert_eq!(h["pages_transferred"], pages(&long, true), "{s}");
    assert_eq!(h["in_process_transfers"], long.len() as u64, "{s}");
    assert_eq!(
        (&h["failed"], &h["active_rooms"], &s["pinned_blocks"]),
        (&json!(0), &json!(0), &json!(0)),
        "{s}"
    );
    let served = |role: &str| {
        let replicas = s["replicas"].as_array().cloned().unwrap_or_default();
        let r = replicas.iter().find(|r| r["role"] == role).cloned().unwrap_or_default();
        r["requests_served"].as_u64().unwrap_or_default()
    };
    assert_eq!(served("decode"), local_prompts + long.len() as u64, "{s}");
    let metrics = http::get(addr, "/metrics").text();
    let line = format!(
        "xinf_handoff_local_prefills_total{{model_uid=\"pd\",model_name=\"smollm2-instruct\"}} {local_prompts}"
    );
    assert!(metrics.contains(&line), "{metrics}");
}
