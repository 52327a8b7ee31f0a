//! The OpenAI-compatible REST API (actix-web).
//!
//! [`serve`] binds `host:port` and serves a [`ModelService`] on the tokio runtime it is
//! awaited in (actix runs its HTTP workers on threads of their own):
//!
//! | route | does |
//! |---|---|
//! | `POST /v1/chat/completions` | chat, streaming (SSE) or not |
//! | `POST /v1/completions` | text completion, streaming or not |
//! | `GET /v1/models`, `GET /v1/models/{uid}` | the models, OpenAI's shape plus an `xinf` object |
//! | `POST /v1/models` (`?wait_ready=false`) | launch a model (Xinference's launch keys) → `{"model_uid"}` |
//! | `DELETE /v1/models/{uid}` | terminate a model |
//! | `GET /v1/workers` | the cluster's workers: devices, liveness, replicas |
//! | `GET /v1/models/{uid}/stats` | the model's load figures (JSON) |
//! | `GET /v1/models/{uid}/replicas` | the model's replicas: role, worker, GPUs, engine, status |
//! | `POST /v1/models/{uid}/replicas` | add replicas (`{"role", "count", "worker_ip", "gpu_idx"}`), copies of the model's first replica of the role → `{"model_uid", "replicas"}` |
//! | `POST /v1/models/{uid}/requests/{rid}/abort` | `{"msg": "DONE"}` or `{"msg": "NOT_FOUND"}` |
//! | `GET /v1/cluster/auth` | `{"auth": bool}`: whether a key is needed (open, as in Xinference) |
//! | `GET /v1/models/{uid}/progress` | `{"progress": 0..1}`: the share of the replicas loaded |
//! | `GET /v1/engines/{model_type}/{name}`, `GET /v1/engines/{name}` | the engines that serve a registry model, with the variants each takes |
//! | `GET /v1/model_registrations/{model_type}` (`?detailed=true`), `…/{name}` | the model registry, in Xinference's shapes |
//! | `GET /health` | `{"status": "ok"}` |
//! | `GET /metrics` | Prometheus text: running/queued requests, token counters, KV blocks |
//!
//! Requests are strict: an unknown field, a field of the wrong type, or a parameter xinf does
//! not support yet (image content, `suffix`) is refused with 400 and the field in `param`.
//! Errors use OpenAI's shape, in the language of `Accept-Language` (see the `error` module for
//! the status table), with the message also under `detail`, where Xinference's client reads it.
//! When an API key is configured, every `/v1` route but `/v1/cluster/auth` needs
//! `Authorization: Bearer <key>`; `/health` and `/metrics` stay open.
//!
//! A client that disconnects from a stream aborts its request: the response body owns the
//! engine's token stream, and dropping it aborts the request.
//!
//! ```no_run
//! use std::sync::Arc;
//! use xinf::api::{ApiConfig, LocalService, serve};
//! # use xinf::engine::Engine;
//! # async fn demo(engine: Arc<dyn Engine>) -> std::io::Result<()> {
//! let service = LocalService::new().with_model("smollm2", "smollm2-instruct", engine);
//! let server = serve(ApiConfig { port: 0, ..ApiConfig::default() }, Arc::new(service)).await?;
//! println!("listening on http://{}/v1", server.local_addr());
//! server.stop(true).await;
//! # Ok(()) }
//! ```

mod auth;
mod choices;
mod cluster;
mod echo;
mod error;
mod logprobs;
mod openai;
mod panics;
mod peer;
mod reasoning;
mod response_format;
mod retries;
mod routes;
mod sampling;
mod service;
pub(crate) mod shown;
mod sse;
mod stats;
mod tools;
mod totals;

pub use cluster::ClusterService;
pub(crate) use routes::registrations_json;
pub(crate) use service::first_seen;
pub(crate) use service::status_name;
pub use service::{
    LocalService, ModelInfo, ModelService, PdOptions, ServiceError, ServiceFuture, WeightsInfo,
};
pub use stats::ModelStats;

use actix_web::{App, HttpServer, web};
use std::net::SocketAddr;
use std::sync::Arc;

/// How the REST server runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiConfig {
    /// Address to bind (default `127.0.0.1`).
    pub host: String,
    /// Port to bind; 0 picks a free one (see [`ServerHandle::local_addr`]). Default 9997.
    pub port: u16,
    /// When set, every `/v1` route needs `Authorization: Bearer <key>`.
    pub api_key: Option<String>,
    /// Largest request body in bytes; larger ones get 413. Default 4 MiB.
    pub max_body_bytes: usize,
    /// HTTP worker threads; `None` uses actix's default (one per CPU core).
    pub workers: Option<usize>,
    /// Seconds a graceful stop waits for requests in flight. Default 10.
    pub shutdown_timeout_secs: u64,
    /// How long a request body may go without a byte arriving before the request gets 408.
    /// Default 30 s. (Headers have actix's own 5 s.) Without it a client could hold a
    /// connection, and its file descriptors, for ever by stopping mid-body.
    pub body_idle: std::time::Duration,
}

impl Default for ApiConfig {
    fn default() -> Self {
        Self {
            host: "127.0.0.1".into(),
            port: 9997,
            api_key: None,
            max_body_bytes: 4 << 20,
            workers: None,
            shutdown_timeout_secs: 10,
            body_idle: std::time::Duration::from_secs(30),
        }
    }
}

/// What every handler reaches through `web::Data`.
pub(crate) struct AppState {
    pub(crate) service: Arc<dyn ModelService>,
    pub(crate) api_key: Option<String>,
    pub(crate) max_body_bytes: usize,
    /// [`ApiConfig::body_idle`].
    pub(crate) body_idle: std::time::Duration,
    /// The requests running as several choices, for the abort route.
    pub(crate) fanouts: choices::Fanouts,
}

/// A running server.
pub struct ServerHandle {
    addr: SocketAddr,
    handle: actix_web::dev::ServerHandle,
    task: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
}

impl std::fmt::Debug for ServerHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerHandle").field("addr", &self.addr).finish_non_exhaustive()
    }
}

impl ServerHandle {
    /// The address the server listens on (with the real port when port 0 was asked for).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops the server: `graceful` lets requests in flight finish (up to the shutdown
    /// timeout). Returns when the server has stopped.
    pub async fn stop(&self, graceful: bool) {
        self.handle.stop(graceful).await;
    }

    /// Waits until the server stops (after [`stop`](Self::stop), or on a fatal error).
    pub async fn stopped(&mut self) -> std::io::Result<()> {
        let Some(task) = self.task.as_mut() else { return Ok(()) };
        let result = task.await;
        self.task = None;
        match result {
            Ok(r) => r,
            Err(e) => Err(std::io::Error::other(e)),
        }
    }
}

/// The connections each of `workers` HTTP workers holds at most, for a process that may open
/// `files` descriptors (`None`: unknown). A connection holds two (its socket and the duplicate
/// `peer` watches), and the HTTP server gets half of them: the rest stays for the cluster's
/// links, engine servers, page transfers and files, which a flood of idle connections would
/// otherwise starve. Past the cap a worker stops accepting until a connection closes (clients
/// wait in the listen backlog), where an exhausted process would refuse everyone. actix's own
/// default, 25,000 a worker, is the most.
fn connections_per_worker(files: Option<u64>, workers: usize) -> usize {
    const ACTIX_DEFAULT: usize = 25_000;
    let Some(files) = files else { return ACTIX_DEFAULT };
    let total = usize::try_from(files / 4).unwrap_or(usize::MAX);
    (total / workers.max(1)).clamp(16, ACTIX_DEFAULT)
}

/// The process's limit on open file descriptors (its soft limit), where the system tells it.
fn open_file_limit() -> Option<u64> {
    let (soft, _) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).ok()?;
    (soft != nix::sys::resource::RLIM_INFINITY).then_some(soft)
}

/// Binds `config.host:config.port` and serves `service` until the handle is stopped.
///
/// Must be awaited inside a tokio runtime; the server's own task runs on it. Signals are not
/// handled here: the caller decides when to [`stop`](ServerHandle::stop).
pub async fn serve(config: ApiConfig, service: Arc<dyn ModelService>) -> std::io::Result<ServerHandle> {
    let state = web::Data::new(AppState {
        service,
        api_key: config.api_key.clone().filter(|k| !k.is_empty()),
        max_body_bytes: config.max_body_bytes,
        body_idle: config.body_idle,
        fanouts: choices::Fanouts::default(),
    });
    let mut server = HttpServer::new(move || {
        App::new()
            .app_data(state.clone())
            .configure(routes::configure)
            .default_service(web::to(routes::not_found))
    })
    .on_connect(peer::on_connect)
    .disable_signals()
    .shutdown_timeout(config.shutdown_timeout_secs);
    // actix's default: a worker per core the process may use.
    let workers =
        config.workers.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())).max(1);
    let cap = connections_per_worker(open_file_limit(), workers);
    server = server.workers(workers).max_connections(cap);
    let server = server.bind((config.host.as_str(), config.port))?;
    let addr = server.addrs().first().copied().ok_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::AddrNotAvailable, format!("{}:{}", config.host, config.port))
    })?;
    let server = server.run();
    let handle = server.handle();
    let task = tokio::spawn(server);
    tracing::info!(target: "xinf::api", %addr, "serving the OpenAI API");
    Ok(ServerHandle { addr, handle, task: Some(task) })
}

#[cfg(test)]
mod tests {
    use super::connections_per_worker;

    #[test]
    fn connections_take_half_the_descriptors_two_each() {
        // The common default soft limit: 1,024 descriptors, 256 connections over 2 workers.
        assert_eq!(connections_per_worker(Some(1024), 2), 128);
        assert_eq!(connections_per_worker(Some(20_000), 2), 2_500);
        // Never below 16 a worker, never above actix's 25,000, which an unknown limit keeps.
        assert_eq!(connections_per_worker(Some(100), 8), 16);
        assert_eq!(connections_per_worker(Some(1 << 20), 1), 25_000);
        assert_eq!(connections_per_worker(None, 4), 25_000);
    }
}
