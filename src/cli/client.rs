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
use std::time::Duration;

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

/// Why a call failed, in words for the terminal.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ClientError {
    /// The server could not be reached.
    #[error("cannot reach {endpoint}: {detail}")]
    Unreachable { endpoint: String, detail: String },
    /// The server answered with an error (its OpenAI-shaped message).
    #[error("{message} (HTTP {status})")]
    Status { status: u16, message: String },
    /// The answer was not what the API returns.
    #[error("unexpected answer from {endpoint}: {detail}")]
    Invalid { endpoint: String, detail: String },
}

impl ClientError {
    /// The HTTP status, when the server answered.
    pub(crate) fn status(&self) -> Option<u16> {
        match self {
            Self::Status { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// A client of one server.
#[derive(Clone)]
pub(crate) struct Client {
    endpoint: String,
    api_key: Option<String>,
    agent: ureq::Agent,
}

impl Client {
    /// A client of `endpoint` (`http://host:port`, with or without a trailing `/`).
    pub(crate) fn new(endpoint: &str, api_key: Option<String>) -> Self {
        let agent = ureq::AgentBuilder::new()
            .timeout_connect(Duration::from_secs(10))
            // Launches wait for weights to load; streams last as long as generation does.
            .timeout_read(Duration::from_secs(3600))
            .build();
        let endpoint = endpoint.trim_end_matches('/').to_owned();
        let endpoint = if endpoint.contains("://") { endpoint } else { format!("http://{endpoint}") };
        Self { endpoint, api_key: api_key.filter(|k| !k.is_empty()), agent }
    }

    fn request(&self, method: &str, path: &str) -> ureq::Request {
        let mut req = self.agent.request(method, &format!("{}{path}", self.endpoint));
        if let Some(key) = &self.api_key {
            req = req.set("Authorization", &format!("Bearer {key}"));
        }
        req
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
    /// until `data: [DONE]`. An `error` event ends the stream with its message.
    pub(crate) fn stream(
        &self,
        path: &str,
        body: &Value,
        mut each: impl FnMut(&Value),
    ) -> Result<(), ClientError> {
        let res = self.request("POST", path).send_json(body).map_err(|e| self.fail(e))?;
        let reader: Box<dyn Read + Send> = res.into_reader();
        for line in BufReader::new(reader).lines() {
            let line = line.map_err(|e| ClientError::Unreachable {
                endpoint: self.endpoint.clone(),
                detail: format!("the stream broke: {e}"),
            })?;
            let Some(data) = line.strip_prefix("data:") else { continue };
            let data = data.trim();
            if data == "[DONE]" {
                return Ok(());
            }
            let event: Value = serde_json::from_str(data).map_err(|e| ClientError::Invalid {
                endpoint: self.endpoint.clone(),
                detail: e.to_string(),
            })?;
            if let Ok(ErrorAnswer { error }) = ErrorAnswer::deserialize(&event) {
                return Err(ClientError::Status { status: 500, message: error.message });
            }
            each(&event);
        }
        Err(ClientError::Unreachable {
            endpoint: self.endpoint.clone(),
            detail: "the stream ended before [DONE]".into(),
        })
    }
}
