//! Weights given as an explicit `model_path`: a GGUF file, a Hugging Face folder, or a folder
//! holding exactly one GGUF file.

use std::ffi::OsStr;
use std::fs::{self, File};
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use super::WeightsFormat;
use crate::error::ModelError;

/// The weights of an explicit `model_path`.
pub(super) fn from_model_path(path: &Path) -> Result<(WeightsFormat, PathBuf), ModelError> {
    let meta = match fs::metadata(path) {
        Ok(meta) => meta,
        Err(err) if err.kind() == io::ErrorKind::NotFound => {
            return Err(ModelError::MissingPath(path.display().to_string()));
        }
        Err(err) => return Err(ModelError::io(path, err)),
    };
    if meta.is_file() {
        return if is_gguf_file(path)? {
            Ok((WeightsFormat::Gguf, path.to_path_buf()))
        } else {
            Err(ModelError::Unsupported {
                field: "model_path".to_owned(),
                value: path.display().to_string(),
                reason: "a file must be a GGUF file; give a Hugging Face model as its folder".to_owned(),
            })
        };
    }
    if path.join("config.json").is_file() {
        return Ok((WeightsFormat::Safetensors, path.to_path_buf()));
    }
    let mut ggufs = Vec::new();
    for entry in fs::read_dir(path).map_err(|err| ModelError::io(path, err))? {
        let entry = entry.map_err(|err| ModelError::io(path, err))?;
        let candidate = entry.path();
        if has_extension(&candidate, "gguf") && candidate.is_file() {
            ggufs.push(candidate);
        }
    }
    ggufs.sort();
    match ggufs.len() {
        0 => Err(ModelError::MissingFile {
            dir: path.display().to_string(),
            file: "config.json (or a single .gguf file)".to_owned(),
        }),
        1 => Ok((WeightsFormat::Gguf, ggufs.remove(0))),
        _ => Err(ModelError::Unsupported {
            field: "model_path".to_owned(),
            value: path.display().to_string(),
            reason: format!(
                "the folder holds several GGUF files ({}); give the path of one of them",
                ggufs
                    .iter()
                    .filter_map(|p| p.file_name())
                    .map(|n| n.to_string_lossy())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }),
    }
}

/// Whether `path` ends in `.ext` (ASCII case-insensitive).
pub(super) fn has_extension(path: &Path, ext: &str) -> bool {
    path.extension().and_then(OsStr::to_str).is_some_and(|e| e.eq_ignore_ascii_case(ext))
}

/// A GGUF file by name, or by its `GGUF` magic for files named otherwise.
fn is_gguf_file(path: &Path) -> Result<bool, ModelError> {
    if has_extension(path, "gguf") {
        return Ok(true);
    }
    let mut magic = [0u8; 4];
    let mut file = File::open(path).map_err(|err| ModelError::io(path, err))?;
    match file.read_exact(&mut magic) {
        Ok(()) => Ok(&magic == b"GGUF"),
        Err(err) if err.kind() == io::ErrorKind::UnexpectedEof => Ok(false),
        Err(err) => Err(ModelError::io(path, err)),
    }
}
