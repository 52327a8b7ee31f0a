//! Content digests of weight files, cached by path, size and modification time, so that a
//! multi-gigabyte model is hashed once, not at every launch.

use crate::ModelError;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

/// The directory xinf keeps its caches in: `$XINF_HOME`, else `~/.xinf`.
pub fn xinf_home() -> PathBuf {
    if let Some(h) = std::env::var_os("XINF_HOME").filter(|h| !h.is_empty()) {
        return PathBuf::from(h);
    }
    std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(std::env::temp_dir).join(".xinf")
}

fn file_key(path: &Path) -> Result<String, ModelError> {
    let meta = std::fs::metadata(path).map_err(|e| ModelError::io(path, e))?;
    let mtime = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let canon = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    Ok(format!("{}|{}|{}", canon.display(), meta.len(), mtime))
}

fn hash_file(path: &Path) -> Result<String, ModelError> {
    let mut f = std::fs::File::open(path).map_err(|e| ModelError::io(path, e))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(|e| ModelError::io(path, e))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(format!("{:x}", h.finalize()))
}

/// One hex digest over the contents of `files` (in the given order).
///
/// Per-file digests are cached in `<xinf home>/digests.json`; a file whose size or mtime changed
/// is hashed again. A cache that cannot be read or written only costs time.
pub fn weights_digest(files: &[PathBuf]) -> Result<String, ModelError> {
    let cache_path = xinf_home().join("digests.json");
    let mut cache: BTreeMap<String, String> = std::fs::read_to_string(&cache_path)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_default();
    let mut changed = false;
    let mut total = Sha256::new();
    for f in files {
        let key = file_key(f)?;
        let d = match cache.get(&key) {
            Some(d) => d.clone(),
            None => {
                let d = hash_file(f)?;
                cache.insert(key, d.clone());
                changed = true;
                d
            }
        };
        total.update(d.as_bytes());
    }
    if changed {
        let tmp = cache_path.with_extension("json.tmp");
        let ok = std::fs::create_dir_all(xinf_home()).is_ok()
            && serde_json::to_string(&cache).ok().is_some_and(|t| std::fs::write(&tmp, t).is_ok());
        if ok {
            let _ = std::fs::rename(&tmp, &cache_path);
        }
    }
    Ok(format!("{:x}", total.finalize()))
}

/// The weight files of a Hugging Face folder, in shard order.
pub fn safetensors_files(dir: &Path) -> Result<Vec<std::path::PathBuf>, ModelError> {
    let single = dir.join("model.safetensors");
    if single.is_file() {
        return Ok(vec![single]);
    }
    let index = dir.join("model.safetensors.index.json");
    if !index.is_file() {
        return Err(ModelError::MissingFile {
            dir: dir.display().to_string(),
            file: "model.safetensors".into(),
        });
    }
    let text = std::fs::read_to_string(&index).map_err(|e| ModelError::io(&index, e))?;
    let v: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| ModelError::Corrupt { file: index.display().to_string(), reason: e.to_string() })?;
    let map = v.get("weight_map").and_then(|m| m.as_object()).ok_or_else(|| ModelError::Corrupt {
        file: index.display().to_string(),
        reason: "no weight_map".into(),
    })?;
    let mut shards: Vec<String> = map.values().filter_map(|s| s.as_str().map(str::to_owned)).collect();
    shards.sort();
    shards.dedup();
    shards
        .into_iter()
        .map(|s| {
            let p = dir.join(&s);
            if p.is_file() {
                Ok(p)
            } else {
                Err(ModelError::MissingFile { dir: dir.display().to_string(), file: s })
            }
        })
        .collect()
}
