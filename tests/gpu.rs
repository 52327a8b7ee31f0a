//! P/D on one GPU with real `xinf` processes: the prefill and decode replicas of a model run in
//! two worker processes sharing the GPU, and the KV pages go from the prefill engine's GPU
//! cache to the decode engine's without touching host memory — over CUDA IPC by default, over
//! NIXL (VRAM) when the launch asks for it, and by a device-to-device copy when both replicas
//! share a process. Greedy output equals the ordinary GPU replica's at every page boundary,
//! streaming and not; the counters prove which route moved the bytes; cancelled requests leave
//! no room behind.
//!
//! With two GPUs the same model also runs with a GPU a role: the prefill on GPU 0 of one
//! worker, the decode on GPU 1 of another, the pages crossing between the GPUs over CUDA IPC.
//!
//! Needs a `--features cuda` build, an NVIDIA GPU and `XINF_TEST_GPU=1` (skipped, loudly,
//! otherwise); the NIXL part needs `XINF_NIXL_LIB_DIR` (the nixl-cu12 wheel's libraries).

use crate::cluster::{SECRET, supervisor, worker};
use crate::pd::{Cancel, LENGTHS, cancelled_request, complete, launch, nixl_here, pages, prompt, stats};
use crate::util::{self, http, procs::poll};
use serde_json::{Value, json};
use xinf_test_util::Rng;

use xinf_test_util::gpu_tests_enabled as gpu_enabled;

/// Bytes of one canonical page of SmolLM2-135M in F32: 2 (K, V) × 30 layers × 64 tokens × 3 KV
/// heads × 64 dims × 4 bytes.
const SMOLLM2_PAGE_BYTES: u64 = 2 * 30 * 64 * 3 * 64 * 4;

/// An engine config with `layout` (an object of layout keys) for a replica that shares its GPU:
/// 5 % of the GPU's memory each (the worker places it on the GPU and sets its device).
fn on_gpu(layout: Value) -> Value {
    let mut config = json!({"gpu_memory_utilization": 0.05, "kv_cache_tokens": 8192});
    if let (Some(c), Some(l)) = (config.as_object_mut(), layout.as_object()) {
        c.extend(l.clone());
    }
    config
}

/// The handoff figures of `model`, with the route counter `route` equal to `fetches`, every
/// byte moved GPU to GPU, none through host memory.
fn moved_gpu_to_gpu(addr: std::net::SocketAddr, model: &str, route: &str, fetches: usize, pages: u64) {
    let s = stats(addr, model);
    let h = &s["handoff"];
    eprintln!(
        "{model}: {fetches} fetches, {} pages, {} bytes, fetch time {} µs in all",
        h["pages_transferred"], h["bytes_transferred"], h["latency"]["sum_us"]
    );
    assert_eq!(h[route], fetches, "{model}: {s}");
    assert_eq!(h["pages_transferred"], pages, "{model}: {s}");
    assert_eq!(h["bytes_transferred"], pages * SMOLLM2_PAGE_BYTES, "{model}: {s}");
    assert_eq!(h["gpu_bytes_transferred"], h["bytes_transferred"], "{model}: {s}");
    for host in
        ["tcp_transfers", "in_process_transfers", "nixl_transfers", "gpu_fallbacks", "failed", "active_rooms"]
    {
        assert_eq!(h[host], 0, "{model}, {host}: {s}");
    }
}

#[test]
fn pd_on_one_gpu_moves_pages_gpu_to_gpu_between_processes() {
    if !gpu_enabled("pd_on_one_gpu_moves_pages_gpu_to_gpu_between_processes") {
        return;
    }
    let _ = util::smollm2();
    let nixl = nixl_here();
    let (_sup, addr, cluster) = supervisor();
    let (_w1, id1) = worker(&cluster, SECRET);
    let (_w2, id2) = worker(&cluster, SECRET);
    // Each worker sees the GPU through the driver.
    let workers = http::get(addr, "/v1/workers").json();
    let names: Vec<String> = workers.to_string().matches("NVIDIA").map(str::to_owned).collect();
    assert!(names.len() >= 2, "both workers report the GPU by name: {workers}");
    let on = |id: &str| json!([{"worker_ip": id, "gpu_idx": [0]}]);
    // `transfer`: the launch's transfer_backend_type (null: the default, Xavier's handoff).
    let pd = |uid: &str, transfer: Value, p: (&str, Value), d: (&str, Value)| {
        json!({"model_name": "smollm2-instruct", "model_uid": uid, "transfer_backend_type": transfer,
               "replica_config": [
                   {"role": "prefill", "devices": on(p.0), "engine_config": on_gpu(p.1)},
                   {"role": "decode", "devices": on(d.0), "engine_config": on_gpu(d.1)}]})
    };
    launch(
        addr,
        json!({"model_name": "smollm2-instruct", "model_uid": "hybrid", "engine_config": on_gpu(json!({})),
               "replica_config": [{"devices": on(&id1)}]}),
    );
    // Two processes, CUDA IPC: vLLM FlashAttention HND blocks of 16 → SGLang token pool.
    launch(
        addr,
        pd(
            "ipc",
            Value::Null,
            (&id1, json!({"kv_layout": "paged-kv-first", "kv_order": "HND", "block_size": 16})),
            (&id2, json!({"kv_layout": "token-pool"})),
        ),
    );
    // One process, a device-to-device copy: FlashInfer NHD 64 → FlashAttention NHD 32.
    launch(
        addr,
        pd(
            "local",
            Value::Null,
            (&id1, json!({"kv_layout": "paged-block-first", "block_size": 64})),
            (&id1, json!({"kv_layout": "paged-kv-first", "block_size": 32})),
        ),
    );
    if nixl {
        // Two processes, NIXL VRAM: token pool → FlashAttention NHD 16.
        launch(
            addr,
            pd(
                "nixl",
                json!("nixl"),
                (&id1, json!({"kv_layout": "token-pool"})),
                (&id2, json!({"kv_layout": "paged-kv-first", "block_size": 16})),
            ),
        );
    }
    // Placed on GPU 0 of its worker, every replica computes there.
    for uid in ["hybrid", "ipc", "local"] {
        let m = http::get(addr, &format!("/v1/models/{uid}")).json();
        for r in m["xinf"]["replica_details"].as_array().expect("replica_details") {
            assert_eq!(r["gpus"], json!([0]), "{uid}: {m}");
        }
    }
    let mut models = vec!["ipc", "local"];
    if nixl {
        models.push("nixl");
    }
    for (i, &n) in LENGTHS.iter().enumerate() {
        let ids = prompt(n);
        let want = complete(addr, "hybrid", &ids, false);
        for (k, model) in models.iter().enumerate() {
            assert_eq!(complete(addr, model, &ids, (i + k) % 2 == 0), want, "{model}, {n}-token prompt");
        }
    }
    let want_pages = pages(LENGTHS, false);
    moved_gpu_to_gpu(addr, "ipc", "cuda_ipc_transfers", LENGTHS.len(), want_pages);
    moved_gpu_to_gpu(addr, "local", "gpu_in_process_transfers", LENGTHS.len(), want_pages);
    if nixl {
        moved_gpu_to_gpu(addr, "nixl", "nixl_vram_transfers", LENGTHS.len(), want_pages);
    }

    // 20 requests cancelled at random points of the handoff leave no room and no pinned KV.
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let model = models[t as usize % models.len()];
            std::thread::spawn(move || {
                let mut rng = Rng::new(t + 11);
                for k in 0..5 {
                    let ids = prompt(2 + rng.below(300) as usize);
                    let how = match rng.below(3) {
                        0 => Cancel::Disconnect(rng.below(60)),
                        1 => Cancel::AbortRoute(rng.below(60)),
                        _ => Cancel::AfterFirstToken,
                    };
                    cancelled_request(addr, model, &format!("gpu-cancel-{t}-{k}"), &ids, how);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("a cancelling client panicked");
    }
    for model in &models {
        poll(
            std::time::Duration::from_secs(20),
            &format!("{model}: every room and pinned block freed"),
            || {
                let s = stats(addr, model);
                s["handoff"]["active_rooms"] == 0 && s["pinned_blocks"] == 0 && s["running"] == 0
            },
        );
        let ids = prompt(150);
        assert_eq!(complete(addr, model, &ids, true), complete(addr, "hybrid", &ids, false), "{model} after");
    }
}

/// P/D with a GPU a role on one host: the prefill replica on GPU 0 of one worker, the decode
/// replica alone on GPU 1 of another, the ordinary replica it is compared with beside the
/// prefill on GPU 0. Greedy output equals the ordinary replica's at every page boundary, the
/// pages cross between the GPUs over CUDA IPC (none through host memory), each replica computes
/// on the GPU it was placed on, and `/v1/workers` shows both GPUs in use.
#[test]
fn pd_with_a_gpu_a_role_moves_pages_between_gpus() {
    if !gpu_enabled("pd_with_a_gpu_a_role_moves_pages_between_gpus") {
        return;
    }
    let _ = util::smollm2();
    let (_sup, addr, cluster) = supervisor();
    let (_w1, id1) = worker(&cluster, SECRET);
    let (_w2, id2) = worker(&cluster, SECRET);
    let workers = http::get(addr, "/v1/workers").json();
    let gpus = workers
        .as_array()
        .and_then(|w| w.first())
        .map_or(0, |w| w["info"]["gpus"].as_array().map_or(0, Vec::len));
    if gpus < 2 {
        eprintln!(
            "SKIPPED pd_with_a_gpu_a_role_moves_pages_between_gpus: the workers see {gpus} GPU, it needs two"
        );
        return;
    }
    let on = |id: &str, gpu: u32| json!([{"worker_ip": id, "gpu_idx": [gpu]}]);
    launch(
        addr,
        json!({"model_name": "smollm2-instruct", "model_uid": "hybrid", "engine_config": on_gpu(json!({})),
               "replica_config": [{"devices": on(&id1, 0)}]}),
    );
    launch(
        addr,
        json!({"model_name": "smollm2-instruct", "model_uid": "two-gpus", "replica_config": [
            {"role": "prefill", "devices": on(&id1, 0),
             "engine_config": on_gpu(json!({"kv_layout": "paged-kv-first", "kv_order": "HND", "block_size": 16}))},
            {"role": "decode", "devices": on(&id2, 1),
             "engine_config": {"kv_layout": "token-pool", "kv_cache_tokens": 8192}}]}),
    );
    let m = http::get(addr, "/v1/models/two-gpus").json();
    let placed: Vec<(&str, Value)> = m["xinf"]["replica_details"]
        .as_array()
        .expect("replica_details")
        .iter()
        .map(|r| (r["role"].as_str().unwrap_or(""), r["gpus"].clone()))
        .collect();
    assert!(placed.contains(&("prefill", json!([0]))) && placed.contains(&("decode", json!([1]))), "{m}");
    for (i, &n) in LENGTHS.iter().enumerate() {
        let ids = prompt(n);
        assert_eq!(
            complete(addr, "two-gpus", &ids, i % 2 == 0),
            complete(addr, "hybrid", &ids, false),
            "{n} tokens"
        );
    }
    moved_gpu_to_gpu(addr, "two-gpus", "cuda_ipc_transfers", LENGTHS.len(), pages(LENGTHS, false));
    let workers = http::get(addr, "/v1/workers").json();
    eprintln!("workers with a GPU a role: {workers}");
}
