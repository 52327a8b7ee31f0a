//! Host memory admission: the replicas computing on a worker's CPU hold their weights and KV
//! cache in its memory, and together they must fit. Each replica's need comes from its engine
//! ([`EngineLoader::host_memory`](xinf_engine::EngineLoader::host_memory)) before its weights
//! load, and is reserved in its slot under the slots' lock, so replicas loading at once cannot
//! each see the same free memory: a launch of more replicas than fit is refused (and rolled
//! back) instead of swapping the node to death or getting it killed.

use crate::error::{ActorError, LaunchRule};
use crate::spec::ReplicaSpec;

/// The memory for replicas: `XINF_WORKER_MEMORY` when set, else the system's available memory
/// now (`MemAvailable` of /proc/meminfo) less what [`for_replicas`] keeps back; `None` where
/// neither says.
pub(crate) fn worker_memory(setting: Option<&str>) -> Result<Option<u64>, ActorError> {
    match setting.map(str::trim).filter(|s| !s.is_empty()) {
        Some(text) => parse_size(text).map(Some).ok_or_else(|| ActorError::InvalidConfig {
            field: "XINF_WORKER_MEMORY".into(),
            reason: format!("`{text}` is not a size (bytes, or a number with K, M, G, KiB, MiB or GiB)"),
        }),
        None => Ok(available_memory().map(for_replicas)),
    }
}

/// Of `available` bytes, what replicas may take: a tenth, at least 512 MiB (at most half), is
/// kept for what an engine's own account leaves out (the process, its threads' stacks, buffers
/// while weights load, the page cache). A launch of forty replicas of a small model on a 24 GB
/// node was admitted to the last byte its engines counted and then killed by the kernel.
fn for_replicas(available: u64) -> u64 {
    let keep = (available / 10).max(512 << 20).min(available / 2);
    available - keep
}

/// `12345`, `512M`, `8GiB`, `1.5G`: binary multiples, as memory is counted.
fn parse_size(text: &str) -> Option<u64> {
    let split = text.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: f64 = number.parse().ok().filter(|n: &f64| n.is_finite() && *n >= 0.0)?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return None,
    };
    let bytes = number * (1u64 << shift) as f64;
    (bytes < u64::MAX as f64).then_some(bytes as u64)
}

/// `MemAvailable` of /proc/meminfo, in bytes.
fn available_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib.saturating_mul(1024))
}

/// What replica `spec` needs of the host's memory, by its engine's account (a CPU replica's
/// weights and KV cache); 0 for a replica on a GPU or an engine that cannot tell. Blocking.
pub(crate) fn need(engines: &xinf_engine::Engines, spec: &ReplicaSpec) -> Result<u64, ActorError> {
    if !spec.gpus.is_empty() {
        return Ok(0);
    }
    let Some(loader) = engines.get(&spec.engine) else { return Ok(0) };
    let need = loader.host_memory(&spec.source, &spec.engine_config).map_err(ActorError::Engine)?;
    Ok(need.unwrap_or(0))
}

/// Whether a replica needing `need` bytes fits beside replicas holding `held` in `memory`.
pub(crate) fn admit(
    memory: Option<u64>,
    held: u64,
    need: u64,
    replica_uid: &str,
    worker_id: &str,
) -> Result<(), ActorError> {
    let Some(memory) = memory else { return Ok(()) };
    if need == 0 || held.saturating_add(need) <= memory {
        return Ok(());
    }
    if need > memory {
        // Too big on its own: its KV cache is what a launch sizes.
        return Err(ActorError::launch(
            LaunchRule::NotEnoughMemory,
            format!(
                "replica '{replica_uid}' needs {} of host memory for its weights and KV cache on the CPU, more \
                 than worker {worker_id} has for replicas ({}); lower engine_config.kv_cache_tokens or place \
                 it on a GPU",
                size(need),
                size(memory)
            ),
        )
        .at("engine_config.kv_cache_tokens"));
    }
    Err(ActorError::launch(
        LaunchRule::NotEnoughMemory,
        format!(
            "replica '{replica_uid}' needs {} of host memory for its weights and KV cache on the CPU, and \
             worker {worker_id} has {} for replicas, {} of it held by the replicas it runs; launch fewer \
             replicas, a smaller kv_cache_tokens, or place them on a GPU",
            size(need),
            size(memory),
            size(held)
        ),
    ))
}

/// A size in the largest binary unit it has at least one of.
fn size(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 30 => format!("{:.2} GiB", b as f64 / f64::from(1u32 << 30)),
        b if b >= 1 << 20 => format!("{:.1} MiB", b as f64 / f64::from(1u32 << 20)),
        b => format!("{} KiB", b.div_ceil(1024)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_binary_multiples() {
        assert_eq!(parse_size("1024"), Some(1024));
        assert_eq!(parse_size("512M"), Some(512 << 20));
        assert_eq!(parse_size("8GiB"), Some(8 << 30));
        assert_eq!(parse_size("1.5g"), Some(3 << 29));
        assert_eq!(parse_size("2 KiB"), Some(2048));
        for bad in ["", "lots", "-1G", "1Q", "1e400"] {
            assert_eq!(parse_size(bad), None, "{bad}");
        }
        assert!(matches!(worker_memory(Some("many")), Err(ActorError::InvalidConfig { .. })));
        assert_eq!(worker_memory(Some("3G")), Ok(Some(3 << 30)));
    }

    #[test]
    fn a_tenth_of_the_available_memory_stays_out_of_the_replicas_reach() {
        let mib = 1u64 << 20;
        assert_eq!(for_replicas(10_240 * mib), 9_216 * mib);
        assert_eq!(for_replicas(2_048 * mib), 1_536 * mib, "at least 512 MiB kept");
        assert_eq!(for_replicas(512 * mib), 256 * mib, "at most half");
        assert_eq!(for_replicas(0), 0);
    }

    #[test]
    fn replicas_are_admitted_while_they_fit() {
        let gib = 1u64 << 30;
        assert_eq!(admit(Some(4 * gib), 2 * gib, 2 * gib, "r", "w"), Ok(()));
        let e = admit(Some(4 * gib), 3 * gib, 2 * gib, "r-3", "w:1").expect_err("no room");
        assert_eq!(e.launch_rule(), Some(LaunchRule::NotEnoughMemory));
        let text = e.to_string();
        assert!(text.contains("'r-3' needs 2.00 GiB") && text.contains("worker w:1 has 4.00 GiB"), "{text}");
        // Too big alone: the cache size is at fault.
        let e = admit(Some(4 * gib), 0, 5 * gib, "r", "w").expect_err("too big");
        assert_eq!(e.launch_field(), Some("engine_config.kv_cache_tokens"), "{e}");
        // Unknown memory or need: nothing is checked.
        assert_eq!(admit(None, 9 * gib, 9 * gib, "r", "w"), Ok(()));
        assert_eq!(admit(Some(gib), 9 * gib, 0, "r", "w"), Ok(()));
    }
}
