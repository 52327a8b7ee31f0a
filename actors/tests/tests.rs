//! The actors with the mock engine (no weights; deterministic output, a real paged KV cache):
//! local mode with two replicas, a failed launch, abort, cluster authentication, and a worker
//! in another process that serves and then dies.

use futures::StreamExt;
use serde_json::json;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;
use xinf_actors::{
    ActorError, Cluster, ClusterOptions, LaunchRequest, LaunchRule, ModelStatus, ReplicaStatus, Role,
    ScaleRequest,
};
use xinf_engine::{
    EngineError, Engines, FinishReason, GenerateRequest, Prompt, SamplingParams, TokenEvent, TokenStream,
};
use xinf_engine_mock::MockLoader;
use xinf_test_util::eventually;

#[path = "tests/admission.rs"]
mod admission;
#[path = "tests/pd.rs"]
mod pd;
#[path = "tests/recovery.rs"]
mod recovery;
mod serving;

/// Logs to stderr when `RUST_LOG` asks for it (`RUST_LOG=xinf_actors=debug`).
fn init_logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .try_init();
}

/// Short time limits so that failures show within seconds.
fn options() -> ClusterOptions {
    init_logs();
    let mut o = ClusterOptions::default();
    o.engines = engines();
    o.heartbeat_interval = Duration::from_millis(200);
    o.heartbeat_timeout = Duration::from_millis(2_000);
    o.call_timeout = Duration::from_secs(5);
    o.load_timeout = Duration::from_secs(120);
    o.stop_timeout = Duration::from_secs(5);
    o.long_poll = Duration::from_millis(500);
    o.idle_abort = Duration::from_secs(3);
    o.join_timeout = Duration::from_secs(10);
    o
}

/// The mock engine, the only one these nodes offer.
fn engines() -> Engines {
    Engines::new(vec![Arc::new(MockLoader::default())])
}

/// A launch of the mock engine whose tokens take 5 ms each, so that a long request is still
/// running when a test acts on it.
fn launch_request(v: serde_json::Value) -> LaunchRequest {
    let mut base = json!({"model_name": "smollm2-instruct", "kv_cache_tokens": 1024, "step_ms": 5});
    for (k, val) in v.as_object().expect("an object") {
        base[k] = val.clone();
    }
    serde_json::from_value(base).expect("a launch request")
}

fn request(id: &str, prompt: &str, max_tokens: usize) -> GenerateRequest {
    GenerateRequest {
        request_id: id.into(),
        prompt: Prompt::Text(prompt.into()),
        sampling: SamplingParams::greedy(max_tokens),
    }
}

/// A request that runs to `max_tokens` (end-of-sequence tokens do not end it), so that it is
/// still running when the test acts on it.
fn long_request(id: &str, prompt: &str) -> GenerateRequest {
    let mut r = request(id, prompt, 400);
    r.sampling.ignore_eos = true;
    r
}

/// Everything a stream produced: text, finish reason, first error.
async fn collect(mut stream: TokenStream) -> (String, Option<FinishReason>, Option<EngineError>) {
    let mut text = String::new();
    let read = async {
        while let Some(event) = stream.next().await {
            match event {
                Ok(TokenEvent::Delta { text: t, .. }) => text.push_str(&t),
                Ok(TokenEvent::Finished { reason, .. }) => return (Some(reason), None),
                Ok(TokenEvent::Prompt(_)) => {}
                Err(e) => return (None, Some(e)),
            }
        }
        (None, None)
    };
    let (reason, error) = tokio::time::timeout(Duration::from_secs(60), read).await.expect("the stream ends");
    (text, reason, error)
}

/// Local mode: two hybrid replicas take turns, duplicate ids are refused, abort and a dropped
/// stream end requests, and terminate leaves only the supervisor and the worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_mode_round_robins_over_two_replicas() {
    let cluster = Cluster::start_local_with(options()).await.expect("start");
    let base_actors = cluster.debug_actor_names();
    assert_eq!(base_actors.len(), 2, "supervisor and worker: {base_actors:?}");
    let workers = cluster.list_workers().await.expect("workers");
    assert_eq!(workers.len(), 1);
    assert_eq!(workers[0].info.worker_id, "local");

    let uid = cluster.launch(launch_request(json!({"replica": 2}))).await.expect("launch");
    assert_eq!(uid, "smollm2-instruct");
    let info = cluster.get_model(&uid).await.expect("model");
    assert_eq!(info.status, ModelStatus::Ready);
    let replicas: Vec<(&str, ReplicaStatus)> =
        info.replicas.iter().map(|r| (r.replica_uid.as_str(), r.status)).collect();
    assert_eq!(
        replicas,
        [("smollm2-instruct-0", ReplicaStatus::Alive), ("smollm2-instruct-1", ReplicaStatus::Alive)]
    );
    assert_eq!(cluster.debug_actor_names().len(), 2 + 2 + 2, "two replicas, a router, a tracker");

    // Four requests alternate; greedy output is the same on both replicas.
    let mut texts = Vec::new();
    for _ in 0..4 {
        let stream =
            cluster.generate(&uid, request("", "The capital of France is", 6)).await.expect("generate");
        let (text, reason, error) = collect(stream).await;
        assert!(error.is_none(), "{error:?}");
        assert!(matches!(reason, Some(FinishReason::Length | FinishReason::Stop)));
        assert!(!text.is_empty());
        texts.push(text);
    }
    assert!(texts.windows(2).all(|w| w[0] == w[1]), "{texts:?}");
    let stats = cluster.stats(&uid).await.expect("stats");
    let served: Vec<(&str, u64)> =
        stats.iter().map(|s| (s.replica_uid.as_str(), s.requests_served)).collect();
    assert_eq!(served, [("smollm2-instruct-0", 2), ("smollm2-instruct-1", 2)]);
    assert!(stats.iter().all(|s| s.generated_tokens > 0 && s.prompt_tokens > 0));

    // A running id is refused; abort ends it.
    let long = cluster
        .generate(&uid, long_request("dup", "Tell me a long story about a dragon."))
        .await
        .expect("long");
    let again = cluster.generate(&uid, request("dup", "Hello", 4)).await.map(|_| ()).expect_err("duplicate");
    assert_eq!(again, ActorError::DuplicateRequest("dup".into()));
    assert!(cluster.abort(&uid, "dup").await.expect("abort"), "the request was running");
    let (_, reason, error) = collect(long).await;
    assert!(
        reason == Some(FinishReason::Abort) || error == Some(EngineError::Aborted),
        "{reason:?} {error:?}"
    );
    assert!(!cluster.abort(&uid, "dup").await.expect("abort again"), "nothing left to abort");

    // Dropping a stream aborts its request on the replica.
    let mut dropped = cluster
        .generate(&uid, long_request("dropped", "Tell me a long story about a knight."))
        .await
        .expect("gen");
    assert!(dropped.next().await.is_some());
    drop(dropped);
    let (c, u) = (&cluster, uid.as_str());
    eventually(Duration::from_secs(10), "the dropped request to stop", || async move {
        c.stats(u).await.expect("stats").iter().all(|s| s.running == 0 && s.queued == 0)
    })
    .await;
    // Its id is free again once the pull loop has finished.
    eventually(Duration::from_secs(5), "the dropped id to be released", || async move {
        match c.generate(u, request("dropped", "Hi", 1)).await {
            Ok(s) => {
                collect(s).await;
                true
            }
            Err(ActorError::DuplicateRequest(_)) => false,
            Err(e) => panic!("{e}"),
        }
    })
    .await;

    // Unknown models, scaling.
    let e = cluster.generate("nope", request("", "Hi", 1)).await.map(|_| ()).expect_err("unknown");
    assert_eq!(e, ActorError::ModelNotFound("nope".into()));

    // Scale-up: a copy of the first replica joins the rotation and serves.
    let added = cluster.scale(&uid, ScaleRequest::default()).await.expect("scaled");
    assert_eq!(added, ["smollm2-instruct-2"]);
    let info = cluster.get_model(&uid).await.expect("model");
    assert_eq!(info.replicas.iter().filter(|r| r.status == ReplicaStatus::Alive).count(), 3);
    for _ in 0..3 {
        collect(cluster.generate(&uid, request("", "Hi", 2)).await.expect("generate")).await;
    }
    let stats = cluster.stats(&uid).await.expect("stats");
    let new = stats.iter().find(|s| s.replica_uid == "smollm2-instruct-2").expect("in the router");
    assert!(new.requests_served > 0, "{stats:?}");
    let e = cluster
        .scale(&uid, ScaleRequest { role: Some(Role::Decode), ..ScaleRequest::default() })
        .await
        .expect_err("no decode replica to copy");
    assert!(e.to_string().contains("has no decode replica to copy"), "{e}");
    assert_eq!(cluster.get_model(&uid).await.expect("model").replicas.len(), 3, "nothing left behind");

    // The block tracker answers; terminate leaves the supervisor and the worker only.
    let tracker = cluster.block_tracker(&uid).await.expect("tracker");
    tracker.register("smollm2-instruct-0", vec![(42, 1)]).expect("register");
    let found = tracker.query(vec![42, 43], None).await.expect("query");
    assert_eq!(found.len(), 1);
    cluster.terminate(&uid).await.expect("terminate");
    assert_eq!(cluster.debug_actor_names(), base_actors);
    assert!(cluster.list_models().await.expect("models").is_empty());
    let e = cluster.generate(&uid, request("", "Hi", 1)).await.map(|_| ()).expect_err("terminated");
    assert_eq!(e.code(), "model_not_found");

    cluster.shutdown().await;
    assert!(cluster.debug_actor_names().is_empty());
    let e = cluster.generate(&uid, request("", "Hi", 1)).await.map(|_| ()).expect_err("closed");
    assert_eq!(e, ActorError::ShuttingDown);
    assert!(cluster.list_models().await.is_err(), "the supervisor is gone");
}

/// 200 P/D requests, 16 at a time, each ended one of four ways at a random moment — the
/// stream dropped, the abort route, the stream dropped after an abort, or left to finish —
/// leave nothing behind: no running or queued request, no room, no pinned block.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_cancellations_leave_nothing_behind() {
    let cluster = Cluster::start_local_with(options()).await.expect("start");
    // Room in the KV caches for 16 requests of 400 tokens at once.
    let body = json!({"model_uid": "pd", "kv_cache_tokens": 16384,
        "replica_config": [{"role": "prefill"}, {"role": "decode"}]});
    let uid = cluster.launch(launch_request(body)).await.expect("pd");
    let seed: u64 = rand::random();
    eprintln!("random cancellations, seed {seed}");
    let one = |i: u64| {
        let (c, u) = (&cluster, uid.as_str());
        async move {
            let draw = seed
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(i.wrapping_mul(1_442_695_040_888_963_407));
            let (how, after_ms) = ((draw >> 33) % 4, (draw >> 40) % 40);
            let id = format!("r{i}");
            let mut stream = match c.generate(u, long_request(&id, "Tell me a story.")).await {
                Ok(stream) => stream,
                Err(e) => panic!("request {i} did not start: {e}"),
            };
            tokio::time::sleep(Duration::from_millis(after_ms)).await;
            match how {
                0 => drop(stream),
                1 | 2 => {
                    let _ = c.abort(u, &id).await;
                    if how == 2 {
                        drop(stream);
                    } else {
                        while stream.next().await.is_some() {}
                    }
                }
                _ => while stream.next().await.is_some() {},
            }
        }
    };
    futures::stream::iter(0..200).for_each_concurrent(16, one).await;
    let (c, u) = (&cluster, uid.as_str());
    eventually(Duration::from_secs(30), "every request and room to be gone", || async move {
        let stats = c.stats(u).await.expect("stats");
        stats
            .iter()
            .all(|s| s.running == 0 && s.queued == 0 && s.pinned_blocks == 0 && s.handoff.active_rooms == 0)
    })
    .await;
    let (_, reason, error) =
        collect(cluster.generate(&uid, request("", "Hi", 4)).await.expect("after")).await;
    assert!(error.is_none() && reason.is_some(), "{reason:?} {error:?}");
    cluster.shutdown().await;
}

/// A launch whose weights do not load leaves no actor and no state behind, and the same uid
/// can be launched again; a request that fails validation creates nothing at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_launch_leaves_nothing_behind() {
    let cluster = Cluster::start_local_with(options()).await.expect("start");
    let before = cluster.debug_actor_names();
    let bad = launch_request(json!({
        "model_uid": "broken", "replica": 2, "model_path": "/nonexistent/xinf-test/model.gguf"
    }));
    for _ in 0..2 {
        let e = cluster.launch(bad.clone()).await.expect_err("the weights do not exist");
        assert!(
            matches!(&e, ActorError::Engine(EngineError::Model(m)) if m.contains("/nonexistent/xinf-test")),
            "{e}"
        );
        assert_eq!(cluster.debug_actor_names(), before);
        assert!(cluster.list_models().await.expect("models").is_empty());
        assert_eq!(cluster.get_model("broken").await, Err(ActorError::ModelNotFound("broken".into())));
    }
    let e = cluster.launch(launch_request(json!({"replica": 0}))).await.expect_err("invalid");
    assert_eq!(e.launch_rule(), Some(LaunchRule::InvalidField));
    assert_eq!(cluster.debug_actor_names(), before);
    cluster.shutdown().await;
}

/// Nodes with different secrets do not join; wildcard listen addresses are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_with_different_secrets_refuse_each_other() {
    let _turn = node_turn().await;
    let sup =
        Cluster::start_supervisor_with("127.0.0.1", 0, "secret-one", options()).await.expect("supervisor");
    let addr = sup.address().expect("an address").to_owned();
    let mut o = options();
    o.join_timeout = Duration::from_secs(30);
    let e = Cluster::start_worker_with(&addr, "127.0.0.1", "secret-two", o).await.expect_err("wrong secret");
    assert_eq!(e.code(), "cluster_join_failed", "{e}");
    // Refused during authentication, not by running out of time.
    assert!(e.to_string().contains("secrets differ"), "{e}");
    assert!(sup.list_workers().await.expect("workers").is_empty());

    let e =
        Cluster::start_supervisor("0.0.0.0", 0, "wildcard-secret", engines()).await.expect_err("wildcard");
    assert_eq!(e.code(), "invalid_cluster_config");
    let e = Cluster::start_worker(&addr, "::", "wildcard-secret", engines()).await.expect_err("wildcard");
    assert_eq!(e.code(), "invalid_cluster_config");
    let e = Cluster::start_supervisor("127.0.0.1", 0, "", engines()).await.expect_err("empty secret");
    assert_eq!(e.code(), "invalid_cluster_config");
    let e = Cluster::start_supervisor("127.0.0.1", 0, "short", engines()).await.expect_err("short secret");
    assert!(e.to_string().contains("fewer than 8"), "{e}");
    sup.shutdown().await;
}

/// Kills the child process when a test ends, however it ends.
struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A worker in another process joins with the secret, serves a replica across the process
/// boundary, and when it dies its replica is marked dead, its in-flight request fails at once,
/// and the model reports no replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_in_another_process_serves_and_its_loss_is_noticed() {
    let (sup, mut workers, ids, _turn) = supervisor_with_workers("secret-cross-process", 1).await;
    let (guard, worker_id) = (&mut workers[0], ids[0].clone());

    let uid = sup
        .launch(launch_request(json!({"model_uid": "remote", "replica_config": [
            {"replica_uid": "remote-a", "devices": [{"worker_ip": worker_id, "n_gpu": 0}]}
        ]})))
        .await
        .expect("launch on the remote worker");
    let (text, reason, error) =
        collect(sup.generate(&uid, request("", "The capital of France is", 6)).await.expect("generate"))
            .await;
    assert!(error.is_none() && reason.is_some() && !text.is_empty(), "{text:?} {reason:?} {error:?}");
    let stats = sup.stats(&uid).await.expect("stats");
    assert_eq!(stats.len(), 1);
    assert_eq!((stats[0].worker_id.as_str(), stats[0].requests_served), (worker_id.as_str(), 1));

    // Kill the worker while a request streams.
    let mut long =
        sup.generate(&uid, long_request("", "Tell me a long story about a dragon.")).await.expect("long");
    assert!(long.next().await.is_some());
    let killed = tokio::time::Instant::now();
    let _ = guard.0.kill();
    let (_, reason, error) = collect(long).await;
    assert!(reason.is_none() && error.is_some(), "the request must fail: {reason:?} {error:?}");
    assert!(killed.elapsed() < Duration::from_secs(8), "it failed after {:?}", killed.elapsed());

    let (s, u) = (&sup, uid.as_str());
    eventually(Duration::from_secs(10), "the replica to be marked dead", || async move {
        s.get_model(u).await.expect("model").status == ModelStatus::Unavailable
    })
    .await;
    let info = sup.get_model(&uid).await.expect("model");
    assert_eq!(info.replicas[0].status, ReplicaStatus::Dead);
    let e = sup.generate(&uid, request("", "Hi", 1)).await.map(|_| ()).expect_err("no replica");
    assert_eq!(e, ActorError::NoReplica { model_uid: uid.clone(), role: None });
    assert!(!sup.list_workers().await.expect("workers")[0].alive);
    sup.terminate(&uid).await.expect("terminate");
    sup.shutdown().await;
}

/// A P/D request whose prefill is over runs on its decode replica alone: losing the prefill
/// worker (SIGKILL) fails only what that worker still computes, and a request already decoding
/// on the other worker streams to its end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_the_prefill_worker_spares_requests_already_decoding() {
    // Joined one at a time: the first is the prefill worker, killed below.
    let (sup, mut workers, ids, _turn) = supervisor_with_workers("secret-prefill-loss", 2).await;
    let uid = sup
        .launch(launch_request(json!({"model_uid": "pd", "replica_config": [
            {"role": "prefill", "replica_uid": "pd-p", "devices": [{"worker_ip": ids[0], "n_gpu": 0}]},
            {"role": "decode", "replica_uid": "pd-d", "devices": [{"worker_ip": ids[1], "n_gpu": 0}]},
        ]})))
        .await
        .expect("launch across the two workers");
    let mut long = sup.generate(&uid, long_request("", "Tell me a long story.")).await.expect("long");
    // The first token is the prefill's, shown before the decode replica has the KV; the second
    // comes from the decode replica.
    let mut text = String::new();
    for _ in 0..2 {
        if let Some(Ok(TokenEvent::Delta { text: t, .. })) = long.next().await {
            text.push_str(&t);
        }
    }
    let _ = workers[0].0.kill();
    let (rest, reason, error) = collect(long).await;
    assert!(error.is_none(), "a request already decoding must not fail: {error:?}");
    assert_eq!(reason, Some(FinishReason::Length));
    assert!(!(text + &rest).is_empty());

    // The prefill replica is lost: new requests have none to start on.
    let (s, u) = (&sup, uid.as_str());
    eventually(Duration::from_secs(10), "the prefill replica to be marked dead", || async move {
        let info = s.get_model(u).await.expect("model");
        info.replicas.iter().any(|r| r.replica_uid == "pd-p" && r.status == ReplicaStatus::Dead)
    })
    .await;
    let e = sup.generate(&uid, request("", "Hi", 1)).await.map(|_| ()).expect_err("no prefill replica");
    assert_eq!(e.to_string(), "model `pd` has no alive prefill replica; retry once one serves again");
    assert_eq!(sup.get_model(&uid).await.expect("model").status, ModelStatus::Unavailable);
    sup.terminate(&uid).await.expect("terminate");
    sup.shutdown().await;
}

/// A frozen worker (SIGSTOP: its connection stays open, its heartbeats stop) is declared lost
/// at the heartbeat deadline, and a request streaming from it fails then, not a call's time
/// limit later (the abort sent to the frozen replica waits for that limit, after the caller
/// has heard).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_worker_fails_its_requests_at_the_heartbeat_deadline() {
    let (sup, workers, ids, _turn) = supervisor_with_workers("secret-frozen-worker", 1).await;
    let worker_id = ids[0].clone();
    let uid = sup
        .launch(launch_request(json!({"model_uid": "frozen", "replica_config": [
            {"devices": [{"worker_ip": worker_id, "n_gpu": 0}]}]})))
        .await
        .expect("launch");
    let mut long = sup.generate(&uid, long_request("", "Tell me a long story.")).await.expect("long");
    assert!(long.next().await.is_some());
    let pid = workers[0].0.id().to_string();
    let signal = |sig: &str| Command::new("kill").args([sig, &pid]).status().expect("kill").success();
    assert!(signal("-STOP"));
    let frozen = tokio::time::Instant::now();
    let (_, reason, error) = collect(long).await;
    let after = frozen.elapsed();
    assert!(signal("-CONT"));
    assert!(reason.is_none() && error.is_some(), "the request must fail: {reason:?} {error:?}");
    // The heartbeat deadline is 2 s here and a call's time limit 5 s: failing at the deadline
    // (plus a check interval) is well under the sum of both.
    let bound = options().heartbeat_timeout + Duration::from_secs(2);
    assert!(after < bound, "it failed {after:?} after the worker froze (bound {bound:?})");
    sup.shutdown().await;
}

/// A worker restarted under its id (`--worker-id`) takes the place of its lost self in the
/// supervisor's table: one worker, alive again, not a second one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_restarted_under_its_id_is_the_same_worker() {
    let secret = "secret-stable-worker";
    let _turn = node_turn().await;
    let sup = Cluster::start_supervisor_with("127.0.0.1", 0, secret, options()).await.expect("supervisor");
    let addr = sup.address().expect("an address").to_owned();
    let s = &sup;
    let listed = || async move {
        let workers = s.list_workers().await.expect("workers");
        workers.into_iter().map(|w| (w.info.worker_id, w.alive)).collect::<Vec<_>>()
    };
    let mut first = child_worker_process_with(&addr, secret, Some("gpu-box-1"), &[]);
    eventually(Duration::from_secs(30), "the worker to join", || async move {
        listed().await == [("gpu-box-1".to_owned(), true)]
    })
    .await;
    let _ = first.0.kill();
    eventually(Duration::from_secs(10), "the worker to be lost", || async move {
        listed().await == [("gpu-box-1".to_owned(), false)]
    })
    .await;
    let _second = child_worker_process_with(&addr, secret, Some("gpu-box-1"), &[]);
    eventually(Duration::from_secs(30), "the worker to come back", || async move {
        listed().await == [("gpu-box-1".to_owned(), true)]
    })
    .await;
    sup.shutdown().await;
}

/// A supervisor and `n` worker processes, joined one at a time; the workers' ids in the order
/// of the processes.
async fn supervisor_with_workers(
    secret: &str,
    n: usize,
) -> (Cluster, Vec<ChildGuard>, Vec<String>, NodeTurn) {
    let turn = node_turn().await;
    let sup = Cluster::start_supervisor_with("127.0.0.1", 0, secret, options()).await.expect("supervisor");
    let addr = sup.address().expect("an address").to_owned();
    let (mut workers, mut ids) = (Vec::new(), Vec::<String>::new());
    for joined in 1..=n {
        workers.push(child_worker_process(&addr, secret));
        let s = &sup;
        eventually(Duration::from_secs(30), "a worker process to join", || async move {
            s.list_workers().await.expect("workers").iter().filter(|w| w.alive).count() == joined
        })
        .await;
        let all = sup.list_workers().await.expect("workers");
        let new =
            all.into_iter().map(|w| w.info.worker_id).find(|id| !ids.contains(id)).expect("a new worker");
        ids.push(new);
    }
    (sup, workers, ids, turn)
}

/// The right to run cluster nodes in this process, held by one test at a time: ractor_cluster
/// numbers the peers of each node server from 1, so two node servers in one process give
/// their peers' actors the same ids, and one losing a peer drops the other's actors too.
type NodeTurn = tokio::sync::MutexGuard<'static, ()>;

async fn node_turn() -> NodeTurn {
    static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    TURN.lock().await
}

/// Starts a worker process (this test binary's `child_worker`) that joins `addr`.
fn child_worker_process(addr: &str, secret: &str) -> ChildGuard {
    child_worker_process_with(addr, secret, None, &[])
}

/// [`child_worker_process`] with a worker id of its own and more environment.
fn child_worker_process_with(
    addr: &str,
    secret: &str,
    worker_id: Option<&str>,
    env: &[(&str, &str)],
) -> ChildGuard {
    let exe = std::env::current_exe().expect("the test binary");
    let mut command = Command::new(exe);
    if let Some(id) = worker_id {
        command.env("XINF_TEST_WORKER_ID", id);
    }
    command.envs(env.iter().copied());
    let child = command
        .args(["--exact", "child_worker", "--ignored", "--nocapture", "--test-threads=1"])
        .env("XINF_TEST_SUPERVISOR", addr)
        .env("XINF_TEST_SECRET", secret)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("start the worker process");
    ChildGuard(child)
}

/// The worker process of the tests above; runs only when one of them starts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "started by the tests of workers in other processes"]
async fn child_worker() {
    let (Ok(addr), Ok(secret)) = (std::env::var("XINF_TEST_SUPERVISOR"), std::env::var("XINF_TEST_SECRET"))
    else {
        panic!("child_worker is started by another test, with XINF_TEST_SUPERVISOR and XINF_TEST_SECRET");
    };
    let mut options = options();
    options.worker_id = std::env::var("XINF_TEST_WORKER_ID").ok();
    let node = Cluster::start_worker_with(&addr, "127.0.0.1", &secret, options).await.expect("join");
    tracing::info!(worker_id = node.worker_id(), "the test worker joined");
    // Serve until the parent closes stdin (or kills this process).
    let _ = tokio::task::spawn_blocking(|| std::io::stdin().read_line(&mut String::new())).await;
    node.shutdown().await;
}
