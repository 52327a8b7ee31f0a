use super::*;

#[test]
fn a_prefill_answer_gives_its_first_token_and_room() {
    let ep = r#"{"process":7,"provider":1,"tcp":"127.0.0.1:4000"}"#;
    let dev = r#"{"host":"h","ordinal":0}"#;
    let v = json!({"choices": [{"token_ids": [42]}],
                   "kv_transfer_params": {"xinf": {"room": 9, "endpoint": ep, "device": dev, "pages": 2}}});
    let (first, room) = prefill_answer(Flavor::Vllm, &v, 9).expect("answer");
    assert_eq!(first, 42);
    assert_eq!(room.endpoint, Endpoint { process: 7, provider: 1, tcp: "127.0.0.1:4000".into() });
    assert_eq!(room.device, Some(KvDevice { host: "h".into(), ordinal: 0 }));
    // An object works as well as its text, and a host-memory room has no device.
    let v = json!({"choices": [{"token_ids": [1]}],
                   "kv_transfer_params": {"xinf": {"room": 9, "endpoint": {"process":7,"provider":1,"tcp":"x:1"}, "device": null}}});
    assert_eq!(prefill_answer(Flavor::Vllm, &v, 9).expect("answer").1.device, None);
}

#[test]
fn a_prefill_answer_without_a_room_says_what_to_check() {
    for v in [
        json!({"choices": [{"token_ids": [1]}]}),
        json!({"choices": [{"token_ids": [1]}], "kv_transfer_params": {"xinf": {"room": 8, "endpoint": "{}"}}}),
        json!({"choices": [{"token_ids": []}], "kv_transfer_params": {"xinf": {"room": 9}}}),
        json!({"choices": [{"token_ids": [1]}], "kv_transfer_params": {"xinf": {"room": 9, "endpoint": "not json"}}}),
    ] {
        let e = prefill_answer(Flavor::Vllm, &v, 9).expect_err("refused");
        assert!(matches!(e, EngineError::Process(ref m) if m.contains("xinf_kv")), "{e}");
    }
}

#[test]
fn the_fetch_fields_are_what_the_connector_parses() {
    let kv = RemoteKv {
        prompt_ids: vec![1, 2, 3],
        first_token: 4,
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
