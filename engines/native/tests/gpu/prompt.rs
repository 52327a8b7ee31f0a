//! Prompt log-probabilities on the GPU: every position's logits leave the GPU for a chunk
//! that asks for them (`prompt_logprobs`), cut into chunks of bounded rows.

use super::*;

/// Each prompt token's log-probability from the GPU engine against the CPU engine's on the same
/// F32 weights, for prompts longer than a chunk (16 tokens a step): within 1e-3, the first token
/// without one, the alternatives alike.
#[test]
fn prompt_log_probabilities_match_the_cpu() {
    if !gpu_enabled("prompt_log_probabilities_match_the_cpu") {
        return;
    }
    let dir = scratch();
    let model = make_model(dir.path(), Arch::Qwen3, candle_core::DType::F32);
    let config = serde_json::json!({"max_batch_tokens": 16, "enable_prefix_caching": false});
    let (cpu, gpu) = (load(&model, config.clone(), "cpu"), load(&model, config, "cuda:0"));
    let rt = rt();
    for (i, len) in [2usize, 70, 150].into_iter().enumerate() {
        let ids = prompt(len, 300 + i as u32, VOCAB);
        let run = |engine: &NativeEngine, tag: &str| {
            let sampling = SamplingParams { prompt_logprobs: Some(3), ..SamplingParams::greedy(2) };
            // An id per prompt: the stream is dropped at the report, and the abort that follows
            // may not have reached the engine when the next prompt is submitted.
            let request_id = format!("{tag}-{len}");
            let request = GenerateRequest { request_id, prompt: Prompt::Tokens(ids.clone()), sampling };
            let mut stream = engine.submit(request).expect("submit");
            rt.block_on(async {
                while let Some(ev) = stream.next().await {
                    if let TokenEvent::Prompt(report) = ev.expect("event") {
                        return report.logprobs.expect("log-probabilities");
                    }
                }
                panic!("{tag}: no prompt report")
            })
        };
        let (c, g) = (run(&cpu, "cpu"), run(&gpu, "gpu"));
        assert_eq!(g.rest.len(), len - 1, "one per prompt token after the first");
        let mut worst = 0.0f32;
        for (j, (a, b)) in c.rest.iter().zip(&g.rest).enumerate() {
            assert_eq!(a.chosen.token_id, b.chosen.token_id, "position {}", j + 1);
            worst = worst.max((a.chosen.logprob - b.chosen.logprob).abs());
            for (x, y) in a.top.iter().zip(&b.top) {
                worst = worst.max((x.logprob - y.logprob).abs());
            }
        }
        eprintln!("prompt of {len}: max |Δlogprob| cpu/gpu over every position and its top 3 = {worst:.3e}");
        assert!(worst <= 1e-3, "prompt of {len}: {worst}");
    }
}
