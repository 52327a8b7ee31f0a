//! The Web UI: one page (running models, a launch form, a chat) and its script and style,
//! embedded in the binary and served as they are. The page talks to the REST API like any
//! client, so it needs no route of its own beyond these three, and no key to be fetched (it
//! asks for the API key when the API answers 401).

use actix_web::http::header;
use actix_web::{HttpResponse, web};

const INDEX: &str = include_str!("../ui/index.html");
const SCRIPT: &str = include_str!("../ui/app.js");
const STYLE: &str = include_str!("../ui/app.css");

/// `GET /` and `GET /ui`: the page.
pub(crate) async fn index() -> HttpResponse {
    asset(INDEX, "text/html; charset=utf-8")
}

/// `GET /ui/{file}`: the page's script and style; anything else is 404.
pub(crate) async fn file(name: web::Path<String>) -> HttpResponse {
    match name.as_str() {
        "app.js" => asset(SCRIPT, "text/javascript; charset=utf-8"),
        "app.css" => asset(STYLE, "text/css; charset=utf-8"),
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
