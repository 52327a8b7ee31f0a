use super::*;
use futures::StreamExt;
use serde_json::json;
use xinf_engine::{GenerateRequest, ImportedKv, KvPages, Prompt, SamplingParams, TokenEvent};

fn engine(config: serde_json::Value) -> Arc<dyn Engine> {
    let loader = MockLoader::default();
    let config = loader.check_config(config.as_object().expect("an object")).expect("valid options");
    loader.load(&ModelSource { model_name: "m".into(), ..Default::default() }, &config).expect("loads")
}

fn request(id: &str, prompt_len: usize, max_tokens: usize) -> GenerateRequest {
    GenerateRequest {
        request_id: id.into(),
        prompt: Prompt::Tokens((0..prompt_len as u32).map(|i| 3 + (i * 7) % 250).collect()),
        sampling: SamplingParams::greedy(max_tokens),
    }
}

/// Text and the error that ended the stream, if any.
async fn collect(mut stream: xinf_engine::TokenStream) -> (String, Option<EngineError>) {
    let mut text = String::new();
    while let Some(event) = stream.next().await {
        match event {
            Ok(TokenEvent::Delta { text: t, .. }) => text.push_str(&t),
            Ok(TokenEvent::Finished { .. } | TokenEvent::Prompt(_)) => {}
            Err(e) => return (text, Some(e)),
        }
    }
    (text, None)
}

async fn handoff(
    prefill: &dyn Engine,
    decode: &dyn Engine,
    req: GenerateRequest,
) -> Result<String, EngineError> {
    let pinned = prefill.prefill_pinned(req.clone()).await?;
    let len = decode.import_len(pinned.prompt_ids.len());
    let pages = prefill.export_pages(&req.request_id, 0, xinf_transfer::pages_for(len)).await?;
    prefill.release_pinned(&req.request_id);
    let kv = ImportedKv {
        prompt_ids: pinned.prompt_ids,
        first_token: pinned.first_token,
        first_logprobs: None,
        pages: KvPages::Host(pages),
    };
    let (text, error) = collect(decode.submit_imported(req, kv)?).await;
    error.map_or(Ok(text), Err)
}

#[tokio::test]
async fn output_is_a_function_of_the_prompt() {
    let (a, b) = (engine(json!({})), engine(json!({"kv_layout": "token-pool"})));
    let one = collect(a.submit(request("r", 70, 20)).expect("admitted")).await;
    let two = collect(b.submit(request("r", 70, 20)).expect("admitted")).await;
    assert_eq!(one, two);
    assert_eq!(one.0.len(), 20);
    let other = collect(a.submit(request("s", 71, 20)).expect("admitted")).await;
    assert_ne!(one.0, other.0);
    assert_eq!(a.stats().used_blocks, 0);
}

#[tokio::test]
async fn pages_move_across_layouts_and_equal_the_ordinary_output() {
    let layouts = [
        json!({"kv_layout": "paged-kv-first", "kv_order": "HND", "block_size": 16}),
        json!({"kv_layout": "token-pool"}),
        json!({"kv_layout": "paged-block-first", "block_size": 64, "recompute_last_token": true}),
    ];
    for p in &layouts {
        for d in &layouts {
            let (prefill, decode) = (engine(p.clone()), engine(d.clone()));
            for len in [1, 63, 64, 65, 129, 193] {
                let ordinary = collect(decode.submit(request("o", len, 9)).expect("admitted")).await.0;
                let moved = handoff(prefill.as_ref(), decode.as_ref(), request("pd", len, 9)).await;
                assert_eq!(moved.as_deref(), Ok(ordinary.as_str()), "{p} → {d} at {len}");
            }
            for e in [&prefill, &decode] {
                let s = e.stats();
                assert_eq!((s.used_blocks, s.pinned_blocks, s.running), (0, 0, 0));
            }
        }
    }
}

#[tokio::test]
async fn a_page_that_moved_wrong_is_refused_naming_it() {
    let (prefill, decode) = (engine(json!({})), engine(json!({})));
    let req = request("r", 130, 4);
    let pinned = prefill.prefill_pinned(req.clone()).await.expect("pinned");
    let mut pages = prefill.export_pages("r", 0, 3).await.expect("pages");
    let page = pages.len() / 3;
    pages[page + 10] ^= 1;
    let kv = ImportedKv {
        prompt_ids: pinned.prompt_ids.clone(),
        first_token: pinned.first_token,
        first_logprobs: None,
        pages: pages.into(),
    };
    let e = decode.submit_imported(req.clone(), kv).err().expect("refused");
    assert!(e.to_string().contains("page 1"), "{e}");
    let short = ImportedKv {
        prompt_ids: pinned.prompt_ids,
        first_token: pinned.first_token,
        first_logprobs: None,
        pages: vec![0; 5].into(),
    };
    assert!(decode.submit_imported(req, short).is_err());
    assert_eq!(decode.stats().used_blocks, 0);
    assert!(prefill.release_pinned("r"));
    assert_eq!(prefill.stats().used_blocks, 0);
}

#[tokio::test]
async fn faults_are_injected_as_asked() {
    let e = engine(json!({"fail_at_admission": true}));
    assert!(e.submit(request("r", 5, 5)).err().expect("refused").to_string().contains("injected fault"));
    let e = engine(json!({"fail_after_tokens": 3, "step_ms": 1}));
    let (text, error) = collect(e.submit(request("r", 5, 10)).expect("admitted")).await;
    assert_eq!(text.len(), 3);
    assert!(error.expect("an error").to_string().contains("after 3 tokens"));
    let e = engine(json!({"stall_export_ms": 5}));
    e.prefill_pinned(request("r", 70, 1)).await.expect("pinned");
    assert_eq!(e.export_pages("r", 0, 2).await.expect("pages").len(), 2 * e.contract().page_bytes());
    assert!(e.export_pages("r", 1, 5).await.is_err());
}

#[tokio::test]
async fn abort_ends_a_stream_and_frees_its_blocks() {
    let e = engine(json!({"step_ms": 2}));
    let stream = e.submit(request("r", 5, 1000)).expect("admitted");
    assert!(matches!(e.submit(request("r", 5, 5)).err(), Some(EngineError::DuplicateRequest(_))));
    assert!(e.abort("r"));
    assert!(matches!(collect(stream).await.1, Some(EngineError::Aborted)));
    assert!(!e.abort("r"));
    let stream = e.submit(request("s", 5, 1000)).expect("admitted");
    assert!(e.stats().used_blocks > 0);
    drop(stream);
    assert_eq!(e.stats().used_blocks, 0);
}

#[test]
fn a_full_cache_or_context_is_refused() {
    let e = engine(json!({"kv_cache_tokens": 64, "context_length": 100}));
    assert!(matches!(e.submit(request("r", 90, 20)).err(), Some(EngineError::ContextLength { .. })));
    let _held = e.submit(request("a", 50, 10)).expect("admitted");
    assert!(matches!(e.submit(request("b", 50, 10)).err(), Some(EngineError::Overloaded { .. })));
}
