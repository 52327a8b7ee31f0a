//! Register, query, unregister, and the purge of a replica.

use super::*;

fn loc(hash: u64, replica: &str, block: u32) -> BlockLocation {
    BlockLocation { hash, replica_uid: replica.into(), block_id: block, endpoint: None }
}

#[test]
fn registered_blocks_are_found() {
    let mut s = BlockTrackerState::default();
    s.register("a", None, &[(10, 1), (11, 2)]);
    s.register("b", None, &[(10, 7)]);
    assert_eq!(s.query(&[10, 11, 12], None), [loc(10, "a", 1), loc(11, "a", 2)]);
    assert_eq!(s.query(&[10, 11], Some("a")), [loc(10, "b", 7)]);
    assert_eq!(s.len(), 3);
}

#[test]
fn a_reused_block_id_drops_its_old_hash() {
    let mut s = BlockTrackerState::default();
    s.register("a", None, &[(10, 1)]);
    s.register("a", None, &[(20, 1)]);
    assert!(s.query(&[10], None).is_empty());
    assert_eq!(s.query(&[20], None), [loc(20, "a", 1)]);
    assert_eq!(s.len(), 1);
    // Registering the same pair again changes nothing.
    s.register("a", None, &[(20, 1)]);
    assert_eq!(s.len(), 1);
}

#[test]
fn unregistered_blocks_are_gone() {
    let mut s = BlockTrackerState::default();
    s.register("a", None, &[(10, 1), (11, 2)]);
    s.unregister("a", &[1, 99]);
    s.unregister("nobody", &[1]);
    assert!(s.query(&[10], None).is_empty());
    assert_eq!(s.query(&[11], None), [loc(11, "a", 2)]);
}

#[test]
fn a_lost_replica_is_purged() {
    let mut s = BlockTrackerState::default();
    s.register("a", None, &[(10, 1), (11, 2)]);
    s.register("b", None, &[(10, 5)]);
    assert_eq!(s.unregister_replica("a"), 2);
    assert_eq!(s.unregister_replica("a"), 0);
    assert_eq!(s.query(&[10, 11], None), [loc(10, "b", 5)]);
    assert_eq!(s.len(), 1);
    s.unregister_replica("b");
    assert!(s.by_hash.is_empty() && s.by_replica.is_empty());
}

#[test]
fn answers_carry_the_holder_endpoint_until_it_goes() {
    let mut s = BlockTrackerState::default();
    let e = xinf_transfer::transport::Endpoint { process: 1, provider: 2, tcp: "127.0.0.1:9".into() };
    s.register("a", Some(e.clone()), &[(10, 1)]);
    assert_eq!(s.query(&[10], None)[0].endpoint, Some(e));
    s.unregister_replica("a");
    s.register("a", None, &[(10, 1)]);
    assert_eq!(s.query(&[10], None)[0].endpoint, None);
}
