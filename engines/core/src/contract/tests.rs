use super::*;

fn contract() -> ModelContract {
    ModelContract {
        architecture: "llama".into(),
        dtype: KvDtype::F32,
        num_layers: 30,
        num_heads: 9,
        kv_heads: 3,
        head_dim: 64,
        vocab_size: 49152,
        context_length: 8192,
        rope_theta: 100_000.0,
        weights_digest: "w1".into(),
        tokenizer_digest: "t1".into(),
    }
}

#[test]
fn the_first_difference_is_named_as_in_the_api() {
    let a = contract();
    assert_eq!(a.first_difference(&a.clone()), None);
    type Change = fn(&mut ModelContract);
    let cases: [(&str, Change); 6] = [
        ("weights", |c| c.weights_digest = "w2".into()),
        ("tokenizer", |c| c.tokenizer_digest = "t2".into()),
        ("architecture", |c| c.architecture = "qwen2".into()),
        ("dtype", |c| c.dtype = KvDtype::F16),
        ("context_length", |c| c.context_length = 4096),
        ("rope_theta", |c| c.rope_theta = 10_000.0),
    ];
    for (field, change) in cases {
        let mut b = contract();
        change(&mut b);
        assert_eq!(a.first_difference(&b), Some(field));
        assert_eq!(b.first_difference(&a), Some(field));
    }
    // Weights are named first: other weights explain every other difference.
    let mut b = contract();
    b.weights_digest = "w2".into();
    b.context_length = 1;
    assert_eq!(a.first_difference(&b), Some("weights"));
    assert_eq!(a.page_bytes(), 30 * 2 * 64 * 3 * 64 * 4);
}
