//! Engine behaviour on the real default model: layouts, batching, sampling, bad input, and
//! the prefill/decode hooks.

use crate::util;
use futures::StreamExt;
use std::sync::Arc;
use xinf::engine::{
    Engine, EngineError, FinishReason, GenerateRequest, ImportedKv, Prompt, SamplingParams, TokenEvent,
};
use xinf::models::{ResolvedModel, WeightsFormat};
use xinf::native::{EngineOptions, NativeEngine};

const PROMPT: &str = "The three most important inventions of the nineteenth century were";

fn layouts() -> Vec<serde_json::Value> {
    let mut v = Vec::new();
    for layout in ["paged-kv-first", "paged-block-first"] {
        for order in ["NHD", "HND"] {
            for block in [16, 32, 64] {
                v.push(serde_json::json!({"kv_layout": layout, "kv_order": order, "block_size": block}));
            }
        }
    }
    v.push(serde_json::json!({"kv_layout": "token-pool"}));
    v.push(serde_json::json!({"kv_layout": "token-pool", "block_size": 64}));
    // vLLM 0.26's layout, K and V packed per head, in both orders.
    v.push(serde_json::json!({"kv_layout": "paged-packed", "block_size": 16}));
    v.push(serde_json::json!({"kv_layout": "paged-packed", "kv_order": "HND", "block_size": 16}));
    v
}

/// Greedy output is the same whatever the KV layout, order and block size.
#[test]
fn greedy_output_is_identical_across_layouts() {
    let rt = util::rt();
    let model = util::smollm2();
    let base = util::shared_smollm2();
    let prompt = base.tokenizer().encode(PROMPT, true).expect("encode");
    // A prompt longer than one 64-token block, so block tables have several entries.
    let long: Vec<u32> = prompt.iter().cycle().take(150).copied().collect();
    let want_short = rt.block_on(util::greedy_ids(base.as_ref(), "base-s", prompt.clone(), 24));
    let want_long = rt.block_on(util::greedy_ids(base.as_ref(), "base-l", long.clone(), 8));
    for config in layouts() {
        let e = util::engine(&model, config.clone());
        let got = rt.block_on(util::greedy_ids(e.as_ref(), "s", prompt.clone(), 24));
        assert_eq!(got, want_short, "layout {config}");
        let got = rt.block_on(util::greedy_ids(e.as_ref(), "l", long.clone(), 8));
        assert_eq!(got, want_long, "layout {config}");
    }
}

/// Eight concurrent requests of different lengths give what each gives alone, while batching
/// really happens (several requests running at once).
#[test]
fn concurrent_requests_match_single_requests() {
    let rt = util::rt();
    let e = util::engine(
        &util::smollm2(),
        serde_json::json!({"kv_layout": "paged-block-first", "block_size": 32}),
    );
    let prompts: Vec<String> =
        (0..8).map(|i| format!("{} {}", "Tell me a story about a dragon".repeat(i + 1), i)).collect();
    let alone: Vec<Vec<u32>> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let ids = e.tokenizer().encode(p, true).expect("encode");
            rt.block_on(util::greedy_ids(e.as_ref(), &format!("a{i}"), ids, 12 + i))
        })
        .collect();
    let together = rt.block_on(async {
        let mut tasks = Vec::new();
        for (i, p) in prompts.iter().enumerate() {
            let ids = e.tokenizer().encode(p, true).expect("encode");
            let e = e.clone();
            tasks.push(tokio::spawn(async move {
                util::greedy_ids(e.as_ref(), &format!("b{i}"), ids, 12 + i).await
            }));
        }
        let mut peak = 0;
        while tasks.iter().any(|t| !t.is_finished()) {
            peak = peak.max(e.stats().running);
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await.expect("task"));
        }
        (out, peak)
    });
    assert!(together.1 >= 2, "requests never ran together (peak {})", together.1);
    assert_eq!(together.0, alone);
    let s = e.stats();
    assert_eq!((s.running, s.queued, s.used_blocks), (0, 0, 0), "everything freed: {s:?}");
}

/// A prompt computed on one engine, exported as canonical pages and imported by an engine
/// with another layout, decodes to the same greedy output as the ordinary path.
#[test]
fn pinned_prefill_exports_pages_that_another_layout_decodes() {
    let rt = util::rt();
    let model = util::smollm2();
    let prefill = util::engine(
        &model,
        serde_json::json!({"kv_layout": "paged-kv-first", "kv_order": "HND", "block_size": 16}),
    );
    for (decode_cfg, recompute) in [
        (serde_json::json!({"kv_layout": "token-pool"}), false),
        (
            serde_json::json!({"kv_layout": "paged-block-first", "block_size": 64, "recompute_last_token": true}),
            true,
        ),
    ] {
        let decode = util::engine(&model, decode_cfg.clone());
        for len in [2usize, 63, 64, 65, 129] {
            let ids: Vec<u32> = prefill
                .tokenizer()
                .encode(&"Once upon a time in a land far away there lived a king. ".repeat(20), true)
                .expect("encode")[..len]
                .to_vec();
            let want = rt.block_on(util::greedy_ids(prefill.as_ref(), "ordinary", ids.clone(), 10));
            let rid = format!("pd-{len}-{recompute}");
            let sampling = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(10) };
            let req =
                GenerateRequest { request_id: rid.clone(), prompt: Prompt::Tokens(ids.clone()), sampling };
            let pinned = rt.block_on(prefill.prefill_pinned(req.clone())).expect("prefill");
            assert_eq!(pinned.first_token, want[0], "first token, {len} tokens");
            assert!(prefill.stats().pinned_blocks > 0);
            let pages = rt.block_on(prefill.export_pages(&rid, 0, len.div_ceil(64))).expect("export");
            assert!(prefill.release_pinned(&rid));
            assert!(!prefill.release_pinned(&rid), "second release finds nothing");
            assert!(rt.block_on(prefill.export_pages(&rid, 0, 1)).is_err(), "late export is refused");
            // An engine that recomputes the last prompt token reads one page fewer when
            // `len % 64 == 1`.
            let need = decode.import_len(len).div_ceil(64);
            assert_eq!(need, if recompute { (len - 1).div_ceil(64) } else { len.div_ceil(64) });
            let pages = pages[..need * decode.contract().page_bytes()].to_vec();
            let kv = ImportedKv {
                prompt_ids: ids.clone(),
                first_token: pinned.first_token,
                first_logprobs: None,
                pages: pages.into(),
            };
            let mut s = decode.submit_imported(req, kv).expect("import");
            let got = rt.block_on(async {
                let mut v = Vec::new();
                while let Some(ev) = s.next().await {
                    if let TokenEvent::Delta { token_id, .. } = ev.expect("event") {
                        v.push(token_id);
                    }
                }
                v
            });
            assert_eq!(got, want, "{decode_cfg}, prompt of {len} tokens");
            let before = decode.stats().prompt_tokens;
            assert!(!recompute || before > 0 || len < 2);
        }
        assert_eq!(prefill.stats().pinned_blocks, 0);
        assert_eq!(decode.stats().used_blocks, 0);
    }
}

/// The KV a prefill engine exports from one layout equals, bit for bit, the KV a decode engine
/// with another layout computes itself for the same prompt: what the decode side imports is
/// exactly what it would have computed (the layout round trip is the transfer property test).
#[test]
fn exported_kv_equals_locally_computed_kv_across_layouts() {
    let rt = util::rt();
    let model = util::smollm2();
    // Without the prefix cache: each prompt here begins with the one before, and a block taken
    // from the cache holds the K and V of the chunk that first computed it, which can differ in
    // the last bits from computing the prompt whole (as a prompt cut into chunks can).
    let prefill = util::engine(
        &model,
        serde_json::json!({"kv_layout": "paged-kv-first", "kv_order": "HND", "block_size": 16,
            "enable_prefix_caching": false}),
    );
    let decode =
        util::engine(&model, serde_json::json!({"kv_layout": "token-pool", "enable_prefix_caching": false}));
    let text = "The quick brown fox jumps over the lazy dog near the river bank. ".repeat(30);
    let all = prefill.tokenizer().encode(&text, true).expect("encode");
    for len in [2usize, 63, 64, 65, 129, 193] {
        let ids = all[..len].to_vec();
        let export = |engine: &NativeEngine, id: String| {
            let req = GenerateRequest {
                request_id: id.clone(),
                prompt: Prompt::Tokens(ids.clone()),
                sampling: SamplingParams::greedy(1),
            };
            rt.block_on(async {
                engine.prefill_pinned(req).await.expect("prefill");
                let pages = engine.export_pages(&id, 0, len.div_ceil(64)).await.expect("export");
                assert!(engine.release_pinned(&id));
                pages
            })
        };
        let from_prefill = export(&prefill, format!("p-{len}"));
        let local = export(&decode, format!("d-{len}"));
        assert_eq!(from_prefill.len(), local.len());
        assert!(from_prefill == local, "{len}-token prompt: the exported KV differs from the local KV");
    }
}

#[test]
fn seeded_sampling_is_reproducible_and_stop_strings_cut_text() {
    let rt = util::rt();
    let e = util::shared_smollm2();
    let sampling = SamplingParams {
        max_tokens: Some(20),
        temperature: 0.9,
        top_p: 0.9,
        top_k: 40,
        seed: Some(7),
        ..SamplingParams::default()
    };
    let a = rt.block_on(util::run(e.as_ref(), "seed-a", Prompt::Text(PROMPT.into()), sampling.clone()));
    let b = rt.block_on(util::run(e.as_ref(), "seed-b", Prompt::Text(PROMPT.into()), sampling.clone()));
    assert_eq!(a, b, "same seed, same output");
    let c = rt.block_on(util::run(
        e.as_ref(),
        "seed-c",
        Prompt::Text(PROMPT.into()),
        SamplingParams { seed: Some(8), ..sampling },
    ));
    assert_ne!(a.ids, c.ids, "another seed, another output");

    let greedy =
        rt.block_on(util::run(e.as_ref(), "g", Prompt::Text(PROMPT.into()), SamplingParams::greedy(20)));
    let words: Vec<&str> = greedy.text.split_whitespace().collect();
    assert!(words.len() >= 3, "{greedy:?}");
    let stop = words[2].to_owned();
    let stopped = rt.block_on(util::run(
        e.as_ref(),
        "stop",
        Prompt::Text(PROMPT.into()),
        SamplingParams { stop: vec![stop.clone()], ..SamplingParams::greedy(20) },
    ));
    assert_eq!(stopped.finish, Some(FinishReason::Stop));
    assert!(!stopped.text.contains(&stop), "stop string leaked: {stopped:?}");
    assert!(greedy.text.starts_with(&stopped.text));
    assert_eq!(greedy.finish, Some(FinishReason::Length));
}

fn submit_err(e: &NativeEngine, prompt: Prompt, sampling: SamplingParams) -> EngineError {
    match e.submit(GenerateRequest { request_id: "bad".into(), prompt, sampling }) {
        Ok(_) => panic!("accepted a bad request"),
        Err(err) => err,
    }
}

#[test]
fn bad_requests_get_typed_errors() {
    let e = util::engine(&util::smollm2(), serde_json::json!({"context_length": 64}));
    let text = || Prompt::Text("hello".into());
    let field = |err: EngineError| match err {
        EngineError::InvalidRequest { field, .. } => field,
        other => panic!("unexpected {other:?}"),
    };
    assert_eq!(field(submit_err(&e, text(), SamplingParams { top_p: 0.0, ..Default::default() })), "top_p");
    assert_eq!(
        field(submit_err(&e, text(), SamplingParams { temperature: -1.0, ..Default::default() })),
        "temperature"
    );
    assert_eq!(
        field(submit_err(&e, text(), SamplingParams { temperature: f32::NAN, ..Default::default() })),
        "temperature"
    );
    assert_eq!(
        field(submit_err(&e, text(), SamplingParams { max_tokens: Some(0), ..Default::default() })),
        "max_tokens"
    );
    assert_eq!(field(submit_err(&e, text(), SamplingParams { min_p: 2.0, ..Default::default() })), "min_p");
    assert_eq!(
        field(submit_err(&e, text(), SamplingParams { repetition_penalty: 0.0, ..Default::default() })),
        "repetition_penalty"
    );
    assert_eq!(field(submit_err(&e, Prompt::Tokens(vec![]), SamplingParams::default())), "prompt");
    assert_eq!(field(submit_err(&e, Prompt::Tokens(vec![u32::MAX]), SamplingParams::default())), "prompt");
    assert_eq!(field(submit_err(&e, Prompt::Chat(vec![]), SamplingParams::default())), "messages");
    let long = Prompt::Text("word ".repeat(100));
    assert!(matches!(
        submit_err(&e, long, SamplingParams::default()),
        EngineError::ContextLength { context_length: 64, .. }
    ));
    // A duplicate running id is refused; the engine keeps serving.
    let rt = util::rt();
    let s = e
        .submit(GenerateRequest {
            request_id: "dup".into(),
            prompt: text(),
            sampling: SamplingParams::greedy(30),
        })
        .expect("first");
    assert!(matches!(
        e.submit(GenerateRequest {
            request_id: "dup".into(),
            prompt: text(),
            sampling: SamplingParams::greedy(3)
        }),
        Err(EngineError::DuplicateRequest(_))
    ));
    drop(s);
    let ok = rt.block_on(util::run(e.as_ref(), "after", text(), SamplingParams::greedy(3)));
    assert_eq!(ok.ids.len(), 3);
    // A P/D prefill checks the whole request's max_tokens against the context before it
    // computes anything, and computes one token of it when it fits.
    let ids = e.prompt_token_ids(&Prompt::Text("word ".repeat(20))).expect("ids");
    let prefill = |rid: &str, max_tokens: usize| GenerateRequest {
        request_id: rid.into(),
        prompt: Prompt::Tokens(ids.clone()),
        sampling: SamplingParams::greedy(max_tokens),
    };
    let computed = e.stats().prompt_tokens;
    let over = 64 - ids.len() + 1;
    match rt.block_on(e.prefill_pinned(prefill("too-long", over))) {
        Err(EngineError::ContextLength { max_tokens, context_length: 64, .. }) => {
            assert_eq!(max_tokens, over)
        }
        other => panic!("a prefill past the context: {:?}", other.map(|p| p.first_token)),
    }
    assert_eq!(e.stats().prompt_tokens, computed, "nothing computed for a refused prefill");
    let pinned = rt.block_on(e.prefill_pinned(prefill("fits", over - 1))).expect("a prefill that fits");
    assert_eq!(pinned.prompt_ids, ids);
    assert!(e.release_pinned("fits"));
}

#[test]
fn aborts_and_disconnects_free_everything() {
    let rt = util::rt();
    let e = util::engine(&util::smollm2(), serde_json::json!({}));
    rt.block_on(async {
        let mut s = e
            .submit(GenerateRequest {
                request_id: "abort-me".into(),
                prompt: Prompt::Text(PROMPT.into()),
                sampling: SamplingParams { ignore_eos: true, ..SamplingParams::greedy(200) },
            })
            .expect("submit");
        let first = s.next().await.expect("event").expect("ok");
        assert!(matches!(first, TokenEvent::Delta { .. }));
        assert!(e.abort("abort-me"));
        let mut last = None;
        while let Some(ev) = s.next().await {
            last = Some(ev.expect("event"));
        }
        assert!(matches!(last, Some(TokenEvent::Finished { reason: FinishReason::Abort, .. })), "{last:?}");
        assert!(!e.abort("abort-me"), "gone after the abort");

        // Dropping the stream aborts too.
        let s = e
            .submit(GenerateRequest {
                request_id: "drop-me".into(),
                prompt: Prompt::Text(PROMPT.into()),
                sampling: SamplingParams { ignore_eos: true, ..SamplingParams::greedy(500) },
            })
            .expect("submit");
        drop(s);
        for _ in 0..500 {
            if e.stats().running == 0 && e.stats().used_blocks == 0 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    });
    let s = e.stats();
    assert_eq!((s.running, s.used_blocks), (0, 0), "{s:?}");
}

/// A cache too small for every request at once preempts and recomputes, and outputs stay
/// identical.
#[test]
fn preemption_under_memory_pressure_keeps_outputs() {
    let rt = util::rt();
    let model = util::smollm2();
    let small = util::engine(&model, serde_json::json!({"kv_cache_tokens": 256, "block_size": 16}));
    let big = util::shared_smollm2();
    let prompts: Vec<Vec<u32>> = (0..4)
        .map(|i| big.tokenizer().encode(&format!("{i} {}", PROMPT.repeat(3)), true).expect("encode"))
        .collect();
    let want: Vec<Vec<u32>> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| rt.block_on(util::greedy_ids(big.as_ref(), &format!("w{i}"), p.clone(), 24)))
        .collect();
    let got = rt.block_on(async {
        let tasks: Vec<_> = prompts
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let (e, p) = (small.clone(), p.clone());
                tokio::spawn(async move { util::greedy_ids(e.as_ref(), &format!("p{i}"), p, 24).await })
            })
            .collect();
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await.expect("task"));
        }
        out
    });
    assert_eq!(got, want);
}

fn load_err(model: &ResolvedModel) -> String {
    NativeEngine::load(model, EngineOptions::default()).expect_err("must not load").to_string()
}

#[test]
fn broken_models_are_refused_with_clear_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let gguf = dir.path().join("broken.gguf");
    std::fs::write(&gguf, b"GGUF but not really").expect("write");
    let m = |format, path| ResolvedModel { format, path, family: None, origin: "test".into() };
    let e = load_err(&m(WeightsFormat::Gguf, gguf.clone()));
    assert!(e.contains("broken.gguf"), "{e}");

    let hf = dir.path().join("hf");
    std::fs::create_dir_all(&hf).expect("mkdir");
    let e = load_err(&m(WeightsFormat::Safetensors, hf.clone()));
    assert!(e.contains("config.json"), "{e}");

    std::fs::write(
        hf.join("config.json"),
        r#"{"model_type": "mamba", "architectures": ["MambaForCausalLM"], "hidden_size": 8,
            "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 1, "vocab_size": 8,
            "rms_norm_eps": 1e-5, "max_position_embeddings": 8}"#,
    )
    .expect("write");
    let e = load_err(&m(WeightsFormat::Safetensors, hf.clone()));
    assert!(e.contains("model_type") && e.contains("mamba"), "{e}");

    // A real tiny model with its weights cut short.
    let tiny = util::tiny("tiny-qwen2");
    let cut = dir.path().join("cut");
    std::fs::create_dir_all(&cut).expect("mkdir");
    for f in ["config.json", "tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(tiny.path.join(f), cut.join(f)).expect("copy");
    }
    let weights = std::fs::read(tiny.path.join("model.safetensors")).expect("read");
    std::fs::write(cut.join("model.safetensors"), &weights[..weights.len() / 2]).expect("write");
    let e = load_err(&m(WeightsFormat::Safetensors, cut.clone()));
    assert!(e.contains("model.safetensors"), "{e}");
    std::fs::remove_file(cut.join("tokenizer.json")).expect("rm");
    let e = load_err(&m(WeightsFormat::Safetensors, cut));
    assert!(e.contains("tokenizer.json"), "{e}");
}

#[test]
fn bad_engine_config_names_the_key() {
    let cases = [
        (serde_json::json!({"kv_layout": "ring"}), "engine_config.kv_layout"),
        (serde_json::json!({"block_size": 8}), "engine_config.block_size"),
        (serde_json::json!({"kv_layout": "token-pool", "kv_order": "HND"}), "engine_config.kv_order"),
        (serde_json::json!({"bogus": 1}), "engine_config.bogus"),
        (serde_json::json!({"max_num_seqs": "many"}), "engine_config.max_num_seqs"),
        (serde_json::json!({"kv_dtype": "int8"}), "engine_config.kv_dtype"),
    ];
    for (cfg, want) in cases {
        match EngineOptions::from_engine_config(&cfg) {
            Err(EngineError::InvalidRequest { field, .. }) => assert_eq!(field, want, "{cfg}"),
            other => panic!("{cfg}: {other:?}"),
        }
    }
}

/// A context longer than the model's positions is refused at load, naming the key; the
/// model's own length is taken.
#[test]
fn a_context_past_the_models_positions_is_refused() {
    let opts = |n: usize| EngineOptions::from_engine_config(&serde_json::json!({"context_length": n}));
    match NativeEngine::load(&util::smollm2(), opts(1 << 20).expect("options")) {
        Err(EngineError::InvalidRequest { field, reason }) => {
            assert_eq!(field, "engine_config.context_length");
            assert!(reason.contains("max_position_embeddings (8192)"), "{reason}");
        }
        other => panic!("{:?}", other.map(|_| "loaded")),
    }
    let e =
        NativeEngine::load(&util::smollm2(), opts(8192).expect("options")).expect("the model's own length");
    assert_eq!(e.contract().context_length, 8192);
}

/// A full waiting queue refuses new requests with a typed "overloaded" error, and the engine
/// serves again once the queue drains.
#[test]
fn a_full_queue_refuses_with_overloaded() {
    let rt = util::rt();
    let e = util::engine(&util::smollm2(), serde_json::json!({"max_queue": 2, "max_num_seqs": 1}));
    let mut streams = Vec::new();
    let mut refused = None;
    for i in 0..16 {
        let req = GenerateRequest {
            request_id: format!("q{i}"),
            prompt: Prompt::Text(PROMPT.into()),
            sampling: SamplingParams { ignore_eos: true, ..SamplingParams::greedy(16) },
        };
        match e.submit(req) {
            Ok(s) => streams.push(s),
            Err(err) => {
                refused = Some(err);
                break;
            }
        }
    }
    assert!(matches!(refused, Some(EngineError::Overloaded { limit: 2, .. })), "{refused:?}");
    drop(streams);
    let ok = rt.block_on(async {
        for _ in 0..1000 {
            if e.stats().queued == 0 && e.stats().running == 0 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        util::run(e.as_ref(), "after", Prompt::Text("hi".into()), SamplingParams::greedy(2)).await
    });
    assert_eq!(ok.ids.len(), 2);
}

/// The prefix cache: a prompt seen before takes its full blocks instead of computing them, and
/// a conversation's next turn takes the blocks of the last one; the output is that of an engine
/// without the cache, its log-probabilities too within the last bits (a cached block holds the
/// K and V of the chunk that first computed it, as a prompt cut into chunks does).
#[test]
fn the_prefix_cache_serves_repeated_prefixes_with_the_same_output() {
    let rt = util::rt();
    let config = |caching: bool| serde_json::json!({"kv_layout": "paged-block-first", "block_size": 16, "enable_prefix_caching": caching});
    let (cached, plain) =
        (util::engine(&util::smollm2(), config(true)), util::engine(&util::smollm2(), config(false)));
    let turn1 = cached
        .tokenizer()
        .encode(&"You are a careful assistant. Answer briefly. ".repeat(8), true)
        .expect("encode");
    let mut turn2 = turn1.clone();
    turn2.extend(cached.tokenizer().encode(" And what about the moon?", false).expect("encode"));
    let sampling = SamplingParams { ignore_eos: true, logprobs: Some(0), ..SamplingParams::greedy(12) };
    let run = |e: &Arc<NativeEngine>, id: &str, ids: &Vec<u32>| {
        rt.block_on(util::run(e.as_ref(), id, Prompt::Tokens(ids.clone()), sampling.clone()))
    };
    let logprobs = |o: &util::Output| o.logprobs.iter().map(|l| l.chosen.logprob).collect::<Vec<_>>();

    let first = run(&cached, "a", &turn1);
    let s = cached.stats();
    assert_eq!((s.cached_prompt_tokens, s.prompt_tokens), (0, turn1.len() as u64), "{s:?}");
    // Again: every full block but the one holding the last prompt token comes from the cache.
    let again = run(&cached, "b", &turn1);
    let reused = ((turn1.len() - 1) / 16 * 16) as u64;
    let s = cached.stats();
    assert_eq!(s.cached_prompt_tokens, reused, "{s:?}");
    assert_eq!(s.prompt_tokens, 2 * turn1.len() as u64 - reused, "only the rest was computed: {s:?}");
    // The next turn starts with the first turn's prompt: its blocks are taken too.
    let next = run(&cached, "c", &turn2);
    assert!(cached.stats().cached_prompt_tokens >= 2 * reused, "{:?}", cached.stats());

    for (out, id, prompt) in [(&first, "x", &turn1), (&again, "y", &turn1), (&next, "z", &turn2)] {
        let fresh = run(&plain, id, prompt);
        assert_eq!(out.ids, fresh.ids, "{id}");
        let (a, b) = (logprobs(out), logprobs(&fresh));
        assert!(a.iter().zip(&b).all(|(x, y)| (x - y).abs() <= 1e-3), "{id}: {a:?} against {b:?}");
    }
    assert_eq!(plain.stats().cached_prompt_tokens, 0, "off means off");
    let s = cached.stats();
    assert_eq!((s.running, s.used_blocks), (0, 0), "cached blocks nobody holds count as free: {s:?}");
}

/// Requests that come together with one prompt (`n` choices, a shared system prompt): one
/// computes the prompt, the others wait a step and take its blocks from the prefix cache.
#[test]
fn requests_that_come_together_compute_a_shared_prompt_once() {
    let rt = util::rt();
    let e = util::engine(
        &util::smollm2(),
        serde_json::json!({"kv_layout": "paged-block-first", "block_size": 16}),
    );
    let prompt = e
        .tokenizer()
        .encode(&"Tell me about the sea and the ships upon it. ".repeat(10), true)
        .expect("encode");
    let outs = rt.block_on(async {
        let tasks: Vec<_> = (0..4)
            .map(|i| {
                let (e, prompt) = (e.clone(), prompt.clone());
                tokio::spawn(async move { util::greedy_ids(e.as_ref(), &format!("n{i}"), prompt, 8).await })
            })
            .collect();
        let mut outs = Vec::new();
        for t in tasks {
            outs.push(t.await.expect("task"));
        }
        outs
    });
    assert!(outs.iter().all(|o| *o == outs[0]), "{outs:?}");
    let reusable = ((prompt.len() - 1) / 16 * 16) as u64;
    let s = e.stats();
    assert_eq!(s.cached_prompt_tokens, 3 * reusable, "three took the first one's blocks: {s:?}");
    assert_eq!(s.prompt_tokens, 4 * prompt.len() as u64 - 3 * reusable, "{s:?}");
}
