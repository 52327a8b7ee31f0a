//! A mock engine for tests of the cluster: no weights, no tensors, deterministic output.
//!
//! What makes it useful is that everything the cluster relies on is real:
//! - output tokens are a pure function of the prompt's token ids, so a prompt gives the same
//!   text on every replica, and through prefill/decode the same text as on one replica;
//! - the KV cache is a real paged cache in the layout `engine_config` asks for, whose values
//!   are a pure function of (token, position, layer, K|V, head, dim); pages are exported by
//!   the transfer crate's gather and imported by its scatter, and an import is checked against
//!   what the engine would have computed, so a page that moved wrong fails the request;
//! - blocks are counted, pinned and freed as the native engine does, so leaks show in stats;
//! - faults are injected by `engine_config` ([`xinf_engine::MockFaults`]): refuse at
//!   admission, fail a stream after N tokens, stall page exports, slow every token.
//!
//! It is registered by tests only; the binary never offers it.
//!
//! ```
//! use xinf_engine::{EngineLoader, ModelSource};
//! use xinf_engine_mock::MockLoader;
//!
//! let loader = MockLoader::named("native").knowing(&["smollm2-instruct"]);
//! assert!(loader.check_model(&ModelSource { model_name: "smollm2-instruct".into(), ..Default::default() }).is_ok());
//! assert!(loader.check_model(&ModelSource { model_name: "other".into(), ..Default::default() }).is_err());
//! ```

mod engine;
mod kv;

pub use engine::MockEngine;

use serde_json::{Map, Value};
use std::sync::Arc;
use xinf_engine::{Engine, EngineConfig, EngineError, EngineLoader, MockConfig, ModelSource};

/// The mock engine's [`EngineLoader`]. It may stand in under another engine's name (a test of
/// launch rules that reads as users see them), and knows either every model name or a list.
#[derive(Debug, Clone)]
pub struct MockLoader {
    name: String,
    models: Vec<String>,
    gpu_only: bool,
    no_pd: bool,
    imports_only: bool,
}

impl Default for MockLoader {
    fn default() -> Self {
        Self::named("mock")
    }
}

impl MockLoader {
    /// A mock engine registered as `name`, knowing every model name.
    pub fn named(name: &str) -> Self {
        Self { name: name.to_owned(), models: Vec::new(), gpu_only: false, no_pd: false, imports_only: false }
    }

    /// Stands in for an engine that serves ordinary replicas only (no prefill/decode roles).
    pub fn ordinary_only(mut self) -> Self {
        self.no_pd = true;
        self
    }

    /// Stands in for an engine that computes only on a GPU (as vLLM and SGLang do): launches
    /// must place it on one.
    pub fn gpu_only(mut self) -> Self {
        self.gpu_only = true;
        self
    }

    /// Stands in for an engine whose decode replicas only continue handed-off prompts (as
    /// SGLang's decode mode does): they cannot compute a prompt themselves.
    pub fn decode_imports_only(mut self) -> Self {
        self.imports_only = true;
        self
    }

    /// Knows only these model names (and any `model_path`).
    pub fn knowing(mut self, models: &[&str]) -> Self {
        self.models = models.iter().map(|m| (*m).to_owned()).collect();
        self
    }
}

impl EngineLoader for MockLoader {
    fn name(&self) -> &str {
        &self.name
    }

    fn needs_gpu(&self) -> bool {
        self.gpu_only
    }

    fn serves_pd(&self) -> bool {
        !self.no_pd
    }

    fn decode_computes_prompts(&self) -> bool {
        !self.imports_only
    }

    fn check_model(&self, model: &ModelSource) -> Result<(), EngineError> {
        let has_path = model.model_path.as_deref().is_some_and(|p| !p.trim().is_empty());
        if has_path
            || self.models.is_empty()
            || self.models.iter().any(|m| m.eq_ignore_ascii_case(&model.model_name))
        {
            return Ok(());
        }
        Err(EngineError::UnknownModel { name: model.model_name.clone(), known: self.models.clone() })
    }

    fn check_config(&self, config: &Map<String, Value>) -> Result<EngineConfig, EngineError> {
        MockConfig::from_map(config).map(EngineConfig::Mock)
    }

    fn host_memory(&self, _model: &ModelSource, config: &EngineConfig) -> Result<Option<u64>, EngineError> {
        let EngineConfig::Mock(config) = config else { return Ok(None) };
        Ok(Some(engine::host_bytes(config)))
    }

    fn load(&self, model: &ModelSource, config: &EngineConfig) -> Result<Arc<dyn Engine>, EngineError> {
        let EngineConfig::Mock(config) = config else {
            return Err(EngineError::Internal("the mock engine was given another engine's options".into()));
        };
        // No weights are read, but a path given must exist, as for a real engine.
        if let Some(path) = model.model_path.as_deref() {
            std::fs::metadata(path).map_err(|e| EngineError::Model(format!("I/O error on {path}: {e}")))?;
        }
        Ok(Arc::new(MockEngine::new(&model.model_name, config)?))
    }
}

#[cfg(test)]
mod tests;
