//! What resolution takes from the process environment, read in one place and once, so that
//! everything after it is a function of its inputs.

use std::ffi::OsString;
use std::io::{self, IsTerminal};
use std::path::PathBuf;

/// Everything resolution takes from the process environment, gathered in one place so tests can
/// pass it explicitly instead of mutating the (process-wide, racy) environment.
pub(super) struct ResolveEnv {
    /// The Hugging Face hub cache root (the folder holding `models--Org--Name`).
    pub(super) hf_cache: Option<PathBuf>,
    /// The xinf cache folder (`$XINF_HOME` or `~/.xinf`).
    pub(super) xinf_home: PathBuf,
    /// The setting that forbids downloads, as `NAME=value`, if one does.
    pub(super) offline: Option<String>,
    /// The Python interpreter that runs pip.
    pub(super) python: OsString,
    /// Whether to draw progress bars (stderr is a terminal).
    pub(super) progress: bool,
    /// A Hugging Face token for gated repositories, overriding the token file.
    pub(super) hf_token: Option<String>,
}

impl ResolveEnv {
    /// Reads the environment, following the conventions of Python's `huggingface_hub` for the
    /// Hugging Face variables so that a cache filled by Python tools is found.
    pub(super) fn from_process_env() -> Self {
        let home = env_path("HOME").or_else(|| env_path("USERPROFILE"));
        let hf_home = env_path("HF_HOME")
            .or_else(|| env_path("XDG_CACHE_HOME").map(|cache| cache.join("huggingface")))
            .or_else(|| home.as_ref().map(|home| home.join(".cache").join("huggingface")));
        let hf_cache = env_path("HF_HUB_CACHE").or_else(|| hf_home.map(|hf_home| hf_home.join("hub")));
        let offline = ["XINF_OFFLINE", "HF_HUB_OFFLINE"].into_iter().find_map(|name| {
            let value = std::env::var(name).ok()?;
            is_truthy(&value).then(|| format!("{name}={value}"))
        });
        let python = std::env::var_os("XINF_PYTHON").filter(|python| !python.is_empty());
        let hf_token = std::env::var("HF_TOKEN")
            .ok()
            .map(|token| token.trim().to_owned())
            .filter(|token| !token.is_empty());
        Self {
            hf_cache,
            // One definition of the xinf cache folder for the whole crate.
            xinf_home: crate::xinf_home(),
            offline,
            python: python.unwrap_or_else(|| OsString::from("python3")),
            progress: io::stderr().is_terminal(),
            hf_token,
        }
    }
}

/// A non-empty environment variable as a path.
fn env_path(name: &str) -> Option<PathBuf> {
    std::env::var_os(name).filter(|value| !value.is_empty()).map(PathBuf::from)
}

/// Whether an `*_OFFLINE` value switches downloads off (`huggingface_hub` accepts these).
pub(super) fn is_truthy(value: &str) -> bool {
    let value = value.trim();
    ["1", "true", "yes"].iter().any(|truthy| value.eq_ignore_ascii_case(truthy))
}
