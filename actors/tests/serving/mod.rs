//! Per-request serving figures as the replicas record them: queue time, TTFT, TPOT, end-to-end
//! latency and finish reasons, each under the replica's role.

use super::*;

/// Three requests on a hybrid model and on a P/D model, then the figures of each replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_record_latencies_and_finish_reasons() {
    let cluster = Cluster::start_local_with(options()).await.expect("start");
    let hybrid = cluster.launch(launch_request(json!({"model_uid": "hybrid"}))).await.expect("hybrid");
    let pd = cluster
        .launch(launch_request(json!({"model_uid": "pd", "replica_config": [
            {"role": "prefill"}, {"role": "decode"},
        ]})))
        .await
        .expect("pd");
    for uid in [&hybrid, &pd] {
        for _ in 0..3 {
            let stream = cluster.generate(uid, request("", "The capital of France is", 6)).await;
            let (_, reason, error) = collect(stream.expect("generate")).await;
            assert!(error.is_none() && reason.is_some(), "{uid}: {reason:?} {error:?}");
        }
    }

    // A hybrid replica times every step of its requests, before their last event is seen.
    let stats = cluster.stats(&hybrid).await.expect("stats");
    let [s] = stats.as_slice() else { panic!("{stats:?}") };
    let (serving, finished) = (&s.serving, s.serving.finished);
    assert_eq!(s.role, Role::Hybrid);
    assert_eq!((serving.queue.count, serving.ttft.count, serving.e2e.count), (3, 3, 3), "{s:?}");
    assert_eq!((finished.stop + finished.length, finished.abort, finished.error), (3, 0, 0), "{s:?}");
    assert!(serving.tpot.count > 0 && serving.e2e.sum_us >= serving.ttft.sum_us, "{s:?}");

    // A prefill replica times its prompts; the decode replica the whole of each request.
    let stats = cluster.stats(&pd).await.expect("stats");
    let role = |r: Role| stats.iter().find(|s| s.role == r);
    let (Some(prefill), Some(decode)) = (role(Role::Prefill), role(Role::Decode)) else {
        panic!("{stats:?}")
    };
    assert_eq!((prefill.serving.ttft.count, prefill.serving.e2e.count), (3, 0), "{prefill:?}");
    let finished = decode.serving.finished;
    assert_eq!((decode.serving.ttft.count, decode.serving.e2e.count), (3, 3), "{decode:?}");
    assert_eq!(finished.stop + finished.length, 3, "{decode:?}");
    cluster.shutdown().await;
}
