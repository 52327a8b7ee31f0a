//! Removing one replica: refusals, the drain that is not replaced, and forgetting a lost one.

use super::*;
use crate::spec::HeldReplica;

fn refusal(e: ActorError) -> String {
    match e {
        ActorError::ReplicaNotRemovable { reason, .. } => reason,
        other => panic!("not a refusal to remove: {other:?}"),
    }
}

#[test]
fn a_serving_replica_drains_unreplaced_then_leaves_and_is_stopped_if_reported() {
    let t0 = Instant::now();
    let mut s = cpu_workers(&["a:1", "b:1"], t0);
    let v = json!({"model_name": "smollm2-instruct", "model_uid": "m", "replica": 2});
    let (uid, placed) = launched(&mut s, v.clone());
    let (gone, kept) = (placed[0].replica_uid.clone(), placed[1].replica_uid.clone());
    let not_found = s.begin_remove(&uid, "m-9").expect_err("no such replica");
    assert_eq!(not_found.code(), "replica_not_found");
    assert_eq!(s.begin_remove("nope", &gone), Err(ActorError::ModelNotFound("nope".into())));
    let removal = s.begin_remove(&uid, &gone).expect("removable");
    assert_eq!(removal, Removal::Drain { worker_id: placed[0].worker_id.clone() });
    assert_eq!(
        status(&s, &uid),
        (
            ModelStatus::Degraded,
            vec![(gone.clone(), ReplicaStatus::Draining), (kept.clone(), ReplicaStatus::Alive)]
        )
    );
    assert!(refusal(s.begin_remove(&uid, &gone).expect_err("twice")).contains("being removed already"));
    assert!(
        refusal(s.begin_remove(&uid, &kept).expect_err("the last")).contains("last alive hybrid replica")
    );
    assert!(s.begin_replacements(t0).is_empty(), "a removed replica is not replaced");
    s.finish_remove(&uid, &gone);
    assert_eq!(status(&s, &uid), (ModelStatus::Ready, vec![(kept, ReplicaStatus::Alive)]));
    // Its worker, had it not stopped it, is told to.
    let common = spec(v).common();
    let held = [HeldReplica { spec: placed[0].replica_spec(&uid, &common), serving: true }];
    assert_eq!(s.reconcile(&placed[0].worker_id, &held).stop, [gone]);
}

#[test]
fn a_lost_replica_is_forgotten_at_once_unless_it_is_its_roles_only_one_or_being_replaced() {
    let t0 = Instant::now();
    let mut s = cpu_workers(&["a:1", "b:1", "c:1"], t0);
    let v = json!({"model_name": "smollm2-instruct", "model_uid": "m", "replica_config": [
        {"role": "prefill", "replica_uid": "p", "devices": [{"worker_ip": "a:1", "n_gpu": 0}]},
        {"role": "decode", "replica_uid": "d1", "devices": [{"worker_ip": "b:1", "n_gpu": 0}]},
        {"role": "decode", "replica_uid": "d2", "devices": [{"worker_ip": "c:1", "n_gpu": 0}]},
    ]});
    let (uid, _) = launched(&mut s, v);
    s.lose_worker("a:1");
    s.lose_worker("b:1");
    assert!(
        refusal(s.begin_remove(&uid, "p").expect_err("the only prefill")).contains("last prefill replica")
    );
    assert_eq!(s.begin_remove(&uid, "d1"), Ok(Removal::Forgotten));
    let left: Vec<String> = status(&s, &uid).1.into_iter().map(|(r, _)| r).collect();
    assert_eq!(left, ["p", "d2"]);
    // A named worker's replica waits for it; once back, its replacement loads: not removable.
    assert!(s.heartbeat(info("a:1", &[]), t0));
    assert_eq!(s.begin_replacements(t0).len(), 1);
    let e = s.begin_remove(&uid, "p").expect_err("being replaced");
    assert!(refusal(e).contains("replacement is loading"));
    let loading = status(&s, &uid).1.into_iter().find(|(_, st)| *st == ReplicaStatus::Loading);
    let e = s.begin_remove(&uid, &loading.expect("the replacement").0).expect_err("loading");
    assert!(refusal(e).contains("loading"));
}
