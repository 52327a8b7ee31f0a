//! The crate's one error type for moving pages: what a page fetch, a NIXL call or a GPU copy
//! reports, on either side of a handoff.
//!
//! It travels: the page server sends it as JSON in its error answers (see the transport's wire
//! format), so the fetching side sees the serving side's failure typed, as the server had it.

use serde::{Deserialize, Serialize};

/// Why a transfer failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[non_exhaustive]
pub enum TransferError {
    /// The source holds no such room (never published, released, aborted or expired).
    #[error("room {0} is not held by the prefill replica (released, aborted or expired)")]
    UnknownRoom(u64),
    /// The source could not produce the pages.
    #[error("the prefill replica could not read the pages: {0}")]
    Source(String),
    /// The connection failed.
    #[error("page transfer from {endpoint} failed: {detail}")]
    Io {
        /// Where the pages were fetched from.
        endpoint: String,
        /// What failed.
        detail: String,
    },
    /// The transfer did not finish in time.
    #[error("page transfer from {endpoint} did not finish within {after_ms} ms")]
    Timeout {
        /// Where the pages were fetched from.
        endpoint: String,
        /// The limit.
        after_ms: u64,
    },
    /// The peers do not share the page plane's key (another cluster, or no key).
    #[error("page server authentication failed: {0}")]
    Unauthenticated(String),
    /// The peer answered something that is not this protocol.
    #[error("page transfer protocol error: {0}")]
    Protocol(String),
    /// A NIXL call failed (what failed, and NIXL's status).
    #[error("NIXL page transfer failed: {0}")]
    Nixl(String),
    /// NIXL was asked for but cannot be loaded in this process (how to install it).
    #[error("NIXL is not available: {0}")]
    NixlUnavailable(String),
}
