//! Prompt reports on the real default model: every prompt token's log-probability
//! (`prompt_logprobs`) however the prompt is cut into chunks, never from the prefix cache,
//! once through preemption; the echoed prompt's ids and text.

use crate::util;
use std::sync::Arc;
use xinf::engine::{Engine, Prompt, PromptLogprobs, SamplingParams};
use xinf::native::NativeEngine;

const TEXT: &str = "The three most important inventions of the nineteenth century were the telegraph, \
                    the steam engine and the photograph, each of which changed how people lived. ";

fn prompt_logprobs(engine: &Arc<NativeEngine>, id: &str, ids: &[u32], top: usize) -> PromptLogprobs {
    let sampling = SamplingParams { prompt_logprobs: Some(top), ..SamplingParams::greedy(2) };
    let out = util::rt().block_on(util::run(engine.as_ref(), id, Prompt::Tokens(ids.to_vec()), sampling));
    let report = out.prompt.unwrap_or_else(|| panic!("{id}: no report"));
    assert_eq!(report.token_ids, ids, "{id}");
    report.logprobs.unwrap_or_else(|| panic!("{id}: no log-probabilities"))
}

/// Two tallies of one prompt agree token for token, within `tol` (chunks of other sizes sum in
/// other orders).
fn assert_close(a: &PromptLogprobs, b: &PromptLogprobs, tol: f32, what: &str) {
    assert_eq!(a.first, b.first, "{what}");
    assert_eq!(a.rest.len(), b.rest.len(), "{what}");
    for (j, (x, y)) in a.rest.iter().zip(&b.rest).enumerate() {
        assert_eq!(x.chosen.token_id, y.chosen.token_id, "{what} position {}", j + 1);
        assert!((x.chosen.logprob - y.chosen.logprob).abs() <= tol, "{what} position {}: {x:?} {y:?}", j + 1);
        let ids = |t: &xinf::engine::TokenLogprobs| t.top.iter().map(|l| l.token_id).collect::<Vec<_>>();
        let near = x.top.windows(2).any(|w| (w[0].logprob - w[1].logprob).abs() <= tol);
        assert!(near || ids(x) == ids(y), "{what} position {}: {x:?} {y:?}", j + 1);
    }
}

/// Chunks of 16 tokens (each a step of its own), a cache that holds the prompt's blocks from
/// an earlier request, and a cache so small that the request is preempted and computed again:
/// each gives every position once, as one whole chunk does.
#[test]
fn prompt_log_probabilities_do_not_depend_on_how_the_prompt_is_computed() {
    let rt = util::rt();
    let whole = util::engine(&util::smollm2(), serde_json::json!({"enable_prefix_caching": false}));
    let ids = whole.tokenizer().encode(&TEXT.repeat(3), true).expect("encode");
    assert!(ids.len() > 64, "a prompt of several chunks: {}", ids.len());
    let want = prompt_logprobs(&whole, "whole", &ids, 4);
    assert_eq!(want.rest.len(), ids.len() - 1);

    let chunked =
        util::engine(&util::smollm2(), serde_json::json!({"max_batch_tokens": 16, "block_size": 16}));
    assert_close(&prompt_logprobs(&chunked, "chunked", &ids, 4), &want, 1e-4, "16-token chunks");

    // The same prompt again: its blocks are in the cache, but its log-probabilities need every
    // position's logits, so it is computed whole.
    let cached = util::engine(&util::smollm2(), serde_json::json!({"block_size": 16}));
    rt.block_on(util::greedy_ids(cached.as_ref(), "warm", ids.clone(), 2));
    let before = cached.stats();
    assert_close(&prompt_logprobs(&cached, "again", &ids, 4), &want, 1e-4, "after a cached run");
    let after = cached.stats();
    assert_eq!(after.cached_prompt_tokens, before.cached_prompt_tokens, "nothing from the cache: {after:?}");
    assert_eq!(after.prompt_tokens - before.prompt_tokens, ids.len() as u64, "{after:?}");

    // Four such requests in a cache that cannot hold them all: some are preempted part way and
    // computed again, and still report each position once.
    let small = util::engine(
        &util::smollm2(),
        serde_json::json!({"kv_cache_tokens": 160, "block_size": 16, "max_batch_tokens": 48}),
    );
    let sampling = SamplingParams { prompt_logprobs: Some(4), ..SamplingParams::greedy(2) };
    // Submitted together: the first poll of `join_all` submits every one.
    let names: Vec<String> = (0..4).map(|i| format!("p{i}")).collect();
    let outs = rt.block_on(futures::future::join_all(
        names.iter().map(|id| util::run(small.as_ref(), id, Prompt::Tokens(ids.clone()), sampling.clone())),
    ));
    for (i, out) in outs.into_iter().enumerate() {
        let got = out.prompt.and_then(|r| r.logprobs).unwrap_or_else(|| panic!("p{i}: no log-probabilities"));
        assert_close(&got, &want, 1e-4, &format!("preempted {i}"));
    }
    assert!(
        small.stats().prompt_tokens > 4 * ids.len() as u64,
        "some prompt was computed twice: {:?}",
        small.stats()
    );
}

/// `echo` alone reports the prompt's ids and text, without log-probabilities; a decode side,
/// which imports the prompt's KV, refuses to compute them.
#[test]
fn an_echo_reports_the_prompt_as_the_engine_took_it() {
    let engine = util::shared_smollm2();
    let sampling = SamplingParams { echo: true, ..SamplingParams::greedy(3) };
    let out = util::rt().block_on(util::run(engine.as_ref(), "echo", Prompt::Text(TEXT.into()), sampling));
    let report = out.prompt.expect("a report");
    assert_eq!(report.token_ids, engine.tokenizer().encode(TEXT, true).expect("encode"));
    assert_eq!(report.text, TEXT);
    assert!(report.logprobs.is_none());
    assert_eq!(out.ids.len(), 3, "the output follows");

    let sampling = SamplingParams { prompt_logprobs: Some(21), ..SamplingParams::greedy(3) };
    let e = engine
        .submit(xinf::engine::GenerateRequest {
            request_id: "many".into(),
            prompt: Prompt::Text(TEXT.into()),
            sampling,
        })
        .err()
        .expect("refused");
    assert!(e.to_string().contains("prompt_logprobs"), "{e}");
}
