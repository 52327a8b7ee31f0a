//! The handoff side with the mock engine (real pages of a real paged cache): a room nobody fetches, or whose fetcher went
//! quiet, is freed by its lease; late fetches get a clear error; pages move exactly once per
//! range asked.

use super::*;
use std::net::Ipv4Addr;
use xinf_engine::{EngineConfig, EngineLoader};
use xinf_engine::{GenerateRequest, Prompt, SamplingParams};
use xinf_engine_mock::{MockEngine, MockLoader};
use xinf_transfer::transport::TransportPolicy;

/// The mock engine the tests run on, as itself (for its own counters).
fn mock() -> MockEngine {
    let options = serde_json::json!({"kv_cache_tokens": 1024});
    let EngineConfig::Mock(config) =
        MockLoader::default().check_config(options.as_object().expect("a map")).expect("options")
    else {
        panic!("a mock engine's config");
    };
    MockEngine::new("smollm2-instruct", &config).expect("mock engine")
}

fn engine() -> Arc<dyn Engine> {
    Arc::new(mock())
}

fn times(unclaimed_ms: u64, idle_ms: u64) -> HandoffTimes {
    HandoffTimes {
        leases: Leases {
            unclaimed: Duration::from_millis(unclaimed_ms),
            claimed_idle: Duration::from_millis(idle_ms),
        },
        transfer: Duration::from_secs(10),
        policy: TransportPolicy::Tcp,
        snapshot_budget: 0,
        local_prefill_tokens: 0,
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
    let h = prefill.prefill(request("unclaimed")).await.expect("prefill").room();
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
    let h = prefill.prefill(request("idle")).await.expect("prefill").room();
    let kv = decode.fetch(&h).await.expect("fetch");
    assert_eq!(kv.pages.len(), 2 * engine.contract().page_bytes());
    let s = decode.stats();
    assert_eq!((s.pages_transferred, s.tcp_transfers), (2, 1), "{s:?}");
    tokio::time::sleep(Duration::from_millis(400)).await;
    prefill.sweep();
    assert_eq!(prefill.stats().expired_leases, 2);
    unpinned(&engine).await;

    // Released by the decode side: the lease never fires, a second release finds nothing.
    let h = prefill.prefill(request("released")).await.expect("prefill").room();
    decode.fetch(&h).await.expect("fetch");
    assert!(prefill.release(h.room));
    assert!(!prefill.release(h.room));
    tokio::time::sleep(Duration::from_millis(400)).await;
    prefill.sweep();
    assert_eq!(prefill.stats().expired_leases, 2);
    unpinned(&engine).await;

    // Aborted before it publishes: nothing is left.
    let early = prefill.prefill(request("early"));
    prefill.abort("early");
    let e = early.await.expect_err("aborted");
    assert_eq!(e, ActorError::Engine(EngineError::Aborted));
    assert_eq!(prefill.stats().active_rooms, 0);
    unpinned(&engine).await;

    // An abort taken before a prefill began ended an earlier attempt under that id (the
    // client's retry comes after it): the prefill publishes.
    prefill.abort("retried");
    let h = prefill.prefill(request("retried")).await.expect("the retry's prefill").room();
    assert_eq!(prefill.stats().active_rooms, 1);
    assert!(prefill.release(h.room));
    unpinned(&engine).await;
}

fn tokens_request(id: &str, ids: Vec<u32>) -> GenerateRequest {
    GenerateRequest {
        request_id: id.into(),
        prompt: Prompt::Tokens(ids),
        sampling: SamplingParams::greedy(1),
    }
}

/// With the snapshot cache, a text prompt's ids are computed once: the cache's lookup needs
/// them, and the engine then takes them instead of the text (tokenizing is on the way to the
/// first token).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefill_with_the_snapshot_cache_tokenizes_its_prompt_once() {
    let mock = mock();
    let engine: Arc<dyn Engine> = Arc::new(mock.clone());
    let page = engine.contract().page_bytes();
    let cached = HandoffTimes { snapshot_budget: 8 * page, ..times(30_000, 30_000) };
    let ip = IpAddr::V4(Ipv4Addr::LOCALHOST);
    let prefill = HandoffSide::new(engine, true, ip, cached).await.expect("prefill side");
    let request = GenerateRequest {
        request_id: "text".into(),
        prompt: Prompt::Text("the cat sat on the mat. ".repeat(12)),
        sampling: SamplingParams::greedy(1),
    };
    let h = prefill.prefill(request).await.expect("prefill").room();
    assert_eq!(h.prompt_ids.len(), 24 * 12);
    assert_eq!(mock.texts_tokenized(), 1);
    assert!(prefill.release(h.room));
}

/// With `max_local_prefill_tokens`, a prompt of at most that many tokens is left to the decode
/// replica (nothing computed, pinned or published here; counted), and a longer one is handed
/// off as before, its text tokenized once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_prompt_is_left_to_the_decode_replica_and_a_longer_one_handed_off() {
    let mock = mock();
    let engine: Arc<dyn Engine> = Arc::new(mock.clone());
    let local = HandoffTimes { local_prefill_tokens: 64, ..times(30_000, 30_000) };
    let ip = IpAddr::V4(Ipv4Addr::LOCALHOST);
    let prefill = HandoffSide::new(engine.clone(), true, ip, local).await.expect("prefill side");
    let text = |id: &str, words: usize| GenerateRequest {
        request_id: id.into(),
        // The mock engine's tokenizer takes a byte a token.
        prompt: Prompt::Text("x".repeat(words)),
        sampling: SamplingParams::greedy(1),
    };

    for (id, n) in [("short", 1), ("edge", 64)] {
        let answer = prefill.prefill(text(id, n)).await.expect("prefill");
        assert_eq!(answer, Prefilled::Local, "{n} tokens");
    }
    let s = prefill.stats();
    assert_eq!((s.local_prefills, s.active_rooms, engine.stats().prompt_tokens), (2, 0, 0), "{s:?}");

    let h = prefill.prefill(text("long", 65)).await.expect("prefill").room();
    assert_eq!(h.prompt_ids.len(), 65);
    assert_eq!(mock.texts_tokenized(), 3, "each prompt tokenized once");
    let s = prefill.stats();
    assert_eq!((s.local_prefills, s.active_rooms), (2, 1), "{s:?}");
    assert!(prefill.release(h.room));
}

/// A prompt's complete pages stay in the prefill replica's snapshot cache after their
/// handoff; a later prompt with the same prefix imports them and computes only the rest, and
/// what it hands off equals what a replica without the cache computes. A budget of one page
/// keeps one page and evicts the next.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_pages_are_reused_by_a_later_prompt_with_the_same_prefix() {
    let engine = engine();
    let ip = IpAddr::V4(Ipv4Addr::LOCALHOST);
    let page = engine.contract().page_bytes();
    let cached = HandoffTimes { snapshot_budget: 8 * page, ..times(30_000, 30_000) };
    let prefill = HandoffSide::new(engine.clone(), true, ip, cached).await.expect("prefill side");
    let plain = HandoffSide::new(engine.clone(), true, ip, times(30_000, 30_000)).await.expect("plain side");
    let decode = HandoffSide::new(engine.clone(), false, ip, times(30_000, 30_000)).await.expect("decode");

    let a: Vec<u32> = (0..200).map(|i| 200 + i * 7).collect();
    let mut b = a[..150].to_vec();
    b.extend((0..60).map(|i| 3000 + i * 11));

    let h = prefill.prefill(tokens_request("a", a)).await.expect("prefill a").room();
    decode.fetch(&h).await.expect("fetch a");
    assert!(prefill.release(h.room));
    let s = prefill.stats();
    // 200 tokens: three complete pages kept, the partial fourth not.
    assert_eq!((s.snapshot_pages, s.snapshot_bytes, s.snapshot_hits), (3, 3 * page as u64, 0), "{s:?}");

    let before = engine.stats().prompt_tokens;
    let h = prefill.prefill(tokens_request("b", b.clone())).await.expect("prefill b").room();
    // b shares a's first 150 tokens: two whole pages.
    assert_eq!(prefill.stats().snapshot_hits, 2);
    assert_eq!(engine.stats().prompt_tokens - before, 210 - 128, "only the rest was computed");
    let reused = decode.fetch(&h).await.expect("fetch b");
    assert!(prefill.release(h.room));

    let h = plain.prefill(tokens_request("b-plain", b)).await.expect("plain prefill").room();
    let computed = decode.fetch(&h).await.expect("fetch plain");
    assert!(plain.release(h.room));
    assert_eq!(reused.first_token, computed.first_token);
    assert_eq!(reused.pages.len(), computed.pages.len());
    assert!(reused.pages.host().is_some(), "host pages expected from a CPU engine");
    assert!(reused.pages.host() == computed.pages.host(), "the handed-off KV differs from the computed one");
    unpinned(&engine).await;

    // One page of budget: the first page is kept, the second evicts it.
    let tight = HandoffTimes { snapshot_budget: page, ..times(30_000, 30_000) };
    let small = HandoffSide::new(engine.clone(), true, ip, tight).await.expect("small side");
    let c: Vec<u32> = (0..130).map(|i| 900 + i).collect();
    let h = small.prefill(tokens_request("c", c.clone())).await.expect("prefill c").room();
    decode.fetch(&h).await.expect("fetch c");
    assert!(small.release(h.room));
    let s = small.stats();
    assert_eq!((s.snapshot_pages, s.snapshot_evictions), (1, 1), "{s:?}");
    // The cache now holds page 1 alone, which is no prefix: the prompt is computed in full.
    let h = small.prefill(tokens_request("c2", c)).await.expect("prefill c again").room();
    assert_eq!(small.stats().snapshot_hits, 0);
    decode.fetch(&h).await.expect("fetch c again");
    assert!(small.release(h.room));
    unpinned(&engine).await;
}

#[test]
fn gpu_routes_follow_process_host_and_policy() {
    use xinf_transfer::device::host_id;
    let here = Endpoint { process: transport::process_nonce(), provider: 1, tcp: "127.0.0.1:1".into() };
    let there = Endpoint { process: transport::process_nonce() ^ 1, ..here.clone() };
    let gpu = |host: &str| Some(KvDevice { host: host.into(), ordinal: 0 });
    let (same, other) = (gpu(host_id()), gpu("another-host"));
    let route = |e: &Endpoint, d: &Option<KvDevice>, p| device_route(e, d.as_ref(), p);
    // A prefill on the CPU: always through host memory.
    assert_eq!(route(&here, &None, TransportPolicy::Auto), None);
    // One process: a device copy, unless TCP is forced.
    assert_eq!(route(&here, &same, TransportPolicy::Auto), Some(DeviceRoute::InProcess));
    assert_eq!(route(&here, &same, TransportPolicy::Nixl), Some(DeviceRoute::InProcess));
    assert_eq!(route(&here, &same, TransportPolicy::Tcp), None);
    // Another process of this host: CUDA IPC, or NIXL when asked for.
    assert_eq!(route(&there, &same, TransportPolicy::Auto), Some(DeviceRoute::CudaIpc));
    assert_eq!(route(&there, &same, TransportPolicy::Nixl), Some(DeviceRoute::NixlVram));
    assert_eq!(route(&there, &same, TransportPolicy::Tcp), None);
    // Another host: NIXL when asked for, else host memory over TCP.
    assert_eq!(route(&there, &other, TransportPolicy::Auto), None);
    assert_eq!(route(&there, &other, TransportPolicy::Nixl), Some(DeviceRoute::NixlVram));
}
