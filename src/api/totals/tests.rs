use super::*;
use serde_json::json;

/// A replica that has served `n` requests, computed `10 n` prompt tokens and moved `n` pages,
/// with `n` requests running and `n` rooms held (gauges).
fn replica(uid: &str, n: u64) -> ReplicaStats {
    let mut handoff = HandoffStats::default();
    (handoff.pages_transferred, handoff.active_rooms) = (n, n);
    let handoff = serde_json::to_value(handoff).unwrap_or_default();
    serde_json::from_value(json!({"replica_uid": uid, "worker_id": "w", "running": n, "queued": 0,
        "requests_served": n, "prompt_tokens": 10 * n, "cached_prompt_tokens": 0,
        "generated_tokens": n, "pinned_blocks": 0, "handoff": handoff}))
    .unwrap_or_else(|e| panic!("replica stats: {e}"))
}

/// What the service shows of a model whose answering replicas are `replicas`.
fn look(totals: &Totals, model: &str, replicas: &[(&str, u64)]) -> ModelStats {
    let mut stats = ModelStats::from_replicas(replicas.iter().map(|(uid, n)| replica(uid, *n)).collect());
    totals.settle(model, &mut stats);
    stats
}

/// (requests served, prompt tokens, pages moved, requests running, rooms held)
fn figures(s: &ModelStats) -> (u64, u64, u64, u64, u64) {
    let h = s.handoff.unwrap_or_default();
    (s.requests_served.unwrap_or_default(), s.prompt_tokens, h.pages_transferred, s.running, h.active_rooms)
}

#[test]
fn a_replica_that_leaves_keeps_its_counts_in_the_model_but_not_its_gauges() {
    let totals = Totals::default();
    assert_eq!(figures(&look(&totals, "m", &[("a", 5), ("b", 3)])), (8, 80, 8, 8, 8));
    // b is lost: its 3 requests stay counted; its running requests and rooms do not.
    assert_eq!(figures(&look(&totals, "m", &[("a", 6)])), (9, 90, 9, 6, 6));
    // Its replacement starts from zero.
    assert_eq!(figures(&look(&totals, "m", &[("a", 6), ("c", 1)])), (10, 100, 10, 7, 7));
    // The list of replicas is still the answering ones.
    let shown = look(&totals, "m", &[("a", 6), ("c", 1)]);
    let uids: Vec<_> = shown.replicas.unwrap_or_default().into_iter().map(|r| r.replica_uid).collect();
    assert_eq!(uids, ["a", "c"]);
}

#[test]
fn a_replica_missing_from_one_look_is_not_counted_twice() {
    let totals = Totals::default();
    look(&totals, "m", &[("a", 5), ("b", 3)]);
    assert_eq!(figures(&look(&totals, "m", &[("a", 5)])).0, 8);
    assert_eq!(figures(&look(&totals, "m", &[("a", 5), ("b", 4)])).0, 9);
}

#[test]
fn a_replica_restarted_under_its_uid_adds_its_new_life_to_the_old_one() {
    let totals = Totals::default();
    look(&totals, "m", &[("a", 5)]);
    assert_eq!(figures(&look(&totals, "m", &[("a", 1)])), (6, 60, 6, 1, 1));
    assert_eq!(figures(&look(&totals, "m", &[("a", 2)])), (7, 70, 7, 2, 2));
}

#[test]
fn models_count_apart_and_a_forgotten_one_counts_from_zero() {
    let totals = Totals::default();
    look(&totals, "m", &[("a", 5)]);
    look(&totals, "n", &[("a", 7)]);
    assert_eq!(figures(&look(&totals, "m", &[])).0, 5);
    assert_eq!(figures(&look(&totals, "n", &[])).0, 7);
    totals.forget("m");
    assert_eq!(figures(&look(&totals, "m", &[("a", 1)])).0, 1);
    assert_eq!(figures(&look(&totals, "n", &[])).0, 7);
}

#[test]
fn replicas_gone_beyond_the_kept_number_are_folded_and_still_counted() {
    let totals = Totals::default();
    for i in 0..ABSENT_KEPT + 10 {
        look(&totals, "m", &[(&format!("r{i}"), 1)]);
    }
    let shown = look(&totals, "m", &[("last", 1)]);
    assert_eq!(figures(&shown).0, ABSENT_KEPT as u64 + 11);
    let models = totals.models.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    assert!(models["m"].last.len() <= ABSENT_KEPT + 1, "{} replicas remembered", models["m"].last.len());
}

#[test]
fn a_single_engine_is_left_as_it_is() {
    let totals = Totals::default();
    let engine = xinf_engine::EngineStats { running: 1, prompt_tokens: 6, ..Default::default() };
    let mut stats = ModelStats::from(&engine);
    totals.settle("one", &mut stats);
    assert_eq!(stats, ModelStats::from(&engine));
}
