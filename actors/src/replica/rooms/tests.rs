use super::*;
use crate::view::LatencyHistogram;

fn table() -> RoomTable {
    RoomTable::new(Leases { unclaimed: Duration::from_secs(10), claimed_idle: Duration::from_secs(2) })
}

#[test]
fn a_room_ends_once_whatever_ends_it() {
    let t0 = Instant::now();
    let mut t = table();
    t.publish(1, "r1", 3, Arc::default(), t0, 0);
    assert_eq!(t.claim(1, 0, 3, t0), Ok("r1".to_owned()));
    assert_eq!(t.is_claimed(1), Some(true));
    assert_eq!(t.release(1), Some("r1".to_owned()));
    assert_eq!(t.release(1), None, "a second release finds nothing");
    assert_eq!(t.claim(1, 0, 1, t0), Err(RoomError::Unknown), "a late fetch gets a clear error");
    t.publish(2, "r2", 1, Arc::default(), t0, 0);
    t.publish(3, "r2", 1, Arc::default(), t0, 0);
    t.publish(4, "r3", 1, Arc::default(), t0, 0);
    assert_eq!(t.abort_request("r2", t0), 2);
    assert_eq!(t.active(), 1);
    assert_eq!(t.release(2), None);
    assert_eq!(t.stats().active_rooms, 1);
}

#[test]
fn ranges_are_checked() {
    let t0 = Instant::now();
    let mut t = table();
    t.publish(1, "r", 2, Arc::default(), t0, 0);
    assert_eq!(t.claim(1, 1, 2, t0), Err(RoomError::OutOfRange { pages: 2 }));
    assert_eq!(t.claim(1, u32::MAX, 2, t0), Err(RoomError::OutOfRange { pages: 2 }));
    assert_eq!(t.is_claimed(1), Some(false), "a refused fetch does not claim");
    assert!(t.claim(1, 1, 1, t0).is_ok());
}

#[test]
fn leases_expire_unclaimed_and_idle_rooms() {
    let t0 = Instant::now();
    let mut t = table();
    t.publish(1, "unclaimed", 1, Arc::default(), t0, 0);
    t.publish(2, "claimed", 1, Arc::default(), t0, 0);
    t.publish(3, "busy", 1, Arc::default(), t0, 0);
    let s = |n| t0 + Duration::from_secs(n);
    assert!(t.claim(2, 0, 1, s(1)).is_ok()); // idle deadline s(3)
    assert!(t.claim(3, 0, 1, s(1)).is_ok());
    assert!(t.expire(s(2)).is_empty());
    assert!(t.claim(3, 0, 1, s(2)).is_ok(), "progress renews the lease"); // deadline s(4)
    assert_eq!(t.expire(s(3)), vec!["claimed".to_owned()]);
    assert_eq!(t.expire(s(4)), vec!["busy".to_owned()]);
    assert!(t.expire(s(9)).is_empty());
    assert_eq!(t.expire(s(10)), vec!["unclaimed".to_owned()]);
    assert_eq!(t.stats().expired_leases, 3);
    assert_eq!(t.active(), 0);
}

#[test]
fn a_prefill_aborted_before_it_publishes_leaves_no_room() {
    let t0 = Instant::now();
    let mut t = table();
    let since = t.epoch();
    assert_eq!(t.abort_request("late", t0), 0);
    assert!(t.was_aborted("late", since));
    assert!(!t.publish(9, "late", 2, Arc::default(), t0, since), "an aborted request publishes nothing");
    assert_eq!(t.active(), 0);
    assert!(t.publish(10, "late", 2, Arc::default(), t0, since), "the mark is used once");
    // Marks lapse.
    let since = t.epoch();
    assert_eq!(t.abort_request("old", t0), 0);
    t.expire(t0 + Duration::from_secs(11));
    assert!(!t.was_aborted("old", since));
    assert!(t.publish(11, "old", 1, Arc::default(), t0, since));
}

#[test]
fn an_abort_ends_its_own_attempt_not_a_retry_under_the_same_id() {
    let t0 = Instant::now();
    let mut t = table();
    // The first attempt's prefill starts, the client goes away (abort), and comes back with
    // the same id before the first prefill has published.
    let first = t.epoch();
    assert_eq!(t.abort_request("r", t0), 0);
    let retry = t.epoch();
    assert!(t.was_aborted("r", first));
    assert!(!t.was_aborted("r", retry), "the retry began after the abort");
    // The retry publishes whether it finishes before the first attempt or after it; the first
    // attempt never does.
    assert!(t.publish(1, "r", 1, Arc::default(), t0, retry));
    assert!(!t.publish(2, "r", 1, Arc::default(), t0, first));
    assert_eq!(t.active(), 1);
    // An abort of the retry, once published, closes its room.
    assert_eq!(t.abort_request("r", t0), 1);
    assert_eq!(t.active(), 0);
}

#[test]
fn the_latency_histogram_is_cumulative() {
    let mut h = LatencyHistogram::default();
    h.observe(0.0004);
    h.observe(0.003);
    h.observe(10.0);
    assert_eq!(h.count, 3);
    assert_eq!(h.buckets[0], 1, "≤ 0.5 ms");
    assert_eq!(h.buckets[3], 2, "≤ 5 ms");
    assert_eq!(h.buckets[11], 2, "≤ 2.5 s: the 10 s fetch is only in +Inf");
    let mut total = HandoffStats::default();
    total.add(&HandoffStats { latency: h, ..HandoffStats::default() });
    total.add(&HandoffStats { latency: h, ..HandoffStats::default() });
    assert_eq!((total.latency.count, total.latency.buckets[3]), (6, 4));
    assert_eq!(total.latency.sum_us, 2 * (400 + 3000 + 10_000_000));
}
