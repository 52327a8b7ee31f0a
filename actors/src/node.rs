//! Cluster plumbing: names and process groups, listen addresses, `NodeServer` start-up with the
//! shared secret as ractor_cluster's cookie, and joining a supervisor.
//!
//! Discovery goes through process groups (`ractor::pg`), the only registry ractor_cluster
//! shares between nodes. Group and actor names carry a namespace: derived from the secret in
//! cluster mode (so nodes that share a secret share names, and two clusters in one process do
//! not see each other), unique per instance in local mode.

use crate::error::ActorError;
use ractor::{Actor, ActorCell, ActorId, ActorRef};
use ractor_cluster::{NodeServer, NodeServerMessage};
use sha2::{Digest, Sha256};
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

mod guard;
#[cfg(test)]
mod tests;

/// The prefix of every group and actor name of one cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Namespace(Arc<str>);

impl Namespace {
    /// A namespace of its own, for an in-process (local mode) cluster.
    pub(crate) fn local() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        Self(format!("xinf-local-{}-{n}", std::process::id()).into())
    }

    /// The namespace of the nodes that share `secret`. Only a digest of the secret appears in
    /// names, which travel to authenticated peers only.
    pub(crate) fn from_secret(secret: &str) -> Self {
        let digest = Sha256::digest(format!("xinf-cluster-namespace\0{secret}").as_bytes());
        let hex = xinf_transfer::hex::encode(&digest[..6]);
        Self(format!("xinf-{hex}").into())
    }

    /// The group the supervisor joins.
    pub(crate) fn supervisor_group(&self) -> String {
        format!("{}.supervisor", self.0)
    }

    /// The group every worker joins; the supervisor watches it for departures.
    pub(crate) fn workers_group(&self) -> String {
        format!("{}.workers", self.0)
    }

    /// The group of one worker.
    pub(crate) fn worker_group(&self, worker_id: &str) -> String {
        format!("{}.worker.{worker_id}", self.0)
    }

    /// The group of one process of a worker: the one that is told when another process took
    /// over its id.
    pub(crate) fn worker_instance_group(&self, worker_id: &str, instance: u64) -> String {
        format!("{}.worker.{worker_id}.{instance:016x}", self.0)
    }

    /// The group of one replica.
    pub(crate) fn replica_group(&self, replica_uid: &str) -> String {
        format!("{}.replica.{replica_uid}", self.0)
    }

    /// The group of one model's block tracker.
    pub(crate) fn tracker_group(&self, model_uid: &str) -> String {
        format!("{}.tracker.{model_uid}", self.0)
    }

    fn name(&self, kind: &str, id: &str) -> String {
        format!("{}/{kind}/{id}", self.0)
    }

    pub(crate) fn supervisor_name(&self) -> String {
        format!("{}/supervisor", self.0)
    }

    pub(crate) fn worker_name(&self, worker_id: &str) -> String {
        self.name("worker", worker_id)
    }

    pub(crate) fn replica_name(&self, replica_uid: &str) -> String {
        self.name("replica", replica_uid)
    }

    pub(crate) fn router_name(&self, model_uid: &str) -> String {
        self.name("router", model_uid)
    }

    pub(crate) fn tracker_name(&self, model_uid: &str) -> String {
        self.name("tracker", model_uid)
    }

    /// Whether an actor name belongs to this cluster.
    pub(crate) fn owns(&self, actor_name: &str) -> bool {
        actor_name.strip_prefix(&*self.0).is_some_and(|rest| rest.starts_with('/'))
    }
}

/// The address to listen on. A wildcard address is refused: the address is also what peers
/// are told to connect back to, and `0.0.0.0` reaches nobody.
pub(crate) fn listen_ip(host: &str) -> Result<IpAddr, ActorError> {
    let bare = host.trim().trim_start_matches('[').trim_end_matches(']');
    if bare.is_empty() {
        return Err(ActorError::InvalidConfig { field: "host".into(), reason: "must not be empty".into() });
    }
    let ip = match bare.parse::<IpAddr>() {
        Ok(ip) => ip,
        Err(_) => {
            (bare, 0).to_socket_addrs().ok().and_then(|mut addrs| addrs.next()).map(|a| a.ip()).ok_or_else(
                || ActorError::InvalidConfig {
                    field: "host".into(),
                    reason: format!("`{bare}` is neither an IP address nor a resolvable host name"),
                },
            )?
        }
    };
    if ip.is_unspecified() {
        return Err(ActorError::InvalidConfig {
            field: "host".into(),
            reason: format!(
                "`{ip}` listens on every interface but is no address other nodes can reach; give this \
                 node's own address (default 127.0.0.1)"
            ),
        });
    }
    Ok(ip)
}

/// The shortest cluster secret a node accepts.
pub(crate) const MIN_SECRET_CHARS: usize = 8;

/// Refuses a secret shorter than [`MIN_SECRET_CHARS`]: an empty one would let any node in, a
/// short one is guessed.
pub(crate) fn check_secret(secret: &str) -> Result<(), ActorError> {
    let len = secret.chars().count();
    if len < MIN_SECRET_CHARS {
        return Err(ActorError::InvalidConfig {
            field: "secret".into(),
            reason: format!(
                "has {len} characters, fewer than {MIN_SECRET_CHARS}: it is what keeps other nodes out \
                 (and what the data plane's keys derive from)"
            ),
        });
    }
    Ok(())
}

/// A free TCP port on `ip`, for a node whose port nobody needs to know in advance (a worker
/// connects out; the supervisor learns its address from the connection).
/// The longest worker id (it names the worker's node and process group).
const MAX_WORKER_ID: usize = 128;

/// A worker id as given (`--worker-id`): letters, digits and `.-_:[]` (so that `host:port` and
/// IPv6 addresses pass), at most 128 characters.
pub(crate) fn check_worker_id(id: &str) -> Result<&str, ActorError> {
    let refuse = |reason: String| ActorError::InvalidConfig { field: "worker_id".into(), reason };
    if id.is_empty() || id.len() > MAX_WORKER_ID {
        return Err(refuse(format!("must have 1 to {MAX_WORKER_ID} characters (has {})", id.len())));
    }
    match id.chars().find(|c| !(c.is_ascii_alphanumeric() || ".-_:[]".contains(*c))) {
        Some(c) => Err(refuse(format!("{c:?} is not allowed (letters, digits and . - _ : [ ] are)"))),
        None => Ok(id),
    }
}

pub(crate) fn free_port(ip: IpAddr) -> Result<u16, ActorError> {
    std::net::TcpListener::bind(SocketAddr::new(ip, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| ActorError::Node(format!("finding a free port on {ip}: {e}")))
}

/// Starts a `NodeServer` listening on `ip:port` only, with the secret as its cookie. Nodes
/// connect to the supervisor only (no transitive mesh): the control plane is a star. An
/// incoming connection that has not authenticated within [`guard::HANDSHAKE_TIMEOUT`] is
/// closed.
pub(crate) async fn start_node(
    name: &str,
    ip: IpAddr,
    port: u16,
    secret: &str,
) -> Result<ActorRef<NodeServerMessage>, ActorError> {
    start_guarded_node(name, ip, port, secret, guard::HANDSHAKE_TIMEOUT).await
}

/// [`start_node`], with the time a peer has to authenticate.
async fn start_guarded_node(
    name: &str,
    ip: IpAddr,
    port: u16,
    secret: &str,
    handshake: Duration,
) -> Result<ActorRef<NodeServerMessage>, ActorError> {
    let server = NodeServer::new(
        port,
        secret.to_owned(),
        name.to_owned(),
        ip.to_string(),
        None,
        Some(ractor_cluster::node::NodeConnectionMode::Isolated),
    )
    .with_listen_addr(ip);
    let (node, _) = Actor::spawn(None, server, ())
        .await
        .map_err(|e| ActorError::Node(format!("listening on {}: {e}", SocketAddr::new(ip, port))))?;
    let guard = Box::new(guard::HandshakeGuard::new(handshake));
    node.cast(NodeServerMessage::SubscribeToEvents {
        id: "xinf-handshake-guard".into(),
        subscription: guard,
    })
    .map_err(|e| ActorError::Node(format!("the node server is gone: {e}")))?;
    Ok(node)
}

/// What the joining node learns about the sessions it opens (client sessions; sessions other
/// nodes open to this one are not its business).
enum SessionEvent {
    Opened(ActorRef<ractor_cluster::NodeSessionMessage>),
    Authenticated(ActorId),
    /// A session closed; whether it had learned the peer's name (the supervisor's challenge
    /// carries it) tells a refused secret from a peer that never took part in the handshake.
    Closed {
        id: ActorId,
        knew_peer: bool,
    },
}

/// Forwards the node server's events about client sessions to the joining task.
struct SessionWatch(tokio::sync::mpsc::UnboundedSender<SessionEvent>);

impl ractor_cluster::NodeEventSubscription for SessionWatch {
    fn node_session_opened(&self, ses: ractor_cluster::node::NodeServerSessionInformation) {
        if !ses.is_server {
            let _ = self.0.send(SessionEvent::Opened(ses.actor));
        }
    }

    fn node_session_disconnected(&self, ses: ractor_cluster::node::NodeServerSessionInformation) {
        if !ses.is_server {
            let _ = self
                .0
                .send(SessionEvent::Closed { id: ses.actor.get_id(), knew_peer: ses.peer_name.is_some() });
        }
    }

    fn node_session_authenticated(&self, ses: ractor_cluster::node::NodeServerSessionInformation) {
        if !ses.is_server {
            let _ = self.0.send(SessionEvent::Authenticated(ses.actor.get_id()));
        }
    }
}

/// Connects `node` to the node at `addr` and waits until the two have authenticated each
/// other. The connection is retried for up to `timeout` (the supervisor may still be
/// starting); the handshake then has `timeout` of its own, so a supervisor that comes up late
/// in the first wait is not given up on halfway through its handshake.
///
/// A session this call gives up on is closed. Left open, it could still authenticate after the
/// caller moved on to a new connection, and the supervisor would then hold two sessions of one
/// node: it refuses the newer one's handshakes (over and over, while the worker retries) or
/// drops one of the two, perhaps the one in use.
pub(crate) async fn connect(
    node: &ActorRef<NodeServerMessage>,
    addr: &str,
    timeout: Duration,
) -> Result<(), ActorError> {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let id = format!("xinf-join-{:016x}", rand::random::<u64>());
    node.cast(NodeServerMessage::SubscribeToEvents {
        id: id.clone(),
        subscription: Box::new(SessionWatch(tx)),
    })
    .map_err(|e| ActorError::Node(format!("the node server is gone: {e}")))?;
    let mut opened = Vec::new();
    let result = connect_and_authenticate(node, addr, timeout, &mut rx, &mut opened).await;
    if node.cast(NodeServerMessage::UnsubscribeToEvents(id)).is_err() {
        tracing::debug!("the node server is gone");
    }
    if result.is_err() {
        for session in opened {
            session.stop(Some("the join gave up on this session".into()));
        }
    }
    result
}

async fn connect_and_authenticate(
    node: &ActorRef<NodeServerMessage>,
    addr: &str,
    timeout: Duration,
    events: &mut tokio::sync::mpsc::UnboundedReceiver<SessionEvent>,
    opened: &mut Vec<ActorRef<ractor_cluster::NodeSessionMessage>>,
) -> Result<(), ActorError> {
    let join_error = |reason: String| ActorError::Join { addr: addr.to_owned(), reason };
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        match ractor_cluster::client_connect(node, addr).await {
            Ok(()) => break,
            Err(e) if tokio::time::Instant::now() >= deadline => {
                let cause = match e {
                    ractor_cluster::ClientConnectErr::Socket(e) => e.to_string(),
                    e => e.to_string(),
                };
                return Err(join_error(format!(
                    "nothing accepted a connection there within {} ms ({cause}); check that the \
                     supervisor runs and that this is its cluster port (`--cluster-port`)",
                    timeout.as_millis()
                )));
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        match tokio::time::timeout_at(deadline, events.recv()).await {
            Ok(Some(SessionEvent::Opened(session))) => opened.push(session),
            Ok(Some(SessionEvent::Authenticated(id))) if opened.iter().any(|s| s.get_id() == id) => {
                return Ok(());
            }
            Ok(Some(SessionEvent::Closed { id, knew_peer })) if opened.iter().any(|s| s.get_id() == id) => {
                return Err(join_error(if knew_peer {
                    "the supervisor refused this node's answer to its challenge: the cluster secrets differ"
                        .into()
                } else {
                    "the peer closed the connection before the handshake's challenge: this is not a \
                     supervisor's cluster port (`--cluster-port`)"
                        .into()
                }));
            }
            Ok(Some(_)) => {}
            Ok(None) => return Err(ActorError::Node("the node server is gone".into())),
            Err(_) => {
                return Err(join_error(format!(
                    "the handshake did not finish within {} ms: this is not a supervisor's cluster port \
                     (`--cluster-port`), or the supervisor still holds this node's previous connection",
                    timeout.as_millis()
                )));
            }
        }
    }
}

/// Whether `node` holds an authenticated session it opened itself: on a worker's node, the one
/// with the supervisor's.
pub(crate) async fn has_outbound_session(node: &ActorRef<NodeServerMessage>) -> bool {
    match node.call(NodeServerMessage::GetSessions, Some(Duration::from_secs(1))).await {
        Ok(ractor::rpc::CallResult::Success(sessions)) => sessions.values().any(|s| !s.is_server),
        _ => false,
    }
}

/// Waits until a process group has a member (a remote member appears once its node's group
/// list arrives), at most `timeout`.
pub(crate) async fn wait_for_member(group: &str, timeout: Duration) -> Option<ActorCell> {
    let deadline = tokio::time::Instant::now() + timeout;
    let group = group.to_owned();
    loop {
        if let Some(cell) = ractor::pg::get_members(&group).into_iter().next() {
            return Some(cell);
        }
        if tokio::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
