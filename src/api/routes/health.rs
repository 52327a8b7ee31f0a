//! `GET /health` and `GET /metrics` (Prometheus text format). Neither needs the API key.

use crate::api::AppState;
use actix_web::{HttpResponse, web};
use std::fmt::Write;

/// Liveness: `{"status": "ok"}`.
pub(crate) async fn health() -> HttpResponse {
    HttpResponse::Ok().json(serde_json::json!({ "status": "ok" }))
}

/// The metrics, one family per stats key; see [`crate::api::ModelService`].
const FAMILIES: &[(&str, &str, &str, &str)] = &[
    ("xinf_requests_running", "gauge", "running", "Requests being computed."),
    ("xinf_requests_queued", "gauge", "queued", "Requests waiting for admission."),
    ("xinf_prompt_tokens_total", "counter", "prompt_tokens", "Prompt tokens computed since start."),
    ("xinf_generation_tokens_total", "counter", "generated_tokens", "Tokens generated since start."),
    ("xinf_kv_blocks_used", "gauge", "used_blocks", "KV cache blocks in use."),
    ("xinf_kv_blocks_total", "gauge", "total_blocks", "KV cache blocks in all."),
];

/// The P/D handoff metrics, from the stats' `handoff` object.
const HANDOFF_FAMILIES: &[(&str, &str, &str, &str)] = &[
    ("xinf_handoff_active_rooms", "gauge", "active_rooms", "Handoff rooms holding pinned KV."),
    ("xinf_handoff_pages_total", "counter", "pages_transferred", "KV pages moved from prefill to decode."),
    ("xinf_handoff_bytes_total", "counter", "bytes_transferred", "KV bytes moved from prefill to decode."),
    ("xinf_handoff_tcp_transfers_total", "counter", "tcp_transfers", "Page fetches over the TCP data plane."),
    (
        "xinf_handoff_in_process_transfers_total",
        "counter",
        "in_process_transfers",
        "Page fetches in process.",
    ),
    ("xinf_handoff_nixl_transfers_total", "counter", "nixl_transfers", "Page fetches through NIXL."),
    (
        "xinf_handoff_gpu_in_process_transfers_total",
        "counter",
        "gpu_in_process_transfers",
        "Page fetches GPU to GPU in process.",
    ),
    (
        "xinf_handoff_cuda_ipc_transfers_total",
        "counter",
        "cuda_ipc_transfers",
        "Page fetches GPU to GPU through CUDA IPC.",
    ),
    (
        "xinf_handoff_nixl_vram_transfers_total",
        "counter",
        "nixl_vram_transfers",
        "Page fetches GPU to GPU through NIXL.",
    ),
    (
        "xinf_handoff_gpu_bytes_total",
        "counter",
        "gpu_bytes_transferred",
        "KV bytes moved GPU to GPU without host memory.",
    ),
    (
        "xinf_handoff_gpu_fallbacks_total",
        "counter",
        "gpu_fallbacks",
        "CUDA IPC handoffs refused by the platform that went through host memory.",
    ),
    ("xinf_handoff_failed_total", "counter", "failed", "Handoffs that failed."),
    ("xinf_handoff_expired_leases_total", "counter", "expired_leases", "Rooms freed by an expired lease."),
    (
        "xinf_handoff_snapshot_hits_total",
        "counter",
        "snapshot_hits",
        "Prompt pages reused from the snapshot cache.",
    ),
    (
        "xinf_handoff_snapshot_remote_hits_total",
        "counter",
        "snapshot_remote_hits",
        "Prompt pages reused from another replica's snapshot cache.",
    ),
    ("xinf_snapshot_pages", "gauge", "snapshot_pages", "Pages held in snapshot caches."),
    ("xinf_snapshot_bytes", "gauge", "snapshot_bytes", "Bytes held in snapshot caches."),
    (
        "xinf_snapshot_evictions_total",
        "counter",
        "snapshot_evictions",
        "Snapshot pages evicted to make room.",
    ),
];

/// A Prometheus label value: backslash, double quote and newline escaped.
fn label(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// The metrics of every model.
pub(crate) async fn metrics(state: web::Data<AppState>) -> HttpResponse {
    let models = state.service.list().await.unwrap_or_default();
    let figures = futures::future::join_all(models.iter().map(|m| state.service.stats(&m.uid))).await;
    let stats: Vec<(String, Option<serde_json::Value>)> = models
        .iter()
        .zip(figures)
        .map(|(m, s)| {
            let labels = format!("model_uid=\"{}\",model_name=\"{}\"", label(&m.uid), label(&m.model_name));
            (labels, s.ok())
        })
        .collect();
    let mut out = String::new();
    let _ = writeln!(out, "# HELP xinf_model_ready Whether the model takes requests (1) or not (0).");
    let _ = writeln!(out, "# TYPE xinf_model_ready gauge");
    for (m, (labels, _)) in models.iter().zip(&stats) {
        let ready = u8::from(m.status == xinf_actors::ModelStatus::Ready);
        let _ = writeln!(out, "xinf_model_ready{{{labels}}} {ready}");
    }
    for (name, kind, key, help) in FAMILIES {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        for (labels, s) in &stats {
            if let Some(v) = s.as_ref().and_then(|s| s.get(*key)).and_then(serde_json::Value::as_f64) {
                let _ = writeln!(out, "{name}{{{labels}}} {v}");
            }
        }
    }
    for (name, kind, key, help) in HANDOFF_FAMILIES {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        for (labels, s) in &stats {
            let v = s.as_ref().and_then(|s| s.get("handoff")).and_then(|h| h.get(*key));
            if let Some(v) = v.and_then(serde_json::Value::as_f64) {
                let _ = writeln!(out, "{name}{{{labels}}} {v}");
            }
        }
    }
    let name = "xinf_handoff_transfer_seconds";
    let _ = writeln!(out, "# HELP {name} Time a decode replica waited for a handoff's pages.");
    let _ = writeln!(out, "# TYPE {name} histogram");
    for (labels, s) in &stats {
        let h = s.as_ref().and_then(|s| s.get("handoff")).and_then(|h| h.get("latency"));
        let Some(h) = h else { continue };
        let count = h.get("count").and_then(serde_json::Value::as_u64).unwrap_or(0);
        let buckets = h.get("buckets").and_then(serde_json::Value::as_array);
        for (bound, n) in xinf_actors::HANDOFF_LATENCY_BOUNDS.iter().zip(buckets.into_iter().flatten()) {
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{bound}\"}} {}", n.as_u64().unwrap_or(0));
        }
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {count}");
        let sum = h.get("sum_us").and_then(serde_json::Value::as_u64).unwrap_or(0) as f64 / 1e6;
        let _ = writeln!(out, "{name}_sum{{{labels}}} {sum}");
        let _ = writeln!(out, "{name}_count{{{labels}}} {count}");
    }
    HttpResponse::Ok().content_type("text/plain; version=0.0.4; charset=utf-8").body(out)
}

#[cfg(test)]
mod tests {
    #[test]
    fn label_escaping() {
        assert_eq!(super::label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
