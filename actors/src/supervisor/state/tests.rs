//! The registry's transitions: registration, launch bookkeeping, lost workers, terminate.

use super::*;
use crate::launch::{LaunchRequest, validate};
use serde_json::json;

mod recovery;
mod removal;

fn info(id: &str, gpus: &[u32]) -> WorkerInfo {
    WorkerInfo {
        worker_id: id.into(),
        host: "127.0.0.1".into(),
        gpus: gpus.to_vec(),
        gpu_details: gpus.iter().map(|g| crate::view::GpuInfo::index_only(*g)).collect(),
        allow_gpu_sharing: false,
        memory: None,
        instance: 0,
    }
}

fn spec(v: serde_json::Value) -> LaunchSpec {
    let req: LaunchRequest = serde_json::from_value(v).expect("request");
    validate(&req, false, &crate::testing::engines()).expect("valid")
}

/// A state that has heard from CPU-only workers `ids` at `t0`.
fn cpu_workers(ids: &[&str], t0: Instant) -> SupervisorState {
    let mut s = SupervisorState::new();
    for id in ids {
        s.heartbeat(info(id, &[]), t0);
    }
    s
}

/// Model `uid`'s status and its replicas' statuses, by uid.
fn status(s: &SupervisorState, uid: &str) -> (ModelStatus, Vec<(String, ReplicaStatus)>) {
    let m = s.model(uid).expect("the model");
    (m.status, m.replicas.iter().map(|r| (r.replica_uid.clone(), r.status)).collect())
}

fn launched(state: &mut SupervisorState, v: serde_json::Value) -> (String, Vec<Placement>) {
    let s = spec(v);
    let out = state.begin_launch(&s, "smollm2-instruct", || "abcd".into()).expect("placed");
    state.finish_launch(&out.0);
    out
}

#[test]
fn heartbeats_register_and_revive_workers() {
    let t0 = Instant::now();
    let mut s = SupervisorState::new();
    assert!(s.heartbeat(info("a:1", &[]), t0));
    assert!(!s.heartbeat(info("a:1", &[]), t0 + Duration::from_millis(500)));
    assert_eq!(s.alive_workers(), ["a:1"]);
    assert!(s.expire(t0 + Duration::from_secs(6), Duration::from_secs(5)).is_empty());
    assert!(s.alive_workers().is_empty());
    let listed = s.workers(t0 + Duration::from_secs(6));
    assert!(!listed[0].alive);
    assert_eq!(listed[0].last_heartbeat_ms, 5500);
    // It comes back.
    assert!(s.heartbeat(info("a:1", &[]), t0 + Duration::from_secs(7)));
    assert_eq!(s.alive_workers(), ["a:1"]);
}

#[test]
fn a_draining_worker_takes_nothing_new_until_a_new_process_comes_back() {
    let t0 = Instant::now();
    let mut s = cpu_workers(&["a:1", "b:1"], t0);
    let (uid, placements) =
        launched(&mut s, json!({"model_name": "smollm2-instruct", "model_uid": "m", "replica": 2}));
    s.finish_launch(&uid);
    let on_a: Vec<String> =
        placements.iter().filter(|p| p.worker_id == "a:1").map(|p| p.replica_uid.clone()).collect();
    let drained = s.drain_worker("a:1");
    assert_eq!(drained, on_a.iter().map(|r| ("m".to_owned(), r.clone())).collect::<Vec<_>>());
    assert!(s.drain_worker("nobody").is_empty());
    let open = |s: &SupervisorState| -> Vec<String> {
        s.view().workers.into_iter().filter(|w| !w.draining).map(|w| w.worker_id).collect()
    };
    assert_eq!(open(&s), ["b:1"]);
    assert!(!s.heartbeat(info("a:1", &[]), t0 + Duration::from_secs(1)), "still the same worker");
    let listed = s.workers(t0 + Duration::from_secs(1));
    assert_eq!(
        listed.iter().map(|w| (w.info.worker_id.as_str(), w.draining)).collect::<Vec<_>>(),
        [("a:1", true), ("b:1", false)]
    );
    // It stops, is lost, and a new process comes back under its id: it takes new replicas.
    s.lose_worker("a:1");
    assert!(s.heartbeat(info("a:1", &[]), t0 + Duration::from_secs(2)));
    assert_eq!(open(&s), ["a:1", "b:1"]);
}

#[test]
fn another_process_under_an_alive_workers_id_is_told_apart() {
    let t0 = Instant::now();
    let mut s = cpu_workers(&["a:1"], t0);
    let twin = WorkerInfo { instance: 7, ..info("a:1", &[]) };
    assert_eq!(s.other_instance(&info("a:1", &[])), None, "the same process");
    assert_eq!(s.other_instance(&twin), Some(true), "worth a warning the first time");
    assert_eq!(s.other_instance(&twin), Some(false));
    s.lose_worker("a:1");
    assert_eq!(s.other_instance(&twin), None, "the id is free once its worker is lost");
    assert!(s.heartbeat(twin.clone(), t0 + Duration::from_secs(1)));
    assert_eq!(s.other_instance(&info("a:1", &[])), Some(true), "the old process, thawed");
}

#[test]
fn a_launch_reserves_its_uid_and_replicas() {
    let mut s = SupervisorState::new();
    s.heartbeat(info("a:1", &[]), Instant::now());
    let sp = spec(json!({"model_name": "smollm2-instruct", "replica": 2}));
    let (uid, placed) = s.begin_launch(&sp, "smollm2-instruct", || "abcd".into()).expect("placed");
    assert_eq!(uid, "smollm2-instruct");
    assert_eq!(placed.len(), 2);
    let m = s.model(&uid).expect("recorded");
    assert_eq!(m.status, ModelStatus::Launching);
    assert!(m.replicas.iter().all(|r| r.status == ReplicaStatus::Loading));
    // The name is taken: a generated suffix.
    let (uid2, _) = s.begin_launch(&sp, "smollm2-instruct", || "abcd".into()).expect("placed");
    assert_eq!(uid2, "smollm2-instruct-abcd");
    // An explicit uid that exists is refused.
    let sp3 = spec(json!({"model_name": "smollm2-instruct", "model_uid": "smollm2-instruct"}));
    assert_eq!(
        s.begin_launch(&sp3, "smollm2-instruct", || "x".into()),
        Err(ActorError::ModelExists("smollm2-instruct".into()))
    );
    assert!(s.finish_launch(&uid).is_empty());
    assert_eq!(s.model(&uid).map(|m| m.status), Some(ModelStatus::Ready));
    assert!(s.model(&uid).expect("model").replicas.iter().all(|r| r.status == ReplicaStatus::Alive));
}

#[test]
fn a_failed_launch_leaves_no_state() {
    let mut s = SupervisorState::new();
    s.heartbeat(info("a:1", &[0]), Instant::now());
    let sp = spec(json!({"model_name": "smollm2-instruct", "model_uid": "m", "n_gpu": 1}));
    s.begin_launch(&sp, "smollm2-instruct", || "x".into()).expect("placed");
    assert_eq!(s.view().workers[0].occupied.len(), 1);
    s.abort_launch("m");
    assert!(s.model("m").is_none());
    assert!(s.models().is_empty());
    // Its GPU and uids are free again.
    assert!(s.view().workers[0].occupied.is_empty());
    assert!(s.view().replica_uids.is_empty());
    s.begin_launch(&sp, "smollm2-instruct", || "x".into()).expect("placed again");
}

#[test]
fn nixl_launches_are_placed_like_any_p_d_launch() {
    let mut s = SupervisorState::new();
    s.heartbeat(info("a:1", &[]), Instant::now());
    let sp =
        spec(json!({"model_name": "smollm2-instruct", "transfer_backend_type": "nixl", "replica_config": [
            {"role": "prefill", "devices": [{"worker_ip": "a:1"}]},
            {"role": "decode", "devices": [{"worker_ip": "a:1"}]}
        ]}));
    let (_, placed) = s.begin_launch(&sp, "smollm2-instruct", || "x".into()).expect("NIXL P/D placed");
    assert_eq!(placed.len(), 2);
    // Placement is checked as for any launch.
    let sp =
        spec(json!({"model_name": "smollm2-instruct", "transfer_backend_type": "nixl", "replica_config": [
            {"role": "prefill", "devices": [{"worker_ip": "b:1"}]},
            {"role": "decode", "devices": [{"worker_ip": "a:1"}]}
        ]}));
    let e = s.begin_launch(&sp, "smollm2-instruct", || "x".into()).expect_err("unknown worker");
    assert_eq!(e.launch_rule(), Some(crate::LaunchRule::UnknownWorker));
}

#[test]
fn placement_round_robin_continues_across_launches() {
    let mut s = SupervisorState::new();
    let now = Instant::now();
    s.heartbeat(info("a:1", &[]), now);
    s.heartbeat(info("b:1", &[]), now);
    let (_, first) = launched(&mut s, json!({"model_name": "smollm2-instruct", "model_uid": "m1"}));
    let (_, second) =
        launched(&mut s, json!({"model_name": "smollm2-instruct", "model_uid": "m2", "replica": 2}));
    assert_eq!(first[0].worker_id, "a:1");
    let on: Vec<&str> = second.iter().map(|p| p.worker_id.as_str()).collect();
    assert_eq!(on, ["b:1", "a:1"]);
}

#[test]
fn a_lost_worker_marks_its_replicas_dead_and_spares_other_models() {
    let t0 = Instant::now();
    let mut s = cpu_workers(&["a:1", "b:1"], t0);
    // m1 has one replica on each worker; m2 only on b.
    launched(&mut s, json!({"model_name": "smollm2-instruct", "model_uid": "m1", "replica": 2}));
    launched(&mut s, json!({"model_name": "smollm2-instruct", "model_uid": "m2", "worker_ip": "b:1"}));
    // a goes quiet, b keeps beating.
    s.heartbeat(info("b:1", &[]), t0 + Duration::from_secs(4));
    let lost = s.expire(t0 + Duration::from_secs(6), Duration::from_secs(5));
    assert_eq!(lost, vec![LostReplica { model_uid: "m1".into(), replica_uid: "m1-0".into() }]);
    let m1 = s.model("m1").expect("m1");
    assert_eq!(m1.status, ModelStatus::Degraded, "one replica is left");
    let status: Vec<ReplicaStatus> = m1.replicas.iter().map(|r| r.status).collect();
    assert_eq!(status, [ReplicaStatus::Dead, ReplicaStatus::Alive]);
    assert_eq!(s.model("m2").map(|m| m.status), Some(ModelStatus::Ready));
    // Losing b too leaves both models without replicas.
    let lost = s.lose_worker("b:1");
    assert_eq!(lost.len(), 2);
    assert_eq!(s.model("m1").map(|m| m.status), Some(ModelStatus::Unavailable));
    assert_eq!(s.model("m2").map(|m| m.status), Some(ModelStatus::Unavailable));
    // Losing it again changes nothing; new launches avoid lost workers.
    assert!(s.lose_worker("b:1").is_empty());
    let e = s
        .begin_launch(
            &spec(json!({"model_name": "smollm2-instruct", "model_uid": "m3"})),
            "smollm2-instruct",
            || "x".into(),
        )
        .expect_err("no alive worker");
    assert_eq!(e.launch_rule(), Some(crate::LaunchRule::NoWorkers));
}

#[test]
fn dead_replicas_free_their_gpus() {
    let t0 = Instant::now();
    let mut s = SupervisorState::new();
    s.heartbeat(info("a:1", &[0]), t0);
    launched(&mut s, json!({"model_name": "smollm2-instruct", "model_uid": "m1", "n_gpu": 1}));
    let on_gpu0 = |s: &SupervisorState| -> Vec<String> {
        s.view().workers[0]
            .occupied
            .get(&0)
            .map_or_else(Vec::new, |t| t.iter().map(|t| t.model_uid.clone()).collect())
    };
    assert_eq!(on_gpu0(&s), ["m1"]);
    assert!(s.replica_dead("m1", "m1-0").is_some());
    assert!(s.replica_dead("m1", "m1-0").is_none(), "already dead");
    assert!(s.view().workers[0].occupied.is_empty());
    assert_eq!(s.model("m1").map(|m| m.status), Some(ModelStatus::Unavailable));
}

#[test]
fn a_replica_lost_while_launching_is_reported_at_the_end() {
    let t0 = Instant::now();
    let mut s = cpu_workers(&["a:1", "b:1"], t0);
    let sp = spec(json!({"model_name": "smollm2-instruct", "model_uid": "m", "replica": 2}));
    s.begin_launch(&sp, "smollm2-instruct", || "x".into()).expect("placed");
    let lost = s.lose_worker("a:1");
    assert_eq!(lost.len(), 1);
    assert_eq!(s.model("m").map(|m| m.status), Some(ModelStatus::Launching));
    let dead = s.finish_launch("m");
    assert_eq!(dead, vec![LostReplica { model_uid: "m".into(), replica_uid: "m-0".into() }]);
    assert_eq!(s.model("m").map(|m| m.status), Some(ModelStatus::Degraded), "it serves with one replica");
}

/// One CPU worker `a:1` and model `m` placed on it, launching.
fn one_model_launching() -> SupervisorState {
    let mut s = SupervisorState::new();
    s.heartbeat(info("a:1", &[]), Instant::now());
    let sp = spec(json!({"model_name": "smollm2-instruct", "model_uid": "m"}));
    s.begin_launch(&sp, "smollm2-instruct", || "x".into()).expect("placed");
    s
}

#[test]
fn terminate_moves_through_terminating() {
    let mut s = one_model_launching();
    assert!(matches!(s.begin_terminate("m"), Err(ActorError::NotReady { .. })), "still launching");
    s.finish_launch("m");
    assert_eq!(s.begin_terminate("m"), Ok(vec![("a:1".to_owned(), "m-0".to_owned())]));
    assert_eq!(s.model("m").map(|m| m.status), Some(ModelStatus::Terminating));
    assert!(matches!(s.begin_terminate("m"), Err(ActorError::NotReady { .. })));
    s.finish_terminate("m");
    assert_eq!(s.begin_terminate("m"), Err(ActorError::ModelNotFound("m".into())));
}

#[test]
fn a_launching_model_is_cancelled_and_gone_when_its_launch_reports() {
    let mut s = one_model_launching();
    assert!(!s.is_terminating("m"));
    assert_eq!(s.cancel_launch("m"), Some(vec![("a:1".to_owned(), "m-0".to_owned())]));
    assert!(s.is_terminating("m"), "it shows as terminating until its launch reports");
    assert_eq!(s.cancel_launch("m"), None, "cancelled once");
    assert!(matches!(s.begin_terminate("m"), Err(ActorError::NotReady { .. })));
    let again = spec(json!({"model_name": "smollm2-instruct", "model_uid": "m"}));
    let e = s.begin_launch(&again, "smollm2-instruct", || "x".into()).expect_err("its uid is still taken");
    assert_eq!((e.code(), e.class()), ("model_terminating", crate::ErrorClass::Unavailable));
    assert_eq!(e.to_string(), "model `m` is being terminated; launch it again once it is gone");
    s.abort_launch("m");
    assert_eq!(s.model("m"), None);
    assert_eq!(s.cancel_launch("m"), None);
    assert!(s.begin_launch(&again, "smollm2-instruct", || "x".into()).is_ok(), "the uid is free");
}

fn scale(role: Option<Role>, count: Option<u32>) -> ScaleRequest {
    ScaleRequest { role, count, ..ScaleRequest::default() }
}

#[test]
fn a_scale_up_copies_a_replica_of_its_role_and_reserves_it_while_it_loads() {
    let mut s = SupervisorState::new();
    let now = Instant::now();
    s.heartbeat(info("a:1", &[]), now);
    s.heartbeat(info("b:1", &[]), now);
    launched(
        &mut s,
        json!({"model_name": "smollm2-instruct", "model_uid": "m", "replica_config": [
            {"role": "prefill", "devices": [{"worker_ip": "a:1"}]},
            {"role": "decode", "devices": [{"worker_ip": "a:1"}]}
        ]}),
    );
    let plan = s.begin_scale("m", &scale(Some(Role::Decode), Some(2))).expect("placed");
    let uids: Vec<&str> = plan.placements.iter().map(|p| p.replica_uid.as_str()).collect();
    assert_eq!(uids, ["m-2", "m-3"]);
    assert!(
        plan.placements
            .iter()
            .all(|p| p.role == Role::Decode && p.worker_id == "a:1" && p.engine == "native")
    );
    assert_eq!(plan.others, [("m-0".to_owned(), Role::Prefill), ("m-1".to_owned(), Role::Decode)]);
    let m = s.model("m").expect("model");
    assert_eq!(m.replicas.len(), 4);
    assert_eq!(m.status, ModelStatus::Ready, "the model keeps serving while replicas load");
    assert_eq!(m.replicas[2].status, ReplicaStatus::Loading);
    // Elsewhere, when asked.
    let elsewhere = ScaleRequest { worker_ip: Some("b:1".into()), ..scale(Some(Role::Prefill), None) };
    let plan2 = s.begin_scale("m", &elsewhere).expect("placed");
    assert_eq!(
        (plan2.placements[0].replica_uid.as_str(), plan2.placements[0].worker_id.as_str()),
        ("m-4", "b:1")
    );
    // One succeeds, one is rolled back.
    assert!(s.finish_scale("m", &["m-2".into(), "m-3".into()], true).is_empty());
    s.finish_scale("m", &["m-4".into()], false);
    let m = s.model("m").expect("model");
    let alive: Vec<&str> = m
        .replicas
        .iter()
        .filter(|r| r.status == ReplicaStatus::Alive)
        .map(|r| r.replica_uid.as_str())
        .collect();
    assert_eq!(alive, ["m-0", "m-1", "m-2", "m-3"]);
}

#[test]
fn a_scale_up_is_refused_with_the_reason_before_anything_starts() {
    let mut s = SupervisorState::new();
    s.heartbeat(info("a:1", &[]), Instant::now());
    launched(&mut s, json!({"model_name": "smollm2-instruct", "model_uid": "h"}));
    launched(
        &mut s,
        json!({"model_name": "smollm2-instruct", "model_uid": "pd", "replica_config": [
            {"role": "prefill", "devices": [{"worker_ip": "a:1"}]},
            {"role": "decode", "devices": [{"worker_ip": "a:1"}]}
        ]}),
    );
    let msg = |r: Result<ScalePlan, ActorError>| r.expect_err("refused").to_string();
    assert!(msg(s.begin_scale("pd", &scale(None, None))).contains("role must be 'prefill' or 'decode'"));
    assert!(
        msg(s.begin_scale("pd", &scale(Some(Role::Hybrid), None))).contains("has no hybrid replica to copy")
    );
    let field = s
        .begin_scale("pd", &scale(Some(Role::Hybrid), None))
        .err()
        .and_then(|e| e.launch_field().map(str::to_owned));
    assert_eq!(field.as_deref(), Some("role"));
    assert!(
        msg(s.begin_scale("h", &scale(Some(Role::Decode), None))).contains("has no decode replica to copy")
    );
    assert!(msg(s.begin_scale("h", &scale(None, Some(0)))).contains("count must be between 1 and 64"));
    assert!(msg(s.begin_scale("h", &scale(None, Some(65)))).contains("count must be between 1 and 64"));
    let dup = ScaleRequest { gpu_idx: Some(vec![0, 0]), ..scale(None, None) };
    assert!(msg(s.begin_scale("h", &dup)).contains("distinct GPU indexes"));
    let nowhere = ScaleRequest { worker_ip: Some("z:9".into()), ..scale(None, None) };
    assert_eq!(
        s.begin_scale("h", &nowhere).expect_err("unknown").launch_rule(),
        Some(crate::LaunchRule::UnknownWorker)
    );
    assert_eq!(
        s.begin_scale("x", &scale(None, None)).expect_err("none"),
        ActorError::ModelNotFound("x".into())
    );
    // Nothing was reserved by the refusals.
    assert_eq!(s.model("h").map(|m| m.replicas.len()), Some(1));
    // A model still launching cannot grow.
    let sp = spec(json!({"model_name": "smollm2-instruct", "model_uid": "l"}));
    s.begin_launch(&sp, "smollm2-instruct", || "x".into()).expect("placed");
    assert!(matches!(s.begin_scale("l", &scale(None, None)), Err(ActorError::NotReady { .. })));
    // A hybrid model grows by hybrid replicas; a terminated model's spec is gone.
    assert_eq!(s.begin_scale("h", &scale(None, None)).expect("placed").placements[0].role, Role::Hybrid);
    s.finish_scale("h", &["h-1".into()], true);
    s.begin_terminate("h").expect("terminate");
    s.finish_terminate("h");
    assert!(!s.specs.contains_key("h"));
}

/// Launches one model sharing GPU 0 of worker `a:1` with `replicas` replicas of this share each.
fn share_gpu0(s: &mut SupervisorState, uid: &str, replicas: u32, fraction: f64) -> Result<(), ActorError> {
    let sp = spec(json!({
        "model_name": "smollm2-instruct", "model_uid": uid, "replica": replicas, "gpu_idx": 0,
        "gpu_memory_utilization": fraction,
    }));
    s.begin_launch(&sp, "smollm2-instruct", || "x".into()).map(|(uid, _)| {
        s.finish_launch(&uid);
    })
}

fn gpu0_fraction(s: &SupervisorState) -> f64 {
    s.workers(Instant::now())[0].gpu_usage[0].memory_fraction
}

#[test]
fn gpu_memory_shares_add_up_across_launches_and_are_freed() {
    let mut s = SupervisorState::new();
    s.heartbeat(info("a:1", &[0]), Instant::now());
    share_gpu0(&mut s, "m1", 2, 0.3).expect("0.3 + 0.3 fit");
    assert!((gpu0_fraction(&s) - 0.6).abs() < 1e-9);
    assert_eq!(s.workers(Instant::now())[0].gpu_usage[0].replicas, ["m1-0", "m1-1"]);
    // A second model sees the first one's shares.
    let e = share_gpu0(&mut s, "m2", 1, 0.5).expect_err("0.6 + 0.5 > 1");
    assert_eq!(e.launch_rule(), Some(crate::LaunchRule::GpuMemoryOversubscribed), "{e}");
    assert!(e.to_string().contains("'m1-0' of model 'm1' (0.3)"), "{e}");
    share_gpu0(&mut s, "m2", 1, 0.4).expect("0.6 + 0.4 fit exactly");
    // A replica without a share cannot join.
    let sp = spec(json!({"model_name": "smollm2-instruct", "model_uid": "m3", "gpu_idx": 0}));
    let e = s.begin_launch(&sp, "smollm2-instruct", || "x".into()).expect_err("no share");
    assert_eq!(e.launch_rule(), Some(crate::LaunchRule::GpuMemoryUtilizationRequired), "{e}");

    // Terminating a model frees its shares.
    s.begin_terminate("m1").expect("terminating");
    s.finish_terminate("m1");
    assert!((gpu0_fraction(&s) - 0.4).abs() < 1e-9);
    share_gpu0(&mut s, "m4", 1, 0.6).expect("m1's shares are free again");
    // A dead replica frees its share.
    assert!(s.replica_dead("m4", "m4-0").is_some());
    assert!((gpu0_fraction(&s) - 0.4).abs() < 1e-9);
    share_gpu0(&mut s, "m5", 1, 0.6).expect("the dead replica's share is free");
    // A failed launch leaves nothing.
    let sp = spec(json!({
        "model_name": "smollm2-instruct", "model_uid": "m6", "gpu_idx": 0, "gpu_memory_utilization": 0.5,
    }));
    assert!(s.begin_launch(&sp, "smollm2-instruct", || "x".into()).is_err());
    assert!((gpu0_fraction(&s) - 1.0).abs() < 1e-9);
    assert!(s.model("m6").is_none());
}

#[test]
fn workers_list_their_gpus_and_what_runs_on_them() {
    let mut s = SupervisorState::new();
    s.heartbeat(info("a:1", &[0, 1]), Instant::now());
    launched(&mut s, json!({"model_name": "smollm2-instruct", "model_uid": "m", "gpu_idx": 1}));
    let w = &s.workers(Instant::now())[0];
    assert_eq!(w.info.gpu_details.iter().map(|g| g.index).collect::<Vec<_>>(), [0, 1]);
    let usage: Vec<(u32, Vec<String>)> = w.gpu_usage.iter().map(|g| (g.index, g.replicas.clone())).collect();
    assert_eq!(usage, [(0, vec![]), (1, vec!["m-0".to_owned()])]);
    assert_eq!(w.gpu_usage[1].memory_fraction, 0.0);
}

#[test]
fn a_pd_model_without_a_role_is_unavailable() {
    let t0 = Instant::now();
    let mut s = cpu_workers(&["a:1", "b:1", "c:1", "d:1", "e:1"], t0);
    launched(
        &mut s,
        json!({"model_name": "smollm2-instruct", "model_uid": "pd", "replica_config": [
            {"role": "prefill", "devices": [{"worker_ip": "a:1", "n_gpu": 0}]},
            {"role": "prefill", "devices": [{"worker_ip": "b:1", "n_gpu": 0}]},
            {"role": "decode", "devices": [{"worker_ip": "c:1", "n_gpu": 0}]}]}),
    );
    assert_eq!(s.model("pd").map(|m| m.status), Some(ModelStatus::Ready));
    // One prefill replica lost, one left: degraded, still serving.
    s.lose_worker("a:1");
    assert_eq!(s.model("pd").map(|m| m.status), Some(ModelStatus::Degraded));
    assert!(s.model("pd").is_some_and(|m| m.status.serves()));
    // The only decode replica lost: unavailable, though a prefill replica is alive.
    s.lose_worker("c:1");
    assert_eq!(s.model("pd").map(|m| m.status), Some(ModelStatus::Unavailable));
    assert!(s.model("pd").is_some_and(|m| !m.status.serves()));

    // With prefill_fallback, the decode replica stands in for lost prefill replicas (degraded),
    // not for a lost decode replica.
    launched(
        &mut s,
        json!({"model_name": "smollm2-instruct", "model_uid": "fb", "prefill_fallback": true, "replica_config": [
            {"role": "prefill", "devices": [{"worker_ip": "d:1", "n_gpu": 0}]},
            {"role": "decode", "devices": [{"worker_ip": "e:1", "n_gpu": 0}]}]}),
    );
    assert!(s.model("fb").is_some_and(|m| m.prefill_fallback && m.status == ModelStatus::Ready));
    s.lose_worker("d:1");
    assert_eq!(s.model("fb").map(|m| m.status), Some(ModelStatus::Degraded));
    s.lose_worker("e:1");
    assert_eq!(s.model("fb").map(|m| m.status), Some(ModelStatus::Unavailable));
}
