//! One load of a room's pages into engine memory: its arguments, moved into the task that runs
//! it, and the counters every load adds to.

use crate::layout::Layout;
use std::ops::Range;
use std::sync::atomic::AtomicU64;
use std::time::Duration;
use xinf_transfer::device::KvDevice;
use xinf_transfer::transport::Endpoint;

/// A load's arguments, moved into its task.
pub(crate) struct Load {
    pub(crate) endpoint: Endpoint,
    pub(crate) room: u64,
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) source: Option<KvDevice>,
    pub(crate) layout: Layout,
    pub(crate) regions: Vec<u64>,
    pub(crate) block_table: Vec<u32>,
    pub(crate) tokens: Range<usize>,
    pub(crate) timeout: Duration,
}

/// What the loads of one loader did.
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) started: AtomicU64,
    pub(crate) loaded: AtomicU64,
    pub(crate) failed: AtomicU64,
    pub(crate) device_bytes_in: AtomicU64,
    pub(crate) host_bytes_in: AtomicU64,
}
