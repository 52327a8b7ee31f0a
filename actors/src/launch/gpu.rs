//! GPU admission: whether a replica may join the replicas already on a GPU, and the refusal
//! that names them and their memory shares when it may not.

use super::invalid;
use crate::error::{ActorError, LaunchRule};

#[cfg(test)]
mod tests;

/// A replica on a GPU, as placement sees it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct GpuTenant {
    pub(crate) model_uid: String,
    pub(crate) replica_uid: String,
    /// Its `gpu_memory_utilization`.
    pub(crate) fraction: Option<f64>,
}

/// Sums of memory shares up to this much over 1 still fit (0.1 + 0.2 + 0.7 is not exactly 1).
const SHARE_EPSILON: f64 = 1e-9;

/// Why a replica may not join the replicas already on a GPU.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Refusal {
    /// Nobody states a memory share and the worker does not allow sharing.
    Conflict,
    /// Some replicas on the GPU state a share and others do not.
    ShareMissing,
    /// The shares add up to more than the whole GPU.
    Oversubscribed(f64),
}

/// Whether a replica stating `fraction` may join `tenants` on one GPU.
///
/// A GPU is shared on memory shares: when every replica on it states
/// `gpu_memory_utilization` and the shares sum to at most 1, sharing needs no permission, as
/// each engine stays within its share. Replicas that state none share a GPU only on a worker
/// that allows it (`XINF_ALLOW_MULTI_REPLICA_PER_GPU`, Xinference's switch), without memory
/// accounting. Mixing the two would make the shares meaningless, so it is refused.
pub(super) fn admit(
    tenants: &[GpuTenant],
    fraction: Option<f64>,
    allow_sharing: bool,
) -> Result<(), Refusal> {
    if tenants.is_empty() {
        return Ok(());
    }
    let stated = tenants.iter().filter(|t| t.fraction.is_some()).count() + usize::from(fraction.is_some());
    if stated == tenants.len() + 1 {
        let sum = tenants.iter().filter_map(|t| t.fraction).sum::<f64>() + fraction.unwrap_or_default();
        return if sum > 1.0 + SHARE_EPSILON { Err(Refusal::Oversubscribed(sum)) } else { Ok(()) };
    }
    match (stated, allow_sharing) {
        (0, true) => Ok(()),
        (0, false) => Err(Refusal::Conflict),
        _ => Err(Refusal::ShareMissing),
    }
}

/// The launch error for a refused GPU, naming the replicas on it and their shares.
pub(super) fn refusal_error(
    refusal: Refusal,
    gpu: u32,
    worker_id: &str,
    model_uid: &str,
    tenants: &[GpuTenant],
    replica_uid: &str,
    fraction: Option<f64>,
) -> ActorError {
    const HOW: &str = "replicas may share a GPU when each sets engine_config.gpu_memory_utilization \
                       (its share of the GPU's memory) and the shares sum to at most 1.0";
    let show = |uid: &str, model: &str, f: Option<f64>| {
        let whose = if model == model_uid { String::new() } else { format!(" of model '{model}'") };
        let share = f.map_or_else(|| "no gpu_memory_utilization".to_owned(), |f| f.to_string());
        format!("'{uid}'{whose} ({share})")
    };
    let all: Vec<String> = tenants
        .iter()
        .map(|t| show(&t.replica_uid, &t.model_uid, t.fraction))
        .chain(std::iter::once(show(replica_uid, model_uid, fraction)))
        .collect();
    match refusal {
        Refusal::Conflict => match tenants.iter().find(|t| t.model_uid != model_uid) {
            Some(t) => invalid(
                LaunchRule::GpuConflict,
                format!(
                    "GPU conflict: GPU {gpu} on worker {worker_id} is already occupied by model '{}', and \
                     this worker disallows sharing a GPU; {HOW}",
                    t.model_uid
                ),
            ),
            None => invalid(
                LaunchRule::GpuConflict,
                format!(
                    "GPU conflict: GPU {gpu} on worker {worker_id} is requested by more than one replica, \
                     and this worker disallows sharing a GPU; {HOW}"
                ),
            ),
        },
        Refusal::ShareMissing => invalid(
            LaunchRule::GpuMemoryUtilizationRequired,
            format!(
                "GPU {gpu} on worker {worker_id} would be shared by replicas {}: every replica sharing a \
                 GPU must set engine_config.gpu_memory_utilization (its share of the GPU's memory)",
                all.join(", ")
            ),
        ),
        Refusal::Oversubscribed(sum) => invalid(
            LaunchRule::GpuMemoryOversubscribed,
            format!(
                "GPU memory oversubscribed: engine_config.gpu_memory_utilization of the replicas on GPU \
                 {gpu} of worker {worker_id} sums to {}, more than 1.0: {}",
                (sum * 1000.0).round() / 1000.0,
                all.join(", ")
            ),
        ),
    }
}
