//! `GET /health` and `GET /metrics` (Prometheus text format). Neither needs the API key.

use crate::api::{AppState, ModelStats};
use actix_web::{HttpResponse, web};
use std::fmt::Write;
use xinf_actors::{
    HANDOFF_LATENCY_BOUNDS, HandoffStats, REQUEST_LATENCY_BOUNDS, ReplicaStatus, RequestHistogram,
    ServingStats,
};

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
        "xinf_prompt_tokens_cached_total",
        "counter",
        |s| Some(s.cached_prompt_tokens),
        "Prompt tokens taken from the prefix cache instead of computed, since start.",
    ),
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
        "xinf_handoff_local_prefills_total",
        "counter",
        |h| Some(h.local_prefills),
        "P/D prompts short enough for the decode replica to compute (max_local_prefill_tokens).",
    ),
    (
        "xinf_handoff_decode_prompts_total",
        "counter",
        |h| Some(h.decode_prompts),
        "Prompts decode replicas computed themselves (short ones, and whole requests under prefill_fallback).",
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

/// The replicas' per-request histograms: name, help text, and the histogram of
/// [`ServingStats`] it shows.
type Histogram = (&'static str, &'static str, fn(&ServingStats) -> &RequestHistogram);

/// The per-request histograms, each sampled per replica.
const SERVING_HISTOGRAMS: &[Histogram] = &[
    ("xinf_time_to_first_token_seconds", "Time from a request reaching a replica to its first token.", |s| {
        &s.ttft
    }),
    (
        "xinf_time_per_output_token_seconds",
        "Mean time per output token after the first, one sample per request.",
        |s| &s.tpot,
    ),
    ("xinf_e2e_request_latency_seconds", "Time from a request reaching a replica to its end.", |s| &s.e2e),
    (
        "xinf_request_queue_time_seconds",
        "Time from a request reaching a replica to its engine accepting it.",
        |s| &s.queue,
    ),
];

/// A Prometheus label value: backslash, double quote and newline escaped.
fn label(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// What `/metrics` shows of one model.
struct ModelMetrics {
    /// Its uid, the `model` label of per-replica samples.
    uid: String,
    /// Its labels, `model_uid="..",model_name=".."`.
    labels: String,
    ready: bool,
    /// How many of its replicas are in each status, in [`REPLICA_STATUSES`]' order; empty
    /// for a model without replicas (a single engine).
    replicas: Vec<usize>,
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
            uid: m.uid.clone(),
            labels: format!("model_uid=\"{}\",model_name=\"{}\"", label(&m.uid), label(&m.model_name)),
            ready: m.status.serves(),
            replicas: replica_counts(&m.replica_details),
            stats: s.ok(),
        })
        .collect();
    HttpResponse::Ok().content_type("text/plain; version=0.0.4; charset=utf-8").body(render(&models))
}

/// Replica statuses, as `xinf_model_replicas` labels them.
const REPLICA_STATUSES: [ReplicaStatus; 4] =
    [ReplicaStatus::Loading, ReplicaStatus::Alive, ReplicaStatus::Draining, ReplicaStatus::Dead];

/// How many replicas are in each of [`REPLICA_STATUSES`]; empty without replicas.
fn replica_counts(replicas: &[xinf_actors::ReplicaInfo]) -> Vec<usize> {
    if replicas.is_empty() {
        return Vec::new();
    }
    REPLICA_STATUSES.iter().map(|s| replicas.iter().filter(|r| r.status == *s).count()).collect()
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
    let _ = writeln!(out, "# HELP xinf_model_replicas The model's replicas by status (a lost one is dead).");
    let _ = writeln!(out, "# TYPE xinf_model_replicas gauge");
    for m in models {
        for (status, n) in REPLICA_STATUSES.iter().zip(&m.replicas) {
            let status = serde_json::to_value(status).ok().and_then(|v| v.as_str().map(str::to_owned));
            let status = status.unwrap_or_default();
            let _ = writeln!(out, "xinf_model_replicas{{{},status=\"{status}\"}} {n}", m.labels);
        }
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
    serving(&mut out, models);
    limits(&mut out, models);
    out
}

/// A `request_limits` family: name, type, help, and its value of a model's figures.
type LimitFamily = (&'static str, &'static str, &'static str, fn(&xinf_actors::RequestLimitStats) -> u64);

/// Writes each model's `request_limits`, the places taken and the requests it refused.
fn limits(out: &mut String, models: &[ModelMetrics]) {
    let of = |m: &ModelMetrics| m.stats.as_ref().and_then(|s| s.request_limit);
    let families: [LimitFamily; 3] = [
        (
            "xinf_request_limit",
            "gauge",
            "The most requests the model serves at once (`request_limits`).",
            |l| u64::from(l.limit),
        ),
        ("xinf_request_limit_running", "gauge", "Requests holding one of the model's places.", |l| {
            u64::from(l.running)
        }),
        ("xinf_requests_refused_total", "counter", "Requests refused (429) over the model's limit.", |l| {
            l.refused
        }),
    ];
    for (name, kind, help, value) in families {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        for m in models {
            if let Some(l) = of(m) {
                let _ = writeln!(out, "{name}{{{}}} {}", m.labels, value(&l));
            }
        }
    }
}

/// Writes the replicas' per-request histograms and finish counts, labelled `model`, `replica`
/// and `role`, so a P/D model's prefill and decode sides can be told apart.
fn serving(out: &mut String, models: &[ModelMetrics]) {
    let replicas: Vec<(String, &ServingStats)> = models
        .iter()
        .flat_map(|m| {
            let list = m.stats.as_ref().and_then(|s| s.replicas.as_deref()).unwrap_or_default();
            list.iter().map(move |r| {
                let labels = format!(
                    "model=\"{}\",replica=\"{}\",role=\"{}\"",
                    label(&m.uid),
                    label(&r.replica_uid),
                    r.role.as_str()
                );
                (labels, &r.serving)
            })
        })
        .collect();
    for (name, help, of) in SERVING_HISTOGRAMS {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} histogram");
        for (labels, s) in &replicas {
            let h = of(s);
            for (bound, n) in REQUEST_LATENCY_BOUNDS.iter().zip(h.buckets) {
                let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{bound}\"}} {n}");
            }
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {}", h.count);
            let _ = writeln!(out, "{name}_sum{{{labels}}} {}", h.sum_us as f64 / 1e6);
            let _ = writeln!(out, "{name}_count{{{labels}}} {}", h.count);
        }
    }
    let name = "xinf_requests_finished_total";
    let _ = writeln!(out, "# HELP {name} Requests a replica finished, by finish reason.");
    let _ = writeln!(out, "# TYPE {name} counter");
    for (labels, s) in &replicas {
        for (reason, n) in s.finished.by_reason() {
            let _ = writeln!(out, "{name}{{{labels},finish_reason=\"{reason}\"}} {n}");
        }
    }
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
            cached_prompt_tokens: 64,
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
        let mut replicas: Vec<ReplicaStats> = replicas.into_iter().flatten().collect();
        assert_eq!(replicas.len(), 2);
        replicas[0].role = xinf_actors::Role::Prefill;
        replicas[0].serving.ttft.observe(0.3);
        replicas[1].role = xinf_actors::Role::Decode;
        replicas[1].serving = serving();
        vec![
            ModelMetrics {
                uid: "one".into(),
                labels: "model_uid=\"one\",model_name=\"smollm2\"".into(),
                ready: true,
                replicas: Vec::new(),
                stats: Some(ModelStats::from(&engine)),
            },
            ModelMetrics {
                uid: "pd".into(),
                labels: "model_uid=\"pd\",model_name=\"qwen3\"".into(),
                ready: false,
                replicas: vec![0, 1, 1, 1],
                stats: Some(ModelStats {
                    request_limit: Some(xinf_actors::RequestLimitStats { limit: 8, running: 2, refused: 5 }),
                    ..ModelStats::from_replicas(replicas)
                }),
            },
            ModelMetrics {
                uid: "gone".into(),
                labels: "model_uid=\"gone\",model_name=\"x\"".into(),
                ready: true,
                replicas: vec![1, 0, 0, 0],
                stats: None,
            },
        ]
    }

    /// A decode replica's figures: three requests, two stopped and one cut at its length.
    fn serving() -> ServingStats {
        let mut s = ServingStats::default();
        for (ttft, e2e) in [(0.04, 1.2), (0.2, 3.0), (0.04, 30.0)] {
            s.ttft.observe(ttft);
            s.e2e.observe(e2e);
            s.queue.observe(0.001);
            s.tpot.observe(0.02);
        }
        s.finished.count(xinf_engine::FinishReason::Stop);
        s.finished.count(xinf_engine::FinishReason::Stop);
        s.finished.count(xinf_engine::FinishReason::Length);
        s
    }

    /// The value of the sample line `name{labels} value`.
    fn sample(text: &str, name_and_labels: &str) -> Option<f64> {
        let line = text
            .lines()
            .find(|l| l.starts_with(name_and_labels) && l[name_and_labels.len()..].starts_with(' '))?;
        line.rsplit(' ').next()?.parse().ok()
    }

    /// Each per-request histogram of the decode replica: cumulative buckets ending in `+Inf`
    /// equal to the count, its sum and count, under the `model`, `replica` and `role` labels;
    /// and its finish counts by reason.
    #[test]
    fn serving_histograms() {
        let text = render(&models());
        let labels = "model=\"pd\",replica=\"d\",role=\"decode\"";
        for (name, _, _) in SERVING_HISTOGRAMS {
            assert!(text.contains(&format!("# TYPE {name} histogram\n")), "{name}");
            let buckets: Vec<f64> = REQUEST_LATENCY_BOUNDS
                .iter()
                .map(|b| sample(&text, &format!("{name}_bucket{{{labels},le=\"{b}\"}}")).unwrap_or(-1.0))
                .collect();
            assert!(buckets.iter().all(|&n| n >= 0.0), "{name}: {buckets:?}");
            assert!(buckets.windows(2).all(|w| w[0] <= w[1]), "{name}: {buckets:?}");
            let inf = sample(&text, &format!("{name}_bucket{{{labels},le=\"+Inf\"}}"));
            let count = sample(&text, &format!("{name}_count{{{labels}}}"));
            assert_eq!((inf, count), (Some(3.0), Some(3.0)), "{name}");
            assert!(sample(&text, &format!("{name}_sum{{{labels}}}")).is_some_and(|s| s > 0.0), "{name}");
        }
        let ttft = |le: &str| {
            sample(&text, &format!("xinf_time_to_first_token_seconds_bucket{{{labels},le=\"{le}\"}}"))
        };
        assert_eq!((ttft("0.025"), ttft("0.05"), ttft("0.25")), (Some(0.0), Some(2.0), Some(3.0)));
        let finished = |reason: &str| {
            sample(&text, &format!("xinf_requests_finished_total{{{labels},finish_reason=\"{reason}\"}}"))
        };
        assert_eq!(
            (finished("stop"), finished("length"), finished("abort")),
            (Some(2.0), Some(1.0), Some(0.0))
        );
        let prefill = "model=\"pd\",replica=\"p\",role=\"prefill\"";
        assert_eq!(sample(&text, &format!("xinf_time_to_first_token_seconds_count{{{prefill}}}")), Some(1.0));
        // A single engine has no replicas, hence no per-replica samples.
        assert!(!text.contains("model=\"one\""));
    }

    /// The whole text, byte for byte: every family's header, samples only for the figures a
    /// model's source knows, floats written as Prometheus reads them, the cumulative buckets.
    #[test]
    fn metrics_text() {
        assert_eq!(render(&models()), include_str!("testdata/metrics.txt"));
    }
}
