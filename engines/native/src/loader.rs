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
        if has_path {
            return Ok(());
        }
        let Some(family) = xinf_models::find_family(&model.model_name) else {
            return Err(EngineError::UnknownModel {
                name: model.model_name.clone(),
                known: xinf_models::families().iter().map(|f| f.name.to_owned()).collect(),
            });
        };
        // A size, format or quantization the registry lacks is refused now, naming the field,
        // not when a worker loads.
        match xinf_models::select_variant(family, &request(model)) {
            Ok(_) => Ok(()),
            Err(e @ xinf_models::ModelError::UnknownVariant { field, .. }) => {
                let field = if field == "size_in_billions" { "model_size_in_billions" } else { field };
                Err(EngineError::invalid(field, e.to_string()))
            }
            Err(e) => Err(EngineError::from(e)),
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn source(size: Option<&str>, format: Option<&str>, quantization: Option<&str>) -> ModelSource {
        ModelSource {
            model_name: "smollm2-instruct".into(),
            size_in_billions: size.map(Into::into),
            model_format: format.map(Into::into),
            quantization: quantization.map(Into::into),
            model_path: None,
        }
    }

    /// The field of the error, or what else came back.
    fn field(r: Result<(), EngineError>) -> String {
        match r {
            Err(EngineError::InvalidRequest { field, .. }) => field,
            other => format!("{other:?}"),
        }
    }

    #[test]
    fn a_variant_the_registry_lacks_is_refused_naming_its_field() {
        let l = NativeLoader;
        assert!(l.check_model(&source(None, None, None)).is_ok());
        assert!(l.check_model(&source(None, Some(""), Some(" "))).is_ok(), "blank means any");
        assert_eq!(field(l.check_model(&source(Some("999"), None, None))), "model_size_in_billions");
        assert_eq!(field(l.check_model(&source(None, Some("exe"), None))), "model_format");
        assert_eq!(field(l.check_model(&source(None, None, Some("Q9")))), "quantization");
        let unknown = ModelSource { model_name: "no-such-model".into(), ..source(None, None, None) };
        assert!(matches!(l.check_model(&unknown), Err(EngineError::UnknownModel { .. })));
    }
}
