//! The catalogs against English and against each other: same keys, same placeables, clean
//! parses; and the keys the code looks up (`source_keys`).

mod source_keys;

use super::*;
use std::collections::BTreeMap;

/// The catalog source of `lang`.
fn source(lang: &str) -> &'static str {
    CATALOGS.iter().find(|(t, _)| *t == lang).map_or("", |(_, s)| *s)
}

/// The messages of a catalog source as (id, value), a value's indented continuation lines
/// joined to it.
fn messages(src: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for line in src.lines() {
        if line.starts_with([' ', '\t']) {
            if let Some((_, value)) = out.last_mut() {
                value.push('\n');
                value.push_str(line.trim());
            }
        } else if !line.starts_with('#')
            && let Some((id, value)) = line.split_once('=')
        {
            out.push((id.trim().to_owned(), value.trim().to_owned()));
        }
    }
    out
}

/// The placeables of a message value (`{ $field }`), as written, sorted.
fn placeables(value: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = value;
    while let Some(start) = rest.find('{') {
        let Some(len) = rest[start..].find('}') else { break };
        out.push(&rest[start..=start + len]);
        rest = &rest[start + len + 1..];
    }
    out.sort_unstable();
    out
}

/// The variable of a placeable (`{ $field }` → `field`).
fn variable(placeable: &str) -> Option<&str> {
    placeable.trim_matches(['{', '}', ' ']).strip_prefix('$')
}

#[test]
fn every_catalog_parses_without_errors_or_duplicates() {
    for lang in languages() {
        let parsed = FluentResource::try_new(source(lang).to_owned());
        let errors = parsed.err().map(|(_, errors)| errors).unwrap_or_default();
        assert!(errors.is_empty(), "{lang}: {errors:?}");
        let mut ids = message_ids(lang);
        let count = ids.len();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), count, "{lang} defines a key twice");
        let values = messages(source(lang));
        assert_eq!(values.len(), count, "{lang}: a line is neither a message nor a comment");
        for (id, value) in &values {
            assert!(!value.is_empty(), "{lang}: `{id}` is empty");
        }
    }
}

#[test]
fn every_catalog_has_exactly_the_keys_of_english() {
    let en = message_ids("en");
    assert!(en.len() > 100, "{}", en.len());
    assert_eq!(languages().count(), 10);
    for lang in languages() {
        let cat = Catalog::new(lang);
        assert_eq!(cat.lang(), lang);
        let ids = message_ids(lang);
        let missing: Vec<&String> = en.iter().filter(|k| !ids.contains(k)).collect();
        let extra: Vec<&String> = ids.iter().filter(|k| !en.contains(k)).collect();
        assert!(missing.is_empty(), "{lang} lacks {missing:?}");
        assert!(extra.is_empty(), "{lang} has keys English lacks: {extra:?}");
        for key in &en {
            assert!(cat.has(key), "{lang} does not load `{key}`");
        }
    }
}

#[test]
fn every_message_has_the_placeables_of_english() {
    let en: BTreeMap<String, String> = messages(source("en")).into_iter().collect();
    for lang in languages() {
        for (id, value) in messages(source(lang)) {
            let Some(english) = en.get(&id) else { continue };
            let (want, got) = (placeables(english), placeables(&value));
            assert_eq!(got, want, "{lang} `{id}`: placeables differ from English");
            for p in &got {
                let name = variable(p).unwrap_or("");
                let well_formed = !name.is_empty()
                    && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
                    && *p == format!("{{ ${name} }}");
                assert!(well_formed, "{lang} `{id}`: `{p}` is not a plain `{{ $name }}`");
            }
        }
    }
}

#[test]
fn every_message_formats_each_argument_once_as_english_does() {
    let en = Catalog::new("en");
    for lang in languages() {
        let cat = Catalog::new(lang);
        for (id, value) in messages(source(lang)) {
            let names: Vec<String> =
                placeables(&value).into_iter().filter_map(variable).map(str::to_owned).collect();
            let values: Vec<String> = names.iter().map(|n| format!("<{n}:7f3a>")).collect();
            let args: Vec<(&str, &str)> =
                names.iter().zip(&values).map(|(n, v)| (n.as_str(), v.as_str())).collect();
            let Some(pattern) = cat.bundle.get_message(&id).and_then(|m| m.value()) else {
                panic!("{lang} `{id}` has no value");
            };
            let mut fa = FluentArgs::new();
            for (k, v) in &args {
                fa.set(*k, FluentValue::from(*v));
            }
            let mut errors = Vec::new();
            let text = cat.bundle.format_pattern(pattern, Some(&fa), &mut errors).into_owned();
            assert!(errors.is_empty(), "{lang} `{id}`: {errors:?}");
            let english = en.text(&id, &args);
            for v in &values {
                assert_eq!(
                    text.matches(v.as_str()).count(),
                    english.matches(v.as_str()).count(),
                    "{lang} `{id}`"
                );
            }
        }
    }
}

#[test]
fn formatting_falls_back_to_english_then_to_the_key() {
    let en = Catalog::new("en");
    let msg = en.text("error-invalid-request", &[("field", "top_p"), ("reason", "must be in (0, 1]")]);
    assert_eq!(msg, "invalid value for `top_p`: must be in (0, 1]");
    assert_eq!(en.text("no-such-key", &[]), "no-such-key");
    assert_eq!(Catalog::new("no-such-language").lang(), "en");
    let ja = Catalog::new("ja");
    assert_eq!(ja.text("no-such-key", &[]), "no-such-key");
    assert!(ja.text("api-model-not-found", &[("model", "qwen3")]).contains("`qwen3`"));
    assert_ne!(ja.text("error-prefix", &[]), en.text("error-prefix", &[]));
}
