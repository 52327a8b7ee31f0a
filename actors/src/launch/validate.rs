//! The checks of a launch request on its own (no cluster state), one function per section of
//! rules, run in a fixed order so that a request breaking several rules is always refused for
//! the same one.

use super::invalid;
use super::keywords::{LaunchKeywords, TransferBackend};
use super::request::{
    DeviceConfig, GpuCount, LaunchRequest, RESERVED_ENGINE_CONFIG_KEYS, ReplicaConfig, Role,
};
use super::spec::{DeviceRequest, LaunchSpec, ReplicaDraft, WorkerNamed};
use crate::error::{ActorError, LaunchRule};
use crate::spec::ModelFront;
use serde_json::{Map, Value};
use std::collections::BTreeSet;
use xinf_engine::{EngineConfig, EngineError, EngineLoader, Engines, ModelSource};

#[cfg(test)]
mod tests;

/// A `replica_config` entry with the placement it asks for.
type Entry<'a> = (&'a ReplicaConfig, DeviceRequest);

impl LaunchRequest {
    /// Checks what can be checked without a cluster: structure, global conflicts, topology
    /// and engine options, with the messages the supervisor would give. Placement (workers,
    /// GPUs, uids of other models) is checked by the supervisor. Clients call this to refuse
    /// a bad request before sending it.
    pub fn check(&self, engines: &Engines) -> Result<(), ActorError> {
        validate(self, true, engines).map(|_| ())
    }
}

/// Checks a launch request on its own (no cluster state) and normalises it.
///
/// `local_mode` relaxes one rule: a `replica_config` entry may leave out `devices`.
pub(crate) fn validate(
    req: &LaunchRequest,
    local_mode: bool,
    engines: &Engines,
) -> Result<LaunchSpec, ActorError> {
    check_names(req)?;
    let model_type_ok = req.model_type.as_deref().is_none_or(|t| t.eq_ignore_ascii_case("llm"));
    let default_engine = engines.default_engine().map(|l| l.name().to_owned()).unwrap_or_default();
    let engine = req.model_engine.as_deref().unwrap_or(&default_engine);
    let entries = req.replica_config.as_deref();
    let pd = entries.is_some_and(|e| e.iter().any(|r| r.role != Role::Hybrid));
    check_counts(req, entries.is_some())?;
    let (keywords, engine_kwargs) = LaunchKeywords::take(&req.extra)?;

    let drafts = match entries {
        Some(entries) => {
            let drafts = check_entries(req, entries, local_mode)?;
            check_topology(entries, pd, model_type_ok, engine, engines)?;
            drafts
        }
        None => {
            check_legacy_placement(req)?;
            Vec::new()
        }
    };
    if !model_type_ok {
        return Err(invalid(
            LaunchRule::ModelTypeNotSupported,
            format!(
                "model_type '{}' is not supported; xinf serves LLM models only",
                req.model_type.as_deref().unwrap_or_default()
            ),
        ));
    }
    let launch_engine = loader(engines, "model_engine", engine)?;
    let replica_count = entries.map_or(req.replica.unwrap_or(1) as usize, <[ReplicaConfig]>::len);
    let (transfer, snapshot_cache_bytes) = check_transfers(&keywords, pd, replica_count)?;
    let (base, base_checked) = engine_options(req, engine_kwargs, launch_engine)?;
    let source = check_model(req, launch_engine)?;

    let replicas = if drafts.is_empty() {
        legacy_drafts(req, replica_count, launch_engine, &base_checked)
    } else {
        entry_drafts(drafts, engines, launch_engine, &base, &base_checked)?
    };
    let decoders: Vec<(usize, &str)> = replicas
        .iter()
        .enumerate()
        .filter(|(_, d)| d.role == Role::Decode)
        .map(|(i, d)| (i, &*d.engine))
        .collect();
    let local_prefill_tokens = keywords.local_prefill_tokens(pd, &decoders, engines)?;
    let front = ModelFront {
        chat: keywords.chat(&req.model_name)?,
        request_limit: keywords.request_limit()?,
        prefill_fallback: keywords.prefill_fallback(pd, &decoders, engines)?,
    };
    // Kept as sent, for the replicas to carry (a restarted supervisor rebuilds the model from it).
    let launch = serde_json::to_string(req)
        .map_err(|e| ActorError::Internal(format!("the launch request does not serialize: {e}")))?;
    Ok(LaunchSpec {
        model_uid: req.model_uid.clone(),
        source,
        replicas,
        pd,
        transfer,
        snapshot_cache_bytes,
        local_prefill_tokens,
        front,
        launch,
    })
}

/// The longest model or replica uid, in bytes: a uid is a path segment of the REST API, whose
/// URIs the HTTP server bounds, and a name in logs and metrics.
const MAX_UID_BYTES: usize = 256;

/// The most replicas one launch asks for (`replica`, or `replica_config`'s entries), as one scale
/// call adds at most [`MAX_SCALE`](super::MAX_SCALE): the drafts of every replica are built
/// before any is placed.
const MAX_LAUNCH_REPLICAS: usize = super::MAX_SCALE as usize;

/// Names: `model_name`, and `model_uid` when given.
fn check_names(req: &LaunchRequest) -> Result<(), ActorError> {
    if blank(&req.model_name) {
        return Err(invalid(LaunchRule::InvalidField, "model_name must not be empty").at("model_name"));
    }
    if let Some(uid) = &req.model_uid {
        if blank(uid) {
            return Err(invalid(LaunchRule::InvalidField, "model_uid must not be empty or whitespace-only")
                .at("model_uid"));
        }
        if let Some(why) = uid_flaw(uid) {
            return Err(invalid(LaunchRule::InvalidField, format!("model_uid {why}")).at("model_uid"));
        }
    }
    Ok(())
}

/// What makes `uid` unusable as a path segment and a name, if anything: a `/`, whitespace or a
/// control character, or more than [`MAX_UID_BYTES`] bytes. Quotes only a uid short enough.
fn uid_flaw(uid: &str) -> Option<String> {
    if uid.len() > MAX_UID_BYTES {
        return Some(format!("must be at most {MAX_UID_BYTES} bytes, got {}", uid.len()));
    }
    (uid.contains('/') || uid.chars().any(|c| c.is_whitespace() || c.is_control()))
        .then(|| format!("'{}' must not contain '/', whitespace or control characters", uid.escape_debug()))
}

/// Counts: `replica` between 1 and [`MAX_LAUNCH_REPLICAS`], and one worker per replica (no
/// sharded launch).
fn check_counts(req: &LaunchRequest, has_replica_config: bool) -> Result<(), ActorError> {
    if req.replica == Some(0) {
        return Err(invalid(LaunchRule::InvalidField, "replica must be an integer ≥ 1").at("replica"));
    }
    if let Some(n) = req.replica.filter(|&n| n as usize > MAX_LAUNCH_REPLICAS) {
        return Err(invalid(
            LaunchRule::InvalidField,
            format!("replica must be at most {MAX_LAUNCH_REPLICAS}, got {n}"),
        )
        .at("replica"));
    }
    match req.n_worker {
        Some(0) => Err(invalid(LaunchRule::InvalidField, "n_worker must be an integer ≥ 1").at("n_worker")),
        Some(n) if n > 1 => Err(invalid(
            LaunchRule::ShardedLaunch,
            if has_replica_config {
                "replica_config is incompatible with n_worker>1 (sharded launch).".to_owned()
            } else {
                format!("n_worker={n} (sharded launch across workers) is not available yet")
            },
        )),
        _ => Ok(()),
    }
}

/// The `replica_config` entries: not mixed with legacy placement, as many as `replica`, each
/// with one device, a usable uid and no reserved engine option. Gives each entry's placement.
fn check_entries<'a>(
    req: &LaunchRequest,
    entries: &'a [ReplicaConfig],
    local_mode: bool,
) -> Result<Vec<Entry<'a>>, ActorError> {
    if entries.is_empty() {
        return Err(invalid(LaunchRule::InvalidField, "replica_config must be a non-empty array")
            .at("replica_config"));
    }
    if entries.len() > MAX_LAUNCH_REPLICAS {
        return Err(invalid(
            LaunchRule::InvalidField,
            format!("replica_config must have at most {MAX_LAUNCH_REPLICAS} entries, got {}", entries.len()),
        )
        .at("replica_config"));
    }
    let legacy_n_gpu = matches!(req.n_gpu, Some(GpuCount::Count(_)));
    if req.worker_ip.is_some() || req.gpu_idx.is_some() || legacy_n_gpu {
        return Err(invalid(
            LaunchRule::LegacyPlacementConflict,
            "Cannot specify worker_ip / n_gpu / gpu_idx together with replica_config.",
        ));
    }
    if let Some(m) = req.replica
        && m as usize != entries.len()
    {
        return Err(invalid(
            LaunchRule::ReplicaCountMismatch,
            format!("replica_config length ({}) must equal replica ({m}).", entries.len()),
        ));
    }
    let mut drafts = Vec::with_capacity(entries.len());
    for (i, entry) in entries.iter().enumerate() {
        let device = entry_device(i, entry, local_mode)?;
        if let Some(uid) = &entry.replica_uid {
            check_replica_uid(i, uid)?;
        }
        if let Some(config) = &entry.engine_config {
            let mut reserved: Vec<&str> =
                config.keys().map(String::as_str).filter(|k| is_reserved_engine_key(k)).collect();
            reserved.sort_unstable();
            if !reserved.is_empty() {
                return Err(invalid(
                    LaunchRule::ReservedEngineConfigKey,
                    format!("Reserved replica engine_config keys: {}", reserved.join(", ")),
                )
                .at(format!("replica_config[{i}].engine_config.{}", reserved[0])));
            }
        }
        drafts.push((entry, device));
    }
    Ok(drafts)
}

/// The placement entry `i` asks for: its one device, or (local mode only) none.
fn entry_device(i: usize, entry: &ReplicaConfig, local_mode: bool) -> Result<DeviceRequest, ActorError> {
    match entry.devices.as_deref() {
        None if local_mode => Ok(DeviceRequest {
            worker_ip: None,
            named: WorkerNamed::ReplicaConfig,
            n_gpu: GpuCount::Auto,
            gpu_idx: None,
        }),
        Some([d]) => {
            check_gpu_list(d.n_gpu, d.gpu_idx.as_deref())?;
            Ok(DeviceRequest {
                worker_ip: Some(d.worker_ip.clone()),
                named: WorkerNamed::ReplicaConfig,
                n_gpu: d.n_gpu,
                gpu_idx: d.gpu_idx.clone(),
            })
        }
        other => Err(invalid(
            LaunchRule::DeviceCount,
            format!(
                "Each replica_config entry must have exactly one device \
                 (replica_config[{i}] has {}). Cross-worker sharding per replica is not \
                 supported yet.",
                other.map_or(0, <[DeviceConfig]>::len)
            ),
        )
        .at(format!("replica_config[{i}].devices"))),
    }
}

/// An explicit replica uid: not blank, not shaped like an internal identifier, usable in a
/// path.
fn check_replica_uid(i: usize, uid: &str) -> Result<(), ActorError> {
    if blank(uid) {
        return Err(invalid(
            LaunchRule::EmptyReplicaUid,
            format!("replica_uid of replica_config[{i}] must not be empty or whitespace-only"),
        )
        .at(format!("replica_config[{i}].replica_uid")));
    }
    if is_reserved_replica_uid(uid) {
        return Err(invalid(
            LaunchRule::ReservedReplicaUid,
            format!("replica_uid '{uid}' collides with a reserved internal replica/rank identifier"),
        )
        .at(format!("replica_config[{i}].replica_uid")));
    }
    if let Some(why) = uid_flaw(uid) {
        return Err(invalid(LaunchRule::InvalidField, format!("replica_uid {why}"))
            .at(format!("replica_config[{i}].replica_uid")));
    }
    Ok(())
}

/// P/D topology and engines: per-replica settings only with P/D roles; P/D needs an LLM on an
/// engine that serves P/D, both roles and no hybrid replica.
fn check_topology(
    entries: &[ReplicaConfig],
    pd: bool,
    model_type_ok: bool,
    engine: &str,
    engines: &Engines,
) -> Result<(), ActorError> {
    let serves_pd = |name: &str| engines.get(name).is_some_and(|l| l.serves_pd());
    let per_replica_settings = entries.iter().any(|e| e.engine_config.is_some() || e.model_engine.is_some());
    if per_replica_settings && !pd {
        return Err(invalid(
            LaunchRule::PerReplicaEngineSettings,
            "Per-replica engine settings require explicit PD roles",
        ));
    }
    if !pd {
        return Ok(());
    }
    // A replica's own engine must serve P/D too (its role is prefill or decode).
    let own = entries
        .iter()
        .filter_map(|e| e.model_engine.as_deref())
        .find(|name| engines.get(name).is_some_and(|l| !l.serves_pd()));
    if !model_type_ok || !serves_pd(engine) || own.is_some() {
        return Err(invalid(
            LaunchRule::PdEngine,
            format!(
                "PD separation requires model_type=LLM and model_engine={}",
                engine_names(engines, |l| l.serves_pd())
            ),
        ));
    }
    let has = |role: Role| entries.iter().any(|e| e.role == role);
    if !has(Role::Prefill) || !has(Role::Decode) || has(Role::Hybrid) {
        return Err(invalid(
            LaunchRule::PdTopology,
            "PD separation requires both prefill and decode replicas, without hybrid replicas",
        ));
    }
    for (i, entry) in entries.iter().enumerate() {
        if let Some(other) = entry.model_engine.as_deref().filter(|e| !serves_pd(e)) {
            return Err(engine_not_available(&format!("replica_config[{i}].model_engine"), other, engines));
        }
    }
    Ok(())
}

/// Legacy placement (no `replica_config`): `n_gpu` agrees with `gpu_idx`, `worker_ip` is not
/// blank.
fn check_legacy_placement(req: &LaunchRequest) -> Result<(), ActorError> {
    let n_gpu = req.n_gpu.unwrap_or_default();
    let gpu_idx = req.gpu_idx.as_ref().map(|g| g.0.clone());
    check_gpu_list(n_gpu, gpu_idx.as_deref())?;
    if let Some(ip) = &req.worker_ip
        && blank(ip)
    {
        return Err(invalid(LaunchRule::InvalidField, "worker_ip must not be empty").at("worker_ip"));
    }
    Ok(())
}

/// Transfers and caches: the P/D transfer backend and the Xavier budgets, each allowed only
/// where the topology uses it. Gives the backend and the prefill snapshot cache size.
fn check_transfers(
    keywords: &LaunchKeywords,
    pd: bool,
    replica_count: usize,
) -> Result<(Option<TransferBackend>, Option<u64>), ActorError> {
    let transfer = keywords.transfer()?;
    if transfer == Some(TransferBackend::Nixl) && !pd {
        return Err(invalid(
            LaunchRule::NixlRoles,
            "NIXL requires explicit prefill and decode replica roles",
        ));
    }
    let xavier = keywords.enable_xavier()? || (pd && transfer != Some(TransferBackend::Nixl));
    if let Some(bytes) = keywords.gpu_cache_bytes()?
        && bytes > 0
        && !(xavier && replica_count > 1)
    {
        return Err(invalid(
            LaunchRule::CacheBudget,
            "xavier_gpu_cache_bytes requires Xavier with multiple replicas",
        )
        .at("xavier_gpu_cache_bytes"));
    }
    // The native engine's CPU snapshot cache lives on prefill replicas.
    let snapshot_cache_bytes = keywords.cache_bytes()?;
    if snapshot_cache_bytes.is_some() && !pd {
        return Err(invalid(
            LaunchRule::CacheBudget,
            "xavier_cache_bytes requires prefill and decode replica roles: the native engine keeps \
             its CPU snapshot cache on prefill replicas",
        )
        .at("xavier_cache_bytes"));
    }
    Ok((transfer, snapshot_cache_bytes))
}

/// Engine options: the launch's `engine_config` plus the top-level engine keywords, none of
/// them reserved, checked by the launch's engine. Gives them as given and as checked.
fn engine_options(
    req: &LaunchRequest,
    engine_kwargs: Map<String, Value>,
    launch_engine: &dyn EngineLoader,
) -> Result<(Map<String, Value>, EngineConfig), ActorError> {
    let mut base = req.engine_config.clone().unwrap_or_default();
    for (k, v) in engine_kwargs {
        if v.is_null() && is_optional_xinference_key(&k) {
            continue;
        }
        if base.contains_key(&k) {
            return Err(invalid(
                LaunchRule::EngineConfig,
                format!("engine option `{k}` is given both at the top level and in engine_config"),
            )
            .at(k));
        }
        base.insert(k, v);
    }
    if let Some(k) = base.keys().find(|k| is_reserved_engine_key(k)) {
        // A Xinference launch key xinf does not implement (envs, peft_model_config, …), or an
        // internal one: not an engine option, and not something to pass on silently.
        return Err(invalid(
            LaunchRule::InvalidField,
            format!("`{k}` is not a supported launch key or engine option"),
        )
        .at(k.as_str()));
    }
    let checked = check_options(launch_engine, &base)?;
    Ok((base, checked))
}

/// The model, as the launch's engine finds it (in its registry, or at `model_path`).
fn check_model(req: &LaunchRequest, launch_engine: &dyn EngineLoader) -> Result<ModelSource, ActorError> {
    let source = ModelSource {
        model_name: req.model_name.clone(),
        size_in_billions: req.model_size_in_billions.as_ref().map(|s| s.0.clone()),
        model_format: req.model_format.clone(),
        quantization: req.quantization.clone(),
        model_path: req.model_path.clone().filter(|p| !blank(p)),
    };
    launch_engine.check_model(&source).map_err(|e| match e {
        EngineError::UnknownModel { .. } => invalid(LaunchRule::UnknownModel, e.to_string()),
        EngineError::InvalidRequest { field, reason } => invalid(LaunchRule::InvalidField, reason).at(field),
        other => invalid(LaunchRule::InvalidField, other.to_string()).at(if req.model_path.is_some() {
            "model_path"
        } else {
            "model_name"
        }),
    })?;
    Ok(source)
}

/// Without `replica_config`: `replica_count` alike hybrid replicas, placed by the legacy keys.
fn legacy_drafts(
    req: &LaunchRequest,
    replica_count: usize,
    launch_engine: &dyn EngineLoader,
    base_checked: &EngineConfig,
) -> Vec<ReplicaDraft> {
    let device = DeviceRequest {
        worker_ip: req.worker_ip.clone(),
        named: WorkerNamed::Request,
        n_gpu: req.n_gpu.unwrap_or_default(),
        gpu_idx: req.gpu_idx.as_ref().map(|g| g.0.clone()),
    };
    (0..replica_count)
        .map(|_| ReplicaDraft {
            replica_uid: None,
            role: Role::Hybrid,
            engine: launch_engine.name().to_owned(),
            engine_config: base_checked.clone(),
            device: device.clone(),
            needs_gpu: launch_engine.needs_gpu(),
        })
        .collect()
}

/// One replica per `replica_config` entry, with its own engine and its options merged over
/// the launch's, checked by its engine.
fn entry_drafts(
    drafts: Vec<Entry<'_>>,
    engines: &Engines,
    launch_engine: &dyn EngineLoader,
    base: &Map<String, Value>,
    base_checked: &EngineConfig,
) -> Result<Vec<ReplicaDraft>, ActorError> {
    let mut out = Vec::with_capacity(drafts.len());
    for (i, (entry, device)) in drafts.into_iter().enumerate() {
        let own_engine = match entry.model_engine.as_deref() {
            Some(name) => loader(engines, &format!("replica_config[{i}].model_engine"), name)?,
            None => launch_engine,
        };
        let engine_config = match &entry.engine_config {
            None if own_engine.name() == launch_engine.name() => base_checked.clone(),
            own => {
                let own = own.clone().unwrap_or_default();
                let mut merged = base.clone();
                merged.extend(own.clone());
                check_options(own_engine, &merged).map_err(|e| blame_entry(e, i, &own))?
            }
        };
        out.push(ReplicaDraft {
            replica_uid: entry.replica_uid.clone(),
            role: entry.role,
            engine: own_engine.name().to_owned(),
            engine_config,
            device,
            needs_gpu: own_engine.needs_gpu(),
        });
    }
    Ok(out)
}

/// A refused option that entry `i` set itself is named as the entry's
/// (`replica_config[i].engine_config.…`), so a form can point at the replica's field; one it
/// inherited from the launch's `engine_config` keeps the launch's name.
fn blame_entry(e: ActorError, i: usize, own: &Map<String, Value>) -> ActorError {
    let field = e.launch_field().map(str::to_owned);
    let key =
        field.as_deref().and_then(|f| f.strip_prefix("engine_config.")).and_then(|k| k.split('.').next());
    match (key, &field) {
        (Some(key), Some(field)) if own.contains_key(key) => e.at(format!("replica_config[{i}].{field}")),
        _ => e,
    }
}

/// Engine options as `loader` checks them; its refusal names the option.
fn check_options(loader: &dyn EngineLoader, config: &Map<String, Value>) -> Result<EngineConfig, ActorError> {
    loader.check_config(config).map_err(|e| {
        let refused = invalid(LaunchRule::EngineConfig, e.to_string());
        match e {
            EngineError::InvalidRequest { field, .. } if field.starts_with("engine_config") => {
                refused.at(field)
            }
            EngineError::InvalidRequest { field, .. } => refused.at(format!("engine_config.{field}")),
            _ => refused,
        }
    })
}

/// The names of the engines that pass `filter`, as a message lists them.
fn engine_names(engines: &Engines, filter: impl Fn(&dyn EngineLoader) -> bool) -> String {
    let names: Vec<&str> = engines.loaders().filter(|l| filter(l.as_ref())).map(|l| l.name()).collect();
    if names.is_empty() { "registered".to_owned() } else { names.join(" or ") }
}

fn engine_not_available(field: &str, engine: &str, engines: &Engines) -> ActorError {
    invalid(
        LaunchRule::EngineNotAvailable,
        format!(
            "{field} '{engine}' is not available yet; model_engine must be {} for now",
            engine_names(engines, |_| true)
        ),
    )
    .at(field)
}

/// The loader of an engine the launch names, or the refusal naming the field.
fn loader<'a>(engines: &'a Engines, field: &str, engine: &str) -> Result<&'a dyn EngineLoader, ActorError> {
    engines.get(engine).map(|l| l.as_ref()).ok_or_else(|| engine_not_available(field, engine, engines))
}

fn blank(s: &str) -> bool {
    s.trim().is_empty()
}

/// Whether a replica uid has the shape of an internal replica or rank identifier.
fn is_reserved_replica_uid(uid: &str) -> bool {
    if uid.ends_with("-rank0") {
        return true;
    }
    match uid.rfind("-rep") {
        Some(at) => {
            let digits = &uid[at + 4..];
            !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
        }
        None => false,
    }
}

/// Launch keys of Xinference that xinf does not implement and that Xinference's client sends,
/// as `null`, with every launch. Null asks for nothing, so the key is dropped; any other value
/// is refused by name like every reserved key.
const OPTIONAL_XINFERENCE_KEYS: &[&str] = &["peft_model_config", "enable_virtual_env", "envs"];

fn is_optional_xinference_key(key: &str) -> bool {
    OPTIONAL_XINFERENCE_KEYS.contains(&key) || key.starts_with("virtual_env_")
}

fn is_reserved_engine_key(key: &str) -> bool {
    RESERVED_ENGINE_CONFIG_KEYS.contains(&key) || key.starts_with('_') || key.starts_with("virtual_env_")
}

fn check_gpu_list(n_gpu: GpuCount, gpu_idx: Option<&[u32]>) -> Result<(), ActorError> {
    if let Some(idx) = gpu_idx {
        if let GpuCount::Count(n) = n_gpu
            && n as usize != idx.len()
        {
            return Err(invalid(
                LaunchRule::GpuCountMismatch,
                format!("n_gpu ({n}) must equal len(gpu_idx) ({}), or be 'auto'", idx.len()),
            ));
        }
        let unique: BTreeSet<u32> = idx.iter().copied().collect();
        if unique.len() != idx.len() {
            return Err(invalid(LaunchRule::DuplicateGpuIdx, "gpu_idx must not contain duplicate indexes"));
        }
    }
    Ok(())
}
