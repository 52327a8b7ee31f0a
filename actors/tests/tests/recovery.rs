//! Recovery with worker processes: a replica lost with its worker is replaced on another, and a
//! frozen worker that thaws takes its replica back into its model.

use super::*;

/// Each replica's uid, worker and status.
async fn replicas(sup: &Cluster, uid: &str) -> Vec<(String, String, ReplicaStatus)> {
    let info = sup.get_model(uid).await.expect("the model");
    info.replicas.into_iter().map(|r| (r.replica_uid, r.worker_id, r.status)).collect()
}

/// A replica placed by the supervisor (no named worker) whose worker dies is placed again on
/// the other worker: the model is ready again with one alive replica there, and answers as
/// before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_lost_with_its_worker_is_replaced_on_another() {
    let (sup, mut workers, ids, _turn) = supervisor_with_workers("secret-replacement", 2).await;
    let uid = sup
        .launch(launch_request(json!({"model_uid": "moved", "n_gpu": 0})))
        .await
        .expect("launch one replica");
    let before = replicas(&sup, &uid).await;
    assert_eq!(before.len(), 1);
    let (lost, on) = (before[0].0.clone(), before[0].1.clone());
    let (text, ..) =
        collect(sup.generate(&uid, request("", "The capital of France is", 6)).await.expect("generate"))
            .await;

    let victim = ids.iter().position(|id| *id == on).expect("the replica's worker");
    let other = ids[1 - victim].clone();
    let killed = tokio::time::Instant::now();
    let _ = workers[victim].0.kill();
    let (s, u, other) = (&sup, uid.as_str(), other.as_str());
    eventually(Duration::from_secs(30), "a replacement serving on the other worker", || async move {
        let now = replicas(s, u).await;
        s.get_model(u).await.expect("model").status == ModelStatus::Ready
            && now.len() == 1
            && now[0].1 == other
            && now[0].2 == ReplicaStatus::Alive
    })
    .await;
    eprintln!("replaced {:?} after the worker was killed", killed.elapsed());
    let after = replicas(&sup, &uid).await;
    assert_ne!(after[0].0, lost, "the replacement has a uid of its own");
    let (again, reason, error) =
        collect(sup.generate(&uid, request("", "The capital of France is", 6)).await.expect("generate"))
            .await;
    assert!(error.is_none() && reason.is_some(), "{reason:?} {error:?}");
    assert_eq!(again, text, "the replacement answers as the lost replica did");
    sup.terminate(&uid).await.expect("terminate");
    sup.shutdown().await;
}

/// A frozen worker (SIGSTOP) is declared lost and its replica dead; thawed (SIGCONT), it
/// heartbeats again with the replica still loaded, which rejoins its model: the model is ready
/// and serves without any reload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thawed_worker_brings_its_replica_back() {
    let (sup, workers, ids, _turn) = supervisor_with_workers("secret-thawed-worker", 1).await;
    let uid = sup
        .launch(launch_request(json!({"model_uid": "thawed", "replica_config": [
            {"replica_uid": "thawed-a", "devices": [{"worker_ip": ids[0], "n_gpu": 0}]}]})))
        .await
        .expect("launch");
    let pid = workers[0].0.id().to_string();
    let signal = |sig: &str| Command::new("kill").args([sig, &pid]).status().expect("kill").success();
    assert!(signal("-STOP"));
    let (s, u) = (&sup, uid.as_str());
    eventually(Duration::from_secs(15), "the frozen worker's replica to be dead", || async move {
        replicas(s, u).await[0].2 == ReplicaStatus::Dead
    })
    .await;
    assert_eq!(sup.get_model(&uid).await.expect("model").status, ModelStatus::Unavailable);
    assert!(signal("-CONT"));
    let thawed = tokio::time::Instant::now();
    eventually(Duration::from_secs(15), "the replica to rejoin", || async move {
        s.get_model(u).await.expect("model").status == ModelStatus::Ready
    })
    .await;
    eprintln!("the replica rejoined {:?} after the worker thawed", thawed.elapsed());
    assert_eq!(replicas(&sup, &uid).await, [("thawed-a".to_owned(), ids[0].clone(), ReplicaStatus::Alive)]);
    let (text, reason, error) =
        collect(sup.generate(&uid, request("", "The capital of France is", 6)).await.expect("generate"))
            .await;
    assert!(error.is_none() && reason.is_some() && !text.is_empty(), "{text:?} {reason:?} {error:?}");
    sup.terminate(&uid).await.expect("terminate");
    sup.shutdown().await;
}
