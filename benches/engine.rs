//! Prefill and decode throughput of the native engine on the default model
//! (SmolLM2-135M-Instruct, Q4_1 GGUF), at batch 1 and 8, with the CPU multiplying the file's
//! quantized blocks as stored (`quantized`, `quantized_matmul`, the default) and with them
//! dequantized to F32 at load (`dequantized`), side by side in one run.
//!
//! `cargo bench --bench engine`. Prefill: 8 × 128-token prompts (or one), time to every first
//! token. Decode: 32 tokens per sequence after the prompts, timed from the last first token.
//! These run without the prefix cache, since every iteration repeats the prompts.
//!
//! `prefix-cache`: the time to first token of a 512-token prompt whose first 448 tokens every
//! iteration shares (a system prompt) and whose last 64 differ (the question), with the prefix
//! cache and without.
//!
//! `prompt-logprobs`: the time to first token of a 512-token prompt without and with every
//! prompt token's log-probability and its 5 likeliest alternatives (`prompt_logprobs: 5`), which
//! takes every position's logits (chunks of at most 341 positions of this vocabulary).

#![allow(missing_docs)] // criterion_group! generates undocumented items

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use futures::StreamExt;
use std::sync::Arc;
use std::time::{Duration, Instant};
use xinf::engine::{Engine, GenerateRequest, Prompt, SamplingParams, TokenEvent};
use xinf::models::{ModelRequest, resolve};
use xinf::native::{EngineOptions, NativeEngine};

const PROMPT_TOKENS: usize = 128;
const DECODE_TOKENS: usize = 32;

fn prompts(engine: &NativeEngine, batch: usize) -> Vec<Vec<u32>> {
    let text = "In the beginning the universe was created. This has made a lot of people very angry and \
                been widely regarded as a bad move. "
        .repeat(20);
    let ids = engine.tokenizer().encode(&text, true).unwrap_or_default();
    (0..batch)
        .map(|b| {
            let mut p: Vec<u32> = ids.iter().skip(b).take(PROMPT_TOKENS).copied().collect();
            p.truncate(PROMPT_TOKENS);
            p
        })
        .collect()
}

/// Runs a batch; returns (time to the last first token, time from there to the end).
async fn run_batch(
    engine: &Arc<NativeEngine>,
    batch: usize,
    new_tokens: usize,
    round: u64,
) -> (Duration, Duration) {
    let start = Instant::now();
    let mut tasks = Vec::new();
    for (i, p) in prompts(engine, batch).into_iter().enumerate() {
        let e = engine.clone();
        tasks.push(tokio::spawn(async move {
            let sampling = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(new_tokens) };
            let req =
                GenerateRequest { request_id: format!("b{round}-{i}"), prompt: Prompt::Tokens(p), sampling };
            let mut s = match e.submit(req) {
                Ok(s) => s,
                Err(_) => return (Instant::now(), Instant::now()),
            };
            let mut first = None;
            while let Some(Ok(ev)) = s.next().await {
                if let TokenEvent::Delta { .. } = ev {
                    first.get_or_insert_with(Instant::now);
                }
            }
            (first.unwrap_or_else(Instant::now), Instant::now())
        }));
    }
    let mut last_first = start;
    let mut end = start;
    for t in tasks {
        if let Ok((f, e)) = t.await {
            last_first = last_first.max(f);
            end = end.max(e);
        }
    }
    (last_first - start, end - last_first)
}

fn bench(c: &mut Criterion) {
    let Ok(model) = resolve(&ModelRequest { model_name: "smollm2-instruct".into(), ..Default::default() })
    else {
        eprintln!("SKIPPED: the default model cannot be fetched here");
        return;
    };
    let Ok(rt) = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() else {
        return;
    };
    let mut round = 0u64;
    for (name, quantized_matmul) in [("quantized", true), ("dequantized", false)] {
        let options = EngineOptions { quantized_matmul, prefix_caching: false, ..EngineOptions::default() };
        let Ok(engine) = NativeEngine::load(&model, options) else {
            eprintln!("SKIPPED: the default model does not load");
            return;
        };
        let engine = Arc::new(engine);
        let mut g = c.benchmark_group(format!("smollm2-135m/{name}"));
        g.sample_size(10).warm_up_time(Duration::from_secs(2)).measurement_time(Duration::from_secs(20));
        for batch in [1usize, 8] {
            g.throughput(Throughput::Elements((batch * PROMPT_TOKENS) as u64));
            g.bench_function(format!("prefill/batch{batch}"), |b| {
                b.iter_custom(|iters| {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        round += 1;
                        total += rt.block_on(run_batch(&engine, batch, 1, round)).0;
                    }
                    total
                })
            });
            g.throughput(Throughput::Elements((batch * (DECODE_TOKENS - 1)) as u64));
            g.bench_function(format!("decode/batch{batch}"), |b| {
                b.iter_custom(|iters| {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        round += 1;
                        total += rt.block_on(run_batch(&engine, batch, DECODE_TOKENS, round)).1;
                    }
                    total
                })
            });
        }
        g.finish();
    }
    let mut g = c.benchmark_group("smollm2-135m/prefix-cache");
    g.sample_size(10).warm_up_time(Duration::from_secs(2)).measurement_time(Duration::from_secs(20));
    for (name, prefix_caching) in [("cached", true), ("uncached", false)] {
        let options = EngineOptions { prefix_caching, ..EngineOptions::default() };
        let Ok(engine) = NativeEngine::load(&model, options) else { return };
        let engine = Arc::new(engine);
        g.bench_function(format!("ttft-448-shared-of-512/{name}"), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    round += 1;
                    let prompt = shared_prefix_prompt(&engine, round);
                    total += rt.block_on(first_token(&engine, prompt, SamplingParams::greedy(1), round));
                }
                total
            })
        });
    }
    g.finish();
    let mut g = c.benchmark_group("smollm2-135m/prompt-logprobs");
    g.sample_size(10).warm_up_time(Duration::from_secs(2)).measurement_time(Duration::from_secs(20));
    let options = EngineOptions { prefix_caching: false, ..EngineOptions::default() };
    let Ok(engine) = NativeEngine::load(&model, options) else { return };
    let engine = Arc::new(engine);
    for (name, top) in [("without", None), ("top5", Some(5))] {
        let sampling = SamplingParams { prompt_logprobs: top, ..SamplingParams::greedy(1) };
        g.bench_function(format!("ttft-512/{name}"), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    round += 1;
                    let prompt = shared_prefix_prompt(&engine, round);
                    total += rt.block_on(first_token(&engine, prompt, sampling.clone(), round));
                }
                total
            })
        });
    }
    g.finish();
}

/// 448 tokens every call shares, then 64 that depend on `round`.
fn shared_prefix_prompt(engine: &NativeEngine, round: u64) -> Vec<u32> {
    let ids = &prompts(engine, 1)[0];
    let text = "Answer the question in one sentence, kindly and precisely. ".repeat(60);
    let shared = engine.tokenizer().encode(&text, true).unwrap_or_default();
    let mut p: Vec<u32> = shared.into_iter().take(448).collect();
    p.extend((0..64).map(|i| ids[(round as usize * 7 + i) % ids.len()]));
    p
}

/// The time to the first token of one request.
async fn first_token(
    engine: &Arc<NativeEngine>,
    prompt: Vec<u32>,
    sampling: SamplingParams,
    round: u64,
) -> Duration {
    let start = Instant::now();
    let req = GenerateRequest { request_id: format!("p{round}"), prompt: Prompt::Tokens(prompt), sampling };
    let Ok(mut s) = engine.submit(req) else { return Duration::ZERO };
    let mut first = None;
    while let Some(Ok(ev)) = s.next().await {
        if let TokenEvent::Delta { .. } = ev {
            first.get_or_insert_with(|| start.elapsed());
        }
    }
    first.unwrap_or_else(|| start.elapsed())
}

criterion_group!(benches, bench);
criterion_main!(benches);
