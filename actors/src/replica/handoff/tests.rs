//! The handoff side with the real default model: a room nobody fetches, or whose fetcher went
//! quiet, is freed by its lease; late fetches get a clear error; pages move exactly once per
//! range asked.

use super::*;
use std::net::Ipv4Addr;
use xinf_engine::{GenerateRequest, Prompt, SamplingParams};
use xinf_engine_native::{EngineOptions, NativeEngine};
use xinf_transfer::transport::TransportPolicy;

fn engine() -> Arc<dyn Engine> {
    let model = xinf_models::resolve(&xinf_models::ModelRequest {
        model_name: "smollm2-instruct".into(),
        ..Default::default()
    })
    .expect("resolve smollm2-instruct");
    let options =
        EngineOptions::from_engine_config(&serde_json::json!({"kv_cache_tokens": 1024})).expect("options");
    Arc::new(NativeEngine::load(&model, options).expect("load"))
}

fn times(unclaimed_ms: u64, idle_ms: u64) -> HandoffTimes {
    HandoffTimes {
        leases: Leases {
            unclaimed: Duration::from_millis(unclaimed_ms),
            claimed_idle: Duration::from_millis(idle_ms),
        },
        transfer: Duration::from_secs(10),
        policy: TransportPolicy::Tcp,
    }
}

fn request(id: &str) -> GenerateRequest {
    let ids: Vec<u32> = (0..70).map(|i| 100 + i * 13).collect();
    GenerateRequest {
        request_id: id.into(),
        prompt: Prompt::Tokens(ids),
        sampling: SamplingParams::greedy(1),
    }
}

/// Waits until the engine holds no pinned block (it frees them on its compute thread).
async fn unpinned(engine: &Arc<dyn Engine>) {
    for _ in 0..200 {
        if engine.stats().pinned_blocks == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{} blocks stay pinned", engine.stats().pinned_blocks);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_free_abandoned_rooms_and_late_fetches_fail_clearly() {
    let engine = engine();
    let ip = IpAddr::V4(Ipv4Addr::LOCALHOST);
    let prefill = HandoffSide::new(engine.clone(), true, ip, times(300, 300)).await.expect("prefill side");
    let decode = HandoffSide::new(engine.clone(), false, ip, times(300, 300)).await.expect("decode side");

    // Unclaimed: published, never fetched.
    let h = prefill.prefill(request("unclaimed")).await.expect("prefill");
    assert_eq!(h.pages, 2);
    assert_eq!(prefill.stats().active_rooms, 1);
    // The engine publishes its figures after each step.
    for _ in 0..100 {
        if engine.stats().pinned_blocks > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(engine.stats().pinned_blocks > 0);
    tokio::time::sleep(Duration::from_millis(400)).await;
    prefill.sweep();
    let s = prefill.stats();
    assert_eq!((s.active_rooms, s.expired_leases), (0, 1), "{s:?}");
    unpinned(&engine).await;
    let e = decode.fetch(&h).await.expect_err("a late fetch");
    assert!(e.to_string().contains("released, aborted or expired"), "{e}");
    assert_eq!(decode.stats().failed, 1);

    // Claimed, then idle: a fetch renews the lease, silence ends it.
    let h = prefill.prefill(request("idle")).await.expect("prefill");
    let kv = decode.fetch(&h).await.expect("fetch");
    assert_eq!(kv.pages.len(), 2 * engine.contract().page_bytes());
    let s = decode.stats();
    assert_eq!((s.pages_transferred, s.tcp_transfers), (2, 1), "{s:?}");
    tokio::time::sleep(Duration::from_millis(400)).await;
    prefill.sweep();
    assert_eq!(prefill.stats().expired_leases, 2);
    unpinned(&engine).await;

    // Released by the decode side: the lease never fires, a second release finds nothing.
    let h = prefill.prefill(request("released")).await.expect("prefill");
    decode.fetch(&h).await.expect("fetch");
    assert!(prefill.release(h.room));
    assert!(!prefill.release(h.room));
    tokio::time::sleep(Duration::from_millis(400)).await;
    prefill.sweep();
    assert_eq!(prefill.stats().expired_leases, 2);
    unpinned(&engine).await;

    // Aborted before it publishes: nothing is left.
    prefill.abort("early");
    let e = prefill.prefill(request("early")).await.expect_err("aborted");
    assert_eq!(e, ActorError::Engine(EngineError::Aborted));
    assert_eq!(prefill.stats().active_rooms, 0);
    unpinned(&engine).await;
}
