//! The actors of xinf: a supervisor per cluster, a worker per node, a replica per model
//! replica, a router and a block tracker per model. They run in one process (`xinf local`) or
//! across nodes (ractor_cluster, nodes authenticated by a shared secret); callers see the same
//! typed [`Cluster`] handle either way.
//!
//! ```no_run
//! use futures::StreamExt;
//! use xinf_actors::{Cluster, LaunchRequest};
//! use xinf_engine::{Engines, GenerateRequest, Prompt, SamplingParams, TokenEvent};
//!
//! // The engines this node offers (the `xinf` crate registers its native engine).
//! # async fn demo(engines: Engines) -> Result<(), Box<dyn std::error::Error>> {
//! let cluster = Cluster::start_local(engines).await?;
//! let uid = cluster
//!     .launch(LaunchRequest { model_name: "smollm2-instruct".into(), replica: Some(2), ..Default::default() })
//!     .await?;
//! let mut stream = cluster
//!     .generate(&uid, GenerateRequest {
//!         request_id: String::new(), // generated
//!         prompt: Prompt::Text("The capital of France is".into()),
//!         sampling: SamplingParams::greedy(8),
//!     })
//!     .await?;
//! while let Some(event) = stream.next().await {
//!     if let TokenEvent::Delta { text, .. } = event? {
//!         print!("{text}");
//!     }
//! }
//! cluster.shutdown().await;
//! # Ok(()) }
//! ```
//!
//! Floor plan (leaves first; no module imports one that imports it back):
//! - `error`, `wire`: [`ActorError`]; messages' serialized results and calls with time limits.
//! - `view`: what the layer hands out (models, replicas, workers, GPUs, load figures).
//! - `spec`: [`Role`] and the replica spec a worker starts a replica from.
//! - `launch`: the launch request, its validation rules and placement, as pure functions.
//! - `protocol`: the supervisor's and the workers' messages (both sides send them).
//! - `node`: names, process groups, node start-up and joining.
//! - `replica`, `router`, `block_tracker`, `worker`, `supervisor`: the actors, each a shell
//!   around a pure state machine.
//! - `cluster`: the [`Cluster`] handle (start-up, options, launch, listings);
//!   `request`: requests on it (the P/D handoff choreography, the abandoned-request guard,
//!   the pull of events).
//!
//! Design notes:
//! - The actors know no engine: a launch names one (`model_engine`), the supervisor checks the
//!   model and the options with its [`xinf_engine::EngineLoader`] before anything starts, and a
//!   worker loads the replica's engine with it. Options travel typed
//!   ([`xinf_engine::EngineConfig`]).
//! - Every actor is a thin shell around a pure state machine (`supervisor/state.rs`,
//!   `router/policy.rs`, `block_tracker/state.rs`, `replica/requests.rs`) that is unit-tested.
//! - Message enums are crate-private; callers use [`Cluster`], [`WorkerNode`] and
//!   [`BlockTrackerHandle`]. Every call has a time limit and every failure is an
//!   [`ActorError`] with a stable [`code`](ActorError::code).
//! - Tokens cross nodes by pulling (see `replica.rs`): actor references cannot travel inside
//!   cluster messages, so a replica cannot be handed a place to push to.
//!
//! Supervision (nothing restarts by itself yet):
//! - The supervisor links each model's router and block tracker; the worker links its
//!   replicas. A replica that stops unasked is reported by its worker and marked dead.
//! - A worker that misses heartbeats for `heartbeat_timeout`, or whose node disconnects, is
//!   lost: its replicas are marked dead and leave their routers, their in-flight requests end
//!   with an error at once, their blocks leave the block tracker, and a model left without an
//!   alive replica turns to `error`. Other models keep serving.
//! - A launch that fails at any step destroys everything it created and leaves no state; a
//!   terminate stops the router and tracker first (no new requests), then the replicas.

mod block_tracker;
mod chat;
mod cluster;
mod error;
mod launch;
mod limit;
mod node;
mod protocol;
mod replica;
mod request;
mod router;
mod spec;
mod supervisor;
#[cfg(test)]
mod testing;
mod view;
mod wire;
mod worker;

pub use block_tracker::BlockTrackerHandle;
pub use block_tracker::state::BlockLocation;
pub use chat::ChatDefaults;
pub use cluster::{Cluster, ClusterOptions, WorkerNode};
pub use error::{ActorError, LaunchRule};
pub use launch::{
    DeviceConfig, GpuCount, GpuIdx, LAUNCH_KEYWORDS, LaunchRequest, MAX_SCALE, ModelSize,
    RESERVED_ENGINE_CONFIG_KEYS, ReplicaConfig, Role, ScaleRequest, scale_refused_key,
};
pub use limit::RequestLimitStats;
pub use view::{
    FinishCounts, GpuInfo, GpuUsage, HANDOFF_LATENCY_BOUNDS, HandoffStats, LatencyHistogram, ModelInfo,
    ModelStatus, REQUEST_LATENCY_BOUNDS, ReplicaInfo, ReplicaStats, ReplicaStatus, RequestHistogram,
    ServingStats, WorkerInfo, WorkerStatus,
};
pub use xinf_engine::{ErrorClass, TokenStream};
