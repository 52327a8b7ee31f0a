//! Model and replica statuses in the reader's words, for `xinf list` and `xinf launch`.

use crate::api::status_name;
use xinf_actors::{ModelStatus, ReplicaStatus};
use xinf_i18n::Catalog;

/// A model's status in the reader's words. The keys follow the API's names for the statuses
/// (`loading`, `ready`), which are also their English words; a status without words is shown
/// as the API names it.
pub(super) fn model_status_text(status: ModelStatus, cat: &Catalog) -> String {
    let key = match status_name(status) {
        "loading" => "cli-model-status-loading",
        "ready" => "cli-model-status-ready",
        "degraded" => "cli-model-status-degraded",
        "unavailable" => "cli-model-status-unavailable",
        "terminating" => "cli-model-status-terminating",
        other => return other.to_owned(),
    };
    cat.text(key, &[])
}

/// A replica's status in the reader's words (the API's names in English).
pub(super) fn replica_status_text(status: ReplicaStatus, cat: &Catalog) -> String {
    let key = match status {
        ReplicaStatus::Loading => "cli-replica-status-loading",
        ReplicaStatus::Alive => "cli-replica-status-alive",
        ReplicaStatus::Draining => "cli-replica-status-draining",
        ReplicaStatus::Dead => "cli-replica-status-dead",
    };
    cat.text(key, &[])
}
