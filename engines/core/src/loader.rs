//! The seam between the cluster and its engines: a launch names an engine (`model_engine`), the
//! cluster finds its [`EngineLoader`] in the node's [`Engines`], checks the model and the
//! options with it before anything starts, and a worker loads the replica's engine with it.
//!
//! The cluster itself knows no engine: the binary (or an embedding program) registers the ones
//! it offers, and tests register the mock engine.

use crate::config::EngineConfig;
use crate::{Engine, EngineError};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::sync::Arc;

/// Where a replica's weights come from, as a launch names them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelSource {
    /// A registry family, or any name when `model_path` is given.
    pub model_name: String,
    /// `model_size_in_billions`, as text (`"0_5"`).
    pub size_in_billions: Option<String>,
    /// `pytorch` or `ggufv2`.
    pub model_format: Option<String>,
    /// `none` or a GGUF quantization.
    pub quantization: Option<String>,
    /// Local weights instead of the registry.
    pub model_path: Option<String>,
}

/// One engine kind, as the cluster sees it.
pub trait EngineLoader: Send + Sync {
    /// The `model_engine` name (lowercase; launches may spell it in any case).
    fn name(&self) -> &str;

    /// Whether prefill/decode replicas can run on it (it implements the handoff hooks of
    /// [`Engine`]).
    fn serves_pd(&self) -> bool {
        true
    }

    /// Whether a decode replica of this engine can also compute a prompt itself, so that a P/D
    /// model may leave its short prompts to the decode replica (`max_local_prefill_tokens`)
    /// instead of handing their KV over. SGLang's decode mode cannot: it takes every prompt's
    /// KV from a prefill server.
    fn decode_computes_prompts(&self) -> bool {
        true
    }

    /// Checks that the model exists for this engine (a registry name, or a path), without
    /// reading weights: [`EngineError::UnknownModel`] names the known ones.
    fn check_model(&self, model: &ModelSource) -> Result<(), EngineError>;

    /// Whether the engine computes only on a GPU: a replica placed on no GPU is refused at
    /// launch instead of failing to load.
    fn needs_gpu(&self) -> bool {
        false
    }

    /// Reads a replica's `engine_config` object into this engine's typed options, refusing
    /// unknown keys and bad values naming the key.
    fn check_config(&self, config: &Map<String, Value>) -> Result<EngineConfig, EngineError>;

    /// The host memory, in bytes, one replica of `model` with these options takes: its weights
    /// as held in host memory and, computing on the CPU, its KV cache. Workers add these up
    /// against their memory before loading a replica, so that a launch of more replicas than
    /// fit is refused instead of swapping the node to death. Blocking (it may read the model's
    /// metadata, resolving its files as a load would); `None` where the engine cannot tell or
    /// keeps the replica in GPU memory.
    fn host_memory(&self, _model: &ModelSource, _config: &EngineConfig) -> Result<Option<u64>, EngineError> {
        Ok(None)
    }

    /// Loads an engine for one replica. Blocking: it reads weights, and may download them.
    fn load(&self, model: &ModelSource, config: &EngineConfig) -> Result<Arc<dyn Engine>, EngineError>;
}

/// The engines a node offers, by name; the first is the default of launches that name none.
#[derive(Clone, Default)]
pub struct Engines(Arc<[Arc<dyn EngineLoader>]>);

impl std::fmt::Debug for Engines {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.names()).finish()
    }
}

impl Engines {
    /// These engines, the first the default.
    pub fn new(loaders: Vec<Arc<dyn EngineLoader>>) -> Self {
        Self(loaders.into())
    }

    /// The engine of this name (case-insensitive).
    pub fn get(&self, name: &str) -> Option<&Arc<dyn EngineLoader>> {
        self.0.iter().find(|l| l.name().eq_ignore_ascii_case(name))
    }

    /// The default engine, if any is registered.
    pub fn default_engine(&self) -> Option<&Arc<dyn EngineLoader>> {
        self.0.first()
    }

    /// The registered engines, default first.
    pub fn loaders(&self) -> impl Iterator<Item = &Arc<dyn EngineLoader>> {
        self.0.iter()
    }

    /// The registered names, default first.
    pub fn names(&self) -> Vec<&str> {
        self.loaders().map(|l| l.name()).collect()
    }
}
