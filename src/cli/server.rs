//! The commands that run a cluster: `xinf local`, `xinf supervisor` and `xinf worker`.

use super::launch::LaunchSource;
use super::shutdown_signal;
use crate::api::{self, ApiConfig, ClusterService, ModelService};
use clap::Args;
use std::sync::Arc;
use xinf_actors::{ActorError, Cluster, ClusterOptions};
use xinf_i18n::Catalog;

/// How the REST API is served.
#[derive(Debug, Args)]
pub(crate) struct HttpArgs {
    /// Address the REST API listens on.
    #[arg(short = 'H', long, env = "XINF_HOST", default_value = "127.0.0.1")]
    pub(crate) host: String,
    /// Port of the REST API; 0 picks a free one (printed on start).
    #[arg(short = 'p', long, env = "XINF_PORT", default_value_t = 9997)]
    pub(crate) port: u16,
    /// Require `Authorization: Bearer KEY` on every /v1 route.
    #[arg(long, env = "XINF_API_KEY", hide_env_values = true)]
    pub(crate) api_key: Option<String>,
    /// Largest request body in bytes; larger ones get 413.
    #[arg(long, env = "XINF_MAX_BODY_BYTES", default_value_t = 4 << 20)]
    pub(crate) max_body_bytes: usize,
    /// HTTP worker threads (default: one per CPU core).
    #[arg(long, env = "XINF_HTTP_WORKERS")]
    pub(crate) http_workers: Option<usize>,
    /// On SIGTERM or Ctrl-C, seconds to let the requests in flight finish (new connections are
    /// refused meanwhile); a second signal stops at once.
    #[arg(long, env = "XINF_DRAIN_TIMEOUT", default_value_t = 30)]
    pub(crate) drain_timeout: u64,
}

impl HttpArgs {
    pub(crate) fn config(&self) -> ApiConfig {
        ApiConfig {
            host: self.host.clone(),
            port: self.port,
            api_key: self.api_key.clone(),
            max_body_bytes: self.max_body_bytes,
            workers: self.http_workers,
            shutdown_timeout_secs: self.drain_timeout,
            ..ApiConfig::default()
        }
    }
}

/// The secret nodes of one cluster share.
#[derive(Debug, Args)]
pub(crate) struct SecretArgs {
    /// Shared secret of the cluster's nodes (at least 8 characters, refused otherwise); a node presenting another
    /// one is refused. Prefer the environment variable: arguments are visible to other users.
    #[arg(long, env = "XINF_CLUSTER_SECRET", hide_env_values = true)]
    pub(crate) cluster_secret: Option<String>,
}

impl SecretArgs {
    fn get(&self, cat: &Catalog) -> Result<&str, String> {
        self.cluster_secret.as_deref().ok_or_else(|| cat.text("cli-secret-required", &[]))
    }
}

/// Settings of the replicas a node runs.
#[derive(Debug, Args)]
pub(crate) struct NodeArgs {
    /// CPU snapshot cache of each prefill replica, in MiB: the complete pages of handed-off
    /// prompts, reused by later prompts with the same prefix; 0 keeps none. A launch's
    /// xavier_cache_bytes overrides it for its model.
    #[arg(long, env = "XINF_SNAPSHOT_CACHE_MIB", default_value_t = 512)]
    snapshot_cache_mib: usize,
    /// Run the node's GPU work under NVIDIA's Multi-Process Service: replicas that share a GPU
    /// (a prefill and a decode server by memory shares) run their kernels side by side instead
    /// of taking turns. Starts the MPS control daemon unless one runs, and stops the one it
    /// started on exit. A fatal GPU fault in one replica then ends the others on its GPU.
    #[arg(long, env = "XINF_MPS", action = clap::ArgAction::SetTrue, value_parser = clap::builder::FalseyValueParser::new())]
    mps: bool,
}

impl NodeArgs {
    /// Whether the node runs under MPS (`--mps`).
    pub(crate) fn mps(&self) -> bool {
        self.mps
    }

    fn options(&self) -> ClusterOptions {
        let mut options = ClusterOptions::default();
        options.engines = crate::engines();
        options.snapshot_cache_bytes = self.snapshot_cache_mib.saturating_mul(1 << 20);
        options
    }
}

/// `xinf local`.
#[derive(Debug, Args)]
pub(crate) struct LocalArgs {
    #[command(flatten)]
    http: HttpArgs,
    #[command(flatten)]
    pub(crate) node: NodeArgs,
    /// With --model-name: a model to launch once the server is up (the flags of `xinf launch`).
    #[command(flatten)]
    launch: LaunchSource,
}

/// `xinf supervisor`.
#[derive(Debug, Args)]
pub(crate) struct SupervisorArgs {
    #[command(flatten)]
    http: HttpArgs,
    /// Port workers join on (the cluster port); 0 picks a free one (printed on start).
    #[arg(long, env = "XINF_CLUSTER_PORT", default_value_t = 9998)]
    cluster_port: u16,
    #[command(flatten)]
    secret: SecretArgs,
}

/// `xinf worker`.
#[derive(Debug, Args)]
pub(crate) struct WorkerArgs {
    /// The supervisor's cluster address, `host:cluster-port`.
    #[arg(long, env = "XINF_SUPERVISOR")]
    supervisor: String,
    /// Address this worker listens on for the supervisor: one the supervisor can reach (not a
    /// wildcard such as 0.0.0.0).
    #[arg(short = 'H', long, env = "XINF_WORKER_HOST", default_value = "127.0.0.1")]
    host: String,
    /// Port this worker listens on; 0 picks a free one. A fixed port keeps the worker's id
    /// (`host:port`) when it restarts.
    #[arg(long, env = "XINF_WORKER_PORT", default_value_t = 0)]
    worker_port: u16,
    /// The worker's id (default `host:port`): a worker restarted under the id of a lost one
    /// takes its place rather than joining as a new worker.
    #[arg(long, env = "XINF_WORKER_ID")]
    worker_id: Option<String>,
    /// On SIGTERM or Ctrl-C, how many seconds to let the requests running here finish (no new
    /// ones are routed here meanwhile); a second signal stops at once.
    #[arg(long, env = "XINF_DRAIN_TIMEOUT", default_value_t = 30)]
    drain_timeout: u64,
    #[command(flatten)]
    secret: SecretArgs,
    #[command(flatten)]
    pub(crate) node: NodeArgs,
}

fn actor_text(cat: &Catalog, e: &ActorError) -> String {
    crate::service_error_text(cat, &api::ServiceError::from(e.clone()))
}

/// Serves `cluster` over REST until a signal, then shuts the cluster down.
async fn serve_cluster(
    cluster: Cluster,
    http: &HttpArgs,
    launch: Option<&LaunchSource>,
    cat: &Catalog,
) -> Result<(), String> {
    let service = Arc::new(ClusterService::new(cluster.clone()));
    let served = api::serve(http.config(), service.clone()).await;
    let mut server = match served {
        Ok(s) => s,
        Err(e) => {
            cluster.shutdown().await;
            let addr = format!("{}:{}", http.host, http.port);
            return Err(cat.text("cli-bind-failed", &[("addr", &addr), ("detail", &e.to_string())]));
        }
    };
    let addr = server.local_addr().to_string();
    eprintln!("{}", cat.text("cli-api-listening", &[("addr", &addr)]));
    eprintln!("{}", cat.text("cli-ui-listening", &[("addr", &addr)]));
    if let Some(args) = launch {
        let request = match args.request(cat) {
            Ok(r) => r,
            Err(e) => {
                server.stop(true).await;
                cluster.shutdown().await;
                return Err(e);
            }
        };
        let name = request.model_name.clone();
        eprintln!("{}", cat.text("cli-launching", &[("name", &name)]));
        let launched = tokio::select! {
            r = service.launch(request, true) => Some(r),
            () = shutdown_signal() => None,
        };
        match launched {
            Some(Ok(uid)) => {
                eprintln!("{}", cat.text("cli-launched", &[("uid", &uid), ("addr", &addr)]));
                let body = serde_json::json!({
                    "model": uid,
                    "messages": [{"role": "user", "content": "What is the capital of France?"}],
                    // Greedy and bounded: the sample answers the same short answer every time.
                    "temperature": 0,
                    "max_tokens": 64,
                });
                eprintln!(
                    "{}\n  curl http://{addr}/v1/chat/completions -H 'Content-Type: application/json' -d '{body}'",
                    cat.text("cli-try", &[])
                );
            }
            Some(Err(e)) => {
                server.stop(true).await;
                cluster.shutdown().await;
                return Err(crate::service_error_text(cat, &e));
            }
            None => {
                eprintln!("{}", cat.text("cli-stopping", &[]));
                server.stop(true).await;
                cluster.shutdown().await;
                return Ok(());
            }
        }
    }
    let result = tokio::select! {
        r = server.stopped() => r.map_err(|e| cat.text("error-internal", &[("detail", &e.to_string())])),
        () = shutdown_signal() => Ok(()),
    };
    drain_server(&server, http, cat).await;
    eprintln!("{}", cat.text("cli-stopping", &[]));
    cluster.shutdown().await;
    result
}

/// Stops the REST server after a signal: the requests in flight may finish within the drain
/// timeout (`--drain-timeout`), new connections are refused; a second signal stops at once.
pub(crate) async fn drain_server(server: &api::ServerHandle, http: &HttpArgs, cat: &Catalog) {
    eprintln!("{}", cat.text("cli-server-draining", &[("seconds", &http.drain_timeout.to_string())]));
    tokio::select! {
        () = server.stop(true) => {}
        () = shutdown_signal() => {}
    }
}

/// `xinf local`: supervisor and worker in this process, REST in front.
pub(crate) async fn local(args: LocalArgs, cat: &Catalog) -> Result<(), String> {
    let cluster = Cluster::start_local_with(args.node.options()).await.map_err(|e| actor_text(cat, &e))?;
    let launch = args.launch.model_name.is_some().then_some(&args.launch);
    serve_cluster(cluster, &args.http, launch, cat).await
}

/// `xinf supervisor`: the cluster's supervisor and the REST API.
pub(crate) async fn supervisor(args: SupervisorArgs, cat: &Catalog) -> Result<(), String> {
    let secret = args.secret.get(cat)?;
    let cluster = Cluster::start_supervisor(&args.http.host, args.cluster_port, secret, crate::engines())
        .await
        .map_err(|e| actor_text(cat, &e))?;
    let cluster_addr = cluster.address().unwrap_or_default().to_owned();
    eprintln!("{}", cat.text("cli-supervisor-listening", &[("addr", &cluster_addr)]));
    serve_cluster(cluster, &args.http, None, cat).await
}

/// `xinf worker`: joins a supervisor and runs the replicas it places here until a signal.
pub(crate) async fn worker(args: WorkerArgs, cat: &Catalog) -> Result<(), String> {
    let secret = args.secret.get(cat)?;
    let mut options = args.node.options();
    options.worker_port = args.worker_port;
    options.worker_id = args.worker_id.clone();
    options.drain_timeout = std::time::Duration::from_secs(args.drain_timeout);
    let mut node = Cluster::start_worker_with(&args.supervisor, &args.host, secret, options)
        .await
        .map_err(|e| actor_text(cat, &e))?;
    eprintln!(
        "{}",
        cat.text("cli-worker-joined", &[("id", node.worker_id()), ("supervisor", &args.supervisor)])
    );
    let id = node.worker_id().to_owned();
    tokio::select! {
        () = shutdown_signal() => {}
        () = node.stopped() => {
            node.shutdown().await;
            return Err(cat.text("cli-worker-superseded", &[("id", &id)]));
        }
    }
    eprintln!("{}", cat.text("cli-worker-draining", &[("seconds", &args.drain_timeout.to_string())]));
    tokio::select! {
        running = node.drain() => if running > 0 {
            eprintln!("{}", cat.text("cli-worker-drain-timeout", &[("running", &running.to_string())]));
        },
        () = shutdown_signal() => {}
    }
    eprintln!("{}", cat.text("cli-stopping", &[]));
    node.shutdown().await;
    Ok(())
}
