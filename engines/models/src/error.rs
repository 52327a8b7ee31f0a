//! Errors of model resolution and loading.

/// Why a model could not be found, fetched or loaded. Each variant names the file, field or
/// source at fault.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    /// The registry has no family of that name.
    #[error("unknown model `{name}`; known models: {known}")]
    UnknownModel {
        /// The requested name.
        name: String,
        /// Comma-separated known names.
        known: String,
    },
    /// The family has no such size / format / quantization.
    #[error("model `{name}` has no {field} `{value}`; available: {available}")]
    UnknownVariant {
        /// The family.
        name: String,
        /// `size_in_billions`, `model_format` or `quantization`.
        field: &'static str,
        /// The requested value.
        value: String,
        /// What exists.
        available: String,
    },
    /// A path that should exist does not.
    #[error("model path `{0}` does not exist")]
    MissingPath(String),
    /// A required file is missing from a model folder.
    #[error("`{file}` is missing from the model folder `{dir}`")]
    MissingFile {
        /// The folder.
        dir: String,
        /// The file name.
        file: String,
    },
    /// A file exists but cannot be parsed.
    #[error("cannot read `{file}`: {reason}")]
    Corrupt {
        /// The file.
        file: String,
        /// What went wrong.
        reason: String,
    },
    /// The model uses something this engine does not implement.
    #[error("unsupported model: `{field}` = {value} ({reason})")]
    Unsupported {
        /// The config field, as in config.json or GGUF metadata.
        field: String,
        /// Its value.
        value: String,
        /// What is supported.
        reason: String,
    },
    /// Weights are not available locally and may not be downloaded.
    #[error("model `{what}` is not in the local cache and downloads are disabled ({why})")]
    Offline {
        /// The repository or package.
        what: String,
        /// Which setting forbids downloading.
        why: String,
    },
    /// A download failed.
    #[error("downloading `{what}` failed: {reason}")]
    Download {
        /// The repository, file or package.
        what: String,
        /// The cause.
        reason: String,
    },
    /// A downloaded file does not have the expected digest.
    #[error("`{file}` has sha256 {actual}, expected {expected}; the download is discarded")]
    Digest {
        /// The file.
        file: String,
        /// Expected hex digest.
        expected: String,
        /// Actual hex digest.
        actual: String,
    },
    /// The tokenizer or chat template failed.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// Rendering the chat template failed (including the template's own `raise_exception`).
    #[error("chat template: {0}")]
    Template(String),
    /// An I/O error on a named path.
    #[error("I/O error on `{path}`: {source}")]
    Io {
        /// The path.
        path: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

impl ModelError {
    /// Wraps an I/O error with its path.
    pub fn io(path: impl AsRef<std::path::Path>, source: std::io::Error) -> Self {
        Self::Io { path: path.as_ref().display().to_string(), source }
    }
}

/// What a replica's launch reports: a failed download (or one that arrived corrupt) may work
/// when tried again (HTTP 503); every other model error needs the launch changed (HTTP 400).
impl From<ModelError> for xinf_engine::EngineError {
    fn from(e: ModelError) -> Self {
        match e {
            ModelError::Download { .. } | ModelError::Digest { .. } => Self::Fetch(e.to_string()),
            other => Self::Model(other.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use xinf_engine::{EngineError, ErrorClass};

    #[test]
    fn only_failed_downloads_are_worth_retrying() {
        let retry = EngineError::from(ModelError::Download { what: "m".into(), reason: "timed out".into() });
        assert_eq!((retry.class(), retry.code()), (ErrorClass::Unavailable, "model_fetch_failed"));
        let fix = EngineError::from(ModelError::MissingPath("/nowhere".into()));
        assert_eq!((fix.class(), fix.code()), (ErrorClass::InvalidInput, "model_error"));
        let corrupt =
            EngineError::from(ModelError::Corrupt { file: "m.gguf".into(), reason: "bad magic".into() });
        assert_eq!(corrupt.class(), ErrorClass::InvalidInput);
    }
}
