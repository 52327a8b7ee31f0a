//! Every user-facing text of xinf, in Fluent catalogs (`i18n/locales/<lang>/xinf.ftl`).
//!
//! Library crates report typed errors with stable codes; only the edges (CLI, REST) turn them
//! into text, through a [`Catalog`] chosen from `LANG` or `Accept-Language`.

use fluent_bundle::{FluentArgs, FluentBundle, FluentResource, FluentValue};
use unic_langid::LanguageIdentifier;

/// Languages with a catalog: (tag, catalog source).
const CATALOGS: &[(&str, &str)] =
    &[("en", include_str!("../locales/en/xinf.ftl")), ("zh-CN", include_str!("../locales/zh-CN/xinf.ftl"))];

/// The messages of one language, falling back to English for anything missing.
pub struct Catalog {
    lang: &'static str,
    bundle: FluentBundle<FluentResource>,
    fallback: Option<Box<Catalog>>,
}

impl std::fmt::Debug for Catalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Catalog").field("lang", &self.lang).finish()
    }
}

fn bundle(tag: &'static str, source: &'static str) -> FluentBundle<FluentResource> {
    let lang: LanguageIdentifier = tag.parse().unwrap_or_default();
    let mut b = FluentBundle::new(vec![lang]);
    // Isolation marks around arguments garble terminals and JSON; xinf's texts are single
    // direction.
    b.set_use_isolating(false);
    let res = FluentResource::try_new(source.to_owned()).unwrap_or_else(|(res, _)| res);
    let _ = b.add_resource(res);
    b
}

/// Picks the best supported language for a `LANG` value (`zh_CN.UTF-8`) or an
/// `Accept-Language` header (`zh-CN,zh;q=0.9,en;q=0.8`).
pub fn negotiate(requested: &str) -> &'static str {
    for part in requested.split(',') {
        let tag = part.split(';').next().unwrap_or("").trim();
        let tag = tag.split('.').next().unwrap_or("").replace('_', "-").to_ascii_lowercase();
        if tag.starts_with("zh") {
            return "zh-CN";
        }
        if tag.starts_with("en") {
            return "en";
        }
    }
    "en"
}

impl Catalog {
    /// The catalog for a language tag as returned by [`negotiate`].
    pub fn new(lang: &str) -> Self {
        let (tag, src) = CATALOGS.iter().find(|(t, _)| *t == lang).copied().unwrap_or(CATALOGS[0]);
        let fallback = (tag != "en").then(|| Box::new(Catalog::new("en")));
        Self { lang: tag, bundle: bundle(tag, src), fallback }
    }

    /// The catalog for the process locale (`LC_ALL`, `LC_MESSAGES`, then `LANG`).
    pub fn from_env() -> Self {
        let lang = ["LC_ALL", "LC_MESSAGES", "LANG"]
            .iter()
            .find_map(|k| std::env::var(k).ok().filter(|v| !v.is_empty()))
            .unwrap_or_default();
        Self::new(negotiate(&lang))
    }

    /// The language of this catalog.
    pub fn lang(&self) -> &'static str {
        self.lang
    }

    /// Formats message `key` with `args`; an unknown key formats as the key itself.
    pub fn text(&self, key: &str, args: &[(&str, &str)]) -> String {
        let Some(pattern) = self.bundle.get_message(key).and_then(|m| m.value()) else {
            return match &self.fallback {
                Some(f) => f.text(key, args),
                None => key.to_owned(),
            };
        };
        let mut fa = FluentArgs::new();
        for (k, v) in args {
            fa.set(*k, FluentValue::from(*v));
        }
        let mut errors = Vec::new();
        self.bundle.format_pattern(pattern, Some(&fa), &mut errors).into_owned()
    }

    /// Whether the catalog defines `key` itself (without falling back).
    pub fn has(&self, key: &str) -> bool {
        self.bundle.has_message(key)
    }
}

/// Message ids of a catalog source, for the completeness test.
pub fn message_ids(lang: &str) -> Vec<String> {
    let src = CATALOGS.iter().find(|(t, _)| *t == lang).map(|(_, s)| *s).unwrap_or("");
    src.lines()
        .filter(|l| !l.starts_with(['#', ' ', '\t']) && l.contains(" ="))
        .filter_map(|l| l.split(" =").next().map(|k| k.trim().to_owned()))
        .collect()
}

/// Supported language tags.
pub fn languages() -> impl Iterator<Item = &'static str> {
    CATALOGS.iter().map(|(t, _)| *t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_exists_in_every_catalog() {
        let en = message_ids("en");
        assert!(en.len() > 10);
        for lang in languages() {
            let cat = Catalog::new(lang);
            for key in &en {
                assert!(cat.has(key), "{lang} lacks `{key}`");
            }
            assert_eq!(message_ids(lang).len(), en.len(), "{lang} has keys English lacks");
        }
    }

    #[test]
    fn negotiation_and_formatting() {
        assert_eq!(negotiate("zh_CN.UTF-8"), "zh-CN");
        assert_eq!(negotiate("fr-FR,zh;q=0.8"), "zh-CN");
        assert_eq!(negotiate("C"), "en");
        let en = Catalog::new("en");
        let msg = en.text("error-invalid-request", &[("field", "top_p"), ("reason", "must be in (0, 1]")]);
        assert!(msg.contains("top_p") && msg.contains("(0, 1]"), "{msg}");
        assert_eq!(en.text("no-such-key", &[]), "no-such-key");
    }
}
