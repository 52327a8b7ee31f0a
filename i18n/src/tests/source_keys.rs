//! The keys the workspace's code looks up, read from its sources, against every catalog.
//!
//! A key is a string literal that is either the first argument of a `.text(` call (the
//! [`Catalog::text`] lookup, in any crate) or, in the root crate's `src/`, which alone turns
//! codes into text, any literal shaped like a key of one of English's families (`cli-…`,
//! `api-…`, `error-…`): such keys travel as values before they are looked up
//! (`Problem::field(.., "api-n-unsupported", ..)`, a table's column keys).

use super::*;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Folders scanned, from the workspace root, and whether key-shaped literals count there too
/// (not only `.text(` arguments).
const ROOTS: [(&str, bool); 3] = [("src", true), ("actors", false), ("engines", false)];

/// A string literal of a Rust source.
#[derive(Debug, PartialEq)]
struct Literal {
    /// Its text as written (escapes not resolved: keys have none).
    value: String,
    /// Its line, from 1.
    line: usize,
    /// Whether it is the first argument of a `.text(` call.
    text_call: bool,
}

/// Whether `c` can continue an identifier.
fn ident_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The string literals of a Rust source, comments skipped. Raw strings, char literals (`'"'`)
/// and lifetimes are told apart, so that a quote in one of them starts no literal.
fn literals(src: &str) -> Vec<Literal> {
    let chars: Vec<char> = src.chars().collect();
    let mut out = Vec::new();
    // The code read so far without comments and literals, to see what precedes a literal.
    let mut code = String::new();
    let (mut i, mut line) = (0, 1);
    let at = |i: usize| chars.get(i).copied().unwrap_or('\0');
    while i < chars.len() {
        let c = chars[i];
        if c == '/' && at(i + 1) == '/' {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && at(i + 1) == '*' {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && at(i + 1) == '*' {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    line += usize::from(chars[i] == '\n');
                    i += 1;
                }
            }
            code.push(' ');
        } else if c == '"' || ((c == 'r' || c == 'b') && !ident_char(at(i.wrapping_sub(1)))) {
            // A string, or an identifier that may open a raw or byte string (`r#"`, `br"`).
            let start = i;
            let mut j = i;
            while j < chars.len() && ident_char(chars[j]) {
                j += 1;
            }
            let prefix: String = chars[start..j].iter().collect();
            let hashes = chars[j..].iter().take_while(|&&h| h == '#').count();
            let opens =
                at(j + hashes) == '"' && (prefix.is_empty() || matches!(prefix.as_str(), "r" | "b" | "br"));
            if !opens {
                code.push_str(&prefix);
                i = j;
                continue;
            }
            let raw = prefix.contains('r');
            let first_line = line;
            let mut k = j + hashes + 1;
            let body_start = k;
            let body_end = loop {
                if k >= chars.len() {
                    break k;
                }
                match chars[k] {
                    '\\' if !raw => {
                        line += usize::from(at(k + 1) == '\n');
                        k += 2;
                    }
                    '"' if chars[k + 1..].iter().take(hashes).filter(|&&h| h == '#').count() == hashes => {
                        break k;
                    }
                    ch => {
                        line += usize::from(ch == '\n');
                        k += 1;
                    }
                }
            };
            let value: String = chars[body_start..body_end.min(chars.len())].iter().collect();
            let before: String = code.chars().rev().filter(|c| !c.is_whitespace()).take(6).collect();
            out.push(Literal { value, line: first_line, text_call: before == "(txet." });
            code.push_str("\"\"");
            i = body_end + 1 + hashes;
        } else if c == '\'' {
            // A char literal (`'x'`, `'\''`, `'"'`) is skipped; a lifetime (`'a`) is code.
            if at(i + 1) == '\\' {
                let mut k = i + 3;
                while k < chars.len() && chars[k] != '\'' {
                    k += 1;
                }
                i = k + 1;
            } else if at(i + 2) == '\'' {
                i += 3;
            } else {
                code.push(c);
                i += 1;
            }
        } else {
            line += usize::from(c == '\n');
            code.push(c);
            i += 1;
        }
    }
    out
}

/// Whether `value` is shaped like a key of one of `families` (`cli-launch-done`).
fn key_shaped(value: &str, families: &BTreeSet<&str>) -> bool {
    let mut parts = value.split('-');
    let family = parts.next().unwrap_or("");
    let rest: Vec<&str> = parts.collect();
    families.contains(family)
        && !rest.is_empty()
        && rest
            .iter()
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()))
}

/// The `.rs` files under `dir`, build outputs and hidden folders left out.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if path.is_dir() {
            if name != "target" && !name.starts_with('.') {
                rust_files(&path, out)?;
            }
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    Ok(())
}

/// Every key the code looks up, with where (`src/cli/models.rs:12`), in file order.
fn used_keys() -> Vec<(String, String)> {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let english = message_ids("en");
    let families: BTreeSet<&str> = english.iter().filter_map(|k| k.split('-').next()).collect();
    let mut used = Vec::new();
    for (root, any_literal) in ROOTS {
        let mut files = Vec::new();
        let dir = workspace.join(root);
        rust_files(&dir, &mut files).unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()));
        files.sort();
        for file in files {
            let src = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            let shown = file.strip_prefix(&workspace).unwrap_or(&file).display().to_string();
            for lit in literals(&src) {
                if lit.text_call || (any_literal && key_shaped(&lit.value, &families)) {
                    used.push((lit.value, format!("{shown}:{}", lit.line)));
                }
            }
        }
    }
    used
}

#[test]
fn every_key_the_code_uses_is_in_every_catalog() {
    let used = used_keys();
    let distinct: BTreeSet<&str> = used.iter().map(|(k, _)| k.as_str()).collect();
    // A scan that finds next to nothing has lost the sources, not proved them right.
    assert!(distinct.len() > 80, "only {} keys found in the sources", distinct.len());
    for lang in languages() {
        let ids = message_ids(lang);
        let missing: Vec<String> =
            used.iter().filter(|(k, _)| !ids.contains(k)).map(|(k, at)| format!("`{k}` ({at})")).collect();
        assert!(missing.is_empty(), "the {lang} catalog lacks keys the code uses: {}", missing.join(", "));
    }
}

#[test]
fn literals_are_read_as_the_compiler_reads_them() {
    let src = r####"
        // cat.text("in-a-comment")
        /* cat.text("in /* a nested */ block") */
        fn f<'a>(cat: &'a Catalog) -> [String; 3] {
            let quote = '"';
            let escaped = '\'';
            let raw = r#"a "raw" text"#;
            let ok = cat.text(
                "cli-multi-line",
                &[("field", "x")],
            );
            [cat.text("cli-one", &[]), r"cli-raw".into(), ok]
        }
    "####;
    let found: Vec<(String, usize, bool)> =
        literals(src).into_iter().map(|l| (l.value, l.line, l.text_call)).collect();
    let expected = [
        ("a \"raw\" text", 7, false),
        ("cli-multi-line", 9, true),
        ("field", 10, false),
        ("x", 10, false),
        ("cli-one", 12, true),
        ("cli-raw", 12, false),
    ];
    let expected: Vec<(String, usize, bool)> =
        expected.iter().map(|(v, l, t)| (v.to_string(), *l, *t)).collect();
    assert_eq!(found, expected);
    let families = BTreeSet::from(["cli", "api"]);
    assert!(key_shaped("cli-bench-col-ttft-p50", &families));
    assert!(!key_shaped("cli", &families) && !key_shaped("cli-", &families));
    assert!(!key_shaped("ssl-keyfile", &families) && !key_shaped("api-Key", &families));
}
