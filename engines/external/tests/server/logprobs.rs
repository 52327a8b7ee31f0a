//! Log-probabilities through the servers: the output's, the prompt's, and what a decode leg
//! needs of them.

use super::*;

/// Log-probabilities reach the caller as each engine sends them (the fake's: token i at
/// -(i + 1) / 4, alternatives the token and the ids after it), cut to the count asked for; the
/// SGLang server runs with its log-probabilities before temperature.
#[test]
fn log_probabilities_come_through_either_engine() {
    let rt = xinf_test_util::runtime();
    let _in_runtime = rt.enter();
    let f = fixture();
    for flavor in Flavor::ALL {
        let engine = load(&f, flavor, json!({})).expect("load");
        let mut scored = request("s", "hello world the cat", 3);
        scored.sampling.logprobs = Some(2);
        let ids = engine.prompt_token_ids(&scored.prompt).expect("ids");
        let events = rt.block_on(async {
            let mut stream = engine.submit(scored).expect("submit");
            let mut v = Vec::new();
            while let Some(event) = stream.next().await {
                if let TokenEvent::Delta { token_id, logprobs, .. } = event.expect("event") {
                    v.push((token_id, logprobs.expect("log-probabilities with every token")));
                }
            }
            v
        });
        assert_eq!(events.iter().map(|e| e.0).collect::<Vec<_>>(), expected(&ids, 3), "{flavor}");
        for (i, (token, l)) in events.iter().enumerate() {
            let lp = -(i as f32 + 1.0) / 4.0;
            assert_eq!((l.chosen.token_id, l.chosen.logprob), (*token, lp), "{flavor}: {l:?}");
            let top: Vec<(u32, f32)> = l.top.iter().map(|t| (t.token_id, t.logprob)).collect();
            assert_eq!(top, [(*token, lp), (token + 1, lp - 1.0)], "{flavor}: {l:?}");
            assert_eq!(l.top[0].token, l.chosen.token, "{flavor}: the same token, the same text: {l:?}");
        }
        let log = log_of(&engine);
        assert_eq!(log.contains("SGLANG_RETURN_ORIGINAL_LOGPROB=1"), flavor == Flavor::Sglang, "{log}");
        // A shape that holds only after a reasoning model's thinking is the native engine's:
        // the server would hold it from the first token.
        let mut after = request("r", "hello", 3);
        after.sampling.structured = Some(xinf_engine::StructuredOutput::Regex("(yes|no)".into()));
        after.sampling.structured_after = Some("</think>".into());
        match engine.submit(after) {
            Err(xinf_engine::EngineError::InvalidRequest { field, reason }) => {
                assert_eq!(field, "response_format", "{flavor}");
                assert!(reason.contains("enable_thinking"), "{flavor}: {reason}");
            }
            other => panic!("{flavor}: {:?}", other.map(|_| "a stream")),
        }
        drop(engine);
    }
}

/// A prompt's report comes before the output: with `echo` alone, xinf's decoding of the ids it
/// sent; with `prompt_logprobs`, each later prompt token's log-probability and rank and the
/// alternatives, from a scoring call of their own (the fake's: token j at -j / 8 - 1, rank
/// k + j, alternatives 1000, 1001, ... at -0.1, -0.2, ...; SGLang gives no rank).
#[test]
fn prompt_log_probabilities_come_through_either_engine() {
    let rt = xinf_test_util::runtime();
    let _in_runtime = rt.enter();
    let f = fixture();
    for flavor in Flavor::ALL {
        let engine = load(&f, flavor, json!({})).expect("load");
        for top in [None, Some(2)] {
            let mut req = request("p", "hello world the cat", 2);
            req.sampling.echo = true;
            req.sampling.prompt_logprobs = top;
            let ids = engine.prompt_token_ids(&req.prompt).expect("ids");
            let events: Vec<TokenEvent> =
                rt.block_on(engine.submit(req).expect("submit").map(|e| e.expect("event")).collect());
            let TokenEvent::Prompt(report) = &events[0] else {
                panic!("{flavor}: the prompt first: {events:?}")
            };
            assert_eq!(report.token_ids, ids, "{flavor}");
            assert_eq!(report.text, "hello world the cat", "{flavor}");
            let deltas: Vec<u32> = events
                .iter()
                .filter_map(
                    |e| if let TokenEvent::Delta { token_id, .. } = e { Some(*token_id) } else { None },
                )
                .collect();
            assert_eq!(deltas, expected(&ids, 2), "{flavor}: the output follows");
            let Some(k) = top else {
                assert!(report.logprobs.is_none(), "{flavor}");
                continue;
            };
            let lp = report.logprobs.as_ref().expect("prompt log-probabilities");
            assert_eq!(lp.rest.len(), ids.len() - 1, "{flavor}");
            for (j, t) in (1..).zip(&lp.rest) {
                assert_eq!(
                    (t.chosen.token_id, t.chosen.logprob),
                    (ids[j], -(j as f32) / 8.0 - 1.0),
                    "{flavor}"
                );
                let want_rank = (flavor == Flavor::Vllm).then_some((k + j) as u32);
                assert_eq!(t.rank, want_rank, "{flavor}");
                let alternatives: Vec<(u32, f32)> = t.top.iter().map(|l| (l.token_id, l.logprob)).collect();
                assert_eq!(alternatives, [(1000, -0.1), (1001, -0.2)], "{flavor} position {j}");
            }
        }
        assert!(scoring_call(&log_of(&engine), "p"), "{flavor}: the scoring call");
        drop(engine);
    }
}

#[test]
fn an_sglang_decode_leg_asked_for_log_probabilities_needs_the_first_token_s() {
    let rt = xinf_test_util::runtime();
    let _in_runtime = rt.enter();
    let f = fixture();
    let engine = load_as(&f, Flavor::Sglang, json!({}), KvRole::Consumer).expect("load");
    let mut req = request("decode", "hello world", 4);
    req.sampling.logprobs = Some(1);
    let kv = |first_logprobs| xinf_engine::RemoteKv {
        prompt_ids: vec![5, 6, 7],
        first_token: 9,
        first_text: None,
        first_logprobs,
        room: 3,
        endpoint: xinf_transfer::transport::Endpoint { process: 1, provider: 1, tcp: "127.0.0.1:9".into() },
        device: None,
        pages: 1,
    };
    // Without them SGLang would report the first token's from a zeroed metadata row: refused.
    let e = engine.submit_remote(req.clone(), kv(None)).err().expect("refused");
    assert!(e.to_string().contains("no log-probabilities for the first token"), "{e}");
    // With them the leg goes to the server, its ticket carrying them.
    let chosen = xinf_engine::Logprob { token_id: 9, token: "t9 ".into(), logprob: -0.5 };
    let l = xinf_engine::TokenLogprobs { chosen: chosen.clone(), top: vec![chosen], rank: None };
    let events: Vec<_> =
        rt.block_on(engine.submit_remote(req, kv(Some(Box::new(l)))).expect("submit").collect::<Vec<_>>());
    assert!(events.iter().all(Result::is_ok), "{events:?}");
    assert!(log_of(&engine).contains("request decode"), "the server got the leg");
    engine.shutdown();
}
