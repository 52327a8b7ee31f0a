use super::*;

/// Qwen2.5-0.5B-Instruct's published config (the fields that set the shapes).
fn qwen25_05b() -> Value {
    serde_json::json!({
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 896,
        "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
        "num_key_value_heads": 2, "vocab_size": 151936, "tie_word_embeddings": true,
        "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
        "torch_dtype": "bfloat16"
    })
}

#[test]
fn shapes_give_the_published_parameter_count() {
    let shapes = tensor_shapes(&qwen25_05b()).expect("shapes");
    let n: usize = shapes.iter().map(|(_, s, _)| s.iter().product::<usize>()).sum();
    // Qwen2.5-0.5B: 494,032,768 parameters (tied embeddings).
    assert_eq!(n, 494_032_768);
    assert!(shapes.iter().any(|(n, _, _)| n == "model.layers.23.self_attn.k_proj.bias"));
    assert!(!shapes.iter().any(|(n, _, _)| n == "lm_head.weight"));
    let mut bad = qwen25_05b();
    bad["model_type"] = "gpt2".into();
    assert!(tensor_shapes(&bad).is_err());
    bad = qwen25_05b();
    bad["hidden_size"] = "896".into();
    assert!(tensor_shapes(&bad).is_err());
}

#[test]
fn weights_have_the_asked_scale_and_repeat_by_seed() {
    let mut a = SplitMix64::new(7);
    let xs: Vec<f32> = (0..100_000).map(|_| a.uniform(0.02 * 3f32.sqrt())).collect();
    let var = xs.iter().map(|x| x * x).sum::<f32>() / xs.len() as f32;
    assert!((var.sqrt() - 0.02).abs() < 0.001, "std {}", var.sqrt());
    let mut b = SplitMix64::new(7);
    assert_eq!(xs[..10], (0..10).map(|_| b.uniform(0.02 * 3f32.sqrt())).collect::<Vec<_>>()[..]);
    assert_eq!(RandomDtype::parse("bfloat16"), Some(RandomDtype::Bf16));
    assert_eq!(RandomDtype::parse("int8"), None);
}

#[test]
fn weights_are_the_same_bytes_whatever_the_threads() {
    let a = 0.02 * 3f32.sqrt();
    for dtype in [RandomDtype::F16, RandomDtype::Bf16, RandomDtype::F32] {
        // Past one part of 64 Ki elements, and not a multiple of it, from a stream already begun.
        let n = 3 * (1 << 16) + 12_345;
        let mut rng = SplitMix64::new(11);
        rng.skip(1_000);
        let mut one_by_one = SplitMix64::new(11);
        for _ in 0..1_000 {
            one_by_one.next_u64();
        }
        let mut want = vec![0u8; n * dtype.size()];
        want.chunks_exact_mut(dtype.size()).for_each(|e| dtype.put(one_by_one.uniform(a), e));
        for threads in [1, 2, 3, 8] {
            let mut got = vec![0u8; n * dtype.size()];
            fill_uniform(dtype, &rng, a, &mut got, threads);
            assert!(got == want, "{dtype:?} on {threads} threads");
        }
        // The generator the caller keeps is not moved; skipping past the part continues it.
        rng.skip(n as u64);
        assert_eq!(rng.next_u64(), one_by_one.next_u64());
    }
}
