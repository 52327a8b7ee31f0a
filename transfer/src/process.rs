//! What names this process and this host to peers.
//!
//! A handoff picks its path by comparing the two sides: the same [`process_nonce`] means one
//! process (pages move by a direct call or a device-to-device copy), the same [`host_id`] means
//! one host (CUDA IPC works only there). Both are fixed for the life of the process and cost
//! nothing after the first call.

use std::sync::OnceLock;

/// A random number fixed for the life of this process. It also names this process's NIXL
/// agents, which must be unique among the agents that talk to each other.
pub fn process_nonce() -> u64 {
    static NONCE: OnceLock<u64> = OnceLock::new();
    *NONCE.get_or_init(|| {
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        // Distinct across processes started in the same nanosecond too.
        (t.as_nanos() as u64) ^ (u64::from(std::process::id()) << 32) ^ 0x9e37_79b9_7f4a_7c15
    })
}

/// This host's identity for routing: the kernel's boot id (the same for every process, and
/// every container, on one running kernel), else the host name.
pub fn host_id() -> &'static str {
    static ID: OnceLock<String> = OnceLock::new();
    ID.get_or_init(|| {
        let read = |p: &str| std::fs::read_to_string(p).ok().map(|s| s.trim().to_owned());
        read("/proc/sys/kernel/random/boot_id")
            .filter(|s| !s.is_empty())
            .or_else(|| read("/etc/hostname").filter(|s| !s.is_empty()))
            .unwrap_or_else(|| "unknown-host".to_owned())
    })
}
