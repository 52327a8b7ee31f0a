//! Whether a request's client is still connected.
//!
//! actix-web notices a closed connection only when it reads from it, which it does not while a
//! handler runs: a non-streamed generation whose client went away would run on to `max_tokens`
//! (a streamed one ends at its next write). So the server keeps a duplicate of each plain TCP
//! connection's socket ([`on_connect`]), and a non-streamed generation races its collection
//! against [`Peer::gone`], which peeks at the socket every [`POLL`]: an end of stream there
//! means the client closed its side. Dropping the generation then aborts the request, as a
//! streamed disconnect does.

use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

use actix_web::dev::Extensions;

/// How often a waiting non-streamed request looks at its connection.
const POLL: Duration = Duration::from_millis(50);

/// A duplicate of a connection's socket, only ever peeked at.
#[derive(Debug, Clone)]
pub(crate) struct Peer(Arc<std::net::TcpStream>);

/// `HttpServer::on_connect`: remembers the socket of a plain TCP connection (none for others,
/// which then never count as gone).
pub(crate) fn on_connect(conn: &dyn Any, ext: &mut Extensions) {
    #[cfg(unix)]
    if let Some(tcp) = conn.downcast_ref::<actix_web::rt::net::TcpStream>() {
        use std::os::fd::AsFd;
        match tcp.as_fd().try_clone_to_owned() {
            // The duplicate shares the connection's (non-blocking) open file.
            Ok(fd) => {
                ext.insert(Peer(Arc::new(std::net::TcpStream::from(fd))));
            }
            Err(e) => tracing::debug!(target: "xinf::api", error = %e, "cannot watch a connection"),
        }
    }
    #[cfg(not(unix))]
    let _ = (conn, ext);
}

impl Peer {
    /// Resolves once the client has closed the connection (never while it is open). Bytes the
    /// client sent ahead (a pipelined request) keep it counted as connected.
    pub(crate) async fn gone(&self) {
        let mut tick = tokio::time::interval(POLL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let mut byte = [0u8; 1];
            match self.0.peek(&mut byte) {
                Ok(0) => return,
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                // Reset, or otherwise unusable: nobody will read the answer.
                Err(_) => return,
            }
        }
    }
}
