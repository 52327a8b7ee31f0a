use super::*;
use std::collections::HashMap;

#[test]
fn locale_names_and_tags_negotiate_to_their_catalog() {
    let cases = [
        ("zh_CN.UTF-8", "zh-CN"),
        ("zh", "zh-CN"),
        ("zh-SG", "zh-CN"),
        ("zh-Hans-HK", "zh-CN"),
        ("zh_TW.Big5", "zh-TW"),
        ("zh-TW", "zh-TW"),
        ("zh-HK", "zh-TW"),
        ("zh-MO", "zh-TW"),
        ("zh-Hant", "zh-TW"),
        ("zh-Hant-CN", "zh-TW"),
        ("ja_JP.UTF-8", "ja"),
        ("ja-JP", "ja"),
        ("ko_KR.eucKR", "ko"),
        ("de_DE@euro", "de"),
        ("de-AT", "de"),
        ("fr_CA", "fr"),
        ("es-419", "es"),
        ("pt", "pt-BR"),
        ("pt-BR", "pt-BR"),
        ("pt_PT.UTF-8", "pt-BR"),
        ("ru_RU.KOI8-R", "ru"),
        ("en_GB", "en"),
        ("EN-us", "en"),
        ("C", "en"),
        ("POSIX", "en"),
        ("C.UTF-8", "en"),
        ("it_IT.UTF-8", "en"),
        ("", "en"),
    ];
    for (requested, lang) in cases {
        assert_eq!(negotiate(requested), lang, "{requested}");
    }
}

#[test]
fn accept_language_is_read_by_quality() {
    let cases = [
        ("zh-CN,zh;q=0.9,en;q=0.8", "zh-CN"),
        ("fr-FR,zh;q=0.8", "fr"),
        ("it-IT, de;q=0.7, ru;q=0.9", "ru"),
        ("en;q=0.5, ja", "ja"),
        ("ko;q=0.8, es;q=0.8", "ko"),
        ("es;Q=0.3,pt-BR;q=0.35", "pt-BR"),
        ("ja;q=0, de", "de"),
        ("ja;q=0", "en"),
        ("ja;q=abc, fr;q=0.1", "fr"),
        ("ja;q=1.5, fr;q=0.1", "fr"),
        ("it, *;q=0.1", "en"),
        ("it, nl", "en"),
        (" , ;q=1, zh-Hant ; q=0.2", "zh-TW"),
    ];
    for (header, lang) in cases {
        assert_eq!(negotiate(header), lang, "{header}");
    }
}

#[test]
fn every_catalog_negotiates_to_itself() {
    for lang in languages() {
        assert_eq!(negotiate(lang), lang);
        assert_eq!(negotiate(&lang.to_ascii_lowercase()), lang);
        assert_eq!(negotiate(&lang.replace('-', "_")), lang);
    }
}

#[test]
fn locale_names_become_accept_language_tags() {
    let cases = [
        ("ja_JP.UTF-8", Some("ja-JP")),
        ("zh_TW.Big5", Some("zh-TW")),
        ("pt_BR", Some("pt-BR")),
        ("de_DE@euro", Some("de-DE")),
        ("sr_RS.UTF-8@latin", Some("sr-RS")),
        ("fr", Some("fr")),
        ("es_419.UTF-8", Some("es-419")),
        ("zh_hant_hk", Some("zh-Hant-HK")),
        ("EN_us", Some("en-US")),
        (" ko_KR ", Some("ko-KR")),
        ("C", None),
        ("C.UTF-8", None),
        ("POSIX", None),
        ("", None),
        (".UTF-8", None),
        ("e", None),
        ("ja_JP\r\nX-Injected: 1", None),
        ("ja__JP", None),
        ("日本語", None),
        ("/usr/share/locale", None),
    ];
    for (posix, tag) in cases {
        assert_eq!(locale_tag(posix).as_deref(), tag, "{posix:?}");
    }
}

#[test]
fn the_user_language_follows_posix_precedence() {
    let env = |pairs: &[(&'static str, &'static str)]| {
        let vars: HashMap<&str, &str> = pairs.iter().copied().collect();
        user_language_in(move |k| vars.get(k).map(|v| (*v).to_owned()))
    };
    assert_eq!(env(&[]), None);
    assert_eq!(env(&[("LANG", "ja_JP.UTF-8")]).as_deref(), Some("ja-JP"));
    assert_eq!(env(&[("LANG", "ja_JP.UTF-8"), ("LC_MESSAGES", "de_DE.UTF-8")]).as_deref(), Some("de-DE"));
    let all = [("LANG", "ja_JP.UTF-8"), ("LC_MESSAGES", "de_DE.UTF-8"), ("LC_ALL", "ko_KR.UTF-8")];
    assert_eq!(env(&all).as_deref(), Some("ko-KR"));
    // An empty variable is unset; a `C` one names no language and hides the ones below it.
    assert_eq!(env(&[("LC_ALL", ""), ("LANG", "fr_FR.UTF-8")]).as_deref(), Some("fr-FR"));
    assert_eq!(env(&[("LC_ALL", "C"), ("LANG", "fr_FR.UTF-8")]), None);
    assert_eq!(env(&[("LANG", "POSIX")]), None);
}
