//! The GPU backend against the CPU backend on the same weights (run with `XINF_TEST_GPU=1` on
//! a host with an NVIDIA GPU; skipped, loudly, otherwise).
//!
//! Models: small random Llama (llama3 RoPE scaling), Qwen2 (QKV biases, tied embeddings) and
//! Qwen3 (Q/K norms, head_dim ≠ hidden/heads) checkpoints written by this test in F32, F16 and
//! BF16; the SmolLM2 GGUF when `XINF_TEST_SMOLLM2` names it. Checks, for two KV layouts
//! (vLLM FlashAttention HND with blocks of 16, SGLang token pool) and one more for F32
//! (FlashInfer NHD, blocks of 64):
//! - last-position logits on prompts of 1 to 300 tokens: max |Δ| ≤ `tol × spread` of the CPU
//!   logits, `tol` = 1e-3 for F32 weights, 3e-2 for F16 and 6e-2 for BF16 (the GPU keeps the
//!   matmul inputs and the KV cache in the weights' dtype, the CPU computes in F32 on the same
//!   rounded weights);
//! - 16 greedy tokens of 4 concurrent requests (prompts chunked, so prefill chunks and decode
//!   tokens share steps): equal to the CPU's for F32; for F16/BF16 every GPU token is the CPU's
//!   or within `tol × spread` of it in the CPU's logits, teacher-forced along the CPU's path
//!   (the GPU's prompt pass) and along the GPU's own (its decode steps);
//! - exported canonical pages of a pinned prefill equal the CPU's within 1e-3 × max |K/V|
//!   (F32), and those pages imported into another GPU engine (other layout) continue greedily
//!   exactly as the CPU engine does;
//! - decode steps replayed from CUDA graphs give the very tokens of eager launches
//!   (`cuda_graphs: false`), and graphs are replayed (`NativeEngine::graph_steps`).

use futures::StreamExt;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use xinf_engine::{Engine, GenerateRequest, ImportedKv, Prompt, SamplingParams, TokenEvent};
use xinf_engine_native::{EngineOptions, NativeEngine};
use xinf_models::{ResolvedModel, WeightsFormat};

use xinf_test_util::{
    Rng, current_thread_runtime as rt, gpu_tests_enabled as gpu_enabled, scratch_dir as scratch,
};

const VOCAB: usize = 512;

#[derive(Clone, Copy, Debug)]
enum Arch {
    Llama,
    Qwen2,
    Qwen3,
}

/// Writes a random checkpoint (config.json, model.safetensors in `dtype`, a word-level
/// tokenizer.json) into `dir/name` and returns it.
fn make_model(dir: &Path, arch: Arch, dtype: candle_core::DType) -> ResolvedModel {
    use candle_core::{Device, Tensor};
    let name = format!("{arch:?}-{dtype:?}").to_lowercase();
    let path = dir.join(&name);
    std::fs::create_dir_all(&path).expect("mkdir");
    // GQA groups of 4 (two KV heads), 7 (one) and 12 (two) query heads, heads of 16, 64 and 128:
    // the decode attention reads each K/V row once for a block of the group's heads (on tensor
    // cores, groups of up to 8 are a tile's columns, larger ones its rows), and its operand
    // loads depend on the head dimension; on Hopper, heads of 64 and 128 take the prefill
    // attention's `wgmma` kernel, which shares its source with the decode attention.
    let (hidden, heads, kv_heads, head_dim, inter, layers) = match arch {
        Arch::Llama => (64, 8, 2, 16, 128, 3),
        Arch::Qwen2 => (64, 7, 1, 64, 160, 2),
        Arch::Qwen3 => (64, 24, 2, 128, 128, 3),
    };
    let tied = matches!(arch, Arch::Qwen2);
    let config = match arch {
        Arch::Llama => serde_json::json!({
            "architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "rope_theta": 10000.0,
            "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 256},
        }),
        Arch::Qwen2 => serde_json::json!({
            "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "rope_theta": 20000.0,
        }),
        Arch::Qwen3 => serde_json::json!({
            "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "rope_theta": 5000.0,
        }),
    };
    let mut config = config.as_object().expect("object").clone();
    for (k, v) in [
        ("hidden_size", serde_json::json!(hidden)),
        ("intermediate_size", serde_json::json!(inter)),
        ("num_hidden_layers", serde_json::json!(layers)),
        ("num_attention_heads", serde_json::json!(heads)),
        ("num_key_value_heads", serde_json::json!(kv_heads)),
        ("head_dim", serde_json::json!(head_dim)),
        ("vocab_size", serde_json::json!(VOCAB)),
        ("rms_norm_eps", serde_json::json!(1e-6)),
        ("max_position_embeddings", serde_json::json!(2048)),
        ("tie_word_embeddings", serde_json::json!(tied)),
        ("hidden_act", serde_json::json!("silu")),
    ] {
        config.insert(k.into(), v);
    }
    std::fs::write(path.join("config.json"), serde_json::to_string_pretty(&config).expect("json"))
        .expect("write config");
    let vocab: serde_json::Map<String, serde_json::Value> =
        (0..VOCAB).map(|i| (format!("w{i}"), serde_json::json!(i))).collect();
    let tokenizer = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null,
        "decoder": null, "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "w0"},
    });
    std::fs::write(path.join("tokenizer.json"), tokenizer.to_string()).expect("write tokenizer");
    let seed = match arch {
        Arch::Llama => 11,
        Arch::Qwen2 => 22,
        Arch::Qwen3 => 33,
    };
    let mut rng = Rng::new(0x9E37_79B9_7F4A_7C15 ^ seed);
    let mut tensors: HashMap<String, Tensor> = HashMap::new();
    let mut put = |name: String, shape: &[usize], kind: u8| {
        let n: usize = shape.iter().product();
        let v: Vec<f32> = (0..n)
            .map(|_| {
                let r = rng.normal();
                match kind {
                    0 => 1.0 + 0.1 * r, // norms
                    1 => 0.2 * r,       // biases
                    2 => 0.5 * r,       // embedding / lm_head
                    _ => 0.15 * r,      // matrices
                }
            })
            .collect();
        let t = Tensor::from_vec(v, shape, &Device::Cpu).and_then(|t| t.to_dtype(dtype)).expect("tensor");
        tensors.insert(name, t);
    };
    put("model.embed_tokens.weight".into(), &[VOCAB, hidden], 2);
    put("model.norm.weight".into(), &[hidden], 0);
    if !tied {
        put("lm_head.weight".into(), &[VOCAB, hidden], 2);
    }
    let (q, kv) = (heads * head_dim, kv_heads * head_dim);
    for l in 0..layers {
        let p = |s: &str| format!("model.layers.{l}.{s}");
        put(p("input_layernorm.weight"), &[hidden], 0);
        put(p("post_attention_layernorm.weight"), &[hidden], 0);
        put(p("self_attn.q_proj.weight"), &[q, hidden], 3);
        put(p("self_attn.k_proj.weight"), &[kv, hidden], 3);
        put(p("self_attn.v_proj.weight"), &[kv, hidden], 3);
        put(p("self_attn.o_proj.weight"), &[hidden, q], 3);
        put(p("mlp.gate_proj.weight"), &[inter, hidden], 3);
        put(p("mlp.up_proj.weight"), &[inter, hidden], 3);
        put(p("mlp.down_proj.weight"), &[hidden, inter], 3);
        if let Arch::Qwen2 = arch {
            put(p("self_attn.q_proj.bias"), &[q], 1);
            put(p("self_attn.k_proj.bias"), &[kv], 1);
            put(p("self_attn.v_proj.bias"), &[kv], 1);
        }
        if let Arch::Qwen3 = arch {
            put(p("self_attn.q_norm.weight"), &[head_dim], 0);
            put(p("self_attn.k_norm.weight"), &[head_dim], 0);
        }
    }
    candle_core::safetensors::save(&tensors, path.join("model.safetensors")).expect("save safetensors");
    ResolvedModel { format: WeightsFormat::Safetensors, path, family: None, origin: "test".into() }
}

fn load(model: &ResolvedModel, mut config: serde_json::Value, device: &str) -> NativeEngine {
    config["device"] = serde_json::json!(device);
    if let Some(c) = config.as_object_mut() {
        c.entry("kv_cache_tokens").or_insert(serde_json::json!(4096));
        c.entry("max_batch_tokens").or_insert(serde_json::json!(96));
    }
    let options = EngineOptions::from_engine_config(&config).expect("engine options");
    match NativeEngine::load(model, options) {
        Ok(e) => e,
        Err(e) => panic!("loading {} on {device} ({config}) failed: {e}", model.path.display()),
    }
}

fn layouts(f32_model: bool) -> Vec<serde_json::Value> {
    let mut v = vec![
        serde_json::json!({"kv_layout": "paged-kv-first", "kv_order": "hnd", "block_size": 16}),
        serde_json::json!({"kv_layout": "token-pool"}),
        serde_json::json!({"kv_layout": "paged-packed", "block_size": 16}),
    ];
    if f32_model {
        v.push(serde_json::json!({"kv_layout": "paged-block-first", "kv_order": "nhd", "block_size": 64}));
    }
    v
}

fn prompt(len: usize, salt: u32, vocab: usize) -> Vec<u32> {
    (0..len as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761).wrapping_add(salt * 7919) >> 7) % vocab as u32)
        .collect()
}

fn spread(l: &[f32]) -> f32 {
    l.iter().cloned().fold(f32::MIN, f32::max) - l.iter().cloned().fold(f32::MAX, f32::min)
}

fn argmax(l: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in l.iter().enumerate() {
        if x > l[best] {
            best = i;
        }
    }
    best as u32
}

async fn generate(engine: &NativeEngine, id: String, ids: Vec<u32>, n: usize) -> Vec<u32> {
    let mut sampling = SamplingParams::greedy(n);
    sampling.ignore_eos = true;
    let mut stream = engine
        .submit(GenerateRequest { request_id: id, prompt: Prompt::Tokens(ids), sampling })
        .expect("submit");
    let mut out = Vec::new();
    while let Some(ev) = stream.next().await {
        match ev.expect("event") {
            TokenEvent::Delta { token_id, .. } => out.push(token_id),
            TokenEvent::Finished { .. } => break,
            TokenEvent::Prompt(_) => {}
        }
    }
    out
}

/// 4 concurrent greedy requests of different lengths.
fn greedy4(engine: &NativeEngine, vocab: usize) -> Vec<Vec<u32>> {
    let lens = [5, 70, 150, 33];
    rt().block_on(futures::future::join_all(
        lens.iter()
            .enumerate()
            .map(|(i, &len)| generate(engine, format!("g{i}"), prompt(len, i as u32, vocab), 16)),
    ))
}

/// Relative logits tolerance of a weights dtype.
fn tolerance(dtype: &str) -> f32 {
    match dtype {
        "f16" => 3e-2,
        "bf16" => 6e-2,
        _ => 1e-3,
    }
}

/// Compares the GPU engine with the CPU engine on one model, across layouts.
fn compare(label: &str, model: &ResolvedModel, dtype: &str, vocab: usize) {
    let tol = tolerance(dtype);
    let exact = dtype == "f32";
    for layout in layouts(exact) {
        let cpu = load(model, layout.clone(), "cpu");
        let gpu = load(model, layout.clone(), "cuda:0");
        let rt = rt();
        for (i, len) in [1usize, 7, 64, 150, 300].into_iter().enumerate() {
            let ids = prompt(len, 100 + i as u32, vocab);
            let c = rt.block_on(cpu.prompt_logits(ids.clone())).expect("cpu logits");
            let g = rt.block_on(gpu.prompt_logits(ids)).expect("gpu logits");
            assert_eq!(c.len(), g.len(), "{label}: vocabulary");
            let s = spread(&c);
            let d = c.iter().zip(&g).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
            eprintln!(
                "{label} {layout}: prompt {len:3} tokens: max |Δlogit| = {d:.3e} (spread {s:.2}, relative {:.3e}, limit {tol:.0e}); argmax cpu {} gpu {}",
                d / s,
                argmax(&c),
                argmax(&g)
            );
            assert!(d <= tol * s, "{label} {layout}: prompt of {len}: logits differ by {d} (spread {s})");
        }
        let want = greedy4(&cpu, vocab);
        let got = greedy4(&gpu, vocab);
        for (i, (w, g)) in want.iter().zip(&got).enumerate() {
            eprintln!("{label} {layout}: request {i}: cpu {w:?}\n{label} {layout}: request {i}: gpu {g:?}");
        }
        if exact {
            assert_eq!(got, want, "{label} {layout}: greedy tokens of 4 concurrent requests differ");
        } else {
            // Teacher-forced along the CPU's path: each GPU choice is the CPU's, or a near tie.
            for (i, w) in want.iter().enumerate() {
                let base = prompt([5, 70, 150, 33][i], i as u32, vocab);
                for k in 0..w.len() {
                    let ids: Vec<u32> = base.iter().chain(&w[..k]).copied().collect();
                    let c = rt.block_on(cpu.prompt_logits(ids.clone())).expect("cpu logits");
                    let g = rt.block_on(gpu.prompt_logits(ids)).expect("gpu logits");
                    let (gc, gg) = (argmax(&c), argmax(&g));
                    let gap = c[gc as usize] - c[gg as usize];
                    assert!(
                        gc == gg || gap <= tol * spread(&c),
                        "{label} {layout}: request {i} step {k}: gpu picks {gg}, cpu {gc} ahead by {gap}"
                    );
                }
            }
            // And along the GPU's own path, whose tokens came from decode steps (the decode
            // attention) rather than prompt passes: each is the CPU's choice or a near tie.
            let prompts: Vec<Vec<u32>> =
                [5, 70, 150, 33].iter().enumerate().map(|(i, &len)| prompt(len, i as u32, vocab)).collect();
            decoded_as_the_cpu(&format!("{label} {layout}"), &cpu, &prompts, &got, tol);
            eprintln!("{label} {layout}: greedy paths agree up to near ties (teacher-forced, both paths)");
        }
    }
}

/// Each token the GPU decoded after `prompts[i]` (`decoded[i]`) is the CPU's greedy choice on
/// the same prefix, or within `tol` of the logits' spread behind it (a near tie).
fn decoded_as_the_cpu(label: &str, cpu: &NativeEngine, prompts: &[Vec<u32>], decoded: &[Vec<u32>], tol: f32) {
    let rt = rt();
    for (i, (base, g)) in prompts.iter().zip(decoded).enumerate() {
        for k in 0..g.len() {
            let ids: Vec<u32> = base.iter().chain(&g[..k]).copied().collect();
            let c = rt.block_on(cpu.prompt_logits(ids)).expect("cpu logits");
            let gc = argmax(&c);
            let gap = c[gc as usize] - c[g[k] as usize];
            assert!(
                gc == g[k] || gap <= tol * spread(&c),
                "{label}: request {i} decode step {k}: gpu decoded {}, cpu picks {gc} ahead by {gap}",
                g[k]
            );
        }
    }
}

/// Decode steps of many sequences of very different lengths, as a serving batch has: the
/// decode attention deals a step's blocks to the sequences by length (a long context takes
/// more splits of its keys than the grid's even share, a short one fewer), and the tokens it
/// decodes are still the CPU's or near ties. 32 sequences of 40 to 900 tokens: on a GPU of
/// 132 SMs the even share is 3 splits a sequence, which the longest outgrow.
#[test]
fn decode_of_mixed_lengths_matches_the_cpu() {
    if !gpu_enabled("decode_of_mixed_lengths_matches_the_cpu") {
        return;
    }
    let dir = scratch();
    for (arch, dt, name) in
        [(Arch::Llama, candle_core::DType::F16, "f16"), (Arch::Qwen3, candle_core::DType::BF16, "bf16")]
    {
        let m = make_model(dir.path(), arch, dt);
        let config = serde_json::json!({"kv_cache_tokens": 16384, "max_batch_tokens": 2048});
        let cpu = load(&m, config.clone(), "cpu");
        let gpu = load(&m, config, "cuda:0");
        let prompts: Vec<Vec<u32>> =
            (0..32).map(|i| prompt([40, 900, 100, 400][i % 4], 200 + i as u32, VOCAB)).collect();
        let decoded = rt().block_on(futures::future::join_all(
            prompts.iter().enumerate().map(|(i, p)| generate(&gpu, format!("m{i}"), p.clone(), 8)),
        ));
        assert!(decoded.iter().all(|d| d.len() == 8), "{arch:?}/{name}: 8 tokens per request");
        decoded_as_the_cpu(
            &format!("{arch:?}/{name} mixed lengths"),
            &cpu,
            &prompts,
            &decoded,
            tolerance(name),
        );
        eprintln!("{arch:?}/{name}: 32 sequences of 40-900 tokens decode as the CPU (up to near ties)");
    }
}

#[test]
fn tiny_models_match_the_cpu_in_f32() {
    if !gpu_enabled("tiny_models_match_the_cpu_in_f32") {
        return;
    }
    let dir = scratch();
    for arch in [Arch::Llama, Arch::Qwen2, Arch::Qwen3] {
        let m = make_model(dir.path(), arch, candle_core::DType::F32);
        compare(&format!("{arch:?}/f32"), &m, "f32", VOCAB);
    }
}

#[test]
fn tiny_models_match_the_cpu_in_half_precision() {
    if !gpu_enabled("tiny_models_match_the_cpu_in_half_precision") {
        return;
    }
    let dir = scratch();
    for (arch, dt, name) in [
        (Arch::Llama, candle_core::DType::F16, "f16"),
        (Arch::Qwen2, candle_core::DType::BF16, "bf16"),
        (Arch::Qwen3, candle_core::DType::BF16, "bf16"),
        (Arch::Qwen3, candle_core::DType::F16, "f16"),
    ] {
        let m = make_model(dir.path(), arch, dt);
        compare(&format!("{arch:?}/{name}"), &m, name, VOCAB);
    }
}

#[test]
fn smollm2_gguf_matches_the_cpu() {
    if !gpu_enabled("smollm2_gguf_matches_the_cpu") {
        return;
    }
    let Some(path) = std::env::var_os("XINF_TEST_SMOLLM2").map(PathBuf::from) else {
        eprintln!(
            "SKIPPED smollm2_gguf_matches_the_cpu: set XINF_TEST_SMOLLM2 to SmolLM2-135M-Instruct.Q4_1.gguf"
        );
        return;
    };
    let m = ResolvedModel { format: WeightsFormat::Gguf, path, family: None, origin: "test".into() };
    compare("SmolLM2/gguf-f32", &m, "f32", 49_152);
}

#[test]
fn make_tiny_checkpoints_match_the_cpu() {
    if !gpu_enabled("make_tiny_checkpoints_match_the_cpu") {
        return;
    }
    let Some(gguf) = std::env::var_os("XINF_TEST_SMOLLM2") else {
        eprintln!(
            "SKIPPED make_tiny_checkpoints_match_the_cpu: make_tiny.py needs XINF_TEST_SMOLLM2 (its tokenizer)"
        );
        return;
    };
    let python = std::env::var("XINF_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden/make_tiny.py");
    let script = if script.is_file() { script } else { PathBuf::from("tests/golden/make_tiny.py") };
    let dir = scratch();
    let status = std::process::Command::new(&python)
        .arg(&script)
        .arg("--gguf")
        .arg(&gguf)
        .arg("--out")
        .arg(dir.path())
        .status()
        .expect("run make_tiny.py");
    assert!(status.success(), "make_tiny.py failed");
    for (name, dt) in [
        ("tiny-llama", "f32"),
        ("tiny-qwen2", "f32"),
        ("tiny-qwen3", "f32"),
        ("tiny-llama-f16", "f16"),
        ("tiny-qwen3-bf16", "bf16"),
    ] {
        let m = ResolvedModel {
            format: WeightsFormat::Safetensors,
            path: dir.path().join(name),
            family: None,
            origin: "test".into(),
        };
        compare(name, &m, dt, 49_152);
    }
}

/// Pinned prefill, export, import: the GPU's pages equal the CPU's, and a GPU engine of another
/// layout continues from them exactly as the CPU does.
#[test]
fn pages_move_between_gpu_engines() {
    if !gpu_enabled("pages_move_between_gpu_engines") {
        return;
    }
    let dir = scratch();
    let rt = rt();
    for arch in [Arch::Llama, Arch::Qwen3] {
        let model = make_model(dir.path(), arch, candle_core::DType::F32);
        let fa = serde_json::json!({"kv_layout": "paged-kv-first", "kv_order": "hnd", "block_size": 16});
        let pool = serde_json::json!({"kv_layout": "token-pool"});
        let cpu = load(&model, fa.clone(), "cpu");
        let gpu = load(&model, fa, "cuda:0");
        let gpu2 = load(&model, pool, "cuda:0");
        for len in [40usize, 130] {
            let ids = prompt(len, 7, VOCAB);
            let req = |id: &str| GenerateRequest {
                request_id: id.into(),
                prompt: Prompt::Tokens(ids.clone()),
                sampling: SamplingParams::greedy(1),
            };
            let pc = rt.block_on(cpu.prefill_pinned(req("p"))).expect("cpu prefill");
            let pg = rt.block_on(gpu.prefill_pinned(req("p"))).expect("gpu prefill");
            assert_eq!(pc.first_token, pg.first_token, "{arch:?}: first token");
            let count = len.div_ceil(64);
            let bc = rt.block_on(cpu.export_pages("p", 0, count)).expect("cpu export");
            let bg = rt.block_on(gpu.export_pages("p", 0, count)).expect("gpu export");
            assert_eq!(bc.len(), bg.len(), "{arch:?}: page bytes");
            let f = |b: &[u8]| -> Vec<f32> {
                b.chunks_exact(4).map(|w| f32::from_le_bytes([w[0], w[1], w[2], w[3]])).collect()
            };
            let (vc, vg) = (f(&bc), f(&bg));
            let max = vc.iter().fold(0.0f32, |m, x| m.max(x.abs()));
            let d = vc.iter().zip(&vg).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
            eprintln!("{arch:?}: {len}-token prompt: {count} pages, max |ΔKV| = {d:.3e} (max |KV| {max:.2})");
            assert!(d <= 1e-3 * max, "{arch:?}: exported pages differ by {d}");
            cpu.release_pinned("p");
            gpu.release_pinned("p");
            // GPU → GPU (FlashAttention HND → token pool), then greedy on.
            let mut sampling = SamplingParams::greedy(12);
            sampling.ignore_eos = true;
            let kv = ImportedKv {
                prompt_ids: ids.clone(),
                first_token: pg.first_token,
                first_logprobs: None,
                pages: bg.into(),
            };
            let stream = gpu2
                .submit_imported(
                    GenerateRequest {
                        request_id: format!("i{len}"),
                        prompt: Prompt::Tokens(ids.clone()),
                        sampling,
                    },
                    kv,
                )
                .expect("import");
            let got: Vec<u32> = rt.block_on(
                stream
                    .filter_map(|e| async move {
                        match e.expect("event") {
                            TokenEvent::Delta { token_id, .. } => Some(token_id),
                            _ => None,
                        }
                    })
                    .collect(),
            );
            let want = rt.block_on(generate(&cpu, format!("c{len}"), ids, 12));
            eprintln!(
                "{arch:?}: {len}: imported continuation {got:?}\n{arch:?}: {len}: cpu                    {want:?}"
            );
            assert_eq!(got, want, "{arch:?}: continuation after GPU→GPU import");
        }
    }
}

/// 4 concurrent greedy requests of different prompt lengths, `n` tokens each, ids tagged `tag`.
fn greedy4_tagged(engine: &NativeEngine, tag: &str, n: usize) -> Vec<Vec<u32>> {
    let lens = [5, 70, 150, 33];
    rt().block_on(futures::future::join_all(
        lens.iter()
            .enumerate()
            .map(|(i, &len)| generate(engine, format!("{tag}{i}"), prompt(len, i as u32, VOCAB), n)),
    ))
}

/// Decode steps replayed from CUDA graphs give exactly the tokens of the same steps launched
/// one kernel at a time (the same kernels and gemms with the same arguments), and graphs are
/// really replayed: mixed prefill/decode steps run eagerly, and decode steps replay the graph
/// of their batch size, which the model's warm-up at load ran once and captured.
#[test]
fn cuda_graphs_decode_exactly_as_eager_launches() {
    if !gpu_enabled("cuda_graphs_decode_exactly_as_eager_launches") {
        return;
    }
    let dir = scratch();
    for (arch, dt) in [(Arch::Qwen2, candle_core::DType::F16), (Arch::Llama, candle_core::DType::F32)] {
        let model = make_model(dir.path(), arch, dt);
        for layout in layouts(false) {
            let label = format!("{arch:?}/{dt:?} {layout}");
            let mut graphs_off = layout.clone();
            graphs_off["cuda_graphs"] = serde_json::json!(false);
            let eager = load(&model, graphs_off, "cuda:0");
            let graphed = load(&model, layout.clone(), "cuda:0");
            let want = greedy4_tagged(&eager, "e", 24);
            let got = greedy4_tagged(&graphed, "g", 24);
            // Again on the same engine: graphs captured in the first round, replayed now.
            let before = graphed.graph_steps();
            let again = greedy4_tagged(&graphed, "a", 24);
            let replayed = graphed.graph_steps();
            for (i, (w, g)) in want.iter().zip(&got).enumerate() {
                eprintln!("{label}: request {i}: eager  {w:?}\n{label}: request {i}: graphs {g:?}");
            }
            eprintln!(
                "{label}: {before} steps replayed in the first round, {} in the second; eager engine: {}",
                replayed - before,
                eager.graph_steps()
            );
            assert!(want.iter().all(|w| w.len() == 24), "{label}: 24 tokens per request");
            assert_eq!(got, want, "{label}: tokens with CUDA graphs differ from eager launches");
            assert_eq!(again, want, "{label}: tokens from graphs captured earlier differ");
            assert_eq!(eager.graph_steps(), 0, "{label}: graphs replayed with cuda_graphs off");
            assert!(before > 0, "{label}: no decode step was replayed from a graph");
            assert!(replayed > before, "{label}: no step replayed in the second round");
            eprintln!("{label}: programmatic edges in the captured graphs: {}", graphed.graph_links());
            assert_eq!(eager.graph_links(), 0, "{label}: graph edges with cuda_graphs off");
            if hopper_or_later() {
                // A driver of CUDA 12.3 or later is assumed (the H200 machines run 13).
                assert!(graphed.graph_links() > 0, "{label}: no programmatic edge between kernels on sm_90+");
            }
        }
    }
}

/// Whether GPU 0 is of compute capability 9.0 or later (programmatic dependent launch); a
/// build without the `cuda` feature runs no GPU.
fn hopper_or_later() -> bool {
    #[cfg(feature = "cuda")]
    {
        let ctx = cudarc::driver::CudaContext::new(0).expect("GPU 0");
        ctx.compute_capability().expect("compute capability").0 >= 9
    }
    #[cfg(not(feature = "cuda"))]
    false
}

#[test]
fn a_missing_gpu_is_an_error_not_a_panic() {
    // Runs everywhere: without the `cuda` feature, or with it on a host without this GPU, the
    // load fails with an error naming `device`.
    let dir = scratch();
    let model = make_model(dir.path(), Arch::Llama, candle_core::DType::F32);
    let options =
        EngineOptions::from_engine_config(&serde_json::json!({"device": "cuda:97"})).expect("options");
    match NativeEngine::load(&model, options) {
        Ok(_) => panic!("a GPU of ordinal 97 loaded"),
        Err(e) => {
            eprintln!("cuda:97: {e}");
            assert!(e.to_string().contains("device") || e.to_string().contains("cuda:97"), "{e}");
        }
    }
}

#[path = "gpu/prompt.rs"]
mod prompt_logprobs;
#[path = "gpu/timing.rs"]
mod timing;
