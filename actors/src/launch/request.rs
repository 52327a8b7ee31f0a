//! The launch request as clients send it: the keys of the reference launch payload and the
//! `replica_config` schema, with strict types (a count given as a string, a negative index or
//! an unknown `replica_config` key does not parse).

pub use crate::spec::Role;
use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::{Deserialize, Serialize, Serializer};
use serde_json::{Map, Value};
use std::fmt;

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
    /// `transfer_backend_type` (or `vllm_transfer_backend_type`), `xavier_cache_bytes`,
    /// `xavier_gpu_cache_bytes`.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}
