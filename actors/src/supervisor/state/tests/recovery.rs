//! Recovery: heartbeats that report replicas (adoption after a restart, replicas gone, ended
//! replicas stopped) and the replacement of lost replicas.

use super::*;
use crate::launch::ScaleRequest;
use crate::spec::HeldReplica;

/// What a worker holding `placements` of model `uid` (launched from `v`) reports.
fn held(uid: &str, v: &serde_json::Value, placements: &[&Placement]) -> Vec<HeldReplica> {
    let common = spec(v.clone()).common();
    placements.iter().map(|p| HeldReplica { spec: p.replica_spec(uid, &common), serving: true }).collect()
}

fn pd_launch() -> serde_json::Value {
    json!({"model_name": "smollm2-instruct", "model_uid": "pd", "replica_config": [
        {"role": "prefill", "replica_uid": "pd-p", "devices": [{"worker_ip": "a:1", "n_gpu": 0}]},
        {"role": "decode", "replica_uid": "pd-d", "devices": [{"worker_ip": "b:1", "n_gpu": 0}]},
    ]})
}

#[test]
fn a_restarted_supervisor_rebuilds_a_model_from_what_its_workers_report() {
    let t0 = Instant::now();
    let mut before = cpu_workers(&["a:1", "b:1"], t0);
    let v = pd_launch();
    let (uid, placed) = launched(&mut before, v.clone());
    let (on_a, on_b) = (held(&uid, &v, &[&placed[0]]), held(&uid, &v, &[&placed[1]]));

    // A new supervisor hears from the prefill worker first.
    let mut s = cpu_workers(&["a:1", "b:1"], t0);
    let r = s.reconcile("a:1", &on_a);
    assert!(r.gone.is_empty() && r.rejoined.is_empty() && r.stop.is_empty(), "{r:?}");
    let specs = &r.unknown_models["pd"];
    assert_eq!(specs.len(), 1);
    let req: LaunchRequest = serde_json::from_str(&specs[0].launch).expect("the launch travels");
    let sp = validate(&req, false, &crate::testing::engines()).expect("valid again");
    s.begin_adopt("pd", &req.model_name, sp, "a:1", specs).expect("adopting");
    assert_eq!(s.model("pd").map(|m| (m.status, m.pd)), Some((ModelStatus::Launching, true)));
    // The decode worker's report waits while the model is being rebuilt.
    assert_eq!(s.reconcile("b:1", &on_b), Reconciled::default());
    assert!(s.finish_adopt("pd", &["pd-p".into()], true).is_empty());
    // A P/D model with no decode replica yet cannot serve.
    assert_eq!(status(&s, "pd"), (ModelStatus::Unavailable, vec![("pd-p".into(), ReplicaStatus::Alive)]));
    let r = s.reconcile("b:1", &on_b);
    assert_eq!(r.rejoined["pd"], [("pd-d".to_owned(), Role::Decode)]);
    assert!(s.finish_adopt("pd", &["pd-d".into()], true).is_empty());
    let (st, replicas) = status(&s, "pd");
    assert_eq!(st, ModelStatus::Ready);
    assert!(replicas.iter().all(|(_, r)| *r == ReplicaStatus::Alive), "{replicas:?}");
    // Steady heartbeats change nothing; the adopted model scales like a launched one.
    assert_eq!(s.reconcile("a:1", &on_a), Reconciled::default());
    let plan = s.begin_scale("pd", &scale(Some(Role::Decode), Some(1))).expect("scale the adopted model");
    assert_eq!(plan.placements[0].worker_id, "b:1");
}

/// With `prefill_fallback`, a model rebuilt from its decode worker's report alone serves,
/// degraded: its decode replica stands in for the prefill one nobody reported yet.
#[test]
fn a_model_with_prefill_fallback_rebuilt_from_its_decode_replica_is_degraded() {
    let t0 = Instant::now();
    let mut before = cpu_workers(&["a:1", "b:1"], t0);
    let mut v = pd_launch();
    v["prefill_fallback"] = json!(true);
    let (uid, placed) = launched(&mut before, v.clone());
    let on_b = held(&uid, &v, &[&placed[1]]);
    let mut s = cpu_workers(&["a:1", "b:1"], t0);
    let specs = s.reconcile("b:1", &on_b).unknown_models["pd"].clone();
    let req: LaunchRequest = serde_json::from_str(&specs[0].launch).expect("the launch travels");
    let sp = validate(&req, false, &crate::testing::engines()).expect("valid again");
    s.begin_adopt("pd", &req.model_name, sp, "b:1", &specs).expect("adopting");
    assert!(s.finish_adopt("pd", &["pd-d".into()], true).is_empty());
    assert_eq!(status(&s, "pd"), (ModelStatus::Degraded, vec![("pd-d".into(), ReplicaStatus::Alive)]));
}

#[test]
fn a_failed_adoption_is_forgotten_and_tried_again() {
    let t0 = Instant::now();
    let mut s = cpu_workers(&["a:1"], t0);
    let v = json!({"model_name": "smollm2-instruct", "model_uid": "m", "worker_ip": "a:1"});
    let placed = launch::place(&spec(v.clone()), "m", &s.view()).expect("placed").0;
    let on_a = held("m", &v, &[&placed[0]]);
    let r = s.reconcile("a:1", &on_a);
    s.begin_adopt("m", "smollm2-instruct", spec(v), "a:1", &r.unknown_models["m"]).expect("adopting");
    assert!(s.finish_adopt("m", &[placed[0].replica_uid.clone()], false).is_empty());
    assert!(s.model("m").is_none());
    // Not ended: the next heartbeat offers it for adoption again.
    assert_eq!(s.reconcile("a:1", &on_a).unknown_models.len(), 1);
}

#[test]
fn a_worker_that_no_longer_holds_a_replica_loses_it() {
    let mut s = cpu_workers(&["a:1"], Instant::now());
    let (uid, placed) = launched(&mut s, json!({"model_name": "smollm2-instruct", "model_uid": "m"}));
    let r = s.reconcile("a:1", &[]);
    assert_eq!(r.gone, [LostReplica { model_uid: uid.clone(), replica_uid: placed[0].replica_uid.clone() }]);
    assert_eq!(status(&s, &uid).0, ModelStatus::Unavailable);
    // Reported once.
    assert!(s.reconcile("a:1", &[]).gone.is_empty());
}

#[test]
fn replicas_of_terminated_models_are_stopped_not_adopted() {
    let mut s = cpu_workers(&["a:1"], Instant::now());
    let v = json!({"model_name": "smollm2-instruct", "model_uid": "m"});
    let (uid, placed) = launched(&mut s, v.clone());
    s.begin_terminate(&uid).expect("terminate");
    s.finish_terminate(&uid);
    let r = s.reconcile("a:1", &held(&uid, &v, &[&placed[0]]));
    assert_eq!(r.stop, [placed[0].replica_uid.clone()]);
    assert!(r.unknown_models.is_empty());
    // Launched again, the model's replicas reuse their uids: new replicas, left running.
    let (uid, again) = launched(&mut s, v.clone());
    assert_eq!(again[0].replica_uid, placed[0].replica_uid);
    assert_eq!(s.reconcile("a:1", &held(&uid, &v, &[&again[0]])), Reconciled::default());
}

#[test]
fn a_lost_replica_is_replaced_where_there_is_room_and_its_return_is_refused() {
    let t0 = Instant::now();
    let mut s = cpu_workers(&["a:1", "b:1"], t0);
    let v = json!({"model_name": "smollm2-instruct", "model_uid": "m"});
    let (uid, placed) = launched(&mut s, v.clone());
    let lost = placed[0].replica_uid.clone();
    assert_eq!(placed[0].worker_id, "a:1");
    s.heartbeat(info("b:1", &[]), t0 + Duration::from_secs(4));
    assert_eq!(s.expire(t0 + Duration::from_secs(6), Duration::from_secs(5)).len(), 1);

    let plans = s.begin_replacements(t0 + Duration::from_secs(6));
    assert_eq!(plans.len(), 1);
    let (m, plan) = &plans[0];
    assert_eq!((m.as_str(), plan.placements.len(), plan.placements[0].worker_id.as_str()), ("m", 1, "b:1"));
    let new = plan.placements[0].replica_uid.clone();
    assert_ne!(new, lost);
    assert_eq!(status(&s, &uid).0, ModelStatus::Unavailable);
    // One replacement at a time.
    assert!(s.begin_replacements(t0 + Duration::from_secs(7)).is_empty());
    assert!(s.finish_scale(&uid, std::slice::from_ref(&new), true).is_empty());
    assert_eq!(status(&s, &uid), (ModelStatus::Ready, vec![(new, ReplicaStatus::Alive)]));
    // The lost worker comes back with the old replica: it is told to stop it.
    s.heartbeat(info("a:1", &[]), t0 + Duration::from_secs(8));
    let r = s.reconcile("a:1", &held(&uid, &v, &[&placed[0]]));
    assert_eq!((r.stop, r.rejoined.len()), (vec![lost], 0));
}

#[test]
fn a_replica_on_a_named_worker_waits_for_it_and_rejoins_when_it_returns() {
    let t0 = Instant::now();
    let mut s = cpu_workers(&["a:1", "b:1"], t0);
    let v = pd_launch();
    let (uid, placed) = launched(&mut s, v.clone());
    s.heartbeat(info("b:1", &[]), t0 + Duration::from_secs(4));
    s.expire(t0 + Duration::from_secs(6), Duration::from_secs(5));
    assert_eq!(status(&s, &uid).0, ModelStatus::Unavailable);
    // Its replica may only run on a:1, which is gone: no replacement, and the next try waits.
    assert!(s.begin_replacements(t0 + Duration::from_secs(6)).is_empty());
    assert!(s.begin_replacements(t0 + Duration::from_secs(6)).is_empty());
    // a:1 comes back (SIGCONT, or the network healed) still holding its replica: it rejoins.
    s.heartbeat(info("a:1", &[]), t0 + Duration::from_secs(7));
    let r = s.reconcile("a:1", &held(&uid, &v, &[&placed[0]]));
    assert_eq!(r.rejoined["pd"], [("pd-p".to_owned(), Role::Prefill)]);
    assert!(s.finish_adopt(&uid, &["pd-p".into()], true).is_empty());
    assert_eq!(status(&s, &uid).0, ModelStatus::Ready);
}

#[test]
fn a_named_worker_back_without_its_replica_gets_a_replacement() {
    let t0 = Instant::now();
    let mut s = cpu_workers(&["a:1", "b:1"], t0);
    let (uid, _) = launched(&mut s, pd_launch());
    s.heartbeat(info("b:1", &[]), t0 + Duration::from_secs(4));
    s.expire(t0 + Duration::from_secs(6), Duration::from_secs(5));
    assert!(s.begin_replacements(t0 + Duration::from_secs(6)).is_empty());
    // Restarted under its id, holding nothing.
    s.heartbeat(info("a:1", &[]), t0 + Duration::from_secs(7));
    assert!(s.reconcile("a:1", &[]).gone.is_empty());
    // A worker that joins ends the wait after a failed try: a prefill replacement on a:1 at once.
    let plans = s.begin_replacements(t0 + Duration::from_secs(7));
    let p = &plans.first().expect("a replacement").1.placements[0];
    assert_eq!((p.worker_id.as_str(), p.role), ("a:1", Role::Prefill));
    let new = p.replica_uid.clone();
    // A failed replacement leaves the lost replica to be replaced again later.
    assert!(s.finish_scale(&uid, std::slice::from_ref(&new), false).is_empty());
    assert!(status(&s, &uid).1.iter().any(|(r, st)| r == "pd-p" && *st == ReplicaStatus::Dead));
    assert!(s.begin_replacements(t0 + Duration::from_secs(9)).is_empty());
    assert_eq!(s.begin_replacements(t0 + Duration::from_secs(12)).len(), 1);
}

#[test]
fn a_draining_workers_replica_is_replaced_while_it_finishes_its_requests() {
    let t0 = Instant::now();
    let mut s = cpu_workers(&["a:1", "b:1"], t0);
    let v = json!({"model_name": "smollm2-instruct", "model_uid": "m", "replica": 1});
    let (uid, placed) = launched(&mut s, v.clone());
    let on = placed[0].worker_id.clone();
    let old = placed[0].replica_uid.clone();
    let report = held(&uid, &v, &[&placed[0]]);
    assert_eq!(s.drain_worker(&on), [(uid.clone(), old.clone())]);
    assert_eq!(status(&s, &uid), (ModelStatus::Unavailable, vec![(old.clone(), ReplicaStatus::Draining)]));
    // Its replacement goes to the other worker at once.
    let plans = s.begin_replacements(t0);
    let p = &plans.first().expect("a replacement").1.placements[0];
    assert_ne!(p.worker_id, on);
    let new = p.replica_uid.clone();
    assert!(s.begin_replacements(t0).is_empty(), "one replacement only");
    assert!(s.finish_scale(&uid, std::slice::from_ref(&new), true).is_empty());
    assert_eq!(status(&s, &uid), (ModelStatus::Ready, vec![(new.clone(), ReplicaStatus::Alive)]));
    // The replaced replica still runs there: the worker keeps waiting for its requests, and is
    // not told to stop it.
    assert_eq!(s.drain_worker(&on), [(uid.clone(), old.clone())]);
    let r = s.reconcile(&on, &report);
    assert_eq!(r, Reconciled::default());
    // A new replica does not take its uid, which the draining process still holds.
    let more = s.begin_scale(&uid, &ScaleRequest { count: Some(1), ..ScaleRequest::default() });
    let fresh = &more.expect("placed").placements[0].replica_uid;
    assert!(*fresh != old && *fresh != new, "{fresh} reused");
    // It stops; nothing of the model's is lost with it.
    assert!(s.lose_worker(&on).is_empty());
    assert_eq!(status(&s, &uid).0, ModelStatus::Ready);
}

#[test]
fn a_draining_replica_without_room_elsewhere_waits_for_its_worker_to_come_back() {
    let t0 = Instant::now();
    let mut s = cpu_workers(&["a:1", "b:1"], t0);
    let (uid, _) = launched(&mut s, pd_launch());
    s.drain_worker("a:1");
    assert_eq!(status(&s, &uid).0, ModelStatus::Unavailable, "no prefill replica takes requests");
    assert!(s.begin_replacements(t0).is_empty(), "pd-p is pinned to the draining a:1");
    s.lose_worker("a:1");
    assert!(s.heartbeat(info("a:1", &[]), t0 + Duration::from_secs(1)), "a new process");
    let plans = s.begin_replacements(t0 + Duration::from_secs(1));
    assert_eq!(plans.first().map(|(_, p)| p.placements[0].worker_id.as_str()), Some("a:1"));
}
