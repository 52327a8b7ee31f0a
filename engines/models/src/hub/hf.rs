//! Hugging Face model repositories: the local cache laid out as `huggingface_hub` writes it,
//! and downloads from the hub into that same cache, so that Python tools and xinf share it.

use std::collections::BTreeSet;
use std::fs;
use std::io;
use std::path::{Component, Path, PathBuf};

use hf_hub::Repo;
use hf_hub::api::sync::{ApiBuilder, ApiRepo};
use tracing::{debug, info, warn};

use super::env::ResolveEnv;
use crate::error::ModelError;

/// Files every safetensors model folder needs besides its weights.
const HF_REQUIRED: [&str; 2] = ["config.json", "tokenizer.json"];
/// Single-file safetensors weights.
pub(super) const HF_WEIGHTS: &str = "model.safetensors";
/// The index of sharded safetensors weights.
pub(super) const HF_INDEX: &str = "model.safetensors.index.json";

/// An error for a missing cache directory, naming the settings that would provide one.
fn no_cache_dir(what: &str, settings: &str) -> ModelError {
    ModelError::io(
        what,
        io::Error::new(io::ErrorKind::NotFound, format!("cannot find the home directory; set {settings}")),
    )
}

/// A Hugging Face model repository from the local cache, else from the hub.
pub(super) fn from_hf(
    env: &ResolveEnv,
    repo_id: &str,
    file: Option<&str>,
) -> Result<(PathBuf, &'static str), ModelError> {
    let root = env
        .hf_cache
        .as_deref()
        .ok_or_else(|| no_cache_dir("the Hugging Face cache", "HF_HOME or HF_HUB_CACHE"))?;
    if let Some(snapshot) = hf_snapshot(root, repo_id) {
        match check_snapshot(&snapshot, file)? {
            Ok(path) => return Ok((path, "hf-cache")),
            Err(missing) => debug!(repo_id, %missing, "the cached snapshot is incomplete"),
        }
    }
    if let Some(why) = &env.offline {
        return Err(ModelError::Offline { what: repo_id.to_owned(), why: why.clone() });
    }
    Ok((download_hf(env, root, repo_id, file)?, "hf-hub"))
}

/// The snapshot folder `refs/main` points at, laid out as `huggingface_hub` and `hf-hub` write
/// it: `<root>/models--Org--Name/{refs/main, snapshots/<commit>/…}`.
pub(super) fn hf_snapshot(root: &Path, repo_id: &str) -> Option<PathBuf> {
    let repo_dir = root.join(Repo::model(repo_id.to_owned()).folder_name());
    let commit = fs::read_to_string(repo_dir.join("refs").join("main")).ok()?;
    let commit = commit.trim();
    if !is_plain_name(commit) {
        return None;
    }
    let dir = repo_dir.join("snapshots").join(commit);
    dir.is_dir().then_some(dir)
}

/// Whether `name` is one relative path component, so joining it cannot leave its folder.
fn is_plain_name(name: &str) -> bool {
    let mut components = Path::new(name).components();
    matches!((components.next(), components.next()), (Some(Component::Normal(_)), None))
        && !name.contains(['/', '\\'])
}

/// Whether a snapshot holds everything the model needs. `Ok(Ok(path))` gives the path to load
/// (the GGUF file, or the folder); `Ok(Err(file))` names the first missing file.
pub(super) fn check_snapshot(dir: &Path, file: Option<&str>) -> Result<Result<PathBuf, String>, ModelError> {
    if let Some(file) = file {
        let path = dir.join(file);
        return Ok(if path.is_file() { Ok(path) } else { Err(file.to_owned()) });
    }
    for required in HF_REQUIRED {
        if !dir.join(required).is_file() {
            return Ok(Err(required.to_owned()));
        }
    }
    if dir.join(HF_WEIGHTS).is_file() {
        return Ok(Ok(dir.to_path_buf()));
    }
    let index = dir.join(HF_INDEX);
    if !index.is_file() {
        return Ok(Err(HF_WEIGHTS.to_owned()));
    }
    for shard in shard_names(&index)? {
        if !dir.join(&shard).is_file() {
            return Ok(Err(shard));
        }
    }
    Ok(Ok(dir.to_path_buf()))
}

/// The distinct shard files listed in a safetensors index's `weight_map`, sorted.
pub(super) fn shard_names(index: &Path) -> Result<Vec<String>, ModelError> {
    let corrupt = |reason: String| ModelError::Corrupt { file: index.display().to_string(), reason };
    let text = fs::read_to_string(index).map_err(|err| ModelError::io(index, err))?;
    let parsed: SafetensorsIndex = serde_json::from_str(&text).map_err(|err| corrupt(err.to_string()))?;
    let mut shards = BTreeSet::new();
    for shard in parsed.weight_map.into_values() {
        if !is_plain_name(&shard) {
            return Err(corrupt(format!("shard `{shard}` is not a plain file name")));
        }
        shards.insert(shard);
    }
    if shards.is_empty() {
        return Err(corrupt("`weight_map` is empty".to_owned()));
    }
    Ok(shards.into_iter().collect())
}

/// The part of `model.safetensors.index.json` that says which shard files exist.
#[derive(serde::Deserialize)]
struct SafetensorsIndex {
    /// Tensor name to shard file name.
    weight_map: std::collections::BTreeMap<String, String>,
}

/// Downloads a repository's files into the Hugging Face cache and returns the loadable path.
fn download_hf(
    env: &ResolveEnv,
    root: &Path,
    repo_id: &str,
    file: Option<&str>,
) -> Result<PathBuf, ModelError> {
    let failed = |what: &str, err: &dyn std::fmt::Display| ModelError::Download {
        what: what.to_owned(),
        reason: err.to_string(),
    };
    // `from_env` honours HF_ENDPOINT and the token file under HF_HOME; the cache folder is
    // set explicitly so that HF_HUB_CACHE is honoured too and lookups and downloads agree.
    let mut builder = ApiBuilder::from_env().with_cache_dir(root.to_path_buf()).with_progress(env.progress);
    if let Some(token) = &env.hf_token {
        builder = builder.with_token(Some(token.clone()));
    }
    let api = builder.build().map_err(|err| failed(repo_id, &err))?;
    let repo = api.model(repo_id.to_owned());
    info!(repo_id, "downloading from the Hugging Face hub");

    let fetch = |name: &str| -> Result<PathBuf, ModelError> {
        repo.get(name).map_err(|err| failed(&format!("{repo_id}/{name}"), &err))
    };
    if let Some(file) = file {
        return fetch(file);
    }

    let listing = repo.info().map_err(|err| failed(repo_id, &err))?;
    let present: BTreeSet<&str> = listing.siblings.iter().map(|s| s.rfilename.as_str()).collect();
    // Two passes: a file taken from an older cached snapshot and files fetched into the newest
    // one can end up in different folders when the repository changed upstream; the second
    // pass fills the newest snapshot, which `refs/main` then points at.
    for _ in 0..2 {
        fetch_safetensors_files(&repo, &present, repo_id, &fetch)?;
        if let Some(snapshot) = hf_snapshot(root, repo_id)
            && let Ok(dir) = check_snapshot(&snapshot, None)?
        {
            return Ok(dir);
        }
    }
    Err(ModelError::Download {
        what: repo_id.to_owned(),
        reason: format!("the files did not land in one complete snapshot under `{}`", root.display()),
    })
}

/// Fetches the files of a safetensors model folder (each from the cache when it is there).
fn fetch_safetensors_files(
    repo: &ApiRepo,
    present: &BTreeSet<&str>,
    repo_id: &str,
    fetch: &dyn Fn(&str) -> Result<PathBuf, ModelError>,
) -> Result<(), ModelError> {
    for name in HF_REQUIRED.into_iter().chain(["tokenizer_config.json"]) {
        fetch(name)?;
    }
    if present.contains("generation_config.json") {
        // Optional: only sampling defaults live there.
        if let Err(err) = repo.get("generation_config.json") {
            warn!(repo_id, %err, "cannot fetch generation_config.json; using default sampling settings");
        }
    }
    if present.contains(HF_WEIGHTS) {
        fetch(HF_WEIGHTS)?;
    } else if present.contains(HF_INDEX) {
        let index = fetch(HF_INDEX)?;
        for shard in shard_names(&index)? {
            fetch(&shard)?;
        }
    } else {
        return Err(ModelError::Download {
            what: repo_id.to_owned(),
            reason: format!("the repository has neither {HF_WEIGHTS} nor {HF_INDEX}"),
        });
    }
    Ok(())
}
