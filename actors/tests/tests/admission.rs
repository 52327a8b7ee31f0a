//! Host memory admission with a worker process whose memory for replicas is set
//! (`XINF_WORKER_MEMORY`): replicas computing on its CPU are admitted while their weights and KV
//! caches fit, and a launch or scale-up of more is refused naming `replica`, leaving nothing.

use super::*;

/// Mock replicas of 1,024 KV tokens hold 128 KiB each; the worker has 400 KiB: three fit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_are_admitted_while_the_workers_memory_holds_them() {
    let _turn = node_turn().await;
    let secret = "secret-host-memory";
    let sup = Cluster::start_supervisor_with("127.0.0.1", 0, secret, options()).await.expect("supervisor");
    let addr = sup.address().expect("an address").to_owned();
    let _worker = child_worker_process_with(&addr, secret, None, &[("XINF_WORKER_MEMORY", "400K")]);
    let s = &sup;
    eventually(Duration::from_secs(30), "the worker to join", || async move {
        s.list_workers().await.expect("workers").iter().any(|w| w.alive)
    })
    .await;
    let memory = sup.list_workers().await.expect("workers")[0].info.memory;
    assert_eq!(memory, Some(400 << 10));

    let e = sup
        .launch(launch_request(json!({"model_uid": "big", "replica": 4, "n_gpu": 0})))
        .await
        .expect_err("four replicas do not fit");
    assert_eq!(e.launch_rule(), Some(LaunchRule::NotEnoughMemory), "{e}");
    assert_eq!(e.launch_field(), Some("replica"), "{e}");
    assert!(
        e.to_string().contains("needs 128 KiB of host memory") && e.to_string().contains("has 400 KiB"),
        "{e}"
    );
    assert!(sup.list_models().await.expect("models").is_empty());
    eventually(Duration::from_secs(10), "every replica stopped", || async move {
        s.list_workers().await.expect("workers")[0].replicas.is_empty()
    })
    .await;

    let uid = sup
        .launch(launch_request(json!({"model_uid": "fits", "replica": 3, "n_gpu": 0})))
        .await
        .expect("three replicas fit");
    let e = sup
        .scale(&uid, ScaleRequest { count: Some(1), ..ScaleRequest::default() })
        .await
        .expect_err("a fourth does not");
    assert_eq!(e.launch_rule(), Some(LaunchRule::NotEnoughMemory), "{e}");
    let (text, reason, error) =
        collect(sup.generate(&uid, request("", "The capital of France is", 6)).await.expect("generate"))
            .await;
    assert!(error.is_none() && reason.is_some() && !text.is_empty(), "{text:?} {reason:?} {error:?}");
    assert_eq!(sup.get_model(&uid).await.expect("model").replicas.len(), 3);
    sup.terminate(&uid).await.expect("terminate");
    sup.shutdown().await;
}
