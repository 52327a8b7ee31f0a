//! A small blocking client of xinf's REST API, for the commands that talk to a running server
//! (`launch`, `list`, `terminate`, `chat`).
//!
//! Blocking on purpose: each command makes a few calls in order, and `ureq` is already in the
//! dependency tree (the Hugging Face hub client), so the CLI needs no second HTTP stack.

use crate::api::ModelInfo;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::io::{BufRead, BufReader, Read};
use std::ops::ControlFlow;
use std::time::Duration;
use xinf_i18n::Catalog;

/// The error shape of every failed call and of a stream's `error` event:
/// `{"error": {"message": ..}}` (other keys are not needed here).
#[derive(Deserialize)]
struct ErrorAnswer {
    error: ErrorMessage,
}

#[derive(Deserialize)]
struct ErrorMessage {
    message: String,
}

/// `GET /v1/models`: of each entry, the CLI reads xinf's own description.
#[derive(Deserialize)]
pub(crate) struct ModelList {
    data: Vec<ModelEntry>,
}

#[derive(Deserialize)]
struct ModelEntry {
    xinf: ModelInfo,
}

impl ModelList {
    /// The models, in the server's order.
    pub(crate) fn into_models(self) -> Vec<ModelInfo> {
        self.data.into_iter().map(|m| m.xinf).collect()
    }
}

/// Why a call failed. `Display` gives the English text (for logs); [`ClientError::text`] gives
/// the reader's.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ClientError {
    /// The server could not be reached.
    #[error("cannot reach {endpoint}: {detail}")]
    Unreachable { endpoint: String, detail: String },
    /// The server answered with an error (its OpenAI-shaped message, in the language the
    /// request asked for).
    #[error("{message} (HTTP {status})")]
    Status { status: u16, message: String },
    /// The answer was not what the API returns.
    #[error("unexpected answer from {endpoint}: {detail}")]
    Invalid { endpoint: String, detail: String },
    /// The call ended without any answer, not even an error.
    #[error("unexpected answer from {endpoint}: no answer")]
    NoAnswer { endpoint: String },
    /// A stream broke off while it was being read.
    #[error("cannot reach {endpoint}: the stream broke: {detail}")]
    StreamBroken { endpoint: String, detail: String },
    /// A stream ended without its closing `data: [DONE]`.
    #[error("cannot reach {endpoint}: the stream ended before [DONE]")]
    StreamUnfinished { endpoint: String },
}

impl ClientError {
    /// The HTTP status, when the server answered.
    pub(crate) fn status(&self) -> Option<u16> {
        match self {
            Self::Status { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// The failure in the catalog's language. The server's own message is already in the
    /// reader's language (the client sends `Accept-Language`); transport details come from the
    /// operating system and stay as they are.
    pub(crate) fn text(&self, cat: &Catalog) -> String {
        match self {
            Self::Unreachable { endpoint, detail } => {
                cat.text("cli-unreachable", &[("endpoint", endpoint), ("detail", detail)])
            }
            Self::Status { status, message } => {
                cat.text("cli-http-error", &[("message", message), ("status", &status.to_string())])
            }
            Self::Invalid { endpoint, detail } => {
                cat.text("cli-bad-answer", &[("endpoint", endpoint), ("detail", detail)])
            }
            Self::NoAnswer { endpoint } => cat.text("cli-no-answer", &[("endpoint", endpoint)]),
            Self::StreamBroken { endpoint, detail } => {
                cat.text("cli-stream-broken", &[("endpoint", endpoint), ("detail", detail)])
            }
            Self::StreamUnfinished { endpoint } => {
                cat.text("cli-stream-unfinished", &[("endpoint", endpoint)])
            }
        }
    }
}

/// A client of one server.
#[derive(Clone)]
pub(crate) struct Client {
    endpoint: String,
    api_key: Option<String>,
    /// The user's language (`ja-JP`), sent as `Accept-Language` so that the server's errors
    /// come back in it; `None` for the `C` locale.
    language: Option<String>,
    agent: ureq::Agent,
}

impl Client {
    /// A client of `endpoint` (`http://host:port`, with or without a trailing `/`) that asks
    /// for answers in the language of the process locale.
    pub(crate) fn new(endpoint: &str, api_key: Option<String>) -> Self {
        let agent = ureq::AgentBuilder::new()
            .timeout_connect(Duration::from_secs(10))
            // Launches wait for weights to load; streams last as long as generation does.
            .timeout_read(Duration::from_secs(3600))
            .build();
        let endpoint = endpoint.trim_end_matches('/').to_owned();
        let endpoint = if endpoint.contains("://") { endpoint } else { format!("http://{endpoint}") };
        let language = xinf_i18n::user_language();
        Self { endpoint, api_key: api_key.filter(|k| !k.is_empty()), language, agent }
    }

    fn request(&self, method: &str, path: &str) -> ureq::Request {
        let mut req = self.agent.request(method, &format!("{}{path}", self.endpoint));
        if let Some(key) = &self.api_key {
            req = req.set("Authorization", &format!("Bearer {key}"));
        }
        if let Some(language) = &self.language {
            req = req.set("Accept-Language", language);
        }
        req
    }

    /// The endpoint, for errors that name it.
    pub(crate) fn endpoint(&self) -> &str {
        &self.endpoint
    }

    fn fail(&self, e: ureq::Error) -> ClientError {
        match e {
            ureq::Error::Status(status, res) => {
                let text = res.into_string().unwrap_or_default();
                let message =
                    serde_json::from_str::<ErrorAnswer>(&text).map(|a| a.error.message).unwrap_or(text);
                ClientError::Status { status, message }
            }
            ureq::Error::Transport(t) => {
                ClientError::Unreachable { endpoint: self.endpoint.clone(), detail: t.to_string() }
            }
        }
    }

    fn json(&self, res: ureq::Response) -> Result<Value, ClientError> {
        res.into_json::<Value>()
            .map_err(|e| ClientError::Invalid { endpoint: self.endpoint.clone(), detail: e.to_string() })
    }

    /// `GET path` → JSON.
    pub(crate) fn get(&self, path: &str) -> Result<Value, ClientError> {
        let res = self.request("GET", path).call().map_err(|e| self.fail(e))?;
        self.json(res)
    }

    /// A JSON answer read as the type the server wrote it from.
    pub(crate) fn typed<T: DeserializeOwned>(&self, answer: Value) -> Result<T, ClientError> {
        serde_json::from_value(answer)
            .map_err(|e| ClientError::Invalid { endpoint: self.endpoint.clone(), detail: e.to_string() })
    }

    /// `GET /v1/models` → xinf's description of each model.
    pub(crate) fn models(&self) -> Result<Vec<ModelInfo>, ClientError> {
        self.typed(self.get("/v1/models")?).map(ModelList::into_models)
    }

    /// `POST path` with a JSON body → JSON.
    pub(crate) fn post(&self, path: &str, body: &Value) -> Result<Value, ClientError> {
        let res = self.request("POST", path).send_json(body).map_err(|e| self.fail(e))?;
        self.json(res)
    }

    /// `DELETE path` → JSON.
    pub(crate) fn delete(&self, path: &str) -> Result<Value, ClientError> {
        let res = self.request("DELETE", path).call().map_err(|e| self.fail(e))?;
        self.json(res)
    }

    /// `POST path` with a JSON body that asks for a stream; calls `each` with every SSE event
    /// until `data: [DONE]` (then `Continue`) or until `each` says `Break` (then `Break`, the
    /// connection closed, so the server aborts the request). An `error` event ends the stream
    /// with its message.
    pub(crate) fn stream(
        &self,
        path: &str,
        body: &Value,
        mut each: impl FnMut(&Value) -> ControlFlow<()>,
    ) -> Result<ControlFlow<()>, ClientError> {
        let res = self.request("POST", path).send_json(body).map_err(|e| self.fail(e))?;
        let reader: Box<dyn Read + Send> = res.into_reader();
        for line in BufReader::new(reader).lines() {
            let line = line.map_err(|e| ClientError::StreamBroken {
                endpoint: self.endpoint.clone(),
                detail: e.to_string(),
            })?;
            let Some(data) = line.strip_prefix("data:") else { continue };
            let data = data.trim();
            if data == "[DONE]" {
                return Ok(ControlFlow::Continue(()));
            }
            let event: Value = serde_json::from_str(data).map_err(|e| ClientError::Invalid {
                endpoint: self.endpoint.clone(),
                detail: e.to_string(),
            })?;
            if let Ok(ErrorAnswer { error }) = ErrorAnswer::deserialize(&event) {
                return Err(ClientError::Status { status: 500, message: error.message });
            }
            if each(&event).is_break() {
                // Dropping the response closes the connection: the server aborts the request.
                return Ok(ControlFlow::Break(()));
            }
        }
        Err(ClientError::StreamUnfinished { endpoint: self.endpoint.clone() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_carry_the_user_language() {
        let mut client = Client::new("127.0.0.1:9997/", Some(String::new()));
        assert_eq!(client.endpoint(), "http://127.0.0.1:9997");
        client.language = xinf_i18n::locale_tag("ja_JP.UTF-8");
        let req = client.request("GET", "/v1/models");
        assert_eq!(req.header("Accept-Language"), Some("ja-JP"));
        assert_eq!(req.header("Authorization"), None);
        client.language = xinf_i18n::locale_tag("C.UTF-8");
        assert_eq!(client.request("GET", "/v1/models").header("Accept-Language"), None);
    }

    #[test]
    fn failures_read_in_the_catalog_language() {
        let endpoint = "http://h:1".to_owned();
        let broken = ClientError::StreamBroken { endpoint: endpoint.clone(), detail: "reset".into() };
        let en = Catalog::new("en");
        assert_eq!(broken.text(&en), broken.to_string());
        let status = ClientError::Status { status: 404, message: "no model".into() };
        assert_eq!(status.text(&en), "no model (HTTP 404)");
        let unfinished = ClientError::StreamUnfinished { endpoint };
        assert_eq!(unfinished.text(&en), "cannot reach http://h:1: the stream ended before [DONE]");
        let de = unfinished.text(&Catalog::new("de"));
        assert!(de.contains("http://h:1") && de != unfinished.to_string(), "{de}");
    }
}
