//! `GET /health` and `GET /metrics` (Prometheus text format). Neither needs the API key.

use crate::api::{AppState, ModelStats};
use actix_web::{HttpResponse, web};
use std::fmt::Write;
use xinf_actors::{HANDOFF_LATENCY_BOUNDS, HandoffStats};

/// Liveness: `{"status": "ok"}`.
pub(crate) async fn health() -> HttpResponse {
    HttpResponse::Ok().json(serde_json::json!({ "status": "ok" }))
}

/// A metric family: its name, Prometheus type, the figure it shows (`None`: the model's
/// source does not know it, and the model gets no sample) and its help text.
type Family<T> = (&'static str, &'static str, fn(&T) -> Option<u64>, &'static str);

/// The metrics of a model's [`ModelStats`].
const FAMILIES: &[Family<ModelStats>] = &[
    ("xinf_requests_running", "gauge", |s| Some(s.running), "Requests being computed."),
    ("xinf_requests_queued", "gauge", |s| Some(s.queued), "Requests waiting for admission."),
    ("xinf_prompt_tokens_total", "counter", |s| Some(s.prompt_tokens), "Prompt tokens computed since start."),
    (
        "xinf_generation_tokens_total",
        "counter",
        |s| Some(s.generated_tokens),
        "Tokens generated since start.",
    ),
    ("xinf_kv_blocks_used", "gauge", |s| s.used_blocks, "KV cache blocks in use."),
    ("xinf_kv_blocks_total", "gauge", |s| s.total_blocks, "KV cache blocks in all."),
];

/// The P/D handoff metrics, from [`ModelStats::handoff`].
const HANDOFF_FAMILIES: &[Family<HandoffStats>] = &[
    ("xinf_handoff_active_rooms", "gauge", |h| Some(h.active_rooms), "Handoff rooms holding pinned KV."),
    (
        "xinf_handoff_pages_total",
        "counter",
        |h| Some(h.pages_transferred),
        "KV pages moved from prefill to decode.",
    ),
    (
        "xinf_handoff_bytes_total",
        "counter",
        |h| Some(h.bytes_transferred),
        "KV bytes moved from prefill to decode.",
    ),
    (
        "xinf_handoff_tcp_transfers_total",
        "counter",
        |h| Some(h.tcp_transfers),
        "Page fetches over the TCP data plane.",
    ),
    (
        "xinf_handoff_in_process_transfers_total",
        "counter",
        |h| Some(h.in_process_transfers),
        "Page fetches in process.",
    ),
    (
        "xinf_handoff_nixl_transfers_total",
        "counter",
        |h| Some(h.nixl_transfers),
        "Page fetches through NIXL.",
    ),
    (
        "xinf_handoff_gpu_in_process_transfers_total",
        "counter",
        |h| Some(h.gpu_in_process_transfers),
        "Page fetches GPU to GPU in process.",
    ),
    (
        "xinf_handoff_cuda_ipc_transfers_total",
        "counter",
        |h| Some(h.cuda_ipc_transfers),
        "Page fetches GPU to GPU through CUDA IPC.",
    ),
    (
        "xinf_handoff_nixl_vram_transfers_total",
        "counter",
        |h| Some(h.nixl_vram_transfers),
        "Page fetches GPU to GPU through NIXL.",
    ),
    (
        "xinf_handoff_gpu_bytes_total",
        "counter",
        |h| Some(h.gpu_bytes_transferred),
        "KV bytes moved GPU to GPU without host memory.",
    ),
    (
        "xinf_handoff_gpu_fallbacks_total",
        "counter",
        |h| Some(h.gpu_fallbacks),
        "CUDA IPC handoffs refused by the platform that went through host memory.",
    ),
    ("xinf_handoff_failed_total", "counter", |h| Some(h.failed), "Handoffs that failed."),
    (
        "xinf_handoff_expired_leases_total",
        "counter",
        |h| Some(h.expired_leases),
        "Rooms freed by an expired lease.",
    ),
    (
        "xinf_handoff_snapshot_hits_total",
        "counter",
        |h| Some(h.snapshot_hits),
        "Prompt pages reused from the snapshot cache.",
    ),
    (
        "xinf_handoff_snapshot_remote_hits_total",
        "counter",
        |h| Some(h.snapshot_remote_hits),
        "Prompt pages reused from another replica's snapshot cache.",
    ),
    ("xinf_snapshot_pages", "gauge", |h| Some(h.snapshot_pages), "Pages held in snapshot caches."),
    ("xinf_snapshot_bytes", "gauge", |h| Some(h.snapshot_bytes), "Bytes held in snapshot caches."),
    (
        "xinf_snapshot_evictions_total",
        "counter",
        |h| Some(h.snapshot_evictions),
        "Snapshot pages evicted to make room.",
    ),
];

/// A Prometheus label value: backslash, double quote and newline escaped.
fn label(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// What `/metrics` shows of one model.
struct ModelMetrics {
    /// Its labels, `model_uid="..",model_name=".."`.
    labels: String,
    ready: bool,
    /// Its figures; `None` when the service could not tell them.
    stats: Option<ModelStats>,
}

impl ModelMetrics {
    fn handoff(&self) -> Option<&HandoffStats> {
        self.stats.as_ref()?.handoff.as_ref()
    }
}

/// The metrics of every model.
pub(crate) async fn metrics(state: web::Data<AppState>) -> HttpResponse {
    let models = state.service.list().await.unwrap_or_default();
    let figures = futures::future::join_all(models.iter().map(|m| state.service.stats(&m.uid))).await;
    let models: Vec<ModelMetrics> = models
        .iter()
        .zip(figures)
        .map(|(m, s)| ModelMetrics {
            labels: format!("model_uid=\"{}\",model_name=\"{}\"", label(&m.uid), label(&m.model_name)),
            ready: m.status.serves(),
            stats: s.ok(),
        })
        .collect();
    HttpResponse::Ok().content_type("text/plain; version=0.0.4; charset=utf-8").body(render(&models))
}

/// The Prometheus text of the models' metrics. Every family gets its `HELP` and `TYPE` lines
/// even without samples; values are written as floats (`3`, `1.5`), as Prometheus reads them.
fn render(models: &[ModelMetrics]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# HELP xinf_model_ready Whether the model takes requests (1) or not (0).");
    let _ = writeln!(out, "# TYPE xinf_model_ready gauge");
    for m in models {
        let _ = writeln!(out, "xinf_model_ready{{{}}} {}", m.labels, u8::from(m.ready));
    }
    families(&mut out, models, FAMILIES, |m| m.stats.as_ref());
    families(&mut out, models, HANDOFF_FAMILIES, ModelMetrics::handoff);
    let name = "xinf_handoff_transfer_seconds";
    let _ = writeln!(out, "# HELP {name} Time a decode replica waited for a handoff's pages.");
    let _ = writeln!(out, "# TYPE {name} histogram");
    for m in models {
        let Some(h) = m.handoff().map(|h| &h.latency) else { continue };
        let labels = &m.labels;
        for (bound, n) in HANDOFF_LATENCY_BOUNDS.iter().zip(h.buckets) {
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{bound}\"}} {n}");
        }
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {}", h.count);
        let _ = writeln!(out, "{name}_sum{{{labels}}} {}", h.sum_us as f64 / 1e6);
        let _ = writeln!(out, "{name}_count{{{labels}}} {}", h.count);
    }
    out
}

/// Writes `list`'s families, each model's sample from the figures `of` finds for it.
fn families<T>(
    out: &mut String,
    models: &[ModelMetrics],
    list: &[Family<T>],
    of: impl Fn(&ModelMetrics) -> Option<&T>,
) {
    for (name, kind, figure, help) in list {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        for m in models {
            if let Some(v) = of(m).and_then(figure) {
                let _ = writeln!(out, "{name}{{{}}} {}", m.labels, v as f64);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use xinf_actors::ReplicaStats;

    #[test]
    fn label_escaping() {
        assert_eq!(super::label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }

    /// A single engine, a P/D cluster model that is loading, and a model whose figures
    /// could not be read.
    fn models() -> Vec<ModelMetrics> {
        let engine = xinf_engine::EngineStats {
            running: 2,
            queued: 1,
            used_blocks: 40,
            pinned_blocks: 0,
            total_blocks: 1000,
            prompt_tokens: 123,
            generated_tokens: 4567,
        };
        let mut handoff = HandoffStats::default();
        handoff.pages_transferred = 12;
        handoff.bytes_transferred = 3 << 20;
        handoff.tcp_transfers = 1;
        handoff.failed = 1;
        handoff.snapshot_hits = 5;
        handoff.latency.observe(0.003);
        handoff.latency.observe(0.2);
        let replica = |uid: &str, handoff: HandoffStats| {
            serde_json::from_value::<ReplicaStats>(json!({"replica_uid": uid, "worker_id": "w",
                "running": 1, "queued": 0, "requests_served": 9, "prompt_tokens": 10,
                "generated_tokens": 20, "pinned_blocks": 3, "handoff": handoff}))
            .ok()
        };
        let replicas = [replica("p", HandoffStats::default()), replica("d", handoff)];
        let replicas: Vec<ReplicaStats> = replicas.into_iter().flatten().collect();
        assert_eq!(replicas.len(), 2);
        vec![
            ModelMetrics {
                labels: "model_uid=\"one\",model_name=\"smollm2\"".into(),
                ready: true,
                stats: Some(ModelStats::from(&engine)),
            },
            ModelMetrics {
                labels: "model_uid=\"pd\",model_name=\"qwen3\"".into(),
                ready: false,
                stats: Some(ModelStats::from_replicas(replicas)),
            },
            ModelMetrics { labels: "model_uid=\"gone\",model_name=\"x\"".into(), ready: true, stats: None },
        ]
    }

    /// The whole text, byte for byte: every family's header, samples only for the figures a
    /// model's source knows, floats written as Prometheus reads them, the cumulative buckets.
    #[test]
    fn metrics_text() {
        assert_eq!(render(&models()), include_str!("testdata/metrics.txt"));
    }
}
