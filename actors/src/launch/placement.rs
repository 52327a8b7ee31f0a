//! Placement: a validated launch checked against the cluster as it is (workers, visible and
//! occupied GPUs, replica uids of other models), and one [`Placement`] per replica.

use super::gpu::{GpuTenant, admit, refusal_error};
use super::invalid;
use super::request::{GpuCount, Role};
use super::spec::{DeviceRequest, LaunchSpec, ReplicaDraft, WorkerNamed};
use crate::error::{ActorError, LaunchRule};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use xinf_engine::{ComputeDevice, EngineConfig};

#[cfg(test)]
mod tests;

/// The replicas on each GPU of one worker.
type Tenants = BTreeMap<u32, Vec<GpuTenant>>;

/// A worker as placement sees it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct WorkerSlot {
    /// The worker's id (`ip:port`; `local` in local mode).
    pub(crate) worker_id: String,
    /// The address it serves on (its host: `127.0.0.1` in local mode).
    pub(crate) host: String,
    /// GPU indexes the worker can use.
    pub(crate) gpus: Vec<u32>,
    /// Whether several replicas may share one GPU on this worker without stating their
    /// memory shares (`XINF_ALLOW_MULTI_REPLICA_PER_GPU`).
    pub(crate) allow_gpu_sharing: bool,
    /// GPUs in use, with the replicas (not dead) of running or launching models on each.
    pub(crate) occupied: Tenants,
    /// Replicas (not dead) on it, on its GPUs or its CPU: the load placement spreads.
    pub(crate) replicas: usize,
    /// It is stopping: nothing new is placed on it.
    pub(crate) draining: bool,
}

/// The cluster as placement sees it.
#[derive(Debug, Clone, Default)]
pub(crate) struct ClusterView {
    /// Alive workers (draining ones too, which a launch may name but gets no replica on), in a
    /// stable order.
    pub(crate) workers: Vec<WorkerSlot>,
    /// Replica uids in use, with their model.
    pub(crate) replica_uids: BTreeMap<String, String>,
    /// Where round-robin placement starts.
    pub(crate) round_robin: usize,
}

/// Where one replica goes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Placement {
    pub(crate) replica_uid: String,
    pub(crate) role: Role,
    pub(crate) worker_id: String,
    /// GPU indexes on the worker; empty means the CPU.
    pub(crate) gpus: Vec<u32>,
    /// Its share of its GPU's memory (`engine_config.gpu_memory_utilization`).
    pub(crate) gpu_memory_utilization: Option<f64>,
    /// The engine's name, as registered.
    pub(crate) engine: String,
    /// Engine options, with `device` set from `gpus` (see [`with_device`]).
    pub(crate) engine_config: EngineConfig,
}

impl Placement {
    /// What the worker is told to start: this replica of model `model_uid`.
    pub(crate) fn replica_spec(
        &self,
        model_uid: &str,
        common: &crate::spec::ModelCommon,
    ) -> crate::spec::ReplicaSpec {
        crate::spec::ReplicaSpec {
            model_uid: model_uid.to_owned(),
            replica_uid: self.replica_uid.clone(),
            role: self.role,
            source: common.source.clone(),
            engine: self.engine.clone(),
            engine_config: self.engine_config.clone(),
            gpus: self.gpus.clone(),
            handoff: common.handoff.clone(),
            launch: common.launch.clone(),
        }
    }
}

/// The index of the worker `ip` names: its id, or a host where exactly one worker runs.
fn find_worker(view: &ClusterView, ip: &str) -> Option<usize> {
    if let Some(w) = view.workers.iter().position(|w| w.worker_id == ip) {
        return Some(w);
    }
    let mut by_host = on_host(view, ip);
    match (by_host.next(), by_host.next()) {
        (Some(w), None) => view.workers.iter().position(|x| x.worker_id == w.worker_id),
        _ => None,
    }
}

/// The workers on host `ip` (`localhost` is the loopback).
fn on_host<'a>(view: &'a ClusterView, ip: &str) -> impl Iterator<Item = &'a WorkerSlot> {
    let host = if ip == "localhost" { "127.0.0.1" } else { ip }.to_owned();
    view.workers
        .iter()
        .filter(move |w| w.host == host || w.worker_id.rsplit_once(':').is_some_and(|(h, _)| h == host))
}

/// Whether `ip` is a host where more than one worker runs (and no worker's id).
fn several_on_host(view: &ClusterView, ip: &str) -> bool {
    on_host(view, ip).nth(1).is_some()
}

/// A replica's engine options with the device it was placed on: `cuda:N` for the first of its
/// GPUs unless `engine_config.device` is given (an explicit device wins); a replica on no GPU
/// keeps the CPU. Tensor parallelism is not implemented, so a replica placed on several GPUs
/// computes on the first one only.
fn with_device(engine_config: &EngineConfig, gpus: &[u32]) -> EngineConfig {
    let mut config = engine_config.clone();
    if let Some(first) = gpus.first().filter(|_| config.device().is_none()) {
        config.set_device(ComputeDevice::Cuda(*first as usize));
    }
    config
}

/// Checks a validated launch against the cluster and places every replica. A replica that
/// names no worker goes to the worker with the fewest replicas that has room for it (ties in
/// round-robin order). Returns the placements and the next round-robin start.
pub(crate) fn place(
    spec: &LaunchSpec,
    model_uid: &str,
    view: &ClusterView,
) -> Result<(Vec<Placement>, usize), ActorError> {
    let uids = replica_uids(spec, model_uid, view)?;
    if view.workers.is_empty() {
        return Err(invalid(LaunchRule::NoWorkers, "no worker is registered in the cluster"));
    }
    // Replicas on each GPU and on each worker: those of other models, then this launch's.
    let mut tenants: BTreeMap<&str, Tenants> = BTreeMap::new();
    let mut load: BTreeMap<&str, usize> =
        view.workers.iter().map(|w| (w.worker_id.as_str(), w.replicas)).collect();
    let mut rr = view.round_robin;
    let mut out = Vec::with_capacity(uids.len());
    for (i, (draft, uid)) in spec.replicas.iter().zip(uids).enumerate() {
        let fraction = draft.engine_config.gpu_memory_utilization();
        let newcomer = GpuTenant { model_uid: model_uid.to_owned(), replica_uid: uid, fraction };
        let mut first_refusal = None;
        let mut chosen = None;
        for w in candidates(view, &draft.device, i, rr, &load)? {
            let worker = &view.workers[w];
            let on_worker = tenants.get(worker.worker_id.as_str()).unwrap_or(&worker.occupied);
            match gpus_on(draft, worker, on_worker, &newcomer) {
                Ok(gpus) => {
                    chosen = Some((w, gpus));
                    break;
                }
                Err(e) => drop(first_refusal.get_or_insert(e)),
            }
        }
        let Some((w, gpus)) = chosen else {
            return Err(first_refusal.unwrap_or_else(|| no_room(view)));
        };
        let worker = &view.workers[w];
        let wid = worker.worker_id.as_str();
        rr = w + 1;
        *load.entry(wid).or_default() += 1;
        let on_worker = tenants.entry(wid).or_insert_with(|| worker.occupied.clone());
        for g in &gpus {
            on_worker.entry(*g).or_default().push(newcomer.clone());
        }
        let engine_config = with_device(&draft.engine_config, &gpus);
        out.push(Placement {
            replica_uid: newcomer.replica_uid,
            role: draft.role,
            worker_id: wid.to_owned(),
            gpus,
            gpu_memory_utilization: fraction,
            engine: draft.engine.clone(),
            engine_config,
        });
    }
    Ok((out, rr))
}

/// The GPUs replica `newcomer` gets on `worker`, whose GPUs hold `on_worker`; or why it does
/// not fit there.
fn gpus_on(
    draft: &ReplicaDraft,
    worker: &WorkerSlot,
    on_worker: &Tenants,
    newcomer: &GpuTenant,
) -> Result<Vec<u32>, ActorError> {
    let wid = worker.worker_id.as_str();
    let (gpu_idx, n_gpu) = gpu_request(draft, worker, &newcomer.replica_uid)?;
    let gpus = choose_gpus(worker, on_worker, gpu_idx, n_gpu, newcomer)?;
    check_share_has_gpu(draft, &gpus, newcomer, wid)?;
    if draft.needs_gpu && gpus.is_empty() {
        return Err(invalid(
            LaunchRule::NotEnoughGpus,
            format!(
                "replica '{}' runs model_engine {}, which computes on a GPU, and worker {wid} has no GPU \
                 for it (visible GPUs: {:?})",
                newcomer.replica_uid, draft.engine, worker.gpus
            ),
        ));
    }
    Ok(gpus)
}

/// Why nothing can be placed: every worker drains.
fn no_room(view: &ClusterView) -> ActorError {
    let ids: Vec<&str> = view.workers.iter().map(|w| w.worker_id.as_str()).collect();
    invalid(
        LaunchRule::NoWorkers,
        format!(
            "every registered worker is stopping (draining): [{}]; launch again once one serves",
            ids.join(", ")
        ),
    )
}

/// Every replica's uid (`{model_uid}-{i}` unless given), refusing one used twice in this
/// launch or already used by another model.
fn replica_uids(spec: &LaunchSpec, model_uid: &str, view: &ClusterView) -> Result<Vec<String>, ActorError> {
    let uids: Vec<String> = spec
        .replicas
        .iter()
        .enumerate()
        .map(|(i, r)| r.replica_uid.clone().unwrap_or_else(|| format!("{model_uid}-{i}")))
        .collect();
    let mut seen = BTreeSet::new();
    for uid in &uids {
        if !seen.insert(uid.as_str()) {
            return Err(invalid(LaunchRule::DuplicateReplicaUid, format!("Duplicate replica_uid '{uid}'")));
        }
        if let Some(model) = view.replica_uids.get(uid) {
            return Err(invalid(
                LaunchRule::DuplicateReplicaUid,
                format!("Duplicate replica_uid '{uid}': model '{model}' already has a replica with this uid"),
            ));
        }
    }
    Ok(uids)
}

/// The workers replica `i` may go to, best first, as indexes into `view.workers`: the one it
/// names, else those not draining by fewest replicas (`load`), ties in round-robin order from
/// `rr`. `view.workers` is not empty.
fn candidates(
    view: &ClusterView,
    d: &DeviceRequest,
    i: usize,
    rr: usize,
    load: &BTreeMap<&str, usize>,
) -> Result<Vec<usize>, ActorError> {
    let (what, field) = match d.named {
        WorkerNamed::Request => ("worker_ip".to_owned(), "worker_ip".to_owned()),
        WorkerNamed::ReplicaConfig => {
            let field = format!("replica_config[{i}].worker_ip");
            (field.clone(), field)
        }
        // A scale-up's request may give its own `worker_ip` instead.
        WorkerNamed::CopiedReplica => ("the copied replica's worker_ip".to_owned(), "worker_ip".to_owned()),
    };
    let what = || what.clone();
    let Some(ip) = &d.worker_ip else {
        let n = view.workers.len();
        let mut order: Vec<usize> = (0..n).filter(|w| !view.workers[*w].draining).collect();
        let replicas = |w: usize| load.get(view.workers[w].worker_id.as_str()).copied().unwrap_or_default();
        order.sort_by_key(|w| (replicas(*w), (w + n - rr % n) % n));
        return Ok(order);
    };
    match find_worker(view, ip) {
        Some(w) if view.workers[w].draining => Err(invalid(
            LaunchRule::WorkerDraining,
            format!(
                "{} '{ip}' is stopping (draining) and takes no new replicas; name another worker, \
                 or launch again once it serves",
                what()
            ),
        )
        .at(field.clone())),
        Some(w) => Ok(vec![w]),
        // A bare host where several workers run names none of them.
        None if several_on_host(view, ip) => {
            let ids: Vec<&str> = on_host(view, ip).map(|w| w.worker_id.as_str()).collect();
            Err(invalid(
                LaunchRule::UnknownWorker,
                format!(
                    "{} '{ip}' matches {} workers ({}); name one by its id",
                    what(),
                    ids.len(),
                    ids.join(", ")
                ),
            )
            .at(field.clone()))
        }
        // Refused in local mode too: a replica placed somewhere else than asked is a surprise
        // (and a launch of many such replicas would all land on this one machine).
        None => {
            let ids: Vec<String> = view
                .workers
                .iter()
                .map(|w| {
                    if w.worker_id.starts_with(&w.host) {
                        w.worker_id.clone()
                    } else {
                        format!("{} ({})", w.worker_id, w.host)
                    }
                })
                .collect();
            Err(invalid(
                LaunchRule::UnknownWorker,
                format!("{} '{ip}' is not in the cluster. Registered workers: [{}]", what(), ids.join(", ")),
            )
            .at(field.clone()))
        }
    }
}

/// The GPUs a replica asks for, as `(gpu_idx, n_gpu)`. An explicit GPU device must exist on
/// the worker; with placement left to `auto`, it also says which GPU the replica occupies (an
/// explicit CPU, none).
fn gpu_request(
    draft: &ReplicaDraft,
    worker: &WorkerSlot,
    uid: &str,
) -> Result<(Option<Vec<u32>>, GpuCount), ActorError> {
    let d = &draft.device;
    Ok(match draft.engine_config.device() {
        Some(ComputeDevice::Cuda(n)) => {
            let g = u32::try_from(n).unwrap_or(u32::MAX);
            if !worker.gpus.contains(&g) {
                return Err(invalid(
                    LaunchRule::GpuNotVisible,
                    format!(
                        "engine_config.device cuda:{n} of replica '{uid}': GPU {n} is not visible on \
                         worker {}. Visible GPUs: {:?}",
                        worker.worker_id, worker.gpus
                    ),
                ));
            }
            match (&d.gpu_idx, d.n_gpu) {
                (None, GpuCount::Auto | GpuCount::Count(0)) => (Some(vec![g]), GpuCount::Auto),
                (idx, n_gpu) => (idx.clone(), n_gpu),
            }
        }
        Some(ComputeDevice::Cpu) if d.gpu_idx.is_none() && d.n_gpu == GpuCount::Auto => {
            (None, GpuCount::Count(0))
        }
        _ => (d.gpu_idx.clone(), d.n_gpu),
    })
}

/// The GPUs a replica gets on its worker: those listed, none, or `n_gpu` (or for `auto`, at
/// most one) of the free GPUs and then of those it may share.
fn choose_gpus(
    worker: &WorkerSlot,
    on_worker: &Tenants,
    gpu_idx: Option<Vec<u32>>,
    n_gpu: GpuCount,
    newcomer: &GpuTenant,
) -> Result<Vec<u32>, ActorError> {
    let wid = worker.worker_id.as_str();
    let fraction = newcomer.fraction;
    let here = |g: &u32| on_worker.get(g).map(Vec::as_slice).unwrap_or_default();
    match (gpu_idx, n_gpu) {
        (Some(idx), _) => {
            for g in &idx {
                if !worker.gpus.contains(g) {
                    return Err(invalid(
                        LaunchRule::GpuNotVisible,
                        format!(
                            "gpu_idx {g} is not visible on worker {wid}. Visible GPUs: {:?}",
                            worker.gpus
                        ),
                    ));
                }
                admit(here(g), fraction, worker.allow_gpu_sharing).map_err(|r| {
                    refusal_error(r, *g, wid, &newcomer.model_uid, here(g), &newcomer.replica_uid, fraction)
                })?;
            }
            Ok(idx)
        }
        (None, GpuCount::Count(0)) => Ok(Vec::new()),
        (None, n_gpu) => {
            let busy = |g: &u32| !here(g).is_empty();
            let free: Vec<u32> = worker.gpus.iter().copied().filter(|g| !busy(g)).collect();
            // Free GPUs first, then those the replica may share.
            let candidates: Vec<u32> =
                free.iter()
                    .copied()
                    .chain(
                        worker.gpus.iter().copied().filter(|g| {
                            busy(g) && admit(here(g), fraction, worker.allow_gpu_sharing).is_ok()
                        }),
                    )
                    .collect();
            match n_gpu {
                GpuCount::Count(n) => match candidates.get(..n as usize) {
                    Some(chosen) => Ok(chosen.to_vec()),
                    None => Err(invalid(
                        LaunchRule::NotEnoughGpus,
                        format!("worker {wid} has {} free GPUs, and n_gpu asks for {n}", free.len()),
                    )),
                },
                GpuCount::Auto => Ok(candidates.first().map(|g| vec![*g]).unwrap_or_default()),
            }
        }
    }
}

/// A memory share is a share of a GPU: a replica that states one must run on a GPU.
fn check_share_has_gpu(
    draft: &ReplicaDraft,
    gpus: &[u32],
    newcomer: &GpuTenant,
    wid: &str,
) -> Result<(), ActorError> {
    let on_gpu = !gpus.is_empty() || matches!(draft.engine_config.device(), Some(ComputeDevice::Cuda(_)));
    if newcomer.fraction.is_some() && !on_gpu {
        return Err(invalid(
            LaunchRule::EngineConfig,
            format!(
                "engine_config.gpu_memory_utilization is a share of a GPU's memory, and replica '{}' \
                 runs on the CPU of worker {wid} (it has no free or shareable GPU, or the launch asks \
                 for none)",
                newcomer.replica_uid
            ),
        ));
    }
    Ok(())
}
