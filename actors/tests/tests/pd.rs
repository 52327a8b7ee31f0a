//! P/D starts: a decode engine that fetches its own KV, the prefill's first token shown before
//! the decode leg, and a failed prefill leg with and without `prefill_fallback`.

use super::*;

/// P/D with a decode engine that loads a handoff's KV itself, from the prefill side's page
/// server (as an engine server does in its own process): greedy output equals the ordinary
/// replica's, and the room is released only after the decode engine has read it (a release
/// before would fail the load, and so the request).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decode_engine_that_fetches_its_own_kv_serves_pd() {
    let cluster = Cluster::start_local_with(options()).await.expect("start");
    let ordinary = cluster.launch(launch_request(json!({"model_uid": "ordinary"}))).await.expect("ordinary");
    let pd = cluster
        .launch(launch_request(json!({"model_uid": "pd", "replica_config": [
            {"role": "prefill"},
            {"role": "decode", "engine_config": {"fetches_kv": true, "recompute_last_token": true}},
        ]})))
        .await
        .expect("pd");
    let words = "the of and to in is you that it he was for on are as with his they at be this ";
    for n in [1, 2, 4, 7, 10] {
        let prompt = words.repeat(n);
        let (want, _, e) =
            collect(cluster.generate(&ordinary, request("", &prompt, 8)).await.expect("ordinary")).await;
        assert!(e.is_none(), "{e:?}");
        let (got, reason, e) =
            collect(cluster.generate(&pd, request("", &prompt, 8)).await.expect("pd")).await;
        assert!(e.is_none(), "{n}: {e:?}");
        assert!(matches!(reason, Some(FinishReason::Length | FinishReason::Stop)));
        assert_eq!(got, want, "{n} repeats");
    }
    let (c, u) = (&cluster, pd.as_str());
    eventually(Duration::from_secs(10), "every room released and nothing pinned", || async move {
        let stats = c.stats(u).await.expect("stats");
        stats.iter().all(|s| s.handoff.active_rooms == 0 && s.pinned_blocks == 0)
    })
    .await;
    let stats = cluster.stats(&pd).await.expect("stats");
    let served: u64 = stats.iter().map(|s| s.requests_served).sum();
    assert!(served >= 5, "{stats:?}");
    cluster.shutdown().await;
}

/// The prefill's first token reaches the caller before the decode leg: a decode replica that
/// refuses the request leaves the caller with that token and then the error, and nothing
/// behind. With a stop string nothing is shown before the decode side answers, and its
/// refusal is the request's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_prefill_s_first_token_is_shown_before_the_decode_leg() {
    let cluster = Cluster::start_local_with(options()).await.expect("start");
    let pd = cluster
        .launch(launch_request(json!({"model_uid": "pd", "replica_config": [
            {"role": "prefill"},
            {"role": "decode", "engine_config": {"fail_at_admission": true}},
        ]})))
        .await
        .expect("pd");
    let mut stream =
        cluster.generate(&pd, request("", "Hello there", 8)).await.expect("started before the decode leg");
    let first = stream.next().await;
    assert!(matches!(first, Some(Ok(TokenEvent::Delta { ref text, .. })) if !text.is_empty()), "{first:?}");
    let (rest, reason, error) = collect(stream).await;
    assert!(rest.is_empty() && reason.is_none(), "{rest:?} {reason:?}");
    assert!(error.is_some_and(|e| e.to_string().contains("fault")), "the decode side's refusal");

    let mut stops = request("", "Hello there", 8);
    stops.sampling.stop = vec!["zzz".into()];
    let e = cluster.generate(&pd, stops).await.map(|_| ()).expect_err("refused by the decode side");
    assert!(e.to_string().contains("fault"), "{e}");
    let (c, u) = (&cluster, pd.as_str());
    eventually(Duration::from_secs(10), "nothing running, no room, nothing pinned", || async move {
        let stats = c.stats(u).await.expect("stats");
        stats.iter().all(|s| s.running == 0 && s.handoff.active_rooms == 0 && s.pinned_blocks == 0)
    })
    .await;
    cluster.shutdown().await;
}

/// A prefill replica whose engine fails every request: the request fails, unless the model was
/// launched with `prefill_fallback`, whose decode replica then computes it whole, giving the
/// ordinary replica's output. An invalid request is still refused as invalid.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_prefill_fallback_a_failed_prefill_leg_runs_on_the_decode_replica() {
    let cluster = Cluster::start_local_with(options()).await.expect("start");
    let ordinary = cluster.launch(launch_request(json!({"model_uid": "ordinary"}))).await.expect("ordinary");
    let launch = |uid: &str, fallback: bool| {
        launch_request(json!({"model_uid": uid, "prefill_fallback": fallback, "replica_config": [
            {"role": "prefill", "engine_config": {"fail_at_admission": true}},
            {"role": "decode"},
        ]}))
    };
    let strict = cluster.launch(launch("strict", false)).await.expect("strict");
    let kept = cluster.launch(launch("kept", true)).await.expect("kept");

    let e = cluster.generate(&strict, request("", "Hello there", 8)).await.map(|_| ()).expect_err("failed");
    assert!(e.to_string().contains("injected fault"), "{e}");
    let (want, _, e) =
        collect(cluster.generate(&ordinary, request("", "Hello there", 8)).await.expect("ordinary")).await;
    assert!(e.is_none(), "{e:?}");
    let (got, _, e) =
        collect(cluster.generate(&kept, request("", "Hello there", 8)).await.expect("kept")).await;
    assert!(e.is_none(), "{e:?}");
    assert_eq!(got, want);
    let stats = cluster.stats(&kept).await.expect("stats");
    let served: Vec<(xinf_actors::Role, u64)> = stats.iter().map(|s| (s.role, s.requests_served)).collect();
    assert!(served.contains(&(xinf_actors::Role::Decode, 1)), "{served:?}");
    let computed: u64 = stats.iter().map(|s| s.handoff.decode_prompts).sum();
    assert_eq!(computed, 1, "{stats:?}");

    let mut bad = request("", "Hello there", 8);
    bad.sampling.temperature = -1.0;
    let e = cluster.generate(&kept, bad).await.map(|_| ()).expect_err("invalid");
    assert_eq!(e.class(), xinf_engine::ErrorClass::InvalidInput, "{e}");
    cluster.shutdown().await;
}
