use super::*;
use serde_json::json;

const TABLE: &str = "# comment\n--enforce-eager bool\n--disable-radix-cache switch\n--lora-modules list\n--max-num-seqs value\n";

#[test]
fn keys_become_flags_by_kind() {
    let t = FlagTable::parse("test", TABLE);
    let read = |k: &str, v: serde_json::Value| t.read(k, &v).expect("read").expect("some");
    let flags = vec![
        ("enforce_eager".to_owned(), read("enforce_eager", json!(false))),
        ("disable-radix-cache".to_owned(), read("disable-radix-cache", json!(true))),
        ("max_num_seqs".to_owned(), read("max_num_seqs", json!(8))),
        ("lora_modules".to_owned(), read("lora_modules", json!(["a", 2]))),
        ("max_num_seqs".to_owned(), read("max_num_seqs", json!({"x": 1}))),
    ];
    assert_eq!(
        t.args(&flags),
        vec![
            "--no-enforce-eager",
            "--disable-radix-cache",
            "--max-num-seqs",
            "8",
            "--lora-modules",
            "a",
            "2",
            "--max-num-seqs",
            "{\"x\":1}"
        ]
    );
    assert_eq!(t.args(&[("disable_radix_cache".into(), FlagValue::Switch(false))]), Vec::<String>::new());
    assert_eq!(t.read("max_num_seqs", &json!(null)).expect("null"), None);
    assert!(t.read("enforce_eager", &json!(1)).is_err());
    assert!(t.read("lora_modules", &json!([])).is_err());
    assert!(t.read("max_num_seqs", &json!([1])).is_err(), "a value flag takes one value");
    assert!(t.read("no_such", &json!(1)).is_err());
}

#[test]
fn the_shipped_tables_know_the_flags_xinf_sets() {
    for (table, flags) in [
        (
            crate::Flavor::Vllm.table(),
            ["model", "port", "gpu-memory-utilization", "max-model-len", "enable-prefix-caching"],
        ),
        (
            crate::Flavor::Sglang.table(),
            ["model-path", "port", "mem-fraction-static", "context-length", "incremental-streaming-output"],
        ),
    ] {
        for f in flags {
            assert!(table.kind(f).is_some(), "--{f}");
        }
    }
    assert_eq!(crate::Flavor::Vllm.table().kind("enable-prefix-caching"), Some(FlagKind::Bool));
    assert_eq!(crate::Flavor::Sglang.table().kind("disable-radix-cache"), Some(FlagKind::Switch));
}
