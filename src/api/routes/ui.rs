//! The Web UI: one page (running models, a launch form, a chat) and its script and style,
//! embedded in the binary and served as they are, and its texts in the reader's language. The
//! page talks to the REST API like any client, so it needs no route of its own beyond these,
//! and no key to be fetched (it asks for the API key when the API answers 401).

use actix_web::http::header;
use actix_web::{HttpRequest, HttpResponse, web};
use xinf_i18n::Catalog;

const INDEX: &str = include_str!("../ui/index.html");
const SCRIPT: &str = include_str!("../ui/app.js");
const STYLE: &str = include_str!("../ui/app.css");

/// `GET /` and `GET /ui`: the page.
pub(crate) async fn index() -> HttpResponse {
    asset(INDEX, "text/html; charset=utf-8")
}

/// The values the page fills into its texts, as `{name}` (`ui-handoff-counts`, …).
const FILLED: [&str; 5] = ["pages", "bytes", "moves", "model", "reason"];

/// `GET /ui/{file}`: the page's script, style and texts; anything else is 404.
pub(crate) async fn file(req: HttpRequest, name: web::Path<String>) -> HttpResponse {
    match name.as_str() {
        "app.js" => asset(SCRIPT, "text/javascript; charset=utf-8"),
        "app.css" => asset(STYLE, "text/css; charset=utf-8"),
        "strings.json" => strings(crate::api::error::request_lang(&req)),
        "" | "index.html" => asset(INDEX, "text/html; charset=utf-8"),
        _ => HttpResponse::NotFound().content_type("text/plain; charset=utf-8").body("not found"),
    }
}

fn asset(body: &'static str, kind: &'static str) -> HttpResponse {
    HttpResponse::Ok()
        .content_type(kind)
        // A new binary may serve a new page: browsers check before using their copy.
        .insert_header((header::CACHE_CONTROL, "no-cache"))
        .body(body)
}

/// The page's texts (every `ui-` message) in `lang`, English where a catalog lacks one, with
/// `{name}` where the page fills in a value; a browser asks in its own language
/// (`Accept-Language`), so the answer varies with it.
fn strings(lang: &'static str) -> HttpResponse {
    let catalog = Catalog::new(lang);
    let args: Vec<(&str, String)> = FILLED.iter().map(|n| (*n, format!("{{{n}}}"))).collect();
    let args: Vec<(&str, &str)> = args.iter().map(|(n, v)| (*n, v.as_str())).collect();
    let texts: serde_json::Map<String, serde_json::Value> = xinf_i18n::message_ids("en")
        .into_iter()
        .filter(|key| key.starts_with("ui-"))
        .map(|key| {
            let text = catalog.text(&key, &args);
            (key, text.into())
        })
        .collect();
    HttpResponse::Ok()
        .insert_header((header::CACHE_CONTROL, "no-cache"))
        .insert_header((header::VARY, "Accept-Language"))
        .json(serde_json::json!({"lang": catalog.lang(), "strings": texts}))
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::{App, test};

    #[test]
    fn the_pages_texts_come_in_the_readers_language_with_every_key_the_page_uses() {
        actix_web::rt::System::new().block_on(run());
    }

    /// The `ui-` keys the page's HTML and script name (`data-i18n…="ui-…"`, `t("ui-…"`).
    fn page_keys() -> Vec<String> {
        let mut keys = Vec::new();
        for src in [INDEX, SCRIPT] {
            for (i, _) in src.match_indices("\"ui-") {
                let key: String =
                    src[i + 1..].chars().take_while(|c| c.is_ascii_lowercase() || *c == '-').collect();
                keys.push(key);
            }
        }
        keys.sort();
        keys.dedup();
        keys
    }

    async fn get(lang: Option<&str>) -> serde_json::Value {
        let app = test::init_service(App::new().route("/ui/{file}", web::get().to(file))).await;
        let mut req = test::TestRequest::get().uri("/ui/strings.json");
        if let Some(lang) = lang {
            req = req.insert_header((header::ACCEPT_LANGUAGE, lang));
        }
        let res = test::call_service(&app, req.to_request()).await;
        assert_eq!(res.status(), 200);
        assert_eq!(res.headers().get(header::VARY).and_then(|v| v.to_str().ok()), Some("Accept-Language"));
        test::read_body_json(res).await
    }

    async fn run() {
        let keys = page_keys();
        assert!(keys.len() > 35, "the page names only {} texts: {keys:?}", keys.len());
        let english = get(None).await;
        assert_eq!(english["lang"], "en");
        for key in &keys {
            assert!(english["strings"][key].is_string(), "no English text for `{key}` the page uses");
        }
        assert_eq!(english["strings"]["ui-tab-models"], "Models");
        assert_eq!(english["strings"]["ui-handoff-counts"], "{pages} pages, {bytes}, {moves} handoffs");
        let japanese = get(Some("ja-JP,ja;q=0.9,en;q=0.8")).await;
        assert_eq!(japanese["lang"], "ja");
        assert_eq!(japanese["strings"]["ui-tab-models"], "モデル");
        assert_eq!(japanese["strings"]["ui-launched"], "{model} を起動しました。");
        for lang in xinf_i18n::languages() {
            let texts = get(Some(lang)).await;
            assert_eq!(texts["lang"], lang);
            for key in &keys {
                let text = texts["strings"][key].as_str().unwrap_or("");
                assert!(!text.is_empty() && !text.starts_with("ui-"), "{lang}: `{key}` is {text:?}");
            }
            // Every language's text fills in the values the English one does.
            for (key, en) in english["strings"].as_object().into_iter().flatten() {
                for name in
                    FILLED.iter().filter(|n| en.as_str().is_some_and(|e| e.contains(&format!("{{{n}}}"))))
                {
                    let text = texts["strings"][key].as_str().unwrap_or("");
                    assert!(
                        text.contains(&format!("{{{name}}}")),
                        "{lang}: `{key}` lacks {{{name}}}: {text}"
                    );
                }
            }
        }
    }
}
