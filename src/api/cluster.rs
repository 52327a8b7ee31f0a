//! [`ClusterService`]: the REST layer over an actor cluster (`xinf local`, `xinf supervisor`).

use crate::api::ModelStats;
use crate::api::service::{
    ModelInfo, ModelService, PdOptions, ServiceError, ServiceFuture, WeightsInfo, first_seen,
};
use crate::api::totals::Totals;
use futures::FutureExt;
use std::sync::Arc;
use xinf_actors::{ActorError, Cluster, LaunchRequest, ReplicaStatus, WorkerStatus};
use xinf_engine::{GenerateRequest, TokenStream};

/// A [`ModelService`] that answers through a [`Cluster`]: models are launched on workers,
/// requests go through each model's router to its replicas, wherever they run.
#[derive(Debug, Clone)]
pub struct ClusterService {
    cluster: Cluster,
    /// The models' counters, kept from replicas that no longer answer.
    totals: Arc<Totals>,
}

impl ClusterService {
    /// Serves the models of `cluster`.
    pub fn new(cluster: Cluster) -> Self {
        Self { cluster, totals: Arc::default() }
    }

    /// The cluster behind the service.
    pub fn cluster(&self) -> &Cluster {
        &self.cluster
    }
}

fn info(m: xinf_actors::ModelInfo) -> ModelInfo {
    // The replicas' engines, once each in launch order (`vllm+sglang` for a mixed launch).
    let engines = first_seen(m.replicas.iter().map(|r| r.engine.as_str()));
    let engine = if engines.is_empty() { "native".to_owned() } else { engines.join("+") };
    ModelInfo {
        // Those that serve or will: not the lost ones, nor those whose worker is stopping.
        replicas: m
            .replicas
            .iter()
            .filter(|r| matches!(r.status, ReplicaStatus::Alive | ReplicaStatus::Loading))
            .count(),
        uid: m.model_uid,
        model_name: m.model_name,
        status: m.status,
        replica_details: m.replicas,
        engine,
        context_length: None,
        created: m.created,
        weights: WeightsInfo::of(&m.source),
        pd: PdOptions {
            prefill_fallback: m.prefill_fallback,
            max_local_prefill_tokens: m.max_local_prefill_tokens,
        },
    }
}

fn service<T>(r: Result<T, ActorError>) -> Result<T, ServiceError> {
    r.map_err(ServiceError::from)
}

impl ModelService for ClusterService {
    fn list(&self) -> ServiceFuture<Vec<ModelInfo>> {
        let c = self.cluster.clone();
        async move { service(c.list_models().await).map(|ms| ms.into_iter().map(info).collect()) }.boxed()
    }

    fn get(&self, uid: &str) -> ServiceFuture<ModelInfo> {
        let (c, uid) = (self.cluster.clone(), uid.to_owned());
        async move { service(c.get_model(&uid).await).map(info) }.boxed()
    }

    fn generate(&self, uid: &str, req: GenerateRequest) -> ServiceFuture<TokenStream> {
        let (c, uid) = (self.cluster.clone(), uid.to_owned());
        async move { service(c.generate(&uid, req).await) }.boxed()
    }

    fn generate_all(&self, uid: &str, reqs: Vec<GenerateRequest>) -> ServiceFuture<Vec<TokenStream>> {
        let (c, uid) = (self.cluster.clone(), uid.to_owned());
        async move { service(c.generate_all(&uid, reqs).await) }.boxed()
    }

    fn chat_defaults(&self, uid: &str) -> ServiceFuture<xinf_actors::ChatDefaults> {
        let (c, uid) = (self.cluster.clone(), uid.to_owned());
        async move { service(c.chat_defaults(&uid).await) }.boxed()
    }

    fn abort(&self, uid: &str, request_id: &str) -> ServiceFuture<bool> {
        let (c, uid, rid) = (self.cluster.clone(), uid.to_owned(), request_id.to_owned());
        async move { service(c.abort(&uid, &rid).await) }.boxed()
    }

    /// The sum over the replicas that answer, and each replica; counters also count the
    /// replicas that answered before (see [`Totals`]).
    fn stats(&self, uid: &str) -> ServiceFuture<ModelStats> {
        let (c, uid, totals) = (self.cluster.clone(), uid.to_owned(), self.totals.clone());
        async move {
            let mut stats = service(c.stats(&uid).await).map(ModelStats::from_replicas)?;
            totals.settle(&uid, &mut stats);
            stats.request_limit = service(c.request_limit(&uid).await)?;
            Ok(stats)
        }
        .boxed()
    }

    fn launch(&self, request: LaunchRequest, wait_ready: bool) -> ServiceFuture<String> {
        let (c, totals) = (self.cluster.clone(), self.totals.clone());
        async move {
            let r = if wait_ready { c.launch(request).await } else { c.launch_detached(request).await };
            let uid = service(r)?;
            // A uid used before (by a model terminated elsewhere) counts from zero.
            totals.forget(&uid);
            Ok(uid)
        }
        .boxed()
    }

    fn terminate(&self, uid: &str) -> ServiceFuture<()> {
        let (c, uid, totals) = (self.cluster.clone(), uid.to_owned(), self.totals.clone());
        async move {
            service(c.terminate(&uid).await)?;
            totals.forget(&uid);
            Ok(())
        }
        .boxed()
    }

    fn workers(&self) -> ServiceFuture<Vec<WorkerStatus>> {
        let c = self.cluster.clone();
        async move { service(c.list_workers().await) }.boxed()
    }

    fn engines(&self) -> xinf_engine::Engines {
        self.cluster.engines().clone()
    }

    fn scale(&self, uid: &str, request: xinf_actors::ScaleRequest) -> ServiceFuture<Vec<String>> {
        let (c, uid) = (self.cluster.clone(), uid.to_owned());
        async move { service(c.scale(&uid, request).await) }.boxed()
    }

    fn remove_replica(&self, uid: &str, replica_uid: &str, drain: std::time::Duration) -> ServiceFuture<()> {
        let (c, uid, replica_uid) = (self.cluster.clone(), uid.to_owned(), replica_uid.to_owned());
        async move { service(c.remove_replica(&uid, &replica_uid, drain).await) }.boxed()
    }
}
