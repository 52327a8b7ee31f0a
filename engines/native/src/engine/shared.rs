//! What the handle and the compute thread share: the commands the handle sends, and the
//! counters both read.

use super::seq::Seq;
use std::collections::HashSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use tokio::sync::oneshot;
use xinf_engine::EngineError;
use xinf_transfer::device::{DeviceLease, DeviceRoute};

/// What the handle asks of the compute thread; answers come back on the `reply` channels.
pub(super) enum Command {
    Submit(Box<Seq>),
    Abort(String),
    Release(String),
    Export {
        id: String,
        first: usize,
        count: usize,
        reply: oneshot::Sender<Result<Vec<u8>, EngineError>>,
    },
    ExportDevice {
        id: String,
        first: usize,
        count: usize,
        route: DeviceRoute,
        reply: oneshot::Sender<Result<DeviceLease, EngineError>>,
    },
    Logits {
        ids: Vec<u32>,
        reply: oneshot::Sender<Result<Vec<f32>, EngineError>>,
    },
}

/// Counters shared by the handle and the compute thread.
#[derive(Default)]
pub(super) struct Shared {
    pub(super) running: AtomicUsize,
    pub(super) queued: AtomicUsize,
    pub(super) used_blocks: AtomicUsize,
    pub(super) pinned_blocks: AtomicUsize,
    pub(super) prompt_tokens: AtomicU64,
    /// Prompt tokens taken from the prefix cache instead of computed, since start.
    pub(super) cached_prompt_tokens: AtomicU64,
    pub(super) generated_tokens: AtomicU64,
    /// Ids of requests submitted and not finished (duplicate detection, abort answers).
    pub(super) active: Mutex<HashSet<String>>,
    /// Ids of pinned prompts.
    pub(super) pinned: Mutex<HashSet<String>>,
}

/// One request left the queue; saturating, so a miscount can never wrap to "overloaded".
pub(super) fn dequeued(queued: &AtomicUsize) {
    let _ = queued.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |q| Some(q.saturating_sub(1)));
}
