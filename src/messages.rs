//! Turning typed errors into localized text.

use crate::api::ServiceError;
use crate::api::shown::clip;
use xinf_actors::ActorError;
use xinf_engine::EngineError;
use xinf_i18n::Catalog;

/// The localized text of an engine error.
pub fn engine_error_text(cat: &Catalog, e: &EngineError) -> String {
    match e {
        EngineError::InvalidRequest { field, reason } => {
            cat.text("error-invalid-request", &[("field", field), ("reason", reason)])
        }
        EngineError::ContextLength { prompt_tokens, max_tokens, context_length } => cat.text(
            "error-context-length",
            &[
                ("prompt", &prompt_tokens.to_string()),
                ("max", &max_tokens.to_string()),
                ("context", &context_length.to_string()),
            ],
        ),
        EngineError::Overloaded { queued, limit } => {
            cat.text("error-overloaded", &[("queued", &queued.to_string()), ("limit", &limit.to_string())])
        }
        EngineError::DuplicateRequest(id) => cat.text("error-duplicate-request", &[("id", id)]),
        EngineError::UnknownRequest(id) => cat.text("error-unknown-request", &[("id", id)]),
        EngineError::Aborted => cat.text("error-aborted", &[]),
        EngineError::Model(detail) => cat.text("error-model", &[("detail", detail)]),
        EngineError::Stopped => cat.text("error-engine-stopped", &[]),
        EngineError::Import(detail) => cat.text("error-kv-import", &[("detail", detail)]),
        EngineError::Rejected(detail) => cat.text("error-engine-rejected", &[("detail", detail)]),
        // The engine process's own words (with its log's last lines): not translated.
        EngineError::Process(detail) => cat.text("error-engine-process", &[("detail", detail)]),
        EngineError::Internal(detail) => cat.text("error-internal", &[("detail", detail)]),
        // Names the replica, the model and the cause (`was removed`, `worker … was lost`).
        EngineError::ReplicaLost(detail) => cat.text("error-replica-lost", &[("detail", detail)]),
        other => cat.text("error-internal", &[("detail", &other.to_string())]),
    }
}

/// The localized text of a model service error.
pub fn service_error_text(cat: &Catalog, e: &ServiceError) -> String {
    match e {
        ServiceError::NotFound(uid) => cat.text("api-model-not-found", &[("model", &clip(uid))]),
        ServiceError::NotReady(uid) => cat.text("api-model-not-ready", &[("model", &clip(uid))]),
        ServiceError::Engine(e) => engine_error_text(cat, e),
        ServiceError::Unavailable(detail) => cat.text("api-unavailable", &[("detail", detail)]),
        // The launch rules keep the reference implementation's exact English texts.
        ServiceError::Cluster(e @ ActorError::InvalidLaunch { .. }) => e.to_string(),
        ServiceError::Cluster(e) => cat.text("api-cluster-error", &[("detail", &e.to_string())]),
        ServiceError::Unsupported(what) => cat.text("api-unsupported", &[("what", what)]),
    }
}
