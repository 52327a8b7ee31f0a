use super::*;

#[test]
fn a_prefill_answer_gives_its_first_token_and_room() {
    let ep = r#"{"process":7,"provider":1,"tcp":"127.0.0.1:4000"}"#;
    let dev = r#"{"host":"h","ordinal":0}"#;
    let v = json!({"choices": [{"token_ids": [42]}],
                   "kv_transfer_params": {"xinf": {"room": 9, "endpoint": ep, "device": dev, "pages": 2}}});
    let a = prefill_answer(Flavor::Vllm, &v, 9, None, false).expect("answer");
    let (first, room) = (a.first_token, a.room);
    assert_eq!(first, 42);
    assert_eq!(room.endpoint, Endpoint { process: 7, provider: 1, tcp: "127.0.0.1:4000".into() });
    assert_eq!(room.device, Some(KvDevice { host: "h".into(), ordinal: 0 }));
    // An object works as well as its text, and a host-memory room has no device.
    let v = json!({"choices": [{"token_ids": [1]}],
                   "kv_transfer_params": {"xinf": {"room": 9, "endpoint": {"process":7,"provider":1,"tcp":"x:1"}, "device": null}}});
    assert_eq!(prefill_answer(Flavor::Vllm, &v, 9, None, false).expect("answer").room.device, None);
}

#[test]
fn a_prefill_answer_without_a_room_says_what_to_check() {
    for v in [
        json!({"choices": [{"token_ids": [1]}]}),
        json!({"choices": [{"token_ids": [1]}], "kv_transfer_params": {"xinf": {"room": 8, "endpoint": "{}"}}}),
        json!({"choices": [{"token_ids": []}], "kv_transfer_params": {"xinf": {"room": 9}}}),
        json!({"choices": [{"token_ids": [1]}], "kv_transfer_params": {"xinf": {"room": 9, "endpoint": "not json"}}}),
    ] {
        let e = prefill_answer(Flavor::Vllm, &v, 9, None, false).expect_err("refused");
        assert!(matches!(e, EngineError::Process(ref m) if m.contains("xinf_kv")), "{e}");
    }
}

#[test]
fn the_fetch_fields_are_what_the_connector_parses() {
    let kv = RemoteKv {
        prompt_ids: vec![1, 2, 3],
        first_token: 4,
        first_text: None,
        first_logprobs: None,
        room: 5,
        endpoint: Endpoint { process: 1, provider: 2, tcp: "127.0.0.1:9".into() },
        device: None,
        pages: 1,
    };
    assert_eq!(
        fetch_params(&kv),
        json!({"xinf": {"fetch": {"room": 5, "endpoint": {"process": 1, "provider": 2, "tcp": "127.0.0.1:9"},
                                   "device": null, "prompt_len": 3}}})
    );
    assert_eq!(prefill_params(5), json!({"xinf": {"room": 5, "lease_ms": LEASE_MS}}));
}

fn contract() -> ModelContract {
    ModelContract {
        architecture: "Qwen2ForCausalLM".into(),
        dtype: xinf_engine::KvDtype::Bf16,
        num_layers: 4,
        num_heads: 8,
        kv_heads: 2,
        head_dim: 64,
        vocab_size: 4096,
        context_length: 2048,
        rope_theta: 1e6,
        weights_digest: "w".into(),
        tokenizer_digest: "t".into(),
    }
}

/// The JSON inside a ticket (what `xinf_kv.params.parse_ticket` decodes).
fn untick(host: &Value) -> Value {
    let hex = host.as_str().and_then(|h| h.strip_prefix("xinf-")).expect("a ticket");
    assert!(!hex.contains(':'), "SGLang would read a host with ':' as IPv6");
    let bytes: Vec<u8> =
        (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex")).collect();
    serde_json::from_slice(&bytes).expect("JSON")
}

#[test]
fn sglang_legs_carry_their_handoff_in_the_bootstrap_fields() {
    let c = contract();
    let shape = json!({"layers": 4, "kv_heads": 2, "head_dim": 64, "elem_bytes": 2});
    let p = sglang_prefill_fields(77, &c);
    assert_eq!(p["bootstrap_room"], 77);
    assert_eq!(untick(&p["bootstrap_host"]), json!({"lease_ms": LEASE_MS, "shape": shape}));
    let kv = RemoteKv {
        prompt_ids: vec![1, 2, 3],
        first_token: 4,
        first_text: None,
        first_logprobs: None,
        room: 5,
        endpoint: Endpoint { process: 1, provider: 2, tcp: "127.0.0.1:9".into() },
        device: Some(KvDevice { host: "h".into(), ordinal: 0 }),
        pages: 1,
    };
    let d = sglang_fetch_fields(&kv, &c);
    assert_eq!(d["bootstrap_room"], 5);
    assert_eq!(
        untick(&d["bootstrap_host"]),
        json!({"fetch": {"endpoint": {"process": 1, "provider": 2, "tcp": "127.0.0.1:9"},
                         "device": {"host": "h", "ordinal": 0}, "prompt_len": 3, "first_token": 4},
               "shape": shape})
    );
    // The first token's log-probabilities go with it, as SGLang's decode reports them.
    let entry =
        |token_id: u32, logprob: f32| xinf_engine::Logprob { token_id, token: String::new(), logprob };
    let kv = RemoteKv {
        first_logprobs: Some(Box::new(xinf_engine::TokenLogprobs {
            chosen: entry(4, -0.5),
            top: vec![entry(4, -0.5), entry(9, f32::NEG_INFINITY)],
            rank: None,
        })),
        ..kv
    };
    let fetch = untick(&sglang_fetch_fields(&kv, &c)["bootstrap_host"])["fetch"].clone();
    let lp = &fetch["first_logprobs"];
    assert_eq!(
        (lp["logprob"].clone(), lp["top"][0].clone(), lp["top"][1][0].clone()),
        (json!(-0.5), json!([4, -0.5]), json!(9))
    );
    // Minus infinity has no JSON number: the lowest finite one goes instead.
    assert_eq!(lp["top"][1][1].as_f64().map(|x| x as f32), Some(f32::MIN));
}

#[test]
fn a_prefill_answer_gives_its_first_token_s_logprobs_in_either_engine_s_shape() {
    let ep = r#"{"process":7,"provider":1,"tcp":"127.0.0.1:4000"}"#;
    let v = json!({"choices": [{"token_ids": [42], "text": "a", "finish_reason": "length",
                                "logprobs": {"tokens": ["token_id:42"], "token_logprobs": [-0.25],
                                             "top_logprobs": [{"token_id:42": -0.25, "token_id:7": -2.0}]}}],
                   "kv_transfer_params": {"xinf": {"room": 9, "endpoint": ep}}});
    let a = prefill_answer(Flavor::Vllm, &v, 9, None, false).expect("answer");
    let want = crate::protocol::Scored { logprob: -0.25, top: vec![(42, -0.25), (7, -2.0)], rank: None };
    assert_eq!(a.first_logprobs, Some(want.clone()));
    let host =
        PageHost { endpoint: Endpoint { process: 3, provider: 1, tcp: "127.0.0.1:7".into() }, device: None };
    let v = json!({"text": "a", "output_ids": [42], "meta_info": {"finish_reason": {"type": "length"},
                   "output_token_logprobs": [[-0.25, 42, null]],
                   "output_top_logprobs": [[[-2.0, 7, null], [-0.25, 42, null]]]}});
    let a = prefill_answer(Flavor::Sglang, &v, 12, Some(&host), false).expect("answer");
    assert_eq!(a.first_logprobs, Some(want));
    // An answer to a request that asked for none has none.
    let v = json!({"text": "a", "output_ids": [42], "meta_info": {}});
    assert_eq!(
        prefill_answer(Flavor::Sglang, &v, 12, Some(&host), false).expect("answer").first_logprobs,
        None
    );
}

#[test]
fn an_sglang_prefill_answer_gives_its_first_token_and_the_server_s_page_host() {
    let host =
        PageHost { endpoint: Endpoint { process: 3, provider: 1, tcp: "127.0.0.1:7".into() }, device: None };
    let v = json!({"text": "a", "output_ids": [311], "meta_info": {"finish_reason": {"type": "length"}}});
    let a = prefill_answer(Flavor::Sglang, &v, 12, Some(&host), false).expect("answer");
    assert_eq!((a.first_token, a.room.room, a.room.endpoint), (311, 12, host.endpoint.clone()));
    assert_eq!(a.first_text.as_deref(), Some("a"));
    let e = prefill_answer(Flavor::Sglang, &v, 12, None, false).expect_err("no page host");
    assert!(e.to_string().contains("named no page server"), "{e}");
    let e = prefill_answer(Flavor::Sglang, &json!({"output_ids": []}), 12, Some(&host), false)
        .expect_err("no token");
    assert!(e.to_string().contains("no token id"), "{e}");
}

#[test]
fn the_page_host_file_is_read_or_its_absence_explained() {
    let dir = std::env::temp_dir().join(format!("xinf-pagehost-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("kv.json");
    let e = PageHost::read(&path).expect_err("missing");
    assert!(e.to_string().contains("is xinf_kv installed"), "{e}");
    std::fs::write(&path, r#"{"endpoint": {"process": 1, "provider": 2, "tcp": "127.0.0.1:5"}, "device": {"host": "h", "ordinal": 0}}"#)
        .expect("write");
    let h = PageHost::read(&path).expect("read");
    assert_eq!(h.device, Some(KvDevice { host: "h".into(), ordinal: 0 }));
    std::fs::write(&path, "[]").expect("write");
    assert!(PageHost::read(&path).is_err());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_first_token_is_shown_early_only_when_whole_and_nothing_can_hold_it_back() {
    let ep = r#"{"process":7,"provider":1,"tcp":"127.0.0.1:4000"}"#;
    let vllm = |text: &str, reason: &str| {
        json!({"choices": [{"token_ids": [42], "text": text, "finish_reason": reason}],
               "kv_transfer_params": {"xinf": {"room": 9, "endpoint": ep}}})
    };
    let text =
        |v: &Value, stops: bool| prefill_answer(Flavor::Vllm, v, 9, None, stops).expect("answer").first_text;
    assert_eq!(text(&vllm(" Hello", "length"), false).as_deref(), Some(" Hello"));
    // A stop token ended it, the request has stop strings, a partial character, no text.
    assert_eq!(text(&vllm("", "stop"), false), None);
    assert_eq!(text(&vllm(" Hello", "length"), true), None);
    assert_eq!(text(&vllm("\u{FFFD}", "length"), false), None);
    assert_eq!(text(&vllm("", "length"), false), None);
    let host =
        PageHost { endpoint: Endpoint { process: 3, provider: 1, tcp: "127.0.0.1:7".into() }, device: None };
    let v = json!({"text": "b", "output_ids": [311], "meta_info": {"finish_reason": {"type": "stop"}}});
    let a = prefill_answer(Flavor::Sglang, &v, 12, Some(&host), false).expect("answer");
    assert_eq!(a.first_text, None);
}
