//! The launch keywords: top-level keys of a launch request that configure KV sharing and P/D
//! transfers, not the engine. They arrive mixed with the engine keywords in
//! [`LaunchRequest::extra`](super::request::LaunchRequest::extra) and are taken out of them
//! once, typed, before anything reads them.

use super::invalid;
use crate::error::{ActorError, LaunchRule};
use serde::Deserialize;
use serde::de::{self, DeserializeOwned, Deserializer};
use serde_json::{Map, Value};
use xinf_engine::Engines;

#[cfg(test)]
mod tests;

/// A transfer backend for P/D KV handoff.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum TransferBackend {
    Xavier,
    Nixl,
}

/// Named case-insensitively: `"NIXL"` names NIXL.
impl<'de> Deserialize<'de> for TransferBackend {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        if name.eq_ignore_ascii_case("xavier") {
            Ok(Self::Xavier)
        } else if name.eq_ignore_ascii_case("nixl") {
            Ok(Self::Nixl)
        } else {
            Err(de::Error::custom(format!("unknown transfer backend '{name}'")))
        }
    }
}

/// One launch keyword as given, and its value when it has the keyword's type.
///
/// A bad value does not fail the parse: it is kept, so that it is refused with its own
/// keyword's rule and message, in the order the launch rules are checked (serde would stop at
/// the first bad key, with its own text). `null` is as good as absent, but is kept too: the two
/// names of the transfer backend are compared as given.
#[derive(Debug)]
struct Keyword<T> {
    /// The JSON value, when the key is present.
    given: Option<Value>,
    /// The value, when the given one has the type.
    value: Option<T>,
}

impl<T> Default for Keyword<T> {
    fn default() -> Self {
        Self { given: None, value: None }
    }
}

impl<'de, T: DeserializeOwned> Deserialize<'de> for Keyword<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let given = Value::deserialize(d)?;
        let value = T::deserialize(&given).ok();
        Ok(Self { given: Some(given), value })
    }
}

impl<T> Keyword<T> {
    /// `Ok(None)` when absent or `null`, the value when it has the type, else what was given.
    fn get(&self) -> Result<Option<&T>, &Value> {
        match (&self.given, &self.value) {
            (None | Some(Value::Null), _) => Ok(None),
            (Some(_), Some(value)) => Ok(Some(value)),
            (Some(given), None) => Err(given),
        }
    }
}

/// The names of the launch keywords: the top-level keys of a launch request that are not engine
/// options (a client that gathers options from flags puts these at the top level).
pub const LAUNCH_KEYWORDS: &[&str] = &[
    "enable_xavier",
    "transfer_backend_type",
    "vllm_transfer_backend_type",
    "xavier_cache_bytes",
    "xavier_gpu_cache_bytes",
    "reasoning_content",
    "enable_thinking",
    "request_limits",
    "max_local_prefill_tokens",
    "prefill_fallback",
];

/// The launch keywords of a request. Strict types: a boolean given as a number, a negative or
/// fractional byte count, a backend that is not a name, is refused.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct LaunchKeywords {
    /// Xavier KV sharing between replicas (P/D roles imply it, unless transfers use NIXL).
    enable_xavier: Keyword<bool>,
    /// The P/D transfer backend.
    transfer_backend_type: Keyword<TransferBackend>,
    /// The same, under the name Xinference's vLLM launches use.
    vllm_transfer_backend_type: Keyword<TransferBackend>,
    /// The CPU snapshot cache of each prefill replica.
    xavier_cache_bytes: Keyword<u64>,
    /// Xavier's GPU cache budget, in bytes (0 turns it off).
    xavier_gpu_cache_bytes: Keyword<u64>,
    /// Chat answers show the model's reasoning apart (Xinference's launch key).
    reasoning_content: Keyword<bool>,
    /// The chat template's `enable_thinking` for requests that leave it out.
    enable_thinking: Keyword<bool>,
    /// The most requests the model serves at once.
    request_limits: Keyword<u64>,
    /// P/D: prompts of at most this many tokens are computed by the decode replica itself.
    max_local_prefill_tokens: Keyword<u64>,
    /// P/D: while no prefill replica serves, decode replicas compute whole requests.
    prefill_fallback: Keyword<bool>,
}

/// A request's extra keys, split in one pass: the fields of [`LaunchKeywords`] are taken out
/// (serde's flattening hands a flattened struct exactly its own fields), and the rest are the
/// engine keywords. The struct's fields are thus the one list of launch keywords.
#[derive(Deserialize)]
struct Split {
    #[serde(flatten)]
    keywords: LaunchKeywords,
    #[serde(flatten)]
    engine: Map<String, Value>,
}

impl LaunchKeywords {
    /// Takes the launch keywords out of a request's extra keys; gives them and the engine
    /// keywords left.
    pub(super) fn take(extra: &Map<String, Value>) -> Result<(Self, Map<String, Value>), ActorError> {
        // Every keyword takes any JSON value, so this fails only if serde does.
        let split = Split::deserialize(Value::Object(extra.clone()))
            .map_err(|e| invalid(LaunchRule::InvalidField, e.to_string()))?;
        Ok((split.keywords, split.engine))
    }

    /// The P/D transfer backend, under either name; both names given must agree.
    pub(super) fn transfer(&self) -> Result<Option<TransferBackend>, ActorError> {
        let keyword = match (&self.transfer_backend_type.given, &self.vllm_transfer_backend_type.given) {
            (Some(a), Some(b)) if a != b => {
                return Err(invalid(
                    LaunchRule::UnknownTransferBackend,
                    "transfer_backend_type and vllm_transfer_backend_type disagree; give one of them",
                ));
            }
            (Some(_), _) => &self.transfer_backend_type,
            (None, _) => &self.vllm_transfer_backend_type,
        };
        keyword.get().map(Option::<&TransferBackend>::copied).map_err(|other| {
            let shown = other.as_str().map_or_else(|| other.to_string(), str::to_owned);
            invalid(
                LaunchRule::UnknownTransferBackend,
                format!("Unknown transfer backend: '{shown}'; use xavier or nixl"),
            )
        })
    }

    /// `enable_xavier`, false when absent.
    pub(super) fn enable_xavier(&self) -> Result<bool, ActorError> {
        match self.enable_xavier.get() {
            Ok(on) => Ok(on.copied().unwrap_or_default()),
            Err(_) => {
                Err(invalid(LaunchRule::InvalidField, "enable_xavier must be a boolean").at("enable_xavier"))
            }
        }
    }

    /// `xavier_gpu_cache_bytes`, when given: any integer ≥ 0.
    pub(super) fn gpu_cache_bytes(&self) -> Result<Option<u64>, ActorError> {
        self.xavier_gpu_cache_bytes.get().map(Option::<&u64>::copied).map_err(|_| {
            invalid(LaunchRule::CacheBudget, "xavier_gpu_cache_bytes must be a non-negative integer")
                .at("xavier_gpu_cache_bytes")
        })
    }

    /// `xavier_cache_bytes`, when given: an integer ≥ 1 (a snapshot cache of no bytes is no
    /// cache, and is refused rather than ignored).
    pub(super) fn cache_bytes(&self) -> Result<Option<u64>, ActorError> {
        match self.xavier_cache_bytes.get() {
            Ok(None) => Ok(None),
            Ok(Some(bytes)) if *bytes > 0 => Ok(Some(*bytes)),
            _ => Err(invalid(LaunchRule::CacheBudget, "xavier_cache_bytes must be a positive integer")
                .at("xavier_cache_bytes")),
        }
    }

    /// `request_limits`, when given: an integer from 1 to 2³² − 1.
    pub(super) fn request_limit(&self) -> Result<Option<u32>, ActorError> {
        match self.request_limits.get() {
            Ok(None) => Ok(None),
            Ok(Some(n)) if *n > 0 => u32::try_from(*n).map(Some).map_err(|_| request_limits_invalid()),
            _ => Err(request_limits_invalid()),
        }
    }

    /// The chat settings: `reasoning_content` (false when absent) and `enable_thinking`, each a
    /// boolean or `null`.
    pub(super) fn chat(&self, model_name: &str) -> Result<crate::ChatDefaults, ActorError> {
        let flag = |k: &Keyword<bool>, name: &str| {
            k.get()
                .map(Option::<&bool>::copied)
                .map_err(|_| invalid(LaunchRule::InvalidField, format!("{name} must be a boolean")).at(name))
        };
        Ok(crate::ChatDefaults {
            model_name: model_name.to_owned(),
            reasoning_content: flag(&self.reasoning_content, "reasoning_content")?.unwrap_or_default(),
            enable_thinking: flag(&self.enable_thinking, "enable_thinking")?,
        })
    }
}

/// The longest prompt `max_local_prefill_tokens` may leave to a decode replica: beyond any
/// context length a model has, so the bound refuses only a typing slip.
const MAX_LOCAL_PREFILL_TOKENS: u64 = 1 << 24;

impl LaunchKeywords {
    /// `max_local_prefill_tokens` (0 when absent): allowed in a P/D launch whose decode
    /// replicas all run an engine that can compute a prompt itself. `decoders`: each decode
    /// replica's index and engine.
    pub(super) fn local_prefill_tokens(
        &self,
        pd: bool,
        decoders: &[(usize, &str)],
        engines: &Engines,
    ) -> Result<u32, ActorError> {
        let Some(n) = self.local_prefill_limit()? else { return Ok(0) };
        decoders_compute("max_local_prefill_tokens", pd, n > 0, decoders, engines)?;
        Ok(n)
    }

    /// `prefill_fallback` (false when absent), allowed as `max_local_prefill_tokens` is.
    pub(super) fn prefill_fallback(
        &self,
        pd: bool,
        decoders: &[(usize, &str)],
        engines: &Engines,
    ) -> Result<bool, ActorError> {
        let on = match self.prefill_fallback.get() {
            Ok(None) => return Ok(false),
            Ok(Some(on)) => *on,
            Err(_) => {
                return Err(invalid(LaunchRule::InvalidField, "prefill_fallback must be a boolean")
                    .at("prefill_fallback"));
            }
        };
        decoders_compute("prefill_fallback", pd, on, decoders, engines)?;
        Ok(on)
    }

    /// `max_local_prefill_tokens`, when given: an integer from 0 (every prompt handed off) to
    /// 2²⁴.
    fn local_prefill_limit(&self) -> Result<Option<u32>, ActorError> {
        match self.max_local_prefill_tokens.get() {
            Ok(None) => Ok(None),
            Ok(Some(n)) if *n <= MAX_LOCAL_PREFILL_TOKENS => Ok(u32::try_from(*n).ok()),
            _ => Err(invalid(
                LaunchRule::InvalidField,
                format!("max_local_prefill_tokens must be an integer from 0 to {MAX_LOCAL_PREFILL_TOKENS}"),
            )
            .at("max_local_prefill_tokens")),
        }
    }
}

/// A P/D launch key `key` that has decode replicas compute prompts: when `on`, refused without
/// P/D roles, and with a decode replica whose engine cannot compute a prompt (it is named).
fn decoders_compute(
    key: &str,
    pd: bool,
    on: bool,
    decoders: &[(usize, &str)],
    engines: &Engines,
) -> Result<(), ActorError> {
    let refused = |why: String| Err(invalid(LaunchRule::InvalidField, why).at(key));
    // Off (0, false) is as good as absent.
    if !pd && on {
        return refused(format!("{key} requires prefill and decode replica roles"));
    }
    let imports_only = |engine: &str| engines.get(engine).is_some_and(|l| !l.decode_computes_prompts());
    match decoders.iter().find(|(_, engine)| imports_only(engine)) {
        Some((i, engine)) if on => refused(format!(
            "{key} needs decode replicas that can compute a prompt; replica_config[{i}] runs {engine}, \
             whose decode replicas only continue prompts a prefill replica hands them"
        )),
        _ => Ok(()),
    }
}

fn request_limits_invalid() -> ActorError {
    invalid(LaunchRule::InvalidField, "request_limits must be a positive integer").at("request_limits")
}
