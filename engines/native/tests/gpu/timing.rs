//! Timings on the GPU (benchmarks printed, not asserted) and a profiling target.

use super::*;
use std::sync::atomic::Ordering;

/// The vocabulary of the Qwen2.5-0.5B-shaped model (SmolLM2's size, so outputs stay printable
/// with SmolLM2's tokenizer in the serving benchmarks).
const VOCAB_Q05: usize = 49_152;

/// The model shapes the timings run on, picked by `XINF_BENCH_SHAPE`: `q05` (default),
/// Qwen2.5-0.5B with [`VOCAB_Q05`] words; `q05v`, the same with its real 151,936-word
/// vocabulary (the lm_head then reads a third of the weights); `l8b`, Llama-3.1-8B's config.
#[derive(Clone, Copy)]
struct Shape {
    name: &'static str,
    vocab: usize,
}

impl Shape {
    fn from_env() -> Self {
        let (name, vocab) = match std::env::var("XINF_BENCH_SHAPE").as_deref() {
            Ok("q05") | Err(_) => ("q05", VOCAB_Q05),
            Ok("q05v") => ("q05v", 151_936),
            Ok("l8b") => ("l8b", 128_256),
            Ok(other) => panic!("XINF_BENCH_SHAPE={other}: q05, q05v or l8b"),
        };
        Self { name, vocab }
    }

    /// What the printed lines call the model.
    fn label(self) -> String {
        match self.name {
            "l8b" => "Llama-3.1-8B shape FP16".into(),
            _ => format!("Qwen2.5-0.5B shape FP16 ({} words)", self.vocab),
        }
    }

    fn config(self) -> serde_json::Value {
        match self.name {
            "l8b" => serde_json::json!({
                "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
                "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
                "num_key_value_heads": 8, "vocab_size": self.vocab, "tie_word_embeddings": false,
                "max_position_embeddings": 131_072, "rms_norm_eps": 1e-5, "rope_theta": 500_000.0,
                "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
                "hidden_act": "silu", "torch_dtype": "float16",
            }),
            _ => serde_json::json!({
                "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 896,
                "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
                "num_key_value_heads": 2, "vocab_size": self.vocab, "tie_word_embeddings": true,
                "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "rope_theta": 1_000_000.0,
                "hidden_act": "silu", "torch_dtype": "float16",
            }),
        }
    }
}

/// Writes a checkpoint of `shape` with random FP16 weights (a word-level tokenizer of its
/// vocabulary) under `dir`, or under `XINF_BENCH_DIR` when set, where one written earlier is
/// used again (an 8B checkpoint takes a minute to write); returns it and its weights' bytes.
fn shape_model(dir: &Path, shape: Shape) -> (ResolvedModel, f64) {
    let dir = std::env::var_os("XINF_BENCH_DIR").map_or_else(|| dir.to_path_buf(), PathBuf::from);
    let path = dir.join(shape.name);
    let model = ResolvedModel {
        format: WeightsFormat::Safetensors,
        path: path.clone(),
        family: None,
        origin: "test".into(),
    };
    if let Ok(meta) = std::fs::metadata(path.join("model.safetensors")) {
        return (model, meta.len() as f64);
    }
    let words: serde_json::Map<String, serde_json::Value> =
        (0..shape.vocab).map(|i| (format!("w{i}"), serde_json::json!(i))).collect();
    let tok_dir = dir.join(format!("tok-{}", shape.name));
    std::fs::create_dir_all(&tok_dir).expect("mkdir");
    let tokenizer = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null,
        "decoder": null, "model": {"type": "WordLevel", "vocab": words, "unk_token": "w0"},
    });
    std::fs::write(tok_dir.join("tokenizer.json"), tokenizer.to_string()).expect("write tokenizer");
    let tok = xinf_models::TextTokenizer::from_hf_dir(&tok_dir, &[]).expect("tokenizer");
    let made =
        xinf_models::write_random_checkpoint(&shape.config(), xinf_models::RandomDtype::F16, 7, &tok, &path)
            .expect("random checkpoint");
    (model, made.bytes as f64)
}

/// Benchmark (a) without the serving path: per-token time of one greedy request decoding on the
/// engine itself (its step loop, the forward pass, the token's copy; no HTTP, no actors), for
/// the FP16 model of `XINF_BENCH_SHAPE` (see [`Shape`]) with random weights, with CUDA graphs
/// and without, against the HBM roofline (the weight bytes read
/// once per token at 4.8 TB/s); and the time of the whole prompt pass of 40-, 733- and
/// 2,833-token prompts (`prompt_logits`, medians of 5, chunks of the default
/// `max_batch_tokens`). Prints; asserts only that both runs decode the same tokens.
#[test]
fn decode_step_time_at_batch_1() {
    if !gpu_enabled("decode_step_time_at_batch_1") {
        return;
    }
    let dir = scratch();
    let shape = Shape::from_env();
    let (model, weight_bytes) = shape_model(dir.path(), shape);
    let (vocab, label) = (shape.vocab, shape.label());
    let roofline_ms = weight_bytes / 4.8e12 * 1e3;
    let mut outputs = Vec::new();
    for graphs in [true, false] {
        let cfg = serde_json::json!({"device": "cuda", "kv_cache_tokens": 8192, "cuda_graphs": graphs});
        let engine = NativeEngine::load(&model, EngineOptions::from_engine_config(&cfg).expect("options"))
            .expect("load");
        let ids = prompt(128, 5, vocab);
        let run = |n: usize, tag: &str| {
            rt().block_on(async {
                let mut sampling = SamplingParams::greedy(n);
                sampling.ignore_eos = true;
                let request =
                    GenerateRequest { request_id: tag.into(), prompt: Prompt::Tokens(ids.clone()), sampling };
                let mut stream = engine.submit(request).expect("submit");
                let (mut times, mut tokens) = (Vec::new(), Vec::new());
                while let Some(ev) = stream.next().await {
                    match ev.expect("event") {
                        TokenEvent::Delta { token_id, .. } => {
                            times.push(std::time::Instant::now());
                            tokens.push(token_id);
                        }
                        TokenEvent::Finished { .. } => break,
                        TokenEvent::Prompt(_) => {}
                    }
                }
                (times, tokens)
            })
        };
        let _ = run(16, "warm");
        if graphs {
            for len in [40usize, 733, 2833] {
                let ids = prompt(len, 9, vocab);
                let mut ms: Vec<f64> = (0..6)
                    .map(|_| {
                        let t = std::time::Instant::now();
                        rt().block_on(engine.prompt_logits(ids.clone())).expect("prompt logits");
                        t.elapsed().as_secs_f64() * 1e3
                    })
                    .skip(1)
                    .collect();
                ms.sort_by(f64::total_cmp);
                eprintln!("{label}: prompt of {len} tokens: whole prompt pass p50 {:.2} ms", ms[2]);
            }
        }
        let (times, tokens) = run(257, "timed");
        let mut gaps: Vec<f64> = times.windows(2).map(|w| (w[1] - w[0]).as_secs_f64() * 1e3).collect();
        gaps.sort_by(f64::total_cmp);
        let median = gaps[gaps.len() / 2];
        eprintln!(
            "{label}, {:.1} MB of weights, batch 1, cuda_graphs {graphs}: per-token p50 \
             {median:.3} ms, p10 {:.3}, p90 {:.3} over {} tokens; roofline {roofline_ms:.3} ms → {:.1}×",
            weight_bytes / 1e6,
            gaps[gaps.len() / 10],
            gaps[gaps.len() * 9 / 10],
            gaps.len(),
            median / roofline_ms
        );
        outputs.push(tokens);
    }
    assert_eq!(outputs[0], outputs[1], "graphs and eager launches decode the same tokens");
}

/// The time `n` concurrent requests of prompts of `lens` tokens (request i's `lens[i %
/// lens.len()]`, words below `vocab`, varied by `salt`) take to their first token, in ms. The
/// requests are built first and submitted back to back, so the engine's first step finds as
/// many of them queued as it can.
fn prompts_ms(engine: &NativeEngine, n: usize, lens: &[usize], salt: u32, vocab: usize) -> f64 {
    let requests: Vec<GenerateRequest> = (0..n)
        .map(|i| GenerateRequest {
            request_id: format!("p{salt}-{i}"),
            prompt: Prompt::Tokens(prompt(lens[i % lens.len()], salt * 1000 + i as u32, vocab)),
            sampling: SamplingParams::greedy(1),
        })
        .collect();
    let t0 = std::time::Instant::now();
    rt().block_on(async {
        let streams: Vec<_> = requests.into_iter().map(|r| engine.submit(r).expect("submit")).collect();
        futures::future::join_all(streams.into_iter().map(|mut stream| async move {
            while let Some(ev) = stream.next().await {
                if let TokenEvent::Finished { .. } = ev.expect("event") {
                    break;
                }
            }
        }))
        .await
    });
    t0.elapsed().as_secs_f64() * 1e3
}

/// Per-token times of `n` concurrent greedy requests of prompts of `lens` tokens (request i's
/// `lens[i % lens.len()]`; words below `vocab`) on `engine`, after their first tokens (the
/// steps that only decode): the median gap between one request's tokens, in ms. With `window`,
/// the profiler collects from when every request has its fifth token until the first has its
/// twentieth (decode-only steps alone).
fn decode_gap_ms(
    engine: &NativeEngine,
    n: usize,
    lens: &[usize],
    tokens: usize,
    vocab: usize,
    window: bool,
) -> f64 {
    let started = std::sync::atomic::AtomicUsize::new(0);
    let stopped = std::sync::atomic::AtomicBool::new(false);
    let (started, stopped) = (&started, &stopped);
    let gaps = rt().block_on(futures::future::join_all((0..n).map(|i| async move {
        let mut sampling = SamplingParams::greedy(tokens);
        sampling.ignore_eos = true;
        let ids = prompt(lens[i % lens.len()], 40 + i as u32, vocab);
        let request =
            GenerateRequest { request_id: format!("b{n}-{i}"), prompt: Prompt::Tokens(ids), sampling };
        let mut stream = engine.submit(request).expect("submit");
        let mut times = Vec::new();
        while let Some(ev) = stream.next().await {
            match ev.expect("event") {
                TokenEvent::Delta { .. } => times.push(std::time::Instant::now()),
                TokenEvent::Finished { .. } => break,
                TokenEvent::Prompt(_) => {}
            }
            if window && times.len() == 5 && started.fetch_add(1, Ordering::SeqCst) + 1 == n {
                profiler(true);
            }
            if window && times.len() == 20 && !stopped.swap(true, Ordering::SeqCst) {
                profiler(false);
            }
        }
        // The first gaps may wait for other requests' prompt chunks.
        times.windows(2).skip(4).map(|w| (w[1] - w[0]).as_secs_f64() * 1e3).collect::<Vec<_>>()
    })));
    let mut all: Vec<f64> = gaps.into_iter().flatten().collect();
    all.sort_by(f64::total_cmp);
    all[all.len() / 2]
}

/// Starts or stops the profiler's collection (Nsight Compute's `--profile-from-start off`)
/// for the primary context of GPU 0, the one the engine runs on.
fn profiler(on: bool) {
    #[cfg(feature = "cuda")]
    {
        let ctx = cudarc::driver::CudaContext::new(0).expect("GPU 0");
        ctx.bind_to_thread().expect("bind the context");
        let r = if on { cudarc::driver::profiler_start() } else { cudarc::driver::profiler_stop() };
        r.expect("profiler start/stop");
    }
    #[cfg(not(feature = "cuda"))]
    let _ = on;
}

/// Benchmark (b): decode-only steps of 1 to 64 sequences with 1,000-token prompts (CUDA
/// graphs on): the per-token time that a batch costs when no prompt shares its steps, the
/// baseline the TPOT of a serving run is compared with. Prints only.
#[test]
fn decode_step_time_by_batch() {
    if !gpu_enabled("decode_step_time_by_batch") {
        return;
    }
    let dir = scratch();
    let shape = Shape::from_env();
    let (model, _) = shape_model(dir.path(), shape);
    let cfg = serde_json::json!({"device": "cuda", "kv_cache_tokens": 131_072});
    let engine =
        NativeEngine::load(&model, EngineOptions::from_engine_config(&cfg).expect("options")).expect("load");
    let _ = decode_gap_ms(&engine, 4, &[64], 16, shape.vocab, false);
    for n in [1usize, 2, 4, 8, 16, 64] {
        let ms = decode_gap_ms(&engine, n, &[1000], 48, shape.vocab, false);
        eprintln!(
            "{}, 1,000-token prompts: decode-only batch {n}: per-token p50 {ms:.3} ms, {:.0} tokens/s",
            shape.label(),
            n as f64 / ms * 1e3
        );
    }
    // A serving run's mix of lengths: the batch's longest contexts are 70 times its shortest.
    for n in [4usize, 16, 64] {
        let ms = decode_gap_ms(&engine, n, &SERVING_MIX, 48, shape.vocab, false);
        eprintln!(
            "{}, prompts of 40/173/733/2,833 tokens: decode-only batch {n}: per-token p50 {ms:.3} ms, {:.0} tokens/s",
            shape.label(),
            n as f64 / ms * 1e3
        );
    }
}

/// The prompt lengths of the serving benchmarks (`xinf bench --prompt-tokens`).
const SERVING_MIX: [usize; 4] = [40, 173, 733, 2833];

/// A profiling target, not a check: with `XINF_PROFILE` set, the model of `XINF_BENCH_SHAPE` runs
/// one workload with CUDA graphs off, so a profiler sees every kernel: `prefillN`, one prompt pass
/// of N tokens (2,833 without N); `prefillmixN`, N prompts of the serving benchmarks' lengths in
/// turn, submitted together, to their first tokens (8 of them are 7,558 tokens: one step when all
/// are queued as it begins, else those that are and then the rest, as in a loaded server; a
/// profile's grid sizes say which); `decodeN`, N requests of 1,000-token prompts decoding 32 tokens
/// each, the profiler collecting only some of their decode-only steps (15 of them, give or take the
/// steps in flight); `decodemixN`, the same with the serving benchmarks' prompt lengths in turn.
/// The profiler collects one prompt pass after five timed ones, or some decode steps, never the
/// load's warm-up. Under Nsight Compute, e.g. `XINF_TEST_GPU=1 XINF_PROFILE=decode16 ncu
/// --profile-from-start off --metrics gpu__time_duration.sum --print-summary per-kernel
/// ./gpu-<hash> profile_target`.
#[test]
fn profile_target() {
    let Ok(what) = std::env::var("XINF_PROFILE") else {
        eprintln!("SKIPPED profile_target: set XINF_PROFILE to prefillN, prefillmixN, decodeN or decodemixN");
        return;
    };
    if !gpu_enabled("profile_target") {
        return;
    }
    let dir = scratch();
    let shape = Shape::from_env();
    let (model, _) = shape_model(dir.path(), shape);
    let cfg = serde_json::json!({"device": "cuda", "kv_cache_tokens": 131_072, "cuda_graphs": false});
    let engine =
        NativeEngine::load(&model, EngineOptions::from_engine_config(&cfg).expect("options")).expect("load");
    let prefill = if let Some(n) = what.strip_prefix("prefillmix") {
        Some((n.parse().expect("XINF_PROFILE=prefillmixN"), SERVING_MIX.to_vec()))
    } else {
        let len = what.strip_prefix("prefill");
        len.map(|len| {
            (1, vec![if len.is_empty() { 2833 } else { len.parse().expect("XINF_PROFILE=prefillN") }])
        })
    };
    if let Some((n, lens)) = prefill {
        let mut salt = 0;
        let mut pass = || {
            salt += 1;
            prompts_ms(&engine, n, &lens, salt, shape.vocab)
        };
        let mut ms: Vec<f64> = (0..5).map(|_| pass()).collect();
        ms.sort_by(f64::total_cmp);
        eprintln!("profile_target {what}: whole prompt pass p50 {:.2} ms (min {:.2})", ms[2], ms[0]);
        profiler(true);
        pass();
        profiler(false);
    } else {
        let (n, lens) = match what.strip_prefix("decodemix") {
            Some(n) => (n, &SERVING_MIX[..]),
            None => (what.trim_start_matches("decode"), &[1000][..]),
        };
        let n = n.parse().expect("XINF_PROFILE=decodeN or decodemixN");
        let ms = decode_gap_ms(&engine, n, lens, 32, shape.vocab, true);
        eprintln!("profile_target {what}: per-token p50 {ms:.3} ms");
    }
}
