//! Every user-facing text of xinf, in Fluent catalogs (`i18n/locales/<lang>/xinf.ftl`): English,
//! Simplified and Traditional Chinese, Japanese, Korean, German, French, Spanish, Brazilian
//! Portuguese and Russian.
//!
//! Library crates report typed errors with stable codes; only the edges (CLI, REST) turn them
//! into text, through a [`Catalog`] chosen from the locale (`LC_ALL`, `LC_MESSAGES`, `LANG`) or
//! `Accept-Language` by [`negotiate`]. Every catalog holds exactly English's keys with the same
//! placeables, which the tests check against the keys the workspace's code looks up.
//!
//! ```
//! use xinf_i18n::{Catalog, negotiate};
//!
//! let cat = Catalog::new(negotiate("ja-JP,ja;q=0.9,en;q=0.5"));
//! assert_eq!(cat.lang(), "ja");
//! assert!(cat.text("api-model-not-found", &[("model", "qwen3")]).contains("qwen3"));
//! ```

mod lang;

use fluent_bundle::{FluentArgs, FluentBundle, FluentResource, FluentValue};
use unic_langid::LanguageIdentifier;

pub use lang::{locale_tag, negotiate, user_language};

/// Languages with a catalog: (tag, catalog source), English first: it is the fallback of every
/// other catalog and the language of anything no catalog fits.
const CATALOGS: &[(&str, &str)] = &[
    ("en", include_str!("../locales/en/xinf.ftl")),
    ("zh-CN", include_str!("../locales/zh-CN/xinf.ftl")),
    ("zh-TW", include_str!("../locales/zh-TW/xinf.ftl")),
    ("ja", include_str!("../locales/ja/xinf.ftl")),
    ("ko", include_str!("../locales/ko/xinf.ftl")),
    ("de", include_str!("../locales/de/xinf.ftl")),
    ("fr", include_str!("../locales/fr/xinf.ftl")),
    ("es", include_str!("../locales/es/xinf.ftl")),
    ("pt-BR", include_str!("../locales/pt-BR/xinf.ftl")),
    ("ru", include_str!("../locales/ru/xinf.ftl")),
];

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

impl Catalog {
    /// The catalog for a language tag as returned by [`negotiate`].
    pub fn new(lang: &str) -> Self {
        let (tag, src) = CATALOGS.iter().find(|(t, _)| *t == lang).copied().unwrap_or(CATALOGS[0]);
        let fallback = (tag != "en").then(|| Box::new(Catalog::new("en")));
        Self { lang: tag, bundle: bundle(tag, src), fallback }
    }

    /// The catalog for the process locale (`LC_ALL`, `LC_MESSAGES`, then `LANG`); English for
    /// `C`, `POSIX` or none.
    pub fn from_env() -> Self {
        Self::new(user_language().map_or("en", |tag| negotiate(&tag)))
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

/// Message ids of a catalog, in its order (empty for a language without one).
pub fn message_ids(lang: &str) -> Vec<String> {
    let src = CATALOGS.iter().find(|(t, _)| *t == lang).map(|(_, s)| *s).unwrap_or("");
    src.lines()
        .filter(|l| !l.starts_with(['#', ' ', '\t']) && l.contains(" ="))
        .filter_map(|l| l.split(" =").next().map(|k| k.trim().to_owned()))
        .collect()
}

/// The languages with a catalog, as [`negotiate`] returns them, English first.
pub fn languages() -> impl Iterator<Item = &'static str> {
    CATALOGS.iter().map(|(t, _)| *t)
}

#[cfg(test)]
mod tests;
