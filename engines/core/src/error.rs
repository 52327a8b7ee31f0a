//! Engine errors: classified once, where they arise.

use serde::{Deserialize, Serialize};

/// The broad kind of a failure; the REST layer maps it to an HTTP status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub enum ErrorClass {
    /// The request is malformed or asks for something impossible (400).
    InvalidInput,
    /// A named thing does not exist (404).
    NotFound,
    /// The request clashes with current state (409).
    Conflict,
    /// Too much load; retry later (429/503).
    Overloaded,
    /// The engine or model is not able to serve (503).
    Unavailable,
    /// The request was cancelled.
    Cancelled,
    /// A bug or an unexpected fault (500).
    Internal,
}

/// Why an engine refused or failed a request. Every variant carries what a user needs to fix
/// the request: the field, the limit, the cause.
#[derive(Debug, Clone, PartialEq, thiserror::Error, Serialize, Deserialize)]
#[non_exhaustive]
pub enum EngineError {
    /// A request field has an invalid value.
    #[error("invalid value for `{field}`: {reason}")]
    InvalidRequest {
        /// The field, named as in the API.
        field: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Prompt plus output do not fit in the model's context.
    #[error(
        "the prompt has {prompt_tokens} tokens and max_tokens asks for {max_tokens} more, \
         over the context length of {context_length} tokens"
    )]
    ContextLength {
        /// Prompt length.
        prompt_tokens: usize,
        /// Requested output tokens.
        max_tokens: usize,
        /// The model's limit.
        context_length: usize,
    },
    /// The waiting queue is full.
    #[error("the engine is overloaded: {queued} requests are waiting (limit {limit}); retry later")]
    Overloaded {
        /// Waiting requests.
        queued: usize,
        /// Queue bound.
        limit: usize,
    },
    /// A request with this id is already running.
    #[error("a request with id `{0}` is already running")]
    DuplicateRequest(String),
    /// No request (or pinned prompt) with this id.
    #[error("no request with id `{0}`")]
    UnknownRequest(String),
    /// The request was aborted.
    #[error("the request was aborted")]
    Aborted,
    /// The model could not be loaded or is not supported: its files, its path, its format or
    /// its architecture (the launch must change).
    #[error("{0}")]
    Model(String),
    /// The model's files could not be fetched (a download failed); the same launch may work
    /// later.
    #[error("{0}")]
    Fetch(String),
    /// No model of this name is known to the engine.
    #[error("unknown model `{name}`; known models: {}", known.join(", "))]
    UnknownModel {
        /// The name asked for.
        name: String,
        /// The names the engine knows.
        known: Vec<String>,
    },
    /// The engine thread has stopped.
    #[error("the engine has stopped")]
    Stopped,
    /// Imported KV does not fit this engine.
    #[error("imported KV cache rejected: {0}")]
    Import(String),
    /// An engine server refused the request (its own validation), with its message.
    #[error("the engine refused the request: {0}")]
    Rejected(String),
    /// An engine server process failed to start, died, or stopped answering; the text says
    /// which, with the last lines of its log where they help.
    #[error("{0}")]
    Process(String),
    /// Anything else; a bug.
    #[error("internal engine error: {0}")]
    Internal(String),
    /// The replica serving the request left its model mid-request: its worker was lost, it
    /// was removed or its worker's drain time ran out, or the model was terminated. The text
    /// says which.
    #[error("{0}")]
    ReplicaLost(String),
}

impl EngineError {
    /// Shorthand for [`EngineError::InvalidRequest`].
    pub fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::InvalidRequest { field: field.into(), reason: reason.into() }
    }

    /// The class of this error.
    pub fn class(&self) -> ErrorClass {
        match self {
            Self::InvalidRequest { .. }
            | Self::ContextLength { .. }
            | Self::Import(_)
            | Self::Rejected(_)
            | Self::Model(_) => ErrorClass::InvalidInput,
            Self::Overloaded { .. } => ErrorClass::Overloaded,
            Self::DuplicateRequest(_) => ErrorClass::Conflict,
            Self::UnknownRequest(_) | Self::UnknownModel { .. } => ErrorClass::NotFound,
            Self::Aborted => ErrorClass::Cancelled,
            Self::Fetch(_) | Self::Stopped | Self::Process(_) | Self::ReplicaLost(_) => {
                ErrorClass::Unavailable
            }
            Self::Internal(_) => ErrorClass::Internal,
        }
    }

    /// A stable, machine-readable reason code.
    pub fn code(&self) -> &'static str {
        match self {
            Self::InvalidRequest { .. } => "invalid_request",
            Self::ContextLength { .. } => "context_length_exceeded",
            Self::Overloaded { .. } => "overloaded",
            Self::DuplicateRequest(_) => "duplicate_request_id",
            Self::UnknownRequest(_) => "unknown_request",
            Self::Aborted => "aborted",
            Self::Model(_) => "model_error",
            Self::Fetch(_) => "model_fetch_failed",
            Self::UnknownModel { .. } => "unknown_model",
            Self::Stopped => "engine_stopped",
            Self::Import(_) => "kv_import_rejected",
            Self::Rejected(_) => "engine_rejected",
            Self::Process(_) => "engine_process",
            Self::ReplicaLost(_) => "replica_lost",
            Self::Internal(_) => "internal_error",
        }
    }
}
