//! Writing into the cache so that a failure at any point leaves nothing half-done: files are
//! written as `<name>.partial` and renamed into place, and downloads land in scratch folders
//! that are removed with their contents.

use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use tracing::{debug, warn};

use crate::error::ModelError;

/// `<path>.partial`: where a file is written before it is complete.
pub(super) fn partial_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".partial");
    PathBuf::from(name)
}

/// Holds `<dir>/.fetch.lock` exclusively until dropped: one fetch into `dir` at a time on
/// this host, whether the others are in this process (replicas loading together) or in
/// another. Blocks until the lock is free.
pub(super) fn fetch_lock(dir: &Path) -> Result<File, ModelError> {
    let path = dir.join(".fetch.lock");
    let file = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|err| ModelError::io(&path, err))?;
    file.lock().map_err(|err| ModelError::io(&path, err))?;
    Ok(file)
}

/// Makes a rename durable. Best effort: not every platform can open a folder to sync it.
pub(super) fn sync_dir(dir: &Path) {
    if let Ok(handle) = File::open(dir)
        && let Err(err) = handle.sync_all()
    {
        debug!(dir = %dir.display(), %err, "cannot sync the folder");
    }
}

/// Removes a file when dropped unless disarmed: a failure anywhere leaves no partial file.
pub(super) struct RemoveOnDrop(Option<PathBuf>);

impl RemoveOnDrop {
    /// Arms the guard for `path`, which need not exist yet.
    pub(super) fn new(path: PathBuf) -> Self {
        Self(Some(path))
    }

    /// Keeps the file (it has been renamed into place).
    pub(super) fn disarm(mut self) {
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
pub(super) struct ScratchDir(PathBuf);

impl ScratchDir {
    /// Creates `<parent>/.download-<pid>-<nanos>[-n]`.
    pub(super) fn create(parent: &Path) -> Result<Self, ModelError> {
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
    pub(super) fn path(&self) -> &Path {
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
