//! What the cluster adds to a request: router overhead and actor round trips, side by side.
//!
//! `cargo bench --bench cluster`. Every case asks for more tokens than the context holds, so
//! the engine refuses the request in `submit` (after tokenizing the prompt) and no model
//! compute happens: each sample is one trip to the engine's submit and back, through
//!
//! - `engine`: the native engine, called directly (the baseline);
//! - `cluster-local`: `Cluster::generate` in local mode (router → replica actor → engine);
//! - `cluster-remote`: the same with the replica in a worker process (`xinf worker`) joined
//!   over loopback TCP;
//! - `rest-direct`, `rest-local`, `rest-remote`: `POST /v1/completions` over a kept-alive
//!   HTTP connection into a single-engine server and into the two clusters.
//!
//! `stats-local` / `stats-remote` time `Cluster::stats`: one router call plus one call to the
//! replica actor, in process or across the node connection (the remote actor round trip).
//!
//! Besides criterion's estimates, each case prints p50 and p99 of the samples it timed.

#![allow(missing_docs)] // criterion_group! generates undocumented items

use criterion::{Criterion, criterion_group, criterion_main};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use xinf::actors::{Cluster, LaunchRequest};
use xinf::api::{self, ApiConfig, ClusterService, LocalService};
use xinf::engine::{Engine, GenerateRequest, Prompt, SamplingParams};
use xinf::models::{ModelRequest, resolve};
use xinf::native::{EngineOptions, NativeEngine};

const SECRET: &str = "bench-cluster-secret";
/// More than any context: refused by the engine at submit.
const TOO_MANY: usize = 1 << 20;

fn request(i: u64) -> GenerateRequest {
    GenerateRequest {
        request_id: format!("bench-{i}"),
        prompt: Prompt::Text("The capital of France is".into()),
        sampling: SamplingParams::greedy(TOO_MANY),
    }
}

fn expect_refused<T>(r: Result<T, String>) {
    match r {
        Err(e) if e.contains("context") => {}
        Err(e) => panic!("unexpected error: {e}"),
        Ok(_) => panic!("the engine accepted a request longer than its context"),
    }
}

/// A kept-alive HTTP/1.1 connection, for REST round trips without connection set-up.
struct Http(ureq::Agent, String);

impl Http {
    fn new(addr: std::net::SocketAddr) -> Self {
        Self(ureq::AgentBuilder::new().build(), format!("http://{addr}/v1/completions"))
    }

    fn refused(&self, model: &str) {
        let body =
            serde_json::json!({"model": model, "prompt": "The capital of France is", "max_tokens": TOO_MANY});
        match self.0.post(&self.1).send_json(body) {
            Err(ureq::Error::Status(400, res)) => {
                let text = res.into_string().unwrap_or_default();
                assert!(text.contains("context"), "{text}");
            }
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("the engine accepted a request longer than its context"),
        }
    }
}

/// Samples of one case, for percentiles.
#[derive(Default, Clone)]
struct Samples(Arc<Mutex<Vec<Duration>>>);

impl Samples {
    fn time(&self, iters: u64, mut f: impl FnMut(u64)) -> Duration {
        let mut total = Duration::ZERO;
        let mut all = self.0.lock().unwrap_or_else(|p| p.into_inner());
        for i in 0..iters {
            let t = Instant::now();
            f(i);
            let d = t.elapsed();
            total += d;
            all.push(d);
        }
        total
    }

    fn report(&self, name: &str) {
        let mut all = self.0.lock().unwrap_or_else(|p| p.into_inner()).clone();
        all.sort_unstable();
        if all.is_empty() {
            return;
        }
        let at = |q: f64| all[((all.len() - 1) as f64 * q).round() as usize];
        println!(
            "{name:<16} n={:<6} p50={:>8.1} µs  p99={:>8.1} µs",
            all.len(),
            at(0.5).as_secs_f64() * 1e6,
            at(0.99).as_secs_f64() * 1e6
        );
    }
}

struct Worker(Child);

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `xinf worker` joined to `cluster` and waits until it is registered.
fn spawn_worker(cluster: &str) -> (Worker, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_xinf"))
        .args(["worker", "--supervisor", cluster])
        .env("XINF_CLUSTER_SECRET", SECRET)
        .env("LANG", "C")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn xinf worker");
    let stderr = child.stderr.take().expect("stderr");
    let worker = Worker(child);
    let mut lines = BufReader::new(stderr).lines();
    let id = loop {
        let line = lines.next().expect("the worker exited").expect("read stderr");
        if let Some(rest) = line.strip_prefix("Worker ") {
            break rest.split_whitespace().next().expect("worker id").to_owned();
        }
    };
    std::thread::spawn(move || for _ in lines {});
    (worker, id)
}

fn launch(rt: &tokio::runtime::Runtime, cluster: &Cluster, uid: &str, worker: Option<&str>) {
    let mut v = serde_json::json!({"model_name": "smollm2-instruct", "model_uid": uid});
    if let Some(w) = worker {
        v["replica_config"] = serde_json::json!([{"devices": [{"worker_ip": w, "n_gpu": 0}]}]);
    }
    let req: LaunchRequest = serde_json::from_value(v).expect("launch request");
    rt.block_on(cluster.launch(req)).expect("launch");
}

fn bench(c: &mut Criterion) {
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let model = resolve(&ModelRequest { model_name: "smollm2-instruct".into(), ..Default::default() })
        .expect("resolve smollm2-instruct");
    let engine: Arc<dyn Engine> =
        Arc::new(NativeEngine::load(&model, EngineOptions::default()).expect("load"));

    let local = rt.block_on(Cluster::start_local(xinf::engines())).expect("local cluster");
    launch(&rt, &local, "m", None);
    let remote =
        rt.block_on(Cluster::start_supervisor("127.0.0.1", 0, SECRET, xinf::engines())).expect("supervisor");
    let (_worker, worker_id) = spawn_worker(remote.address().expect("address"));
    launch(&rt, &remote, "m", Some(&worker_id));

    let serve = |service: Arc<dyn api::ModelService>| {
        let config = ApiConfig { port: 0, workers: Some(1), ..ApiConfig::default() };
        rt.block_on(api::serve(config, service)).expect("serve")
    };
    let direct_srv = serve(Arc::new(LocalService::new().with_model("m", "smollm2-instruct", engine.clone())));
    let local_srv = serve(Arc::new(ClusterService::new(local.clone())));
    let remote_srv = serve(Arc::new(ClusterService::new(remote.clone())));

    let mut g = c.benchmark_group("to-engine-submit");
    g.measurement_time(Duration::from_secs(4)).warm_up_time(Duration::from_secs(1));
    let mut reports = Vec::new();

    let s = Samples::default();
    g.bench_function("engine", |b| {
        b.iter_custom(|n| s.time(n, |i| expect_refused(engine.submit(request(i)).map_err(|e| e.to_string()))))
    });
    reports.push(("engine", s));
    for (name, cluster) in [("cluster-local", &local), ("cluster-remote", &remote)] {
        let s = Samples::default();
        g.bench_function(name, |b| {
            b.iter_custom(|n| {
                s.time(n, |i| {
                    let r = rt.block_on(cluster.generate("m", request(i)));
                    expect_refused(r.map_err(|e| e.to_string()));
                })
            })
        });
        reports.push((name, s));
    }
    for (name, srv) in
        [("rest-direct", &direct_srv), ("rest-local", &local_srv), ("rest-remote", &remote_srv)]
    {
        let http = Http::new(srv.local_addr());
        let s = Samples::default();
        g.bench_function(name, |b| b.iter_custom(|n| s.time(n, |_| http.refused("m"))));
        reports.push((name, s));
    }
    for (name, cluster) in [("stats-local", &local), ("stats-remote", &remote)] {
        let s = Samples::default();
        g.bench_function(name, |b| {
            b.iter_custom(|n| {
                s.time(n, |_| {
                    let stats = rt.block_on(cluster.stats("m")).expect("stats");
                    assert_eq!(stats.len(), 1);
                })
            })
        });
        reports.push((name, s));
    }
    g.finish();
    for (name, s) in &reports {
        s.report(name);
    }
    rt.block_on(async {
        for srv in [&direct_srv, &local_srv, &remote_srv] {
            srv.stop(false).await;
        }
        local.shutdown().await;
        remote.shutdown().await;
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
