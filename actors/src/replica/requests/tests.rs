//! Long polls, batching and the idle sweep of the request buffers.

use super::*;
use xinf_engine::{FinishReason, Usage};

fn delta(id: u32) -> Result<TokenEvent, EngineError> {
    Ok(TokenEvent::Delta { token_id: id, text: format!("t{id}"), logprobs: None })
}

#[tokio::test]
async fn a_pull_returns_everything_buffered() {
    let table = RequestTable::default();
    let slot = table.insert("r", Instant::now());
    slot.push(delta(1));
    slot.push(delta(2));
    let batch = slot.next_batch(Duration::from_secs(5)).await;
    assert_eq!(batch.events, [delta(1), delta(2)]);
    assert!(!batch.done);
}

#[tokio::test]
async fn an_empty_pull_waits_for_the_long_poll() {
    let table = RequestTable::default();
    let slot = table.insert("r", Instant::now());
    let started = tokio::time::Instant::now();
    let batch = slot.next_batch(Duration::from_millis(50)).await;
    assert!(batch.events.is_empty() && !batch.done);
    assert!(started.elapsed() >= Duration::from_millis(50));
}

#[tokio::test]
async fn a_waiting_pull_wakes_on_the_first_event() {
    let table = RequestTable::default();
    let slot = table.insert("r", Instant::now());
    let pusher = slot.clone();
    let waiter = tokio::spawn(async move { slot.next_batch(Duration::from_secs(30)).await });
    tokio::task::yield_now().await;
    pusher.push(delta(7));
    let batch = tokio::time::timeout(Duration::from_secs(5), waiter).await.expect("woke").expect("joined");
    assert_eq!(batch.events, [delta(7)]);
}

#[tokio::test]
async fn the_last_batch_says_done() {
    let table = RequestTable::default();
    let slot = table.insert("r", Instant::now());
    slot.push(delta(1));
    let end = Ok(TokenEvent::Finished { reason: FinishReason::Stop, usage: Usage::default() });
    slot.push(end.clone());
    slot.finish();
    let batch = slot.next_batch(Duration::from_secs(5)).await;
    assert_eq!(batch.events, [delta(1), end]);
    assert!(batch.done);
    let again = slot.next_batch(Duration::from_secs(5)).await;
    assert!(again.events.is_empty() && again.done);
}

#[test]
fn unpulled_requests_expire_and_running_ones_are_named() {
    let t0 = Instant::now();
    let table = RequestTable::default();
    table.insert("running", t0);
    table.insert("finished", t0).finish();
    assert!(table.expire(t0 + Duration::from_secs(5), Duration::from_secs(10)).is_empty());
    assert!(table.get("running").is_some());
    let expired = table.expire(t0 + Duration::from_secs(11), Duration::from_secs(10));
    assert_eq!(expired, ["running"]);
    assert!(table.get("running").is_none() && table.get("finished").is_none());
}

#[test]
fn drain_names_running_requests() {
    let table = RequestTable::default();
    table.insert("a", Instant::now());
    table.insert("b", Instant::now()).finish();
    assert_eq!(table.drain_all(), ["a"]);
    assert!(table.get("b").is_none());
}

#[test]
fn an_aborted_request_frees_its_id_once_its_stream_ends() {
    let table = RequestTable::default();
    assert!(table.free_for_new("r"));
    let slot = table.insert("r", Instant::now());
    assert!(!table.free_for_new("r"), "running");
    slot.finish();
    assert!(!table.free_for_new("r"), "ended, not aborted: its caller still pulls its last events");
    let slot = table.insert("a", Instant::now());
    table.aborted("a");
    assert!(!table.free_for_new("a"), "aborted, its stream not yet ended");
    slot.finish();
    assert!(table.free_for_new("a"));
    assert!(table.get("a").is_none(), "the old buffer is dropped");
    table.aborted("unknown");
}
