//! What a P/D deployment reports besides text: each token's log-probabilities (the echoed
//! prompt's and the first token's from the prefill side, the rest from the decode side) and
//! output under a grammar or a seed (the decode side goes on from the prefill side's first
//! token); all as the ordinary replica `hybrid` gives them.

use super::{NEW_TOKENS, prompt};
use crate::util::http;
use serde_json::{Value, json};
use std::net::SocketAddr;

/// Prompt lengths asked for log-probabilities, each streamed and not (two handoffs each).
pub(crate) const LOGPROB_LENGTHS: &[usize] = &[65, 130];
/// Prompt lengths asked for an integer under a JSON Schema (one handoff each).
pub(crate) const SHAPED_LENGTHS: &[usize] = &[65, 130];
/// Seeds each of [`SHAPED_LENGTHS`] is sampled with (one handoff each).
pub(crate) const SEEDS: &[u64] = &[7, 8];

/// One token of a completion's `logprobs`: its text, log-probability (none for the echoed
/// prompt's first token) and alternatives (most likely first).
type ScoredToken = (String, Option<f64>, Vec<(String, f64)>);

/// The completions API's `logprobs` of a greedy completion of `ids` with 3 alternatives, the
/// prompt echoed first, as `(token, logprob, alternatives)` per token, streamed or not.
fn logprobs(addr: SocketAddr, model: &str, ids: &[u32], stream: bool) -> Vec<ScoredToken> {
    let body = json!({
        "model": model, "prompt": ids, "max_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": true,
        "stream": stream, "logprobs": 3, "echo": true,
    });
    let res = http::post(addr, "/v1/completions", &body);
    assert_eq!(res.status, 200, "{model}, {} tokens: {}", ids.len(), res.text());
    let parts: Vec<Value> = if stream {
        let events = res.events();
        events[..events.len().saturating_sub(1)].iter().filter_map(|e| serde_json::from_str(e).ok()).collect()
    } else {
        vec![res.json()]
    };
    let mut out = Vec::new();
    for v in parts {
        let l = &v["choices"][0]["logprobs"];
        let Some(tokens) = l["tokens"].as_array() else { continue };
        for (i, t) in tokens.iter().enumerate() {
            let top = l["top_logprobs"][i].as_object().into_iter().flatten();
            let mut top: Vec<(String, f64)> =
                top.map(|(k, v)| (k.clone(), v.as_f64().expect("logprob"))).collect();
            top.sort_by(|a, b| b.1.total_cmp(&a.1));
            out.push((t.as_str().expect("token").to_owned(), l["token_logprobs"][i].as_f64(), top));
        }
    }
    out
}

/// Checks every deployment of `uids` against the ordinary replica `hybrid`.
pub(crate) fn check(addr: SocketAddr, uids: &[&str]) {
    // Log-probabilities: the first token's comes from the prefill side (shown before the decode
    // side answers), the rest from the decode side; all as the ordinary replica reports them.
    for &n in LOGPROB_LENGTHS {
        let ids = prompt(n);
        let want = logprobs(addr, "hybrid", &ids, false);
        assert_eq!(want.len(), n + NEW_TOKENS, "{n} tokens: {want:?}");
        assert!(want[0].1.is_none() && want[1..].iter().all(|t| t.1.is_some()), "{n} tokens: {want:?}");
        for uid in uids {
            for stream in [false, true] {
                let got = logprobs(addr, uid, &ids, stream);
                assert_eq!(got.len(), want.len(), "{uid}, {n} tokens: {got:?}");
                for ((t, lp, top), (wt, wlp, wtop)) in got.iter().zip(&want) {
                    let close = |a: f64, b: f64| (a - b).abs() <= 1e-4;
                    let same = match (lp, wlp) {
                        (Some(a), Some(b)) => close(*a, *b),
                        (a, b) => a == b,
                    };
                    assert!(t == wt && same, "{uid}, {n} tokens: {got:?} against {want:?}");
                    assert_eq!(top.len(), wtop.len(), "{uid}, {n} tokens: {got:?} against {want:?}");
                    assert!(
                        top.iter().zip(wtop).all(|(a, b)| a.0 == b.0 && close(a.1, b.1)),
                        "{uid}: {got:?} / {want:?}"
                    );
                }
            }
        }
    }

    // Seeded sampling: the decode side goes on with the random numbers after the one the
    // prefill side drew for the first token, so the text is the ordinary replica's.
    for &n in SHAPED_LENGTHS {
        let text = |model: &str, seed: u64| {
            let body = json!({"model": model, "prompt": prompt(n), "max_tokens": 8, "temperature": 1.0,
                "top_p": 0.95, "seed": seed, "ignore_eos": true});
            let res = http::post(addr, "/v1/completions", &body);
            assert_eq!(res.status, 200, "{model}: {}", res.text());
            res.json()["choices"][0]["text"].as_str().unwrap_or_default().to_owned()
        };
        for &seed in SEEDS {
            let want = text("hybrid", seed);
            for uid in uids {
                assert_eq!(text(uid, seed), want, "{uid}, {n} tokens, seed {seed}");
            }
        }
    }

    // Structured output: the grammar the prefill side sampled the first token under goes on at
    // the decode side from that token, so the output is the ordinary replica's.
    for &n in SHAPED_LENGTHS {
        let body = |model: &str| {
            json!({"model": model, "prompt": prompt(n), "max_tokens": 12, "temperature": 0,
                "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "integer"}}}})
        };
        let text = |model: &str| {
            let res = http::post(addr, "/v1/completions", &body(model));
            assert_eq!(res.status, 200, "{model}: {}", res.text());
            res.json()["choices"][0]["text"].as_str().unwrap_or_default().to_owned()
        };
        let want = text("hybrid");
        assert!(want.trim().parse::<i64>().is_ok(), "{n} tokens: {want:?}");
        for uid in uids {
            assert_eq!(text(uid), want, "{uid}, {n} tokens");
        }
    }
}
