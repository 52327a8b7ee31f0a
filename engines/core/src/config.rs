//! Typed `engine_config`: one struct per engine kind, read once from a launch's JSON and carried
//! as it is from then on (across nodes too, inside bincode, which cannot carry JSON values).
//!
//! A launch names its options as a JSON object; the cluster turns that object into the engine
//! kind's struct at validation, refusing unknown keys (naming them and the known ones) and bad
//! values (naming the field), so nothing later parses JSON again and a replica never fails to
//! load over an option.

use crate::EngineError;
use crate::contract::KvDtype;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};
use std::fmt::Display;
use std::str::FromStr;
use xinf_transfer::{KvLayoutKind, KvOrder};

#[cfg(test)]
mod tests;

/// Where an engine computes (`device`).
///
/// The cluster sets it from a replica's GPU placement unless `engine_config` names one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ComputeDevice {
    /// The host's CPU (`"cpu"`).
    #[default]
    Cpu,
    /// The NVIDIA GPU of this ordinal (`"cuda"` for 0, `"cuda:N"`).
    Cuda(usize),
}

impl Display for ComputeDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Cpu => f.write_str("cpu"),
            Self::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

impl FromStr for ComputeDevice {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "cpu" => Ok(Self::Cpu),
            "cuda" | "gpu" => Ok(Self::Cuda(0)),
            _ => s
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(Self::Cuda)
                .ok_or_else(|| "must be cpu, cuda or cuda:N (N the GPU ordinal)".to_owned()),
        }
    }
}

/// The KV element type asked for (`kv_dtype`): `auto` follows the weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KvDtypeChoice {
    /// The weights' own type (F32 for GGUF and F32 weights).
    Auto,
    /// 32-bit float.
    #[serde(alias = "float32")]
    F32,
    /// IEEE half.
    #[serde(alias = "float16")]
    F16,
    /// bfloat16.
    #[serde(alias = "bfloat16")]
    Bf16,
}

impl KvDtypeChoice {
    /// The element type, `None` for `auto`.
    pub fn dtype(self) -> Option<KvDtype> {
        match self {
            Self::Auto => None,
            Self::F32 => Some(KvDtype::F32),
            Self::F16 => Some(KvDtype::F16),
            Self::Bf16 => Some(KvDtype::Bf16),
        }
    }
}

/// Options of xinf's native engine, as `engine_config` gives them. Every field is optional: an
/// absent one takes the engine's default. The values are checked when the struct is read
/// ([`NativeConfig::from_map`]), so a value of this type is always one the engine accepts.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NativeConfig {
    /// KV cache layout family (`paged-kv-first`, `paged-block-first`, `token-pool`).
    #[serde(default, with = "by_name")]
    pub kv_layout: Option<KvLayoutKind>,
    /// Token/head order inside a block (`NHD`, `HND`).
    #[serde(default, with = "by_name")]
    pub kv_order: Option<KvOrder>,
    /// Tokens per KV block (the token pool defaults to 1, as SGLang).
    #[serde(default)]
    pub block_size: Option<usize>,
    /// KV element type.
    #[serde(default)]
    pub kv_dtype: Option<KvDtypeChoice>,
    /// Tokens the KV cache holds across all sequences (≥ 64).
    #[serde(default)]
    pub kv_cache_tokens: Option<usize>,
    /// Sequences computed together at most (≥ 1).
    #[serde(default)]
    pub max_num_seqs: Option<usize>,
    /// Tokens per step at most (≥ 16).
    #[serde(default)]
    pub max_batch_tokens: Option<usize>,
    /// Requests waiting for admission at most (≥ 1).
    #[serde(default)]
    pub max_queue: Option<usize>,
    /// Caps the model's context length (≥ 2).
    #[serde(default)]
    pub context_length: Option<usize>,
    /// Recompute the last prompt token when decoding imported KV, as vLLM does.
    #[serde(default)]
    pub recompute_last_token: Option<bool>,
    /// Where the model computes.
    #[serde(default, with = "by_name")]
    pub device: Option<ComputeDevice>,
    /// The share of the GPU's memory the engine may take, in (0, 1] (vLLM's name).
    #[serde(default)]
    pub gpu_memory_utilization: Option<f64>,
    /// Replay decode steps as CUDA graphs on a GPU.
    #[serde(default)]
    pub cuda_graphs: Option<bool>,
    /// Keep full KV blocks for later prompts that begin with the same tokens (vLLM's name).
    #[serde(default)]
    pub enable_prefix_caching: Option<bool>,
    /// On the CPU, multiply a GGUF file's quantized weights as stored (`false`: dequantize
    /// them to F32 at load).
    #[serde(default)]
    pub quantized_matmul: Option<bool>,
}

impl NativeConfig {
    /// The keys [`from_map`](Self::from_map) accepts.
    pub const KEYS: &'static [&'static str] = &[
        "kv_layout",
        "kv_order",
        "block_size",
        "kv_dtype",
        "kv_cache_tokens",
        "max_num_seqs",
        "max_batch_tokens",
        "max_queue",
        "context_length",
        "recompute_last_token",
        "device",
        "gpu_memory_utilization",
        "cuda_graphs",
        "enable_prefix_caching",
        "quantized_matmul",
    ];

    /// Reads and checks the options of an `engine_config` object; unknown keys and bad values
    /// are refused naming the key (`engine_config.<key>`).
    pub fn from_map(map: &Map<String, Value>) -> Result<Self, EngineError> {
        let config: Self = read_keys(map, Self::KEYS, "the native engine")?;
        config.check()?;
        Ok(config)
    }

    /// Like [`from_map`](Self::from_map) for any JSON value: `null` is no options, anything
    /// but an object is refused.
    pub fn from_json(value: &Value) -> Result<Self, EngineError> {
        match value {
            Value::Null => Ok(Self::default()),
            Value::Object(map) => Self::from_map(map),
            _ => Err(EngineError::invalid("engine_config", "must be a JSON object")),
        }
    }

    /// The layout these options give: the family, the order and the block size, where the
    /// token pool defaults to pages of 1 token (SGLang's) and the paged layouts to 16.
    pub fn layout(&self) -> xinf_transfer::KvLayout {
        let mut layout =
            xinf_transfer::KvLayout { kind: KvLayoutKind::PagedKvFirst, order: KvOrder::Nhd, block_size: 16 };
        if let Some(kind) = self.kv_layout {
            layout.kind = kind;
            if kind == KvLayoutKind::TokenPool {
                layout.block_size = 1;
            }
        }
        if let Some(order) = self.kv_order {
            layout.order = order;
        }
        if let Some(b) = self.block_size {
            layout.block_size = b;
        }
        layout
    }

    fn check(&self) -> Result<(), EngineError> {
        let at_least = |key: &str, v: Option<usize>, min: usize| match v {
            Some(n) if n < min => {
                Err(EngineError::invalid(field(key), format!("must be an integer ≥ {min}")))
            }
            _ => Ok(()),
        };
        at_least("block_size", self.block_size, 1)?;
        at_least("kv_cache_tokens", self.kv_cache_tokens, 64)?;
        at_least("max_num_seqs", self.max_num_seqs, 1)?;
        at_least("max_batch_tokens", self.max_batch_tokens, 16)?;
        at_least("max_queue", self.max_queue, 1)?;
        at_least("context_length", self.context_length, 2)?;
        self.layout().validate().map_err(|e| {
            let key = match e {
                xinf_transfer::LayoutError::PoolOrder => "kv_order",
                _ => "block_size",
            };
            EngineError::invalid(field(key), e.to_string())
        })?;
        if let Some(f) = self.gpu_memory_utilization {
            if !(f > 0.0 && f <= 1.0) {
                return Err(EngineError::invalid(
                    field("gpu_memory_utilization"),
                    format!("must be a number in (0, 1], not {f}"),
                ));
            }
            // Without a `device` the cluster may still place the replica on a GPU; an
            // explicit CPU never has GPU memory to share.
            if self.device == Some(ComputeDevice::Cpu) {
                return Err(EngineError::invalid(
                    field("gpu_memory_utilization"),
                    "is a share of a GPU's memory, and engine_config.device is cpu",
                ));
            }
        }
        Ok(())
    }
}

/// Faults the mock engine injects, for tests of what the cluster does when an engine fails.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MockFaults {
    /// Refuse every request at admission.
    #[serde(default)]
    pub fail_at_admission: Option<bool>,
    /// End every stream with an error after this many tokens.
    #[serde(default)]
    pub fail_after_tokens: Option<usize>,
    /// Wait this long before every page export (a prefill side that stalls a transfer).
    #[serde(default)]
    pub stall_export_ms: Option<u64>,
    /// Wait this long before every token (a slow engine).
    #[serde(default)]
    pub step_ms: Option<u64>,
    /// Fetch a handoff's pages itself, over the page plane's TCP path (as an engine server
    /// does in its own process), instead of being handed them by the replica.
    #[serde(default)]
    pub fetches_kv: Option<bool>,
}

impl MockFaults {
    /// The keys of the faults.
    pub const KEYS: &'static [&'static str] =
        &["fail_at_admission", "fail_after_tokens", "stall_export_ms", "step_ms", "fetches_kv"];
}

/// Options of the mock engine: the native engine's options it honours (KV layout and size,
/// context length, device and memory share, so launch rules see what they see for the native
/// engine) and its faults.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MockConfig {
    /// The native options.
    pub engine: NativeConfig,
    /// The faults.
    pub faults: MockFaults,
}

impl MockConfig {
    /// Reads the options of an `engine_config` object: fault keys, then native keys; anything
    /// else is refused naming the key and the known ones.
    pub fn from_map(map: &Map<String, Value>) -> Result<Self, EngineError> {
        let known: Vec<&str> = NativeConfig::KEYS.iter().chain(MockFaults::KEYS).copied().collect();
        if let Some(k) = map.keys().find(|k| !known.contains(&k.as_str())) {
            return Err(unknown_key(k, &known, "the mock engine"));
        }
        let (faults, engine): (Map<String, Value>, Map<String, Value>) =
            map.clone().into_iter().partition(|(k, _)| MockFaults::KEYS.contains(&k.as_str()));
        Ok(Self {
            engine: NativeConfig::from_map(&engine)?,
            faults: read_keys(&faults, MockFaults::KEYS, "the mock engine")?,
        })
    }
}

/// A value of an external engine's own command-line flag, as `engine_config` gave it: typed
/// here because JSON values cannot cross nodes inside bincode.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum FlagValue {
    /// `true` or `false`: a switch (`--flag`, or `--no-flag` where the engine has one).
    Switch(bool),
    /// A number or a string, as its text.
    Text(String),
    /// A list: one argument per item after the flag.
    List(Vec<String>),
    /// A JSON object, passed as its JSON text (vLLM's `--compilation-config '{…}'`).
    Json(String),
}

impl FlagValue {
    /// The value as JSON again (for [`EngineConfig::to_json`]).
    fn to_json(&self) -> Value {
        match self {
            Self::Switch(b) => Value::Bool(*b),
            Self::Text(t) => serde_json::from_str::<serde_json::Number>(t)
                .map(Value::Number)
                .unwrap_or_else(|_| Value::String(t.clone())),
            Self::List(items) => Value::Array(items.iter().cloned().map(Value::String).collect()),
            Self::Json(text) => serde_json::from_str(text).unwrap_or(Value::String(text.clone())),
        }
    }
}

/// Options of an engine that runs as its own server process (vLLM, SGLang): what xinf itself
/// decides about the process, and the engine's own flags, checked against the engine's flag
/// table by its loader before the value is built.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ServerConfig {
    /// The Python interpreter that runs the engine (`python`; else `XINF_PYTHON`, else
    /// `python3`).
    pub python: Option<String>,
    /// Extra environment of the engine process (`env`).
    pub env: Vec<(String, String)>,
    /// How long the engine may take to answer its health check (`launch_timeout_s`).
    pub launch_timeout_s: Option<u64>,
    /// How long the running engine may go without answering a health check before xinf stops
    /// it as hung (`health_timeout_s`; 0: never).
    #[serde(default)]
    pub health_timeout_s: Option<u64>,
    /// Caps the context length (`context_length`; vLLM `--max-model-len`, SGLang
    /// `--context-length`).
    pub context_length: Option<usize>,
    /// The share of the GPU's memory the engine may take (vLLM `--gpu-memory-utilization`,
    /// SGLang `--mem-fraction-static`).
    pub gpu_memory_utilization: Option<f64>,
    /// The GPU it runs on (placement sets it; `CUDA_VISIBLE_DEVICES`).
    #[serde(with = "by_name")]
    pub device: Option<ComputeDevice>,
    /// The engine's own flags, by `engine_config` key (`max_num_seqs`), in the launch's order.
    pub flags: Vec<(String, FlagValue)>,
    /// The replica's side of P/D handoffs, set by the worker from the replica's role (never an
    /// `engine_config` key): the engine then runs with xinf's KV connector.
    #[serde(default)]
    pub kv_role: Option<KvRole>,
    /// Where the server's page server listens (the worker's data-plane address; set by the
    /// worker, not an `engine_config` key): decode sides on other hosts fetch rooms there.
    #[serde(default)]
    pub page_ip: Option<std::net::IpAddr>,
}

/// Which side of P/D handoffs an engine server's KV connector takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KvRole {
    /// A prefill replica: it publishes its prompts' KV as rooms.
    Producer,
    /// A decode replica: it loads prompts' KV from rooms.
    Consumer,
}

impl ServerConfig {
    /// The keys xinf reads itself; every other key is one of the engine's flags.
    pub const KEYS: &'static [&'static str] = &[
        "python",
        "env",
        "launch_timeout_s",
        "health_timeout_s",
        "context_length",
        "gpu_memory_utilization",
        "device",
    ];
}

/// A replica's engine options, typed by engine kind.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum EngineConfig {
    /// xinf's native engine.
    Native(NativeConfig),
    /// The mock engine (tests only; never offered to users).
    Mock(MockConfig),
    /// An engine that runs as its own server process.
    Server(ServerConfig),
}

/// The KV layout of an engine server, by the engine's name (`vllm`, `sglang`).
pub fn server_layout(engine: &str) -> Option<xinf_transfer::KvLayout> {
    let (kind, block_size) = match engine {
        "vllm" => (KvLayoutKind::PagedPacked, 16),
        "sglang" => (KvLayoutKind::TokenPool, 1),
        _ => return None,
    };
    Some(xinf_transfer::KvLayout { kind, order: KvOrder::Nhd, block_size })
}

impl EngineConfig {
    /// The device `engine_config` names, if it names one.
    pub fn device(&self) -> Option<ComputeDevice> {
        match self {
            Self::Native(c) => c.device,
            Self::Mock(c) => c.engine.device,
            Self::Server(c) => c.device,
        }
    }

    /// Sets the device (placement does, from the replica's GPUs).
    pub fn set_device(&mut self, device: ComputeDevice) {
        match self {
            Self::Native(c) => c.device = Some(device),
            Self::Mock(c) => c.engine.device = Some(device),
            Self::Server(c) => c.device = Some(device),
        }
    }

    /// Sets the replica's side of P/D handoffs (the worker does, from the replica's role); only
    /// an engine server needs it told, to run with xinf's KV connector.
    pub fn set_kv_role(&mut self, role: KvRole) {
        if let Self::Server(c) = self {
            c.kv_role = Some(role);
        }
    }

    /// Sets the address an engine server's page server listens on (the worker's data-plane
    /// address); other engines serve their pages from the worker's own page server.
    pub fn set_page_ip(&mut self, ip: std::net::IpAddr) {
        if let Self::Server(c) = self {
            c.page_ip = Some(ip);
        }
    }

    /// The layout of the replica's KV cache: the options' for xinf's own engines, the engine's
    /// own for a server (`vllm`: vLLM 0.26's packed blocks of 16 tokens; `sglang`: SGLang's
    /// token pool).
    pub fn kv_layout(&self, engine: &str) -> Option<xinf_transfer::KvLayout> {
        match self {
            Self::Native(c) => Some(c.layout()),
            Self::Mock(c) => Some(c.engine.layout()),
            Self::Server(_) => server_layout(engine),
        }
    }

    /// The replica's share of its GPU's memory (`gpu_memory_utilization`), if given.
    pub fn gpu_memory_utilization(&self) -> Option<f64> {
        match self {
            Self::Native(c) => c.gpu_memory_utilization,
            Self::Mock(c) => c.engine.gpu_memory_utilization,
            Self::Server(c) => c.gpu_memory_utilization,
        }
    }

    /// The options as the JSON object a launch would give, without the absent ones: what tests
    /// and diagnostics compare against a launch's `engine_config`.
    pub fn to_json(&self) -> Value {
        let mut out = Map::new();
        let mut put = |v: Result<Value, serde_json::Error>| {
            if let Ok(Value::Object(m)) = v {
                out.extend(m.into_iter().filter(|(_, v)| !v.is_null()));
            }
        };
        match self {
            Self::Native(c) => put(serde_json::to_value(c)),
            Self::Mock(c) => {
                put(serde_json::to_value(&c.engine));
                put(serde_json::to_value(&c.faults));
            }
            Self::Server(c) => {
                let mut m = Map::new();
                let mut set = |k: &str, v: Option<Value>| {
                    if let Some(v) = v {
                        m.insert(k.to_owned(), v);
                    }
                };
                set("python", c.python.clone().map(Value::String));
                let env: Map<String, Value> =
                    c.env.iter().map(|(k, v)| (k.clone(), Value::String(v.clone()))).collect();
                set("env", (!env.is_empty()).then_some(Value::Object(env)));
                set("launch_timeout_s", c.launch_timeout_s.map(Value::from));
                set("health_timeout_s", c.health_timeout_s.map(Value::from));
                set("context_length", c.context_length.map(Value::from));
                set("gpu_memory_utilization", c.gpu_memory_utilization.map(Value::from));
                set("device", c.device.map(|d| Value::String(d.to_string())));
                for (k, v) in &c.flags {
                    m.insert(k.clone(), v.to_json());
                }
                out.extend(m);
            }
        }
        Value::Object(out)
    }
}

fn field(key: &str) -> String {
    format!("engine_config.{key}")
}

fn unknown_key(key: &str, known: &[&str], engine: &str) -> EngineError {
    EngineError::invalid(field(key), format!("unknown key for {engine} (known: {})", known.join(", ")))
}

/// Deserializes `map` into `T` after refusing keys outside `known` (the message names the
/// known ones, which serde's own would not in the field's terms); a bad value names its key.
fn read_keys<T: DeserializeOwned>(
    map: &Map<String, Value>,
    known: &[&str],
    engine: &str,
) -> Result<T, EngineError> {
    if let Some(k) = map.keys().find(|k| !known.contains(&k.as_str())) {
        return Err(unknown_key(k, known, engine));
    }
    let value = Value::Object(map.clone());
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        EngineError::invalid(field(&path), e.into_inner().to_string())
    })
}

/// Serde for optional values written by name (`Display`) and read back by name (`FromStr`), the
/// same way in JSON and in bincode.
mod by_name {
    use super::*;

    pub(super) fn serialize<T: Display, S: Serializer>(v: &Option<T>, s: S) -> Result<S::Ok, S::Error> {
        v.as_ref().map(ToString::to_string).serialize(s)
    }

    pub(super) fn deserialize<'de, T, D>(d: D) -> Result<Option<T>, D::Error>
    where
        T: FromStr,
        T::Err: Display,
        D: Deserializer<'de>,
    {
        Option::<String>::deserialize(d)?
            .map(|s| s.parse().map_err(|e: T::Err| serde::de::Error::custom(e)))
            .transpose()
    }
}
