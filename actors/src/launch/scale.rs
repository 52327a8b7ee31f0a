//! Scale-up: more replicas of a running model (`POST /v1/models/{uid}/replicas`).
//!
//! A new replica copies the model's first replica of its role (engine, engine options, GPU
//! count and share) and may only be placed elsewhere (`worker_ip`, `gpu_idx`): its engine
//! settings cannot differ, since a P/D deployment's replicas of one role must serve alike and
//! their contract was checked against the other role's at launch. The spec made here goes
//! through placement like a launch's.

use super::invalid;
use super::request::{GpuCount, Role};
use super::spec::{LaunchSpec, ReplicaDraft, WorkerNamed};
use crate::error::{ActorError, LaunchRule};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

#[cfg(test)]
mod tests;

/// Most replicas one scale-up adds.
pub const MAX_SCALE: u32 = 64;

/// A scale-up request: how many replicas of which role, and optionally where.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScaleRequest {
    /// The role of the new replicas; required for a P/D model, `hybrid` otherwise.
    #[serde(default)]
    pub role: Option<Role>,
    /// How many (default 1, at most [`MAX_SCALE`]).
    #[serde(default)]
    pub count: Option<u32>,
    /// The worker to place them on (default: as placement chooses for the copied replica).
    #[serde(default)]
    pub worker_ip: Option<String>,
    /// The GPUs to place them on (default: the copied replica's request).
    #[serde(default)]
    pub gpu_idx: Option<Vec<u32>>,
}

/// Keys a scale-up refuses by name, with why (the rest of the unknown keys are refused by the
/// request's schema).
pub fn refused_key(key: &str) -> Option<&'static str> {
    match key {
        "model_engine" | "engine_config" | "replica_config" | "n_gpu" | "replica_uid" => Some(
            "new replicas copy the model's first replica of their role (engine, engine options, GPU count); \
             per-replica engine settings are not accepted when scaling",
        ),
        _ => None,
    }
}

/// The spec of `request`'s new replicas of model `uid`, copied from `spec` (the model's launch);
/// `taken` holds the replica uids in use in the cluster.
pub(crate) fn scale_spec(
    spec: &LaunchSpec,
    uid: &str,
    request: &ScaleRequest,
    taken: &BTreeMap<String, String>,
) -> Result<LaunchSpec, ActorError> {
    let count = request.count.unwrap_or(1);
    if !(1..=MAX_SCALE).contains(&count) {
        return Err(invalid(
            LaunchRule::InvalidField,
            format!("count must be between 1 and {MAX_SCALE}, got {count}"),
        )
        .at("count"));
    }
    let role = match (request.role, spec.pd) {
        (Some(role), _) => role,
        (None, false) => Role::Hybrid,
        (None, true) => {
            return Err(invalid(
                LaunchRule::InvalidField,
                format!("model '{uid}' separates prefill and decode: role must be 'prefill' or 'decode'"),
            )
            .at("role"));
        }
    };
    let template = spec.replicas.iter().find(|r| r.role == role).ok_or_else(|| {
        let roles: Vec<&str> = spec.replicas.iter().map(|r| r.role.as_str()).collect();
        invalid(
            LaunchRule::PdTopology,
            format!(
                "model '{uid}' has no {} replica to copy (its replicas are {}); a P/D model keeps prefill and \
                 decode replicas only, a hybrid one hybrid replicas only",
                role.as_str(),
                roles.join(", ")
            ),
        )
        .at("role")
    })?;
    if let Some(idx) = &request.gpu_idx {
        let mut seen = idx.clone();
        seen.sort_unstable();
        seen.dedup();
        if seen.len() != idx.len() || idx.is_empty() {
            return Err(invalid(LaunchRule::DuplicateGpuIdx, "gpu_idx must list distinct GPU indexes"));
        }
    }
    // After the highest number the model's replicas have: a replica that left (lost, replaced,
    // removed) gave up its number, and a new one under it would blur logs and counters.
    let prefix = format!("{uid}-");
    let ours = taken.iter().filter(|(_, model)| model.as_str() == uid);
    let numbers = ours.filter_map(|(r, _)| r.strip_prefix(&prefix)?.parse::<usize>().ok());
    let mut next = numbers.max().map_or(0, |n| n + 1);
    let mut fresh_uid = || loop {
        let candidate = format!("{uid}-{next}");
        next += 1;
        if !taken.contains_key(&candidate) {
            return candidate;
        }
    };
    let replicas = (0..count)
        .map(|_| {
            let mut draft: ReplicaDraft = template.clone();
            draft.replica_uid = Some(fresh_uid());
            match &request.worker_ip {
                Some(ip) => {
                    draft.device.worker_ip = Some(ip.clone());
                    draft.device.named = WorkerNamed::Request;
                }
                None => draft.device.named = WorkerNamed::CopiedReplica,
            }
            if let Some(idx) = &request.gpu_idx {
                draft.device.gpu_idx = Some(idx.clone());
                draft.device.n_gpu = GpuCount::Count(idx.len() as u32);
            }
            draft
        })
        .collect();
    Ok(LaunchSpec { model_uid: Some(uid.to_owned()), replicas, ..spec.clone() })
}

/// Replica `i` of `spec` alone, which a replacement of that replica is copied from (through
/// [`scale_spec`]: the same engine, options and device request, the named worker included).
pub(crate) fn one_replica(spec: &LaunchSpec, i: usize) -> Option<LaunchSpec> {
    let draft = spec.replicas.get(i)?.clone();
    Some(LaunchSpec { replicas: vec![draft], ..spec.clone() })
}
