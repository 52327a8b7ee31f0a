use super::*;

#[test]
fn vllm_chunks_carry_ids_text_finish_and_usage() {
    let c = parse_chunk(
        Flavor::Vllm,
        r#"{"choices":[{"index":0,"text":" hi","token_ids":[5,6],"finish_reason":null}],"usage":null}"#,
    )
    .expect("parse")
    .expect("chunk");
    assert_eq!(c, Chunk { token_ids: vec![5, 6], text: " hi".into(), ..Chunk::default() });
    let c =
        parse_chunk(Flavor::Vllm, r#"{"choices":[{"text":"","token_ids":[7],"finish_reason":"length"}]}"#)
            .expect("parse")
            .expect("chunk");
    assert_eq!(c.finish, Some(FinishReason::Length));
    let c = parse_chunk(Flavor::Vllm, r#"{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}"#)
        .expect("parse")
        .expect("chunk");
    assert_eq!(c.usage, Some(Usage { prompt_tokens: 3, completion_tokens: 2 }));
    assert_eq!(parse_chunk(Flavor::Vllm, "[DONE]").expect("done"), None);
    let e = parse_chunk(Flavor::Vllm, r#"{"error":{"message":"bad things","code":400}}"#).expect_err("error");
    assert_eq!(e, EngineError::Rejected("bad things".into()));
    let e = parse_chunk(Flavor::Vllm, r#"{"error":{"message":"","type":"InternalServerError","code":500}}"#)
        .expect_err("error");
    assert_eq!(
        e,
        EngineError::Internal("the vllm server failed on the request: InternalServerError (code 500)".into())
    );
    assert!(parse_chunk(Flavor::Vllm, "not json").is_err());
}

#[test]
fn sglang_chunks_carry_ids_and_meta_info() {
    let c = parse_chunk(
        Flavor::Sglang,
        r#"{"text":"ab","output_ids":[9],"meta_info":{"finish_reason":null,"prompt_tokens":4,"completion_tokens":1}}"#,
    )
    .expect("parse")
    .expect("chunk");
    assert_eq!(c, Chunk { token_ids: vec![9], text: "ab".into(), ..Chunk::default() });
    let c = parse_chunk(
        Flavor::Sglang,
        r#"{"text":"","output_ids":[2],"meta_info":{"finish_reason":{"type":"stop","matched":2},"prompt_tokens":4,"completion_tokens":5}}"#,
    )
    .expect("parse")
    .expect("chunk");
    assert_eq!(c.finish, Some(FinishReason::Stop));
    assert_eq!(c.usage, Some(Usage { prompt_tokens: 4, completion_tokens: 5 }));
}

#[test]
fn bodies_send_ids_and_the_engines_own_spellings() {
    let mut s = SamplingParams::greedy(4);
    s.seed = Some(3);
    s.logit_bias = vec![(7, -100.0), (9, 2.5)];
    s.logprobs = Some(2);
    let v = generate_body(Flavor::Vllm, "m", "r1", &[1, 2], &s, 100);
    assert_eq!(v["logit_bias"], json!({"7": -100.0, "9": 2.5}));
    assert_eq!((v["logprobs"].clone(), v["return_tokens_as_token_ids"].clone()), (json!(2), json!(true)));
    assert_eq!(v["prompt"], json!([1, 2]));
    assert_eq!(v["return_token_ids"], json!(true));
    assert_eq!(v["max_tokens"], json!(4));
    assert_eq!(v["request_id"], json!("r1"));
    assert_eq!(v["seed"], json!(3));
    let v = generate_body(Flavor::Sglang, "m", "r1", &[1, 2], &SamplingParams { max_tokens: None, ..s }, 100);
    assert_eq!(v["input_ids"], json!([1, 2]));
    assert_eq!(v["rid"], json!("r1"));
    assert_eq!(v["sampling_params"]["max_new_tokens"], json!(100), "no limit: what the context leaves");
    assert_eq!(v["sampling_params"]["top_k"], json!(-1), "SGLang spells all tokens -1");
    assert_eq!(v["sampling_params"]["sampling_seed"], json!(3));
    assert_eq!(v["sampling_params"]["logit_bias"], json!({"7": -100.0, "9": 2.5}));
    assert_eq!((v["return_logprob"].clone(), v["top_logprobs_num"].clone()), (json!(true), json!(2)));
    assert!(v["sampling_params"].get("min_new_tokens").is_none());
    let held = SamplingParams { min_tokens: 3, ..SamplingParams::greedy(4) };
    assert_eq!(generate_body(Flavor::Vllm, "m", "r1", &[1], &held, 100)["min_tokens"], json!(3));
    let v = generate_body(Flavor::Sglang, "m", "r1", &[1], &held, 100);
    assert_eq!(v["sampling_params"]["min_new_tokens"], json!(3));
}

#[test]
fn error_bodies_of_either_shape_give_their_message() {
    for (body, want) in [
        (json!({"error": {"message": "m1"}}), "m1"),
        (json!({"error": "m2"}), "m2"),
        (json!({"object": "error", "message": "m3"}), "m3"),
        (json!({"detail": "m4"}), "m4"),
        (
            json!({"error": {"message": "", "type": "InternalServerError", "code": 500}}),
            "InternalServerError (code 500)",
        ),
        (json!({"error": {"message": "", "type": "InternalServerError"}}), "InternalServerError"),
    ] {
        assert_eq!(error_message(&body).as_deref(), Some(want));
    }
    assert_eq!(error_message(&json!({"ok": true})), None);
}

#[test]
fn log_probabilities_are_read_in_either_engines_shape() {
    let c = parse_chunk(
        Flavor::Vllm,
        r#"{"choices":[{"text":"ab","token_ids":[5,6],"logprobs":{"tokens":["token_id:5","token_id:6"],
            "token_logprobs":[-0.5,null],"text_offset":[0,1],
            "top_logprobs":[{"token_id:5":-0.5,"token_id:9":-0.25,"bad":-1.0},{"token_id:6":-3.0}]}}]}"#,
    )
    .expect("parse")
    .expect("chunk");
    assert_eq!(
        c.logprobs,
        [
            Scored { logprob: -0.5, top: vec![(9, -0.25), (5, -0.5)], rank: None },
            Scored { logprob: f32::NEG_INFINITY, top: vec![(6, -3.0)], rank: None },
        ]
    );
    let c = parse_chunk(
        Flavor::Sglang,
        r#"{"text":"a","output_ids":[7],"meta_info":{"finish_reason":null,
            "output_token_logprobs":[[-0.125,7,null]],
            "output_top_logprobs":[[[-0.125,7,null],[-2.0,3,null],[-2.0,1,null]]]}}"#,
    )
    .expect("parse")
    .expect("chunk");
    assert_eq!(
        c.logprobs,
        [Scored { logprob: -0.125, top: vec![(7, -0.125), (1, -2.0), (3, -2.0)], rank: None }]
    );
    // Asked for nothing, nothing is read.
    let c = parse_chunk(Flavor::Sglang, r#"{"text":"a","output_ids":[7],"meta_info":{}}"#).expect("parse");
    assert!(c.is_some_and(|c| c.logprobs.is_empty()));
}

#[test]
fn shapes_go_as_each_engine_takes_them() {
    let mut s = SamplingParams::greedy(4);
    s.structured = Some(StructuredOutput::JsonSchema(r#"{"type":"integer"}"#.into()));
    let v = generate_body(Flavor::Vllm, "m", "r1", &[1], &s, 100);
    assert_eq!(
        v["response_format"],
        json!({"type": "json_schema", "json_schema": {"name": "output", "schema": {"type": "integer"}}})
    );
    let v = generate_body(Flavor::Sglang, "m", "r1", &[1], &s, 100);
    assert_eq!(v["sampling_params"]["json_schema"], json!(r#"{"type":"integer"}"#));
    s.structured = Some(StructuredOutput::JsonObject);
    let v = generate_body(Flavor::Vllm, "m", "r1", &[1], &s, 100);
    assert_eq!(v["response_format"], json!({"type": "json_object"}));
    let v = generate_body(Flavor::Sglang, "m", "r1", &[1], &s, 100);
    assert_eq!(v["sampling_params"]["json_schema"], json!(r#"{"type": "object"}"#));
    s.structured = Some(StructuredOutput::Choice(vec!["a".into(), "b.c".into()]));
    let v = generate_body(Flavor::Vllm, "m", "r1", &[1], &s, 100);
    assert_eq!(v["structured_outputs"], json!({"choice": ["a", "b.c"]}));
    let v = generate_body(Flavor::Sglang, "m", "r1", &[1], &s, 100);
    assert_eq!(v["sampling_params"]["regex"], json!(r"(a)|(b\.c)"));
    s.structured = Some(StructuredOutput::Regex("[0-9]+".into()));
    let v = generate_body(Flavor::Vllm, "m", "r1", &[1], &s, 100);
    assert_eq!(v["structured_outputs"], json!({"regex": "[0-9]+"}));
    let plain = generate_body(Flavor::Vllm, "m", "r1", &[1], &SamplingParams::greedy(4), 100);
    assert!(plain.get("response_format").is_none(), "{plain}");
}
