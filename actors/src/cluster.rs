//! [`Cluster`], the handle on a running cluster that the REST layer and embedders hold: model
//! launch, terminate and listings here; start-up in `start`, options in `options`, and the
//! requests themselves in `crate::request`.

mod options;
mod start;

pub use options::ClusterOptions;
pub use start::WorkerNode;

use crate::block_tracker::BlockTrackerHandle;
use crate::error::ActorError;
use crate::launch::{LaunchRequest, ScaleRequest};
use crate::node::Namespace;
use crate::protocol::{SupervisorMsg, WorkerMsg};
use crate::replica::ReplicaMsg;
use crate::router::RouterMsg;
use crate::supervisor::{ModelActors, ModelTable};
use crate::view::{ModelInfo, ModelStatus, ReplicaStats, WorkerStatus};
use crate::wire::{JsonWire, Wire, call, call_local};
use ractor::ActorRef;
use ractor_cluster::NodeServerMessage;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

pub(crate) struct Inner {
    pub(crate) ns: Namespace,
    pub(crate) supervisor: ActorRef<SupervisorMsg>,
    pub(crate) models: Arc<ModelTable>,
    pub(crate) options: ClusterOptions,
    pub(crate) local_worker: Option<ActorRef<WorkerMsg>>,
    pub(crate) node: Option<ActorRef<NodeServerMessage>>,
    pub(crate) address: Option<String>,
    pub(crate) closed: AtomicBool,
}

/// A handle on a running cluster, held on the supervisor's node. Cheap to clone; every clone
/// drives the same cluster.
#[derive(Clone)]
pub struct Cluster {
    pub(crate) inner: Arc<Inner>,
}

impl fmt::Debug for Cluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cluster").field("address", &self.inner.address).finish_non_exhaustive()
    }
}

impl Cluster {
    /// The address workers join (`ip:port`), in cluster mode.
    pub fn address(&self) -> Option<&str> {
        self.inner.address.as_deref()
    }

    /// The engines launches may name, the default first: what the REST API lists as the
    /// engines of a registry model.
    pub fn engines(&self) -> &xinf_engine::Engines {
        &self.inner.options.engines
    }

    pub(crate) fn open(&self) -> Result<(), ActorError> {
        if self.inner.closed.load(Ordering::Acquire) { Err(ActorError::ShuttingDown) } else { Ok(()) }
    }

    pub(crate) fn timeout(&self) -> Duration {
        self.inner.options.call_timeout
    }

    /// Validates and launches a model; returns its uid once every replica is loaded and its
    /// router exists. On any failure nothing of the model is left behind.
    pub async fn launch(&self, request: LaunchRequest) -> Result<String, ActorError> {
        self.open()?;
        let o = &self.inner.options;
        // Loading, plus creating and (on failure) destroying the other actors.
        let limit = o.load_timeout + 2 * o.call_timeout + 2 * o.stop_timeout;
        call(&self.inner.supervisor, "supervisor", limit, |reply| SupervisorMsg::Launch {
            request: JsonWire(Ok(Box::new(request))),
            detach: false,
            reply,
        })
        .await
    }

    /// Validates and places a model, starts loading it, and returns its uid without waiting
    /// for the replicas: the model is `launching` (requests get [`ActorError::NotReady`]) until
    /// it serves. A validation failure is returned as from [`launch`](Self::launch); a later
    /// failure rolls the launch back, and the model disappears from the list.
    pub async fn launch_detached(&self, request: LaunchRequest) -> Result<String, ActorError> {
        self.open()?;
        call(&self.inner.supervisor, "supervisor", self.timeout(), |reply| SupervisorMsg::Launch {
            request: JsonWire(Ok(Box::new(request))),
            detach: true,
            reply,
        })
        .await
    }

    /// Terminates a model: its router, block tracker and replicas.
    pub async fn terminate(&self, model_uid: &str) -> Result<(), ActorError> {
        let o = &self.inner.options;
        let limit = 2 * o.call_timeout + 3 * o.stop_timeout;
        call(&self.inner.supervisor, "supervisor", limit, |reply| SupervisorMsg::Terminate {
            model_uid: model_uid.to_owned(),
            reply,
        })
        .await
    }

    /// Every model.
    pub async fn list_models(&self) -> Result<Vec<ModelInfo>, ActorError> {
        call(&self.inner.supervisor, "supervisor", self.timeout(), |reply| SupervisorMsg::ListModels {
            reply,
        })
        .await
    }

    /// One model: status and replicas.
    pub async fn get_model(&self, model_uid: &str) -> Result<ModelInfo, ActorError> {
        call(&self.inner.supervisor, "supervisor", self.timeout(), |reply| SupervisorMsg::GetModel {
            model_uid: model_uid.to_owned(),
            reply,
        })
        .await
    }

    /// Every worker that ever registered.
    pub async fn list_workers(&self) -> Result<Vec<WorkerStatus>, ActorError> {
        call(&self.inner.supervisor, "supervisor", self.timeout(), |reply| SupervisorMsg::ListWorkers {
            reply,
        })
        .await
    }

    /// Adds replicas to a serving model, copies of its first replica of the role asked for
    /// (see [`ScaleRequest`]); returns their uids once they serve. A failure leaves the model
    /// as it was.
    pub async fn scale(&self, model_uid: &str, request: ScaleRequest) -> Result<Vec<String>, ActorError> {
        self.open()?;
        let o = &self.inner.options;
        let limit = o.load_timeout + 2 * o.call_timeout + 2 * o.stop_timeout;
        call(&self.inner.supervisor, "supervisor", limit, |reply| SupervisorMsg::Scale {
            model_uid: model_uid.to_owned(),
            request: Wire::ok(request),
            reply,
        })
        .await
    }

    /// Removes one replica of a serving model: it takes no new requests, its running ones get
    /// up to `drain` to finish (those left then end with an error), and its worker stops it.
    /// Returns once it is gone. The model's last alive replica of a role is not removed.
    pub async fn remove_replica(
        &self,
        model_uid: &str,
        replica_uid: &str,
        drain: Duration,
    ) -> Result<(), ActorError> {
        self.open()?;
        let o = &self.inner.options;
        let limit = drain + 2 * o.call_timeout + 2 * o.stop_timeout;
        call(&self.inner.supervisor, "supervisor", limit, |reply| SupervisorMsg::RemoveReplica {
            model_uid: model_uid.to_owned(),
            replica_uid: replica_uid.to_owned(),
            drain_ms: u64::try_from(drain.as_millis()).unwrap_or(u64::MAX),
            reply,
        })
        .await
    }

    /// The local actors of a serving model, or why there are none.
    pub(crate) async fn serving(&self, model_uid: &str) -> Result<ModelActors, ActorError> {
        self.open()?;
        if let Some(actors) = self.inner.models.get(model_uid) {
            return Ok(actors);
        }
        let info = self.get_model(model_uid).await?;
        Err(match info.status {
            ModelStatus::Unavailable => ActorError::NoReplica { model_uid: model_uid.to_owned(), role: None },
            status => ActorError::NotReady { model_uid: model_uid.to_owned(), status: status.to_string() },
        })
    }

    /// The chat settings of a serving model's launch (`reasoning_content`, `enable_thinking`);
    /// read locally, without a call.
    pub async fn chat_defaults(&self, model_uid: &str) -> Result<crate::ChatDefaults, ActorError> {
        self.serving(model_uid).await.map(|actors| actors.chat)
    }

    /// The model's `request_limits` and how it is used; `None` for a model without one.
    pub async fn request_limit(
        &self,
        model_uid: &str,
    ) -> Result<Option<crate::RequestLimitStats>, ActorError> {
        self.serving(model_uid).await.map(|actors| actors.limit.map(|l| l.stats()))
    }

    /// Load figures of every replica of the model in rotation, by replica uid, then of those
    /// draining.
    pub async fn stats(&self, model_uid: &str) -> Result<Vec<ReplicaStats>, ActorError> {
        let actors = self.serving(model_uid).await?;
        let t = self.timeout();
        let replicas = call_local(&actors.router, "router", t, |reply| RouterMsg::Replicas { reply }).await?;
        let calls = replicas.iter().map(|held| async move {
            let what = format!("replica `{}`", held.uid);
            let stats = call(&held.replica, &what, t, |reply| ReplicaMsg::Stats { reply }).await;
            stats.map(|s| ReplicaStats { draining: held.draining, ..s })
        });
        let mut out = Vec::new();
        for result in futures::future::join_all(calls).await {
            match result {
                Ok(s) => out.push(s),
                Err(e) => tracing::warn!(error = %e, "a replica did not report its stats"),
            }
        }
        Ok(out)
    }

    /// The block tracker of a serving model.
    pub async fn block_tracker(&self, model_uid: &str) -> Result<BlockTrackerHandle, ActorError> {
        let actors = self.serving(model_uid).await?;
        Ok(BlockTrackerHandle::new(actors.tracker, self.timeout()))
    }

    /// Names of this cluster's actors alive in this process (supervisor, workers, replicas,
    /// routers, block trackers). For tests and diagnosis: a failed launch leaves none behind.
    pub fn debug_actor_names(&self) -> Vec<String> {
        let mut names: Vec<String> =
            ractor::registry::registered().into_iter().filter(|n| self.inner.ns.owns(n)).collect();
        names.sort();
        names
    }

    /// Stops the supervisor, the local worker and the node listener; later calls fail with
    /// [`ActorError::ShuttingDown`]. With a local worker (`xinf local`) every model is
    /// terminated first. A supervisor of remote workers leaves their models running: a
    /// supervisor restarted on the same cluster port and secret adopts them, as after a crash,
    /// so that restarting it (a signal, a service manager) does not empty the cluster.
    pub async fn shutdown(&self) {
        if self.inner.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        if self.inner.local_worker.is_none() {
            tracing::info!(
                "the workers keep their models; a supervisor restarted with this cluster port adopts them"
            );
        } else if let Ok(models) = self.list_models().await {
            for m in models {
                if let Err(e) = self.terminate(&m.model_uid).await {
                    tracing::warn!(model_uid = %m.model_uid, error = %e, "could not terminate a model");
                }
            }
        }
        let stop = Some(self.inner.options.stop_timeout);
        if let Err(e) = self.inner.supervisor.stop_and_wait(Some("shutdown".into()), stop).await {
            tracing::warn!(error = %e, "the supervisor did not stop in time");
        }
        if let Some(worker) = &self.inner.local_worker
            && let Err(e) = worker.stop_and_wait(Some("shutdown".into()), stop).await
        {
            tracing::warn!(error = %e, "the worker did not stop in time");
        }
        if let Some(node) = &self.inner.node {
            node.stop(Some("shutdown".into()));
        }
    }
}
