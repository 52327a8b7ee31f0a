//! The one place where failures become HTTP responses.
//!
//! Handlers fail with a [`Problem`] (typed, not yet text). [`ApiError`] pairs it with the
//! language negotiated from `Accept-Language` and renders the OpenAI error shape
//! `{"error": {"message", "type", "param", "code"}}`, the message coming from the Fluent
//! catalog of that language.
//!
//! | class / problem | status | `type` |
//! |---|---|---|
//! | invalid input, bad JSON, unknown or mistyped field, unsupported parameter | 400 | `invalid_request_error` |
//! | missing or wrong API key | 401 | `authentication_error` |
//! | unknown model, request id or route | 404 | `not_found_error` |
//! | known route, wrong method | 405 | `invalid_request_error` |
//! | request id already running | 409 | `conflict_error` |
//! | body over the size limit | 413 | `invalid_request_error` |
//! | engine queue full (`Retry-After: 1`) | 429 | `overloaded_error` |
//! | request cancelled (`EngineError::Aborted`), as Xinference does | 499 | `cancelled_error` |
//! | bug | 500 | `internal_error` |
//! | management route on a server that does not manage models | 501 | `internal_error` |
//! | model not ready (`Retry-After: 5`), engine stopped, service unavailable, peer lost | 503 | `unavailable_error` |
//!
//! A request aborted through the abort route or by its client is not an error: it ends with
//! `finish_reason: "abort"`, as in vLLM.

use crate::api::ServiceError;
use crate::api::openai::{ErrorBody, ErrorDetail};
use crate::api::shown::clip;
use crate::service_error_text;
use actix_web::http::StatusCode;
use actix_web::http::header;
use actix_web::{HttpRequest, HttpResponse, ResponseError};
use xinf_engine::{EngineError, ErrorClass};
use xinf_i18n::Catalog;

/// A failed API request, before it is put into words.
#[derive(Debug)]
pub(crate) enum Problem {
    /// The model service (or the engine behind it) refused or failed.
    Service(ServiceError),
    /// The body is not JSON.
    InvalidJson(String),
    /// A field the request type does not have.
    UnknownField(String),
    /// A required field is absent.
    MissingField(String),
    /// A field has the wrong type or shape; `detail` is the parser's description.
    InvalidField { field: String, detail: String },
    /// A field is refused; `key` is the catalog message (given `field` and `arg`).
    Field { field: String, key: &'static str, arg: Option<(&'static str, String)>, code: &'static str },
    /// The body is larger than the limit.
    TooLarge { limit: usize },
    /// The body could not be read.
    BadBody(String),
    /// The body stopped arriving: no bytes for `secs` seconds.
    BodyStalled { secs: u64 },
    /// No or a wrong API key.
    Unauthorized,
    /// No such route.
    RouteNotFound { method: String, path: String },
    /// The route does not take this method.
    MethodNotAllowed { method: String, path: String },
    /// Another problem, blamed on a field it could not name itself: a context overflow is the
    /// prompt's or `max_tokens`', and only the route knows what its prompt field is called.
    AtParam { problem: Box<Problem>, param: String },
}

impl Problem {
    /// A refused field whose message needs no argument besides the field.
    pub(crate) fn field(field: impl Into<String>, key: &'static str, code: &'static str) -> Self {
        Self::Field { field: field.into(), key, arg: None, code }
    }

    /// A refused field whose message takes one more argument.
    pub(crate) fn field_with(
        field: impl Into<String>,
        key: &'static str,
        code: &'static str,
        arg: (&'static str, String),
    ) -> Self {
        Self::Field { field: field.into(), key, arg: Some(arg), code }
    }

    /// `problem`, blamed on `param`.
    pub(crate) fn at_param(problem: impl Into<Problem>, param: &str) -> Self {
        Self::AtParam { problem: Box::new(problem.into()), param: param.to_owned() }
    }

    /// Classifies a parse failure of a JSON body into a request type.
    pub(crate) fn from_json(e: serde_path_to_error::Error<serde_json::Error>) -> Self {
        Self::from_json_of(e, false)
    }

    /// [`from_json`](Self::from_json) for a body known to be well-formed JSON: a syntax error
    /// there is a field of a type its parser does not read at all (serde_json says "expected
    /// value" for a number where an enum's name goes), named as a field of the wrong type.
    pub(crate) fn from_json_of(e: serde_path_to_error::Error<serde_json::Error>, well_formed: bool) -> Self {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let detail = without_position(&inner.to_string());
        if !inner.is_data() {
            if well_formed && !(path == "." || path.is_empty()) {
                return Self::InvalidField { field: path, detail: "invalid type".into() };
            }
            return Self::InvalidJson(detail);
        }
        if let Some(name) = backticked(&detail, "unknown field `") {
            // The path ends with the unknown field itself.
            let field = if path.ends_with(name) { path.clone() } else { join(&path, name) };
            return Self::UnknownField(field);
        }
        if let Some(name) = backticked(&detail, "missing field `") {
            return Self::MissingField(join(&path, name));
        }
        if let Some(name) = backticked(&detail, "duplicate field `") {
            let field = if path.ends_with(name) { path.clone() } else { join(&path, name) };
            return Self::InvalidField { field, detail };
        }
        let field = if path == "." || path.is_empty() { "body".to_owned() } else { path };
        Self::InvalidField { field, detail }
    }

    fn status(&self) -> StatusCode {
        match self {
            Self::Service(ServiceError::NotFound(_)) => StatusCode::NOT_FOUND,
            Self::Service(ServiceError::Unsupported(_)) => StatusCode::NOT_IMPLEMENTED,
            Self::Service(e) => class_status(e.class()),
            Self::InvalidJson(_)
            | Self::UnknownField(_)
            | Self::MissingField(_)
            | Self::InvalidField { .. }
            | Self::Field { .. }
            | Self::BadBody(_) => StatusCode::BAD_REQUEST,
            Self::BodyStalled { .. } => StatusCode::REQUEST_TIMEOUT,
            Self::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::Unauthorized => StatusCode::UNAUTHORIZED,
            Self::RouteNotFound { .. } => StatusCode::NOT_FOUND,
            Self::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            Self::AtParam { problem, .. } => problem.status(),
        }
    }

    fn retry_after(&self) -> Option<u32> {
        match self {
            Self::AtParam { problem, .. } => problem.retry_after(),
            Self::Service(ServiceError::NotReady(_)) => Some(5),
            Self::Service(e) if e.class() == ErrorClass::Overloaded => Some(1),
            _ => None,
        }
    }

    fn code(&self) -> &'static str {
        match self {
            Self::Service(e) => e.code(),
            Self::InvalidJson(_) => "invalid_json",
            Self::UnknownField(_) => "unknown_field",
            Self::MissingField(_) => "missing_field",
            Self::InvalidField { .. } => "invalid_type",
            Self::Field { code, .. } => code,
            Self::TooLarge { .. } => "payload_too_large",
            Self::BadBody(_) => "invalid_body",
            Self::BodyStalled { .. } => "request_timeout",
            Self::Unauthorized => "invalid_api_key",
            Self::RouteNotFound { .. } => "route_not_found",
            Self::MethodNotAllowed { .. } => "method_not_allowed",
            Self::AtParam { problem, .. } => problem.code(),
        }
    }

    fn param(&self) -> Option<String> {
        match self {
            Self::Service(ServiceError::NotFound(_) | ServiceError::NotReady(_)) => Some("model".into()),
            Self::Service(ServiceError::Engine(EngineError::InvalidRequest { field, .. })) => {
                Some(field.clone())
            }
            Self::Service(ServiceError::Engine(EngineError::DuplicateRequest(_))) => {
                Some("request_id".into())
            }
            // A launch under a uid in use: the uid is the field at fault.
            Self::Service(ServiceError::Cluster(xinf_actors::ActorError::ModelExists(_))) => {
                Some("model_uid".into())
            }
            Self::Service(ServiceError::Cluster(e)) => e.launch_field().map(str::to_owned),
            Self::Service(_) => None,
            Self::UnknownField(f) | Self::MissingField(f) => Some(f.clone()),
            Self::InvalidField { field, .. } | Self::Field { field, .. } => Some(field.clone()),
            Self::InvalidJson(_) | Self::TooLarge { .. } | Self::BadBody(_) | Self::BodyStalled { .. } => {
                None
            }
            Self::Unauthorized | Self::RouteNotFound { .. } | Self::MethodNotAllowed { .. } => None,
            Self::AtParam { param, .. } => Some(param.clone()),
        }
    }

    /// The message in the catalog's language.
    pub(crate) fn text(&self, cat: &Catalog) -> String {
        match self {
            Self::Service(e) => service_error_text(cat, e),
            Self::InvalidJson(detail) => cat.text("api-invalid-json", &[("detail", detail)]),
            Self::UnknownField(field) => cat.text("api-unknown-field", &[("field", field)]),
            Self::MissingField(field) => cat.text("api-missing-field", &[("field", field)]),
            Self::InvalidField { field, detail } => {
                cat.text("api-invalid-field", &[("field", field), ("detail", detail)])
            }
            Self::Field { field, key, arg, .. } => match arg {
                Some((name, value)) => cat.text(key, &[("field", field), (name, value)]),
                None => cat.text(key, &[("field", field)]),
            },
            Self::TooLarge { limit } => cat.text("api-body-too-large", &[("limit", &limit.to_string())]),
            Self::BadBody(detail) => cat.text("api-bad-body", &[("detail", detail)]),
            Self::BodyStalled { secs } => cat.text("api-body-stalled", &[("secs", &secs.to_string())]),
            Self::Unauthorized => cat.text("api-unauthorized", &[]),
            Self::RouteNotFound { method, path } => {
                cat.text("api-route-not-found", &[("method", &clip(method)), ("path", &clip(path))])
            }
            Self::MethodNotAllowed { method, path } => {
                cat.text("api-method-not-allowed", &[("method", &clip(method)), ("path", &clip(path))])
            }
            Self::AtParam { problem, .. } => problem.text(cat),
        }
    }

    /// The OpenAI error object, in the given language.
    pub(crate) fn body(&self, lang: &str) -> ErrorBody {
        let cat = Catalog::new(lang);
        let message = self.text(&cat);
        ErrorBody {
            detail: message.clone(),
            error: ErrorDetail {
                message,
                kind: status_type(self.status()),
                param: self.param(),
                code: self.code(),
            },
        }
    }
}

impl From<ServiceError> for Problem {
    fn from(e: ServiceError) -> Self {
        Self::Service(e)
    }
}

impl From<EngineError> for Problem {
    fn from(e: EngineError) -> Self {
        Self::Service(ServiceError::Engine(e))
    }
}

/// The HTTP status of an error class.
fn class_status(class: ErrorClass) -> StatusCode {
    match class {
        ErrorClass::InvalidInput => StatusCode::BAD_REQUEST,
        ErrorClass::NotFound => StatusCode::NOT_FOUND,
        ErrorClass::Conflict => StatusCode::CONFLICT,
        ErrorClass::Overloaded => StatusCode::TOO_MANY_REQUESTS,
        ErrorClass::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        // nginx's "client closed request", which Xinference answers for cancelled requests.
        ErrorClass::Cancelled => StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
        ErrorClass::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// The OpenAI error `type` of a status.
fn status_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        401 => "authentication_error",
        404 => "not_found_error",
        409 => "conflict_error",
        429 => "overloaded_error",
        499 => "cancelled_error",
        503 => "unavailable_error",
        s if s >= 500 => "internal_error",
        _ => "invalid_request_error",
    }
}

/// serde_json appends " at line L column C"; the position means little to an API client.
fn without_position(msg: &str) -> String {
    match msg.rfind(" at line ") {
        Some(i) => msg[..i].to_owned(),
        None => msg.to_owned(),
    }
}

/// The text between `prefix` and the next backtick.
fn backticked<'a>(msg: &'a str, prefix: &str) -> Option<&'a str> {
    let rest = &msg[msg.find(prefix)? + prefix.len()..];
    rest.find('`').map(|end| &rest[..end])
}

fn join(path: &str, name: &str) -> String {
    if path == "." || path.is_empty() { name.to_owned() } else { format!("{path}.{name}") }
}

/// The catalog language a request asks for (`Accept-Language`; English without one).
pub(crate) fn request_lang(req: &HttpRequest) -> &'static str {
    let header = req.headers().get(header::ACCEPT_LANGUAGE).and_then(|v| v.to_str().ok()).unwrap_or("");
    xinf_i18n::negotiate(header)
}

/// A [`Problem`] in a language: what handlers return.
#[derive(Debug)]
pub(crate) struct ApiError {
    problem: Problem,
    lang: &'static str,
}

impl ApiError {
    pub(crate) fn new(problem: Problem, lang: &'static str) -> Self {
        Self { problem, lang }
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.problem.text(&Catalog::new("en")))
    }
}

/// The level an error response is logged at. A client's mistake (4xx) is the client's to see,
/// so it stays at debug; 503 means "try later" (a model loading, a role without replicas, an
/// overload), worth an operator's notice but not a fault; any other 5xx is a fault of the
/// server.
fn log_level(status: StatusCode) -> tracing::Level {
    match status {
        StatusCode::SERVICE_UNAVAILABLE => tracing::Level::WARN,
        s if s.is_server_error() => tracing::Level::ERROR,
        _ => tracing::Level::DEBUG,
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        self.problem.status()
    }

    fn error_response(&self) -> HttpResponse {
        let status = self.status_code();
        let code = status.as_u16();
        match log_level(status) {
            tracing::Level::ERROR => tracing::error!(target: "xinf::api", status = code, "{}", self),
            tracing::Level::WARN => tracing::warn!(target: "xinf::api", status = code, "{}", self),
            _ => tracing::debug!(target: "xinf::api", status = code, "{}", self),
        }
        let mut res = HttpResponse::build(status);
        if let Some(secs) = self.problem.retry_after() {
            res.insert_header((header::RETRY_AFTER, secs.to_string()));
        }
        if matches!(self.problem, Problem::Unauthorized) {
            res.insert_header((header::WWW_AUTHENTICATE, "Bearer"));
        }
        res.json(self.problem.body(self.lang))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::openai::ChatCompletionRequest;
    use crate::api::sampling::WithSampling;

    fn parse(json: &str) -> Problem {
        let de = &mut serde_json::Deserializer::from_str(json);
        match serde_path_to_error::deserialize::<_, WithSampling<ChatCompletionRequest>>(de) {
            Ok(_) => panic!("{json} parsed"),
            Err(e) => Problem::from_json(e),
        }
    }

    #[test]
    fn log_level_by_status() {
        use tracing::Level;
        assert_eq!(log_level(StatusCode::BAD_REQUEST), Level::DEBUG);
        assert_eq!(log_level(StatusCode::NOT_FOUND), Level::DEBUG);
        assert_eq!(log_level(StatusCode::TOO_MANY_REQUESTS), Level::DEBUG);
        assert_eq!(log_level(StatusCode::SERVICE_UNAVAILABLE), Level::WARN);
        assert_eq!(log_level(StatusCode::INTERNAL_SERVER_ERROR), Level::ERROR);
        assert_eq!(log_level(StatusCode::GATEWAY_TIMEOUT), Level::ERROR);
    }

    #[test]
    fn parse_errors_name_the_field() {
        let ok = r#""model": "m", "messages": [{"role": "user", "content": "hi"}]"#;
        match parse(&format!("{{{ok}, \"foo\": 1}}")) {
            Problem::UnknownField(f) => assert_eq!(f, "foo"),
            p => panic!("{p:?}"),
        }
        match parse(&format!("{{{ok}, \"temperature\": \"hot\"}}")) {
            Problem::InvalidField { field, detail } => {
                assert_eq!(field, "temperature");
                assert!(!detail.contains("line"), "{detail}");
            }
            p => panic!("{p:?}"),
        }
        match parse(r#"{"model": "m", "messages": [{"role": "user", "content": "hi", "x": 1}]}"#) {
            Problem::UnknownField(f) => assert_eq!(f, "messages[0].x"),
            p => panic!("{p:?}"),
        }
        match parse(r#"{"messages": []}"#) {
            Problem::MissingField(f) => assert_eq!(f, "model"),
            p => panic!("{p:?}"),
        }
        match parse(&format!("{{{ok}, \"model\": \"n\"}}")) {
            Problem::InvalidField { field, detail } => {
                assert_eq!((field.as_str(), detail.as_str()), ("model", "duplicate field `model`"))
            }
            p => panic!("{p:?}"),
        }
        match parse(r#"{"model": "m", "messages": [{"role": "user", "content": "hi", "role": "user"}]}"#) {
            Problem::InvalidField { field, .. } => assert_eq!(field, "messages[0].role"),
            p => panic!("{p:?}"),
        }
        assert!(matches!(parse(r#"{"model": "#), Problem::InvalidJson(_)));
        assert!(matches!(parse(r#"{"model" "m"}"#), Problem::InvalidJson(_)));
    }

    #[test]
    fn statuses_and_bodies() {
        let p = Problem::from(ServiceError::NotFound("nope".into()));
        assert_eq!(p.status(), StatusCode::NOT_FOUND);
        let body = serde_json::to_value(p.body("en")).unwrap_or_default();
        assert_eq!(body["error"]["param"], "model");
        assert!(body["error"]["message"].as_str().unwrap_or("").contains("nope"), "{body}");
        assert_eq!(body["detail"], body["error"]["message"]);
        let p = Problem::from(ServiceError::Cluster(xinf_actors::ActorError::ModelExists("m".into())));
        assert_eq!(p.status(), StatusCode::CONFLICT);
        assert_eq!(serde_json::to_value(p.body("en")).unwrap_or_default()["error"]["param"], "model_uid");
        let p = Problem::from(EngineError::Overloaded { queued: 3, limit: 3 });
        assert_eq!(p.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(p.retry_after(), Some(1));
        let p = Problem::from(EngineError::Aborted);
        assert_eq!(p.status().as_u16(), 499);
        let zh = serde_json::to_value(Problem::Unauthorized.body("zh-CN")).unwrap_or_default();
        assert_ne!(
            zh["error"]["message"],
            serde_json::to_value(Problem::Unauthorized.body("en")).unwrap_or_default()["error"]["message"]
        );
    }
}
