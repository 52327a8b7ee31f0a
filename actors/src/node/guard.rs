//! The cluster port's handshake guard. ractor_cluster keeps a connection open for as long as
//! the peer keeps it, whether or not it ever authenticates: anyone who can reach the port could
//! hold connections until the node runs out of file descriptors (and its REST port with it),
//! and have each buffer up to a frame's worth of bytes. The guard closes an incoming
//! connection that has not authenticated within a deadline, and refuses new ones at once while
//! too many handshakes are in progress, in all or from one host.

use ractor::ActorId;
use ractor_cluster::node::NodeServerSessionInformation;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How long a peer has to complete the handshake. An authenticating node takes milliseconds.
pub(crate) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshakes in progress at once, from all hosts.
const MAX_PENDING: usize = 64;
/// Handshakes in progress at once from one host, so that one host cannot keep the others out.
const MAX_PENDING_PER_HOST: usize = 16;
/// The least time between two log lines about connections closed by the guard.
const LOG_EVERY: Duration = Duration::from_secs(10);

/// Subscribed to a node server's session events (see [`super::start_node`]).
pub(crate) struct HandshakeGuard {
    pending: Arc<Mutex<Pending>>,
    timeout: Duration,
}

#[derive(Default)]
struct Pending {
    /// Incoming sessions not yet authenticated, with their peer's host.
    sessions: HashMap<ActorId, Option<IpAddr>>,
    /// Connections closed since the last log line.
    unlogged: u64,
    last_log: Option<Instant>,
}

impl Pending {
    fn pending_from(&self, host: Option<IpAddr>) -> usize {
        self.sessions.values().filter(|h| **h == host).count()
    }

    /// Counts a closed connection; the log line to write now, if one is due.
    fn closed(&mut self, why: &str, peer: &str) -> Option<String> {
        self.unlogged += 1;
        let now = Instant::now();
        if self.last_log.is_some_and(|t| now.duration_since(t) < LOG_EVERY) {
            return None;
        }
        self.last_log = Some(now);
        let n = std::mem::take(&mut self.unlogged);
        Some(format!(
            "cluster port: closed the connection from {peer} ({why}); {n} closed since the last such line"
        ))
    }
}

impl HandshakeGuard {
    pub(crate) fn new(timeout: Duration) -> Self {
        Self { pending: Arc::default(), timeout }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Stops a session (its connection closes with it) and logs why, at most every [`LOG_EVERY`].
fn close(ses: &NodeServerSessionInformation, why: &str, pending: &Mutex<Pending>) {
    ses.actor.stop(Some(why.to_owned()));
    let line = pending.lock().unwrap_or_else(PoisonError::into_inner).closed(why, &ses.peer_addr);
    if let Some(line) = line {
        tracing::warn!("{line}");
    }
}

impl ractor_cluster::NodeEventSubscription for HandshakeGuard {
    fn node_session_opened(&self, ses: NodeServerSessionInformation) {
        // Sessions this node opens (a worker joining its supervisor) have a deadline of their own.
        if !ses.is_server {
            return;
        }
        let host = ses.peer_addr.parse::<SocketAddr>().ok().map(|a| a.ip());
        let id = ses.actor.get_id();
        let refused = {
            let mut p = self.lock();
            if p.sessions.len() >= MAX_PENDING {
                Some("too many handshakes in progress")
            } else if p.pending_from(host) >= MAX_PENDING_PER_HOST {
                Some("too many handshakes in progress from its host")
            } else {
                p.sessions.insert(id, host);
                None
            }
        };
        if let Some(why) = refused {
            close(&ses, why, &self.pending);
            return;
        }
        let (pending, timeout) = (self.pending.clone(), self.timeout);
        tokio::spawn(async move {
            tokio::time::sleep(timeout).await;
            let late = pending.lock().unwrap_or_else(PoisonError::into_inner).sessions.remove(&id).is_some();
            if late {
                close(&ses, "no handshake in time", &pending);
            }
        });
    }

    fn node_session_disconnected(&self, ses: NodeServerSessionInformation) {
        self.lock().sessions.remove(&ses.actor.get_id());
    }

    fn node_session_authenticated(&self, ses: NodeServerSessionInformation) {
        self.lock().sessions.remove(&ses.actor.get_id());
    }
}
