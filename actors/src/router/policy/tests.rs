//! Round-robin per role, duplicate ids, and what a lost replica takes down.

use super::*;

fn policy(replicas: &[(&str, Role)]) -> RouterPolicy {
    let mut p = RouterPolicy::default();
    for (uid, role) in replicas {
        p.add(uid, *role);
    }
    p
}

#[test]
fn requests_alternate_between_replicas() {
    let mut p = policy(&[("a", Role::Hybrid), ("b", Role::Hybrid)]);
    let picks: Vec<String> = (0..5).map(|i| p.begin(&format!("r{i}"), Role::Hybrid).expect("pick")).collect();
    assert_eq!(picks, ["a", "b", "a", "b", "a"]);
}

#[test]
fn each_role_has_its_own_rotation() {
    let mut p =
        policy(&[("p1", Role::Prefill), ("d1", Role::Decode), ("p2", Role::Prefill), ("d2", Role::Decode)]);
    assert_eq!(p.begin("1", Role::Prefill), Ok("p1".into()));
    assert_eq!(p.begin("2", Role::Decode), Ok("d1".into()));
    assert_eq!(p.begin("3", Role::Prefill), Ok("p2".into()));
    assert_eq!(p.begin("4", Role::Prefill), Ok("p1".into()));
    assert_eq!(p.begin("5", Role::Decode), Ok("d2".into()));
    assert_eq!(p.begin("6", Role::Hybrid), Err(RouteError::NoReplica(Role::Hybrid)));
}

#[test]
fn a_running_id_is_refused_until_it_finishes() {
    let mut p = policy(&[("a", Role::Hybrid)]);
    assert_eq!(p.begin("r", Role::Hybrid), Ok("a".into()));
    assert_eq!(p.begin("r", Role::Hybrid), Err(RouteError::Duplicate));
    assert_eq!(p.finish("r"), Some(vec!["a".to_owned()]));
    assert_eq!(p.finish("r"), None);
    assert_eq!(p.begin("r", Role::Hybrid), Ok("a".into()));
}

#[test]
fn removing_a_replica_names_its_requests_and_keeps_the_rotation_fair() {
    let mut p = policy(&[("a", Role::Hybrid), ("b", Role::Hybrid), ("c", Role::Hybrid)]);
    assert_eq!(p.begin("1", Role::Hybrid), Ok("a".into()));
    assert_eq!(p.begin("2", Role::Hybrid), Ok("b".into()));
    // Next would be c; losing a must not skip it.
    let mut lost = p.remove("a");
    lost.sort();
    assert_eq!(lost, ["1"]);
    assert_eq!(p.begin("3", Role::Hybrid), Ok("c".into()));
    assert_eq!(p.begin("4", Role::Hybrid), Ok("b".into()));
    let mut gone = p.remove("b");
    gone.sort();
    assert_eq!(gone, ["2", "4"]);
    assert_eq!(p.begin("5", Role::Hybrid), Ok("c".into()));
    assert_eq!(p.begin("6", Role::Hybrid), Ok("c".into()));
    p.remove("c");
    assert_eq!(p.begin("7", Role::Hybrid), Err(RouteError::NoReplica(Role::Hybrid)));
    assert!(p.replicas().is_empty());
}

#[test]
fn adding_twice_is_harmless() {
    let mut p = policy(&[("a", Role::Hybrid), ("a", Role::Hybrid)]);
    assert_eq!(p.replicas(), [("a".to_owned(), Role::Hybrid)]);
    assert_eq!(p.begin("1", Role::Hybrid), Ok("a".into()));
    assert_eq!(p.begin("2", Role::Hybrid), Ok("a".into()));
}

#[test]
fn pd_requests_take_one_prefill_and_one_decode_replica_in_turn() {
    let mut p = policy(&[("p1", Role::Prefill), ("d1", Role::Decode), ("d2", Role::Decode)]);
    assert!(p.is_pd());
    let pick = |p: &mut RouterPolicy, id: &str| p.begin_pd(id).expect("pick");
    assert_eq!(pick(&mut p, "1"), ("p1".to_owned(), "d1".to_owned()));
    assert_eq!(pick(&mut p, "2"), ("p1".to_owned(), "d2".to_owned()));
    assert_eq!(pick(&mut p, "3"), ("p1".to_owned(), "d1".to_owned()));
    assert_eq!(p.begin_pd("3"), Err(RouteError::Duplicate));
    // Losing the prefill replica takes down every request that used it.
    let mut lost = p.remove("p1");
    lost.sort();
    assert_eq!(lost, ["1", "2", "3"]);
    assert_eq!(p.begin_pd("4"), Err(RouteError::NoReplica(Role::Prefill)), "no prefill replica is left");
    assert!(!policy(&[("h", Role::Hybrid)]).is_pd());
}

#[test]
fn once_its_prefill_is_done_a_request_survives_the_prefill_replica() {
    let mut p = policy(&[("p", Role::Prefill), ("d", Role::Decode)]);
    assert_eq!(p.begin_pd("prefilling"), Ok(("p".into(), "d".into())));
    assert_eq!(p.begin_pd("decoding"), Ok(("p".into(), "d".into())));
    p.prefill_done("decoding");
    p.prefill_done("decoding"); // twice changes nothing: the decode replica stays
    p.prefill_done("unknown");
    // The prefill replica's loss takes down only the request it still computes.
    assert_eq!(p.remove("p"), ["prefilling"]);
    assert_eq!(p.finish("decoding"), Some(vec!["d".to_owned()]));
}

#[test]
fn a_drained_replica_takes_no_new_requests_and_keeps_its_running_ones() {
    let mut p = policy(&[("p1", Role::Prefill), ("d1", Role::Decode), ("d2", Role::Decode)]);
    assert_eq!(p.begin_pd("r1"), Ok(("p1".into(), "d1".into())));
    assert_eq!(p.begin_pd("r2"), Ok(("p1".into(), "d2".into())));
    assert_eq!(p.drain("d1"), 1, "r1 still decodes there");
    assert_eq!(p.begin_pd("r3"), Ok(("p1".into(), "d2".into())));
    assert_eq!(p.begin_pd("r4"), Ok(("p1".into(), "d2".into())), "d1 is out of rotation");
    assert_eq!(p.drain("p1"), 4);
    assert_eq!(p.begin_pd("r5"), Err(RouteError::NoReplica(Role::Prefill)));
    for id in ["r2", "r3", "r4"] {
        p.prefill_done(id);
    }
    assert_eq!(p.drain("p1"), 1, "only r1 is still in its prefill");
    assert_eq!(p.finish("r1"), Some(vec!["p1".to_owned(), "d1".to_owned()]));
    assert_eq!((p.drain("p1"), p.drain("d1")), (0, 0));
    assert_eq!(p.replicas(), vec![("d2".to_owned(), Role::Decode)]);
}

#[test]
fn a_draining_replica_is_held_until_its_last_request_ends() {
    let mut p = policy(&[("p1", Role::Prefill), ("d1", Role::Decode), ("d2", Role::Decode)]);
    assert_eq!(p.begin_pd("r1"), Ok(("p1".into(), "d1".into())));
    assert_eq!((p.drain("p1"), p.drain("d1"), p.drain("d2")), (1, 1, 0));
    assert_eq!(p.drop_drained(), ["d2"], "d2 runs nothing");
    assert_eq!(p.draining().collect::<Vec<_>>(), ["d1", "p1"], "both still report their figures");
    p.prefill_done("r1");
    assert_eq!(p.drop_drained(), ["p1"], "r1 no longer needs its prefill replica");
    p.add("d1", Role::Decode);
    assert_eq!(p.draining().count(), 0, "d1 is back in rotation");
    assert_eq!(p.drain("d1"), 1);
    assert_eq!(p.remove("d1"), ["r1"], "a lost draining replica takes its requests down");
    assert_eq!((p.draining().count(), p.drop_drained().len()), (0, 0));
}

#[test]
fn with_prefill_fallback_a_decode_replica_takes_whole_requests_while_no_prefill_one_serves() {
    let pd = [("p", Role::Prefill), ("d", Role::Decode)];
    for fallback in [false, true] {
        let mut p = RouterPolicy::new(fallback);
        for (uid, role) in pd {
            p.add(uid, role);
        }
        assert_eq!(p.begin_request("1"), Ok((Some("p".into()), "d".into())), "both roles serve");
        assert_eq!(p.remove("p"), ["1"]);
        let alone = if fallback { Ok((None, "d".into())) } else { Err(RouteError::NoReplica(Role::Prefill)) };
        assert_eq!(p.begin_request("2"), alone, "fallback {fallback}");
        // The prefill replica's replacement joins: P/D again.
        p.add("p2", Role::Prefill);
        assert_eq!(p.begin_request("3"), Ok((Some("p2".into()), "d".into())));
        // No decode replica: nothing serves, and the error names the decode role.
        p.remove("p2");
        p.remove("d");
        assert_eq!(
            p.begin_request("4"),
            Err(RouteError::NoReplica(if fallback { Role::Decode } else { Role::Prefill }))
        );
    }
    let mut hybrid = RouterPolicy::new(true);
    hybrid.add("h", Role::Hybrid);
    assert_eq!(hybrid.begin_request("1"), Ok((None, "h".into())));
}

#[test]
fn with_prefill_fallback_a_lost_prefill_replica_spares_the_requests_in_their_prefill() {
    for fallback in [false, true] {
        let mut p = RouterPolicy::new(fallback);
        p.add("p", Role::Prefill);
        p.add("d", Role::Decode);
        assert!(p.begin_request("in-prefill").is_ok());
        assert!(p.begin_request("decoding").is_ok());
        p.prefill_done("decoding");
        let spared = p.spare_prefills_on("p");
        let killed = p.remove("p");
        if fallback {
            assert_eq!((spared, killed), (vec!["in-prefill".to_owned()], vec![]));
            // It now runs on the decode replica alone, whose loss still ends it.
            let mut ended = p.remove("d");
            ended.sort();
            assert_eq!(ended, ["decoding", "in-prefill"]);
        } else {
            assert_eq!((spared, killed), (vec![], vec!["in-prefill".to_owned()]));
        }
    }
}
