//! The optional API key: when one is configured, every `/v1` route needs
//! `Authorization: Bearer <key>`.

use crate::api::AppState;
use crate::api::error::{ApiError, Problem, request_lang};
use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header;
use actix_web::middleware::Next;
use actix_web::web;

/// Compares without stopping at the first differing byte.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Whether an `Authorization` header value carries `key`.
fn bearer_matches(value: Option<&str>, key: &str) -> bool {
    let Some(value) = value else { return false };
    let mut parts = value.trim().splitn(2, ' ');
    let scheme = parts.next().unwrap_or("");
    let token = parts.next().unwrap_or("").trim();
    scheme.eq_ignore_ascii_case("bearer") && same(token.as_bytes(), key.as_bytes())
}

/// The middleware: passes the request on, or answers 401 in the OpenAI error shape.
pub(crate) async fn require_api_key(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<impl MessageBody + 'static>, actix_web::Error> {
    let key = req.app_data::<web::Data<AppState>>().and_then(|s| s.api_key.clone());
    if let Some(key) = key {
        let value = req.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
        if !bearer_matches(value, &key) {
            let lang = request_lang(req.request());
            return Err(ApiError::new(Problem::Unauthorized, lang).into());
        }
    }
    next.call(req).await
}

#[cfg(test)]
mod tests {
    use super::bearer_matches;

    #[test]
    fn bearer() {
        assert!(bearer_matches(Some("Bearer k1"), "k1"));
        assert!(bearer_matches(Some("bearer  k1 "), "k1"));
        assert!(!bearer_matches(Some("Bearer k2"), "k1"));
        assert!(!bearer_matches(Some("Basic k1"), "k1"));
        assert!(!bearer_matches(Some("Bearer"), "k1"));
        assert!(!bearer_matches(None, "k1"));
    }
}
