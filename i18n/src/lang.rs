//! Which catalog a reader gets: negotiation over an `Accept-Language` header or a POSIX locale
//! name, and the BCP 47 tag of the user's locale that the command line sends to a server so
//! that the server's errors come back in the user's language.

use crate::languages;

/// The catalog for one language range, lowercase with `-` between subtags (`zh-hant-hk`), or
/// `None` when no catalog fits it.
///
/// Chinese is split by script, as readers are: Traditional for `Hant` and the regions that
/// write it (Taiwan, Hong Kong, Macau), Simplified otherwise. The one Portuguese catalog serves
/// every Portuguese range, which reads better to a European reader than English would. `*`
/// (any language) gets English.
fn supported(range: &str) -> Option<&'static str> {
    let mut subtags = range.split('-');
    let primary = subtags.next()?;
    match primary {
        "*" => Some("en"),
        "zh" => {
            let rest: Vec<&str> = subtags.collect();
            let traditional = if rest.contains(&"hant") {
                true
            } else if rest.contains(&"hans") {
                false
            } else {
                rest.iter().any(|s| matches!(*s, "tw" | "hk" | "mo"))
            };
            Some(if traditional { "zh-TW" } else { "zh-CN" })
        }
        "pt" => Some("pt-BR"),
        _ => languages().find(|tag| tag.eq_ignore_ascii_case(primary)),
    }
}

/// A language range as [`supported`] reads it: a POSIX name's codeset (`.UTF-8`) and modifier
/// (`@euro`) dropped, `_` turned into `-`, lowercase.
fn normalize(range: &str) -> String {
    let end = range.find(['.', '@']).unwrap_or(range.len());
    range[..end].trim().replace('_', "-").to_ascii_lowercase()
}

/// The weight of an `Accept-Language` entry from its parameters (`q=0.8`): 1 without one,
/// `None` when it is not a number in [0, 1], so that a malformed entry is passed over rather
/// than preferred.
fn weight<'a>(mut params: impl Iterator<Item = &'a str>) -> Option<f32> {
    let q = params.find_map(|p| {
        let (name, value) = p.split_once('=')?;
        name.trim().eq_ignore_ascii_case("q").then(|| value.trim())
    });
    match q {
        None => Some(1.0),
        Some(q) => q.parse::<f32>().ok().filter(|q| (0.0..=1.0).contains(q)),
    }
}

/// Picks the best supported language for a POSIX locale name (`zh_TW.UTF-8`) or an
/// `Accept-Language` header (`de-CH, fr;q=0.9, en;q=0.8`): the entries by falling quality
/// (in the header's order among equals), the first that a catalog fits; English when none
/// does. Entries of quality 0 are refused by the reader and never chosen.
pub fn negotiate(requested: &str) -> &'static str {
    let mut ranges: Vec<(f32, String)> = requested
        .split(',')
        .filter_map(|entry| {
            let mut parts = entry.split(';');
            let range = normalize(parts.next()?);
            let q = weight(parts)?;
            (q > 0.0 && !range.is_empty()).then_some((q, range))
        })
        .collect();
    // Stable: equal weights keep the header's order.
    ranges.sort_by(|a, b| b.0.total_cmp(&a.0));
    ranges.iter().find_map(|(_, range)| supported(range)).unwrap_or("en")
}

/// The BCP 47 tag of a POSIX locale name, for an `Accept-Language` header: `ja_JP.UTF-8` →
/// `ja-JP`, `de_DE@euro` → `de-DE`. `None` for the `C` and `POSIX` locales (which name no
/// language) and for anything that is not a well-formed tag, so that no stray text from the
/// environment reaches a header.
pub fn locale_tag(posix: &str) -> Option<String> {
    let end = posix.find(['.', '@']).unwrap_or(posix.len());
    let name = posix[..end].trim();
    if name.is_empty() || name == "C" || name == "POSIX" {
        return None;
    }
    let subtags: Vec<&str> = name.split(['_', '-']).collect();
    let primary = subtags.first()?;
    let well_formed = (2..=8).contains(&primary.len())
        && primary.bytes().all(|b| b.is_ascii_alphabetic())
        && subtags[1..]
            .iter()
            .all(|s| (1..=8).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_alphanumeric()));
    if !well_formed {
        return None;
    }
    // BCP 47's conventional case: language lower, script title, region upper.
    let cased: Vec<String> = subtags
        .iter()
        .enumerate()
        .map(|(i, s)| match s.len() {
            _ if i == 0 => s.to_ascii_lowercase(),
            2 => s.to_ascii_uppercase(),
            4 if s.bytes().all(|b| b.is_ascii_alphabetic()) => {
                let lower = s.to_ascii_lowercase();
                lower[..1].to_ascii_uppercase() + &lower[1..]
            }
            _ => s.to_ascii_lowercase(),
        })
        .collect();
    Some(cased.join("-"))
}

/// The user's locale name: the first of `LC_ALL`, `LC_MESSAGES` and `LANG` that `var` finds set
/// and not empty, the precedence POSIX gives them for messages.
fn env_locale(var: impl Fn(&str) -> Option<String>) -> Option<String> {
    ["LC_ALL", "LC_MESSAGES", "LANG"].iter().find_map(|k| var(k).filter(|v| !v.is_empty()))
}

/// The user's language as a BCP 47 tag from [`env_locale`] through [`locale_tag`].
fn user_language_in(var: impl Fn(&str) -> Option<String>) -> Option<String> {
    locale_tag(&env_locale(var)?)
}

/// The language of the process's locale as a BCP 47 tag (`LANG=ja_JP.UTF-8` → `ja-JP`), for
/// an `Accept-Language` header; `None` when the locale names no language (unset, `C`,
/// `POSIX`).
pub fn user_language() -> Option<String> {
    user_language_in(|k| std::env::var(k).ok())
}

#[cfg(test)]
mod tests;
