//! The launch request, its `replica_config` schema, and every validation rule, as pure
//! functions: a request is checked completely before any actor exists, so a bad request leaves
//! nothing to roll back.
//!
//! Two stages:
//! 1. [`validate`] checks the request alone (structure, global conflicts, topology, engine
//!    options) and gives a [`LaunchSpec`].
//! 2. [`place`] checks the spec against the cluster as it is (workers, visible and occupied
//!    GPUs, replica uids of other models) and gives one [`Placement`] per replica.
//!
//! The message texts are those of the reference implementation (Xinference), so users who
//! know it recognise them.

use crate::error::{ActorError, LaunchRule};
use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::{Deserialize, Serialize, Serializer};
use serde_json::{Map, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use xinf_engine::{ComputeDevice, EngineConfig, EngineError, EngineLoader, Engines, ModelSource};

#[cfg(test)]
mod tests;

/// Keys a replica's `engine_config` must not set: they are launch-level settings, or internal.
/// Any key starting with `_` or `virtual_env_` is reserved too.
pub const RESERVED_ENGINE_CONFIG_KEYS: &[&str] = &[
    "model_uid",
    "model_name",
    "model_size_in_billions",
    "model_format",
    "quantization",
    "model_engine",
    "model_type",
    "model_path",
    "n_gpu",
    "n_worker",
    "shard",
    "driver_info",
    "gpu_idx",
    "worker_ip",
    "replica",
    "replica_uid",
    "replica_config",
    "role",
    "request_limits",
    "peft_model_config",
    "download_hub",
    "enable_virtual_env",
    "envs",
    "xavier_config",
    "enable_xavier",
    "transfer_backend_type",
    "xavier_cache_bytes",
    "xavier_gpu_cache_bytes",
];

/// Top-level keywords that configure the launch (KV sharing, transfers), not the engine.
const LAUNCH_KEYWORDS: &[&str] = &[
    "enable_xavier",
    "transfer_backend_type",
    "vllm_transfer_backend_type",
    "xavier_cache_bytes",
    "xavier_gpu_cache_bytes",
];

/// What a replica does in a deployment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Runs whole requests (the default).
    #[default]
    Hybrid,
    /// Computes prompts and hands their KV to a decode replica.
    Prefill,
    /// Generates from KV computed by a prefill replica.
    Decode,
}

impl Role {
    /// The lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Hybrid => "hybrid",
            Self::Prefill => "prefill",
            Self::Decode => "decode",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `n_gpu`: a count, or `"auto"`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum GpuCount {
    /// Let placement decide: the listed `gpu_idx`, else one free GPU if the worker has one,
    /// else the CPU.
    #[default]
    Auto,
    /// Exactly this many GPUs (0 means the CPU).
    Count(u32),
}

impl Serialize for GpuCount {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Auto => s.serialize_str("auto"),
            Self::Count(n) => s.serialize_u32(*n),
        }
    }
}

impl<'de> Deserialize<'de> for GpuCount {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = GpuCount;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an integer ≥ 0 or \"auto\"")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<GpuCount, E> {
                u32::try_from(v).map(GpuCount::Count).map_err(|_| E::custom("n_gpu is too large"))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<GpuCount, E> {
                u64::try_from(v)
                    .map_err(|_| E::custom("n_gpu must be an integer ≥ 0 or \"auto\""))
                    .and_then(|v| self.visit_u64(v))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<GpuCount, E> {
                if v == "auto" {
                    Ok(GpuCount::Auto)
                } else {
                    Err(E::custom(format!("n_gpu must be an integer ≥ 0 or \"auto\", not \"{v}\"")))
                }
            }
        }
        d.deserialize_any(V)
    }
}

/// `model_size_in_billions`: a string (`"0_5"`, `"7"`) or a number (`0.5`, `7`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelSize(pub String);

impl Serialize for ModelSize {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for ModelSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = ModelSize;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string or a number")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<ModelSize, E> {
                Ok(ModelSize(v.to_string()))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<ModelSize, E> {
                Ok(ModelSize(v.to_string()))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<ModelSize, E> {
                Ok(ModelSize(v.to_string()))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<ModelSize, E> {
                Ok(ModelSize(v.to_owned()))
            }
        }
        d.deserialize_any(V)
    }
}

/// The legacy top-level `gpu_idx`: one index or a list.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GpuIdx(pub Vec<u32>);

impl Serialize for GpuIdx {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

impl<'de> Deserialize<'de> for GpuIdx {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = GpuIdx;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an integer ≥ 0 or a list of them")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<GpuIdx, E> {
                u32::try_from(v).map(|v| GpuIdx(vec![v])).map_err(|_| E::custom("gpu_idx is too large"))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<GpuIdx, A::Error> {
                let mut out = Vec::new();
                while let Some(v) = seq.next_element::<u32>()? {
                    out.push(v);
                }
                Ok(GpuIdx(out))
            }
        }
        d.deserialize_any(V)
    }
}

/// Where one replica runs: exactly one entry of `replica_config[i].devices`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceConfig {
    /// The worker, as `ip:port` (the worker's cluster address) or a bare ip when only one
    /// worker has it.
    pub worker_ip: String,
    /// GPUs for the replica.
    #[serde(default)]
    pub n_gpu: GpuCount,
    /// Which GPUs, by index on the worker.
    #[serde(default)]
    pub gpu_idx: Option<Vec<u32>>,
}

/// One entry of `replica_config`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct ReplicaConfig {
    /// The replica's uid; `{model_uid}-{i}` when absent.
    #[serde(default)]
    pub replica_uid: Option<String>,
    /// Its role.
    #[serde(default)]
    pub role: Role,
    /// An engine for this replica (P/D deployments only).
    #[serde(default)]
    pub model_engine: Option<String>,
    /// Engine options for this replica (P/D deployments only), merged over the launch's.
    #[serde(default)]
    pub engine_config: Option<Map<String, Value>>,
    /// Exactly one device entry (optional in local mode).
    #[serde(default)]
    pub devices: Option<Vec<DeviceConfig>>,
}

/// A request to launch a model, with the keys of the reference launch payload.
///
/// Unknown top-level keys are engine keywords: they are merged into `engine_config` and checked
/// by the engine, which refuses keys it does not know, naming them. `replica_config` entries
/// refuse unknown keys themselves.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct LaunchRequest {
    /// The deployment's uid; the model name (or the name plus a random suffix when the name is
    /// taken) when absent.
    #[serde(default)]
    pub model_uid: Option<String>,
    /// A registry family, or any name when `model_path` is given.
    pub model_name: String,
    /// The engine, one of those the cluster offers; the first of them when absent.
    #[serde(default)]
    pub model_engine: Option<String>,
    /// `LLM` (the default) is the only type served.
    #[serde(default)]
    pub model_type: Option<String>,
    /// Size in billions.
    #[serde(default)]
    pub model_size_in_billions: Option<ModelSize>,
    /// `pytorch` or `ggufv2`.
    #[serde(default)]
    pub model_format: Option<String>,
    /// `none` or a GGUF quantization.
    #[serde(default)]
    pub quantization: Option<String>,
    /// Number of replicas (≥ 1); inferred from `replica_config` when absent.
    #[serde(default)]
    pub replica: Option<u32>,
    /// GPUs per replica (legacy placement).
    #[serde(default)]
    pub n_gpu: Option<GpuCount>,
    /// Workers per replica (sharded launch; only 1 is supported).
    #[serde(default)]
    pub n_worker: Option<u32>,
    /// GPU indexes for every replica (legacy placement).
    #[serde(default)]
    pub gpu_idx: Option<GpuIdx>,
    /// The worker for every replica (legacy placement).
    #[serde(default)]
    pub worker_ip: Option<String>,
    /// Local weights instead of the registry.
    #[serde(default)]
    pub model_path: Option<String>,
    /// Per-replica placement and roles.
    #[serde(default)]
    pub replica_config: Option<Vec<ReplicaConfig>>,
    /// Engine options for every replica.
    #[serde(default)]
    pub engine_config: Option<Map<String, Value>>,
    /// Other keys: engine keywords, and the launch keywords `enable_xavier`,
    /// `transfer_backend_type`, `xavier_cache_bytes`, `xavier_gpu_cache_bytes`.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl LaunchRequest {
    /// Checks what can be checked without a cluster: structure, global conflicts, topology
    /// and engine options, with the messages the supervisor would give. Placement (workers,
    /// GPUs, uids of other models) is checked by the supervisor. Clients call this to refuse
    /// a bad request before sending it.
    pub fn check(&self, engines: &Engines) -> Result<(), ActorError> {
        validate(self, true, engines).map(|_| ())
    }
}

/// A placement request for one replica.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DeviceRequest {
    /// The worker asked for, and whether it came from `replica_config` (for the message).
    pub(crate) worker_ip: Option<String>,
    pub(crate) from_replica_config: bool,
    pub(crate) n_gpu: GpuCount,
    pub(crate) gpu_idx: Option<Vec<u32>>,
}

/// One replica of a validated launch.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ReplicaDraft {
    /// The explicit uid, if any.
    pub(crate) replica_uid: Option<String>,
    pub(crate) role: Role,
    /// The engine's name, as registered.
    pub(crate) engine: String,
    /// The merged, checked engine options. `device` in them, when given, wins over the device
    /// placement would choose; `gpu_memory_utilization` is the replica's share of its GPU.
    pub(crate) engine_config: EngineConfig,
    pub(crate) device: DeviceRequest,
}

/// A transfer backend for P/D KV handoff.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TransferBackend {
    Xavier,
    Nixl,
}

/// A launch request that passed every check that does not depend on the cluster's state.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct LaunchSpec {
    pub(crate) model_uid: Option<String>,
    pub(crate) source: ModelSource,
    pub(crate) replicas: Vec<ReplicaDraft>,
    /// Whether the replicas have prefill/decode roles.
    pub(crate) pd: bool,
    /// The P/D transfer backend.
    pub(crate) transfer: Option<TransferBackend>,
    /// `xavier_cache_bytes`: the snapshot cache of each prefill replica.
    pub(crate) snapshot_cache_bytes: Option<u64>,
}

impl LaunchSpec {
    /// The handoff settings every replica of this launch gets.
    pub(crate) fn handoff(&self) -> crate::replica::ModelHandoff {
        crate::replica::ModelHandoff {
            nixl: self.transfer == Some(TransferBackend::Nixl),
            snapshot_cache_bytes: self.snapshot_cache_bytes,
        }
    }
}

fn invalid(rule: LaunchRule, message: impl Into<String>) -> ActorError {
    ActorError::launch(rule, message)
}

/// The names of the engines that pass `filter`, as a message lists them.
fn engine_names(engines: &Engines, filter: impl Fn(&dyn EngineLoader) -> bool) -> String {
    let names: Vec<&str> =
        engines.names().into_iter().filter(|n| engines.get(n).is_some_and(|l| filter(l.as_ref()))).collect();
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

fn is_reserved_engine_key(key: &str) -> bool {
    RESERVED_ENGINE_CONFIG_KEYS.contains(&key) || key.starts_with('_') || key.starts_with("virtual_env_")
}

fn check_gpu_list(n_gpu: GpuCount, gpu_idx: Option<&[u32]>) -> Result<(), ActorError> {
    if let Some(idx) = gpu_idx {
        if let GpuCount::Count(n) = n_gpu {
            if n as usize != idx.len() {
                return Err(invalid(
                    LaunchRule::GpuCountMismatch,
                    format!("n_gpu ({n}) must equal len(gpu_idx) ({}), or be 'auto'", idx.len()),
                ));
            }
        }
        let unique: BTreeSet<u32> = idx.iter().copied().collect();
        if unique.len() != idx.len() {
            return Err(invalid(LaunchRule::DuplicateGpuIdx, "gpu_idx must not contain duplicate indexes"));
        }
    }
    Ok(())
}

/// Reads an optional non-negative integer launch keyword; bools and negative numbers are refused.
fn non_negative(extra: &Map<String, Value>, key: &str) -> Result<Option<u64>, ActorError> {
    match extra.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) if n.as_u64().is_some() => Ok(n.as_u64()),
        Some(_) => Err(invalid(LaunchRule::CacheBudget, format!("{key} must be a non-negative integer"))),
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
    // Names.
    if blank(&req.model_name) {
        return Err(invalid(LaunchRule::InvalidField, "model_name must not be empty"));
    }
    if let Some(uid) = &req.model_uid {
        if blank(uid) {
            return Err(invalid(LaunchRule::InvalidField, "model_uid must not be empty or whitespace-only"));
        }
        if uid.contains('/') || uid.chars().any(char::is_whitespace) {
            return Err(invalid(
                LaunchRule::InvalidField,
                format!("model_uid '{uid}' must not contain '/' or whitespace"),
            ));
        }
    }
    let model_type_ok = req.model_type.as_deref().is_none_or(|t| t.eq_ignore_ascii_case("llm"));
    let default_engine = engines.default_engine().map(|l| l.name().to_owned()).unwrap_or_default();
    let engine = req.model_engine.as_deref().unwrap_or(&default_engine);
    let serves_pd = |name: &str| engines.get(name).is_some_and(|l| l.serves_pd());
    let entries = req.replica_config.as_deref();
    let pd = entries.is_some_and(|e| e.iter().any(|r| r.role != Role::Hybrid));

    // Counts.
    if req.replica == Some(0) {
        return Err(invalid(LaunchRule::InvalidField, "replica must be an integer ≥ 1"));
    }
    match req.n_worker {
        Some(0) => return Err(invalid(LaunchRule::InvalidField, "n_worker must be an integer ≥ 1")),
        Some(n) if n > 1 => {
            return Err(invalid(
                LaunchRule::ShardedLaunch,
                if entries.is_some() {
                    "replica_config is incompatible with n_worker>1 (sharded launch).".to_owned()
                } else {
                    format!("n_worker={n} (sharded launch across workers) is not available yet")
                },
            ));
        }
        _ => {}
    }

    // Launch keywords, taken out of the engine keywords.
    let mut engine_kwargs = req.extra.clone();
    let launch_kw: Map<String, Value> = LAUNCH_KEYWORDS
        .iter()
        .filter_map(|k| engine_kwargs.remove(*k).map(|v| ((*k).to_owned(), v)))
        .collect();

    let mut drafts = Vec::new();
    match entries {
        Some(entries) => {
            if entries.is_empty() {
                return Err(invalid(LaunchRule::InvalidField, "replica_config must be a non-empty array"));
            }
            let legacy_n_gpu = matches!(req.n_gpu, Some(GpuCount::Count(_)));
            if req.worker_ip.is_some() || req.gpu_idx.is_some() || legacy_n_gpu {
                return Err(invalid(
                    LaunchRule::LegacyPlacementConflict,
                    "Cannot specify worker_ip / n_gpu / gpu_idx together with replica_config.",
                ));
            }
            if let Some(m) = req.replica {
                if m as usize != entries.len() {
                    return Err(invalid(
                        LaunchRule::ReplicaCountMismatch,
                        format!("replica_config length ({}) must equal replica ({m}).", entries.len()),
                    ));
                }
            }
            for (i, entry) in entries.iter().enumerate() {
                let device = match entry.devices.as_deref() {
                    None if local_mode => DeviceRequest {
                        worker_ip: None,
                        from_replica_config: true,
                        n_gpu: GpuCount::Auto,
                        gpu_idx: None,
                    },
                    Some([d]) => {
                        check_gpu_list(d.n_gpu, d.gpu_idx.as_deref())?;
                        DeviceRequest {
                            worker_ip: Some(d.worker_ip.clone()),
                            from_replica_config: true,
                            n_gpu: d.n_gpu,
                            gpu_idx: d.gpu_idx.clone(),
                        }
                    }
                    other => {
                        return Err(invalid(
                            LaunchRule::DeviceCount,
                            format!(
                                "Each replica_config entry must have exactly one device \
                                 (replica_config[{i}] has {}). Cross-worker sharding per replica is not \
                                 supported yet.",
                                other.map_or(0, <[DeviceConfig]>::len)
                            ),
                        ));
                    }
                };
                if let Some(uid) = &entry.replica_uid {
                    if blank(uid) {
                        return Err(invalid(
                            LaunchRule::EmptyReplicaUid,
                            format!(
                                "replica_uid of replica_config[{i}] must not be empty or whitespace-only"
                            ),
                        ));
                    }
                    if is_reserved_replica_uid(uid) {
                        return Err(invalid(
                            LaunchRule::ReservedReplicaUid,
                            format!(
                                "replica_uid '{uid}' collides with a reserved internal replica/rank identifier"
                            ),
                        ));
                    }
                    if uid.contains('/') || uid.chars().any(char::is_whitespace) {
                        return Err(invalid(
                            LaunchRule::InvalidField,
                            format!("replica_uid '{uid}' must not contain '/' or whitespace"),
                        ));
                    }
                }
                if let Some(config) = &entry.engine_config {
                    let mut reserved: Vec<&str> =
                        config.keys().map(String::as_str).filter(|k| is_reserved_engine_key(k)).collect();
                    reserved.sort_unstable();
                    if !reserved.is_empty() {
                        return Err(invalid(
                            LaunchRule::ReservedEngineConfigKey,
                            format!("Reserved replica engine_config keys: {}", reserved.join(", ")),
                        ));
                    }
                }
                drafts.push((entry, device));
            }
            let per_replica_settings =
                entries.iter().any(|e| e.engine_config.is_some() || e.model_engine.is_some());
            if per_replica_settings && !pd {
                return Err(invalid(
                    LaunchRule::PerReplicaEngineSettings,
                    "Per-replica engine settings require explicit PD roles",
                ));
            }
            if pd {
                if !model_type_ok || !serves_pd(engine) {
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
                        return Err(engine_not_available(
                            &format!("replica_config[{i}].model_engine"),
                            other,
                            engines,
                        ));
                    }
                }
            }
        }
        None => {
            let n_gpu = req.n_gpu.unwrap_or_default();
            let gpu_idx = req.gpu_idx.as_ref().map(|g| g.0.clone());
            check_gpu_list(n_gpu, gpu_idx.as_deref())?;
            if let Some(ip) = &req.worker_ip {
                if blank(ip) {
                    return Err(invalid(LaunchRule::InvalidField, "worker_ip must not be empty"));
                }
            }
        }
    }
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

    // Transfers and caches.
    let backend_value =
        match (launch_kw.get("transfer_backend_type"), launch_kw.get("vllm_transfer_backend_type")) {
            (Some(a), Some(b)) if a != b => {
                return Err(invalid(
                    LaunchRule::UnknownTransferBackend,
                    "transfer_backend_type and vllm_transfer_backend_type disagree; give one of them",
                ));
            }
            (Some(v), _) | (None, Some(v)) => Some(v),
            (None, None) => None,
        };
    let transfer = match backend_value {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if s.eq_ignore_ascii_case("xavier") => Some(TransferBackend::Xavier),
        Some(Value::String(s)) if s.eq_ignore_ascii_case("nixl") => Some(TransferBackend::Nixl),
        Some(other) => {
            let shown = other.as_str().map_or_else(|| other.to_string(), str::to_owned);
            return Err(invalid(
                LaunchRule::UnknownTransferBackend,
                format!("Unknown transfer backend: '{shown}'; use xavier or nixl"),
            ));
        }
    };
    if transfer == Some(TransferBackend::Nixl) && !pd {
        return Err(invalid(
            LaunchRule::NixlRoles,
            "NIXL requires explicit prefill and decode replica roles",
        ));
    }
    let enable_xavier = match launch_kw.get("enable_xavier") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(invalid(LaunchRule::InvalidField, "enable_xavier must be a boolean")),
    };
    let replica_count = entries.map_or(req.replica.unwrap_or(1) as usize, <[ReplicaConfig]>::len);
    let xavier = enable_xavier || (pd && transfer != Some(TransferBackend::Nixl));
    if let Some(bytes) = non_negative(&launch_kw, "xavier_gpu_cache_bytes")? {
        if bytes > 0 && !(xavier && replica_count > 1) {
            return Err(invalid(
                LaunchRule::CacheBudget,
                "xavier_gpu_cache_bytes requires Xavier with multiple replicas",
            ));
        }
    }
    // The native engine's CPU snapshot cache lives on prefill replicas.
    let snapshot_cache_bytes = match launch_kw.get("xavier_cache_bytes") {
        None | Some(Value::Null) => None,
        Some(Value::Number(n)) if n.as_u64().is_some_and(|b| b > 0) && pd => n.as_u64(),
        Some(Value::Number(n)) if n.as_u64().is_some_and(|b| b > 0) => {
            return Err(invalid(
                LaunchRule::CacheBudget,
                "xavier_cache_bytes requires prefill and decode replica roles: the native engine keeps \
                 its CPU snapshot cache on prefill replicas",
            ));
        }
        Some(_) => {
            return Err(invalid(LaunchRule::CacheBudget, "xavier_cache_bytes must be a positive integer"));
        }
    };

    // Engine options: the launch's engine_config plus top-level engine keywords.
    let mut base = req.engine_config.clone().unwrap_or_default();
    for (k, v) in engine_kwargs {
        if base.contains_key(&k) {
            return Err(invalid(
                LaunchRule::EngineConfig,
                format!("engine option `{k}` is given both at the top level and in engine_config"),
            ));
        }
        base.insert(k, v);
    }
    if let Some(k) = base.keys().find(|k| is_reserved_engine_key(k)) {
        // A Xinference launch key xinf does not implement (request_limits, envs, …), or an
        // internal one: not an engine option, and not something to pass on silently.
        return Err(invalid(
            LaunchRule::InvalidField,
            format!("`{k}` is not a supported launch key or engine option"),
        ));
    }
    let check_engine = |loader: &dyn EngineLoader, config: &Map<String, Value>| {
        loader.check_config(config).map_err(|e| invalid(LaunchRule::EngineConfig, e.to_string()))
    };
    let base_checked = check_engine(launch_engine, &base)?;

    // The model.
    let source = ModelSource {
        model_name: req.model_name.clone(),
        size_in_billions: req.model_size_in_billions.as_ref().map(|s| s.0.clone()),
        model_format: req.model_format.clone(),
        quantization: req.quantization.clone(),
        model_path: req.model_path.clone().filter(|p| !blank(p)),
    };
    launch_engine.check_model(&source).map_err(|e| match e {
        EngineError::UnknownModel { .. } => invalid(LaunchRule::UnknownModel, e.to_string()),
        other => invalid(LaunchRule::InvalidField, other.to_string()),
    })?;

    let replicas = if drafts.is_empty() {
        let device = DeviceRequest {
            worker_ip: req.worker_ip.clone(),
            from_replica_config: false,
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
            })
            .collect()
    } else {
        let mut out = Vec::with_capacity(drafts.len());
        for (i, (entry, device)) in drafts.into_iter().enumerate() {
            let own_engine = match entry.model_engine.as_deref() {
                Some(name) => loader(engines, &format!("replica_config[{i}].model_engine"), name)?,
                None => launch_engine,
            };
            let engine_config = match &entry.engine_config {
                None if own_engine.name() == launch_engine.name() => base_checked.clone(),
                own => {
                    let mut merged = base.clone();
                    merged.extend(own.clone().unwrap_or_default());
                    check_engine(own_engine, &merged)?
                }
            };
            out.push(ReplicaDraft {
                replica_uid: entry.replica_uid.clone(),
                role: entry.role,
                engine: own_engine.name().to_owned(),
                engine_config,
                device,
            });
        }
        out
    };
    Ok(LaunchSpec { model_uid: req.model_uid.clone(), source, replicas, pd, transfer, snapshot_cache_bytes })
}

/// A replica on a GPU, as placement sees it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct GpuTenant {
    pub(crate) model_uid: String,
    pub(crate) replica_uid: String,
    /// Its `gpu_memory_utilization`.
    pub(crate) fraction: Option<f64>,
}

/// A worker as placement sees it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct WorkerSlot {
    /// The worker's id (`ip:port`).
    pub(crate) worker_id: String,
    /// GPU indexes the worker can use.
    pub(crate) gpus: Vec<u32>,
    /// Whether several replicas may share one GPU on this worker without stating their
    /// memory shares (`XINF_ALLOW_MULTI_REPLICA_PER_GPU`).
    pub(crate) allow_gpu_sharing: bool,
    /// GPUs in use, with the replicas (not dead) of running or launching models on each.
    pub(crate) occupied: BTreeMap<u32, Vec<GpuTenant>>,
}

/// The cluster as placement sees it.
#[derive(Debug, Clone, Default)]
pub(crate) struct ClusterView {
    /// Whether this is `xinf local` (unknown worker addresses only warn).
    pub(crate) local_mode: bool,
    /// Alive workers, in a stable order.
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

fn find_worker<'a>(view: &'a ClusterView, ip: &str) -> Option<&'a WorkerSlot> {
    if let Some(w) = view.workers.iter().find(|w| w.worker_id == ip) {
        return Some(w);
    }
    // A bare host matches when exactly one worker runs there.
    let mut by_host =
        view.workers.iter().filter(|w| w.worker_id.rsplit_once(':').is_some_and(|(h, _)| h == ip));
    match (by_host.next(), by_host.next()) {
        (Some(w), None) => Some(w),
        _ => None,
    }
}

/// Sums of memory shares up to this much over 1 still fit (0.1 + 0.2 + 0.7 is not exactly 1).
const SHARE_EPSILON: f64 = 1e-9;

/// Why a replica may not join the replicas already on a GPU.
#[derive(Debug, Clone, PartialEq)]
enum Refusal {
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
fn admit(tenants: &[GpuTenant], fraction: Option<f64>, allow_sharing: bool) -> Result<(), Refusal> {
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
fn refusal_error(
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

/// A replica's engine options with the device it was placed on: `cuda:N` for the first of its
/// GPUs unless `engine_config.device` is given (an explicit device wins); a replica on no GPU
/// keeps the CPU. Tensor parallelism is not implemented, so a replica placed on several GPUs
/// computes on the first one only.
pub(crate) fn with_device(engine_config: &EngineConfig, gpus: &[u32]) -> EngineConfig {
    let mut config = engine_config.clone();
    if let Some(first) = gpus.first().filter(|_| config.device().is_none()) {
        config.set_device(ComputeDevice::Cuda(*first as usize));
    }
    config
}

/// Checks a validated launch against the cluster and places every replica.
/// Returns the placements and the next round-robin start.
pub(crate) fn place(
    spec: &LaunchSpec,
    model_uid: &str,
    view: &ClusterView,
) -> Result<(Vec<Placement>, usize), ActorError> {
    // Replica uids.
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
    if view.workers.is_empty() {
        return Err(invalid(LaunchRule::NoWorkers, "no worker is registered in the cluster"));
    }
    let registered = || {
        let ids: Vec<&str> = view.workers.iter().map(|w| w.worker_id.as_str()).collect();
        format!("[{}]", ids.join(", "))
    };
    // Replicas on each GPU: those of other models, then those this launch places.
    let mut tenants: BTreeMap<&str, BTreeMap<u32, Vec<GpuTenant>>> = BTreeMap::new();
    let mut rr = view.round_robin;
    let mut out = Vec::with_capacity(uids.len());
    for (i, (draft, uid)) in spec.replicas.iter().zip(uids).enumerate() {
        let d = &draft.device;
        let worker = match &d.worker_ip {
            Some(ip) => match find_worker(view, ip) {
                Some(w) => w,
                None if view.local_mode => {
                    tracing::warn!(worker_ip = %ip, "worker_ip is not in the cluster; local mode places the replica on the local worker");
                    &view.workers[0]
                }
                None => {
                    let what = if d.from_replica_config {
                        format!("replica_config[{i}].worker_ip")
                    } else {
                        "worker_ip".to_owned()
                    };
                    return Err(invalid(
                        LaunchRule::UnknownWorker,
                        format!("{what} '{ip}' is not in the cluster. Registered workers: {}", registered()),
                    ));
                }
            },
            None => {
                let w = &view.workers[rr % view.workers.len()];
                rr = rr.wrapping_add(1);
                w
            }
        };
        let wid = worker.worker_id.as_str();
        let on_worker = tenants.entry(wid).or_insert_with(|| worker.occupied.clone());
        let fraction = draft.engine_config.gpu_memory_utilization();
        // An explicit GPU device must exist on the worker; with placement left to `auto`, it
        // also says which GPU the replica occupies (an explicit CPU, none).
        let (gpu_idx, n_gpu) = match draft.engine_config.device() {
            Some(ComputeDevice::Cuda(n)) => {
                let g = u32::try_from(n).unwrap_or(u32::MAX);
                if !worker.gpus.contains(&g) {
                    return Err(invalid(
                        LaunchRule::GpuNotVisible,
                        format!(
                            "engine_config.device cuda:{n} of replica '{uid}': GPU {n} is not visible on \
                             worker {wid}. Visible GPUs: {:?}",
                            worker.gpus
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
        };
        let gpus: Vec<u32> = match (gpu_idx, n_gpu) {
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
                    let here = on_worker.get(g).map(Vec::as_slice).unwrap_or_default();
                    admit(here, fraction, worker.allow_gpu_sharing)
                        .map_err(|r| refusal_error(r, *g, wid, model_uid, here, &uid, fraction))?;
                }
                idx
            }
            (None, GpuCount::Count(0)) => Vec::new(),
            (None, n_gpu) => {
                let busy = |g: &u32| on_worker.get(g).is_some_and(|t| !t.is_empty());
                let free: Vec<u32> = worker.gpus.iter().copied().filter(|g| !busy(g)).collect();
                // Free GPUs first, then those the replica may share.
                let candidates: Vec<u32> = free
                    .iter()
                    .copied()
                    .chain(worker.gpus.iter().copied().filter(|g| {
                        busy(g)
                            && admit(
                                on_worker.get(g).map(Vec::as_slice).unwrap_or_default(),
                                fraction,
                                worker.allow_gpu_sharing,
                            )
                            .is_ok()
                    }))
                    .collect();
                match n_gpu {
                    GpuCount::Count(n) => match candidates.get(..n as usize) {
                        Some(chosen) => chosen.to_vec(),
                        None => {
                            return Err(invalid(
                                LaunchRule::NotEnoughGpus,
                                format!("worker {wid} has {} free GPUs, and n_gpu asks for {n}", free.len()),
                            ));
                        }
                    },
                    GpuCount::Auto => candidates.first().map(|g| vec![*g]).unwrap_or_default(),
                }
            }
        };
        let on_gpu = !gpus.is_empty() || matches!(draft.engine_config.device(), Some(ComputeDevice::Cuda(_)));
        if fraction.is_some() && !on_gpu {
            return Err(invalid(
                LaunchRule::EngineConfig,
                format!(
                    "engine_config.gpu_memory_utilization is a share of a GPU's memory, and replica '{uid}' \
                     runs on the CPU of worker {wid} (it has no free or shareable GPU, or the launch asks \
                     for none)"
                ),
            ));
        }
        for g in &gpus {
            on_worker.entry(*g).or_default().push(GpuTenant {
                model_uid: model_uid.to_owned(),
                replica_uid: uid.clone(),
                fraction,
            });
        }
        let engine_config = with_device(&draft.engine_config, &gpus);
        out.push(Placement {
            replica_uid: uid,
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
