//! The native engine behind the cluster's engine seam: models from the registry or a path,
//! options from [`NativeConfig`].

use crate::{EngineOptions, NativeEngine};
use serde_json::{Map, Value};
use std::sync::Arc;
use xinf_engine::{Engine, EngineConfig, EngineError, EngineLoader, ModelSource, NativeConfig};
use xinf_models::ModelRequest;

/// The native engine's [`EngineLoader`], named `native`.
#[derive(Debug, Clone, Copy, Default)]
pub struct NativeLoader;

/// The hub request for a launch's model.
fn request(model: &ModelSource) -> ModelRequest {
    ModelRequest {
        model_name: model.model_name.clone(),
        size_in_billions: model.size_in_billions.clone(),
        model_format: model.model_format.clone(),
        quantization: model.quantization.clone(),
        model_path: model.model_path.as_ref().map(Into::into),
    }
}

impl EngineLoader for NativeLoader {
    fn name(&self) -> &str {
        "native"
    }

    fn check_model(&self, model: &ModelSource) -> Result<(), EngineError> {
        let has_path = model.model_path.as_deref().is_some_and(|p| !p.trim().is_empty());
        if has_path || xinf_models::find_family(&model.model_name).is_some() {
            return Ok(());
        }
        Err(EngineError::UnknownModel {
            name: model.model_name.clone(),
            known: xinf_models::families().iter().map(|f| f.name.to_owned()).collect(),
        })
    }

    fn check_config(&self, config: &Map<String, Value>) -> Result<EngineConfig, EngineError> {
        NativeConfig::from_map(config).map(EngineConfig::Native)
    }

    fn host_memory(&self, model: &ModelSource, config: &EngineConfig) -> Result<Option<u64>, EngineError> {
        let EngineConfig::Native(config) = config else { return Ok(None) };
        let options = EngineOptions::from_config(config);
        if options.device != crate::options::ComputeDevice::Cpu {
            return Ok(None);
        }
        let resolved = xinf_models::resolve(&request(model)).map_err(EngineError::from)?;
        let (cfg, weights) = crate::engine::cpu_weights(&resolved, &options)?;
        Ok(Some(crate::memory::host_bytes(weights, &cfg, &options)))
    }

    fn load(&self, model: &ModelSource, config: &EngineConfig) -> Result<Arc<dyn Engine>, EngineError> {
        let EngineConfig::Native(config) = config else {
            return Err(EngineError::Internal("the native engine was given another engine's options".into()));
        };
        let resolved = xinf_models::resolve(&request(model)).map_err(EngineError::from)?;
        let engine = NativeEngine::load(&resolved, EngineOptions::from_config(config))?;
        Ok(Arc::new(engine))
    }
}
