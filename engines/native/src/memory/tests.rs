use super::*;

const GIB: u64 = 1 << 30;

/// An 80 GiB GPU, 10 GiB of weights, 1 GiB reserve, 128 KiB per token, blocks of 16.
fn budget(fraction: f64) -> MemoryBudget {
    MemoryBudget {
        total_memory: 80 * GIB,
        fraction,
        weight_bytes: 10 * GIB,
        reserve_bytes: GIB,
        bytes_per_token: 128 << 10,
        block_size: 16,
    }
}

fn field_of(e: &EngineError) -> &str {
    match e {
        EngineError::InvalidRequest { field, .. } => field,
        other => panic!("not an invalid-request error: {other:?}"),
    }
}

#[test]
fn bytes_per_token_counts_k_and_v_of_every_layer() {
    // SmolLM2-135M: 30 layers, 3 KV heads of 64, f32 → 2·30·3·64·4.
    assert_eq!(kv_bytes_per_token(30, 3, 64, KvDtype::F32), 46_080);
    assert_eq!(kv_bytes_per_token(32, 8, 128, KvDtype::Bf16), 131_072);
}

#[test]
fn the_cache_takes_what_the_weights_and_reserve_leave() {
    // Half of 80 GiB = 40 GiB; minus 11 GiB → 29 GiB = 237,568 tokens of 128 KiB, i.e.
    // 14,848 blocks, one of them the engine's spare.
    let tokens = kv_cache_tokens(&budget(0.5), None).expect("fits");
    assert_eq!(tokens, (14_848 - 1) * 16);
    // What the engine then allocates fits in the share, and one more block would not.
    let b = budget(0.5);
    let alloc = |t: usize| ((t as u64).div_ceil(16) + 1) * 16 * b.bytes_per_token;
    assert!(b.weight_bytes + b.reserve_bytes + alloc(tokens) <= 40 * GIB);
    assert!(b.weight_bytes + b.reserve_bytes + alloc(tokens + 16) > 40 * GIB);
    // A larger share gives a larger cache.
    assert!(kv_cache_tokens(&budget(0.9), None).expect("fits") > tokens);
}

#[test]
fn too_small_a_share_names_the_field_with_the_numbers() {
    // 10% of 80 GiB = 8 GiB < 10 GiB of weights.
    let e = kv_cache_tokens(&budget(0.1), None).expect_err("weights do not fit");
    assert_eq!(field_of(&e), "engine_config.gpu_memory_utilization");
    let text = e.to_string();
    for part in ["0.1", "80.00 GiB", "8.00 GiB", "10.00 GiB", "1.00 GiB"] {
        assert!(text.contains(part), "`{text}` should contain `{part}`");
    }
}

#[test]
fn an_explicit_cache_wins_when_it_fits() {
    assert_eq!(kv_cache_tokens(&budget(0.5), Some(4096)), Ok(4096));
    // 300,000 tokens of 128 KiB ≈ 36.6 GiB: more than the 29 GiB left.
    let e = kv_cache_tokens(&budget(0.5), Some(300_000)).expect_err("does not fit");
    assert_eq!(field_of(&e), "engine_config.gpu_memory_utilization");
    assert!(e.to_string().contains("kv_cache_tokens = 300000"), "{e}");
}

#[test]
fn the_whole_gpu_is_a_valid_share() {
    assert!(kv_cache_tokens(&budget(1.0), None).expect("fits") > 0);
}

#[test]
fn a_fraction_on_the_cpu_is_refused() {
    let options = EngineOptions { gpu_memory_utilization: Some(0.5), ..EngineOptions::default() };
    let cfg = crate::test_support::small_llama();
    let e = fit_kv_cache(options, &cfg, [KvDtype::F32; 2], 0).expect_err("a CPU has no GPU memory");
    assert_eq!(field_of(&e), "engine_config.gpu_memory_utilization");
    // Without a fraction nothing changes.
    let plain = EngineOptions::default();
    assert_eq!(fit_kv_cache(plain.clone(), &cfg, [KvDtype::F32; 2], 0), Ok(plain));
}

#[test]
fn a_kv_cache_larger_than_the_machine_is_refused_naming_the_limit() {
    let cfg = crate::test_support::small_llama();
    let absurd = EngineOptions {
        kv_cache_tokens: 1 << 62,
        kv_cache_tokens_explicit: true,
        ..EngineOptions::default()
    };
    let e = fit_kv_cache(absurd, &cfg, [KvDtype::F32; 2], 0).expect_err("2^62 tokens fit in no machine");
    assert_eq!(field_of(&e), "engine_config.kv_cache_tokens");
    let text = e.to_string();
    assert!(text.contains("this machine's memory") && text.contains("at most"), "{text}");
    // The default cache fits.
    let plain = EngineOptions::default();
    assert_eq!(fit_kv_cache(plain.clone(), &cfg, [KvDtype::F32; 2], 0), Ok(plain));
}

#[test]
fn a_cpu_replica_holds_its_weights_in_f32_and_its_kv_cache() {
    // SmolLM2-135M's shapes: 134.5 M parameters (tied embeddings).
    let cfg = ModelConfig::from_hf_json(
        &serde_json::json!({
            "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 576,
            "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
            "num_key_value_heads": 3, "vocab_size": 49152, "rms_norm_eps": 1e-5,
            "max_position_embeddings": 8192, "tie_word_embeddings": true, "eos_token_id": 2
        })
        .to_string(),
        "config.json",
    )
    .expect("a valid config");
    assert_eq!(param_count(&cfg), 134_479_872);
    let options = EngineOptions { kv_cache_tokens: 8192, ..EngineOptions::default() };
    // 8,192 tokens in blocks of the layout's size, plus the spare block, at 46,080 bytes each.
    let block = options.kv_layout.block_size as u64;
    let cache = (8192u64.div_ceil(block) + 1) * block * 46_080;
    assert_eq!(host_bytes(cpu_weight_bytes(&cfg, None, &options), &cfg, &options), 134_479_872 * 4 + cache);
    // Untied embeddings count the LM head too.
    let untied = ModelConfig { tie_word_embeddings: false, ..cfg };
    assert_eq!(param_count(&untied), 134_479_872 + 49_152 * 576);
}

#[test]
fn step_buffers_grow_with_the_step_and_the_sequences() {
    let mut cfg = crate::test_support::small_llama();
    // Llama-3.1-8B's shape in f16: 114,688 bytes a token (Q, residual stream, QKV, activations
    // and gate/up), 779,264 a sequence (logits and 16 partials of 130 floats a head); Q in an
    // f32 cache takes 8,192 more.
    (cfg.hidden_size, cfg.num_heads, cfg.kv_heads, cfg.head_dim) = (4096, 32, 8, 128);
    (cfg.intermediate_size, cfg.vocab_size) = (14_336, 128_256);
    let f16 = [KvDtype::F16, KvDtype::F16];
    assert_eq!(step_buffer_bytes(&cfg, 1, 0, f16), 114_688);
    assert_eq!(step_buffer_bytes(&cfg, 1, 0, [KvDtype::F16, KvDtype::F32]), 122_880);
    assert_eq!(step_buffer_bytes(&cfg, 0, 1, f16), 779_264);
    // At 8,192 tokens and 64 sequences: 0.99 GB; at 16,384 tokens 1.93 GB, more than a fixed
    // 1 GiB reserve held.
    assert_eq!(step_buffer_bytes(&cfg, 8192, 64, f16), 8192 * 114_688 + 64 * 779_264);
    assert!(step_buffer_bytes(&cfg, 16_384, 64, f16) > GIB);
}
