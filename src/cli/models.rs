//! `xinf list` and `xinf terminate`.

use super::client::ModelList;
use super::columns;
use super::launch::EndpointArgs;
use super::status::{model_status_text, replica_status_text};
use crate::api::{ModelInfo, first_seen};
use clap::Args;
use xinf_actors::{GpuInfo, GpuUsage, WorkerStatus};
use xinf_i18n::Catalog;

/// `xinf list`.
#[derive(Debug, Args)]
pub(crate) struct ListArgs {
    #[command(flatten)]
    endpoint: EndpointArgs,
    /// List the cluster's workers instead of its models.
    #[arg(long)]
    workers: bool,
    /// Print the server's JSON answer as it is.
    #[arg(long)]
    json: bool,
}

/// `xinf terminate`.
#[derive(Debug, Args)]
pub(crate) struct TerminateArgs {
    /// The model's uid (see `xinf list`).
    #[arg(value_name = "MODEL_UID", required_unless_present = "model_uid")]
    uid: Option<String>,
    /// The model's uid, as Xinference's CLI takes it (instead of the positional uid).
    #[arg(short = 'u', long = "model-uid", conflicts_with = "uid")]
    model_uid: Option<String>,
    #[command(flatten)]
    endpoint: EndpointArgs,
}

impl TerminateArgs {
    /// The uid to terminate, however it was given.
    fn uid(&self) -> &str {
        self.uid.as_deref().or(self.model_uid.as_deref()).unwrap_or_default()
    }
}

/// Prints rows as columns padded to the widest cell (in terminal columns: headers may be
/// Chinese, Japanese or Korean).
pub(super) fn table(rows: &[Vec<String>]) {
    let widths: Vec<usize> = (0..rows.first().map_or(0, Vec::len))
        .map(|c| rows.iter().filter_map(|r| r.get(c)).map(|s| columns::width(s)).max().unwrap_or(0))
        .collect();
    for row in rows {
        let cells: Vec<String> = row.iter().zip(&widths).map(|(c, w)| columns::pad(c, *w, true)).collect();
        println!("{}", cells.join("  ").trim_end());
    }
}

/// A worker's GPUs for `xinf list --workers`: each index with its name, memory and the share of
/// its memory the replicas on it hold, where known (`0 (NVIDIA H200, 139.8 GiB, used 0.8)`), or
/// `cpu` when it has none.
fn gpus_cell(worker: &WorkerStatus, cat: &Catalog) -> String {
    let cells: Vec<String> = if worker.info.gpu_details.is_empty() {
        worker.info.gpus.iter().map(u32::to_string).collect()
    } else {
        worker.info.gpu_details.iter().map(|g| gpu_cell(g, &worker.gpu_usage, cat)).collect()
    };
    if cells.is_empty() { "cpu".into() } else { cells.join("; ") }
}

/// One GPU of [`gpus_cell`].
fn gpu_cell(gpu: &GpuInfo, usage: &[GpuUsage], cat: &Catalog) -> String {
    let mut about: Vec<String> = Vec::new();
    if let Some(name) = &gpu.name {
        about.push(name.clone());
    }
    if let Some(bytes) = gpu.total_memory {
        about.push(format!("{:.1} GiB", bytes as f64 / f64::from(1u32 << 30)));
    }
    let used = usage.iter().find(|u| u.index == gpu.index).map(|u| u.memory_fraction);
    if let Some(f) = used.filter(|f| *f > 0.0) {
        let fraction = ((f * 100.0).round() / 100.0).to_string();
        about.push(cat.text("cli-list-gpu-used", &[("fraction", &fraction)]));
    }
    if about.is_empty() { gpu.index.to_string() } else { format!("{} ({})", gpu.index, about.join(", ")) }
}

/// A table's header row from its column keys.
pub(super) fn header(keys: &[&str], cat: &Catalog) -> Vec<String> {
    keys.iter().map(|k| cat.text(k, &[])).collect()
}

/// The rows of `xinf list --workers`.
fn worker_rows(workers: &[WorkerStatus], cat: &Catalog) -> Vec<Vec<String>> {
    let columns = ["cli-list-col-worker", "cli-list-col-alive", "cli-list-col-gpus", "cli-list-col-replicas"];
    let mut rows = vec![header(&columns, cat)];
    for w in workers {
        let alive = cat.text(if w.alive { "cli-list-alive-true" } else { "cli-list-alive-false" }, &[]);
        rows.push(vec![w.info.worker_id.clone(), alive, gpus_cell(w, cat), w.replicas.join(",")]);
    }
    rows
}

/// The rows of `xinf list`: each model, and where its replicas run (their count for a single
/// engine, which has no replica details). Roles stay as the API names them: they are the values
/// `--replica-config` takes.
fn model_rows(models: &[ModelInfo], cat: &Catalog) -> Vec<Vec<String>> {
    let columns = [
        "cli-list-col-uid",
        "cli-list-col-name",
        "cli-list-col-status",
        "cli-list-col-context",
        "cli-list-col-format",
        "cli-list-col-size",
        "cli-list-col-quantization",
        "cli-list-col-engine",
        "cli-list-col-layout",
        "cli-list-col-replicas",
    ];
    let mut rows = vec![header(&columns, cat)];
    for m in models {
        let context = m.context_length.map_or_else(|| "-".to_owned(), |n| n.to_string());
        let replicas = if m.replica_details.is_empty() {
            m.replicas.to_string()
        } else {
            let each = m.replica_details.iter().map(|r| {
                let status = replica_status_text(r.status, cat);
                format!("{}({} {status} {})", r.replica_uid, r.role, r.worker_id)
            });
            each.collect::<Vec<_>>().join(" ")
        };
        let status = model_status_text(m.status, cat);
        let cell = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".to_owned());
        let w = &m.weights;
        rows.push(vec![
            m.uid.clone(),
            m.model_name.clone(),
            status,
            context,
            cell(&w.model_format),
            cell(&w.model_size_in_billions),
            cell(&w.quantization),
            engines(m),
            layouts(m),
            replicas,
        ]);
    }
    rows
}

/// The engines a model runs on: its replicas' in the order they first appear (`vllm/sglang` for
/// a vLLM prefill with SGLang decode), else the model's own.
fn engines(m: &ModelInfo) -> String {
    let seen = first_seen(m.replica_details.iter().map(|r| r.engine.as_str()));
    if seen.is_empty() { m.engine.clone() } else { seen.join("/") }
}

/// The KV layouts of a model's replicas, in the order they first appear (`-` when no replica
/// says).
fn layouts(m: &ModelInfo) -> String {
    let seen = first_seen(m.replica_details.iter().map(|r| r.kv_layout.as_str()).filter(|l| !l.is_empty()));
    if seen.is_empty() { "-".to_owned() } else { seen.join(" → ") }
}

/// `xinf list`: the models (uid, name, status, context length, weights' format, size and
/// quantization, engines, KV layouts, replicas and where they run) or the workers.
pub(crate) fn list(args: ListArgs, cat: &Catalog) -> Result<(), String> {
    let client = args.endpoint.client();
    let path = if args.workers { "/v1/workers" } else { "/v1/models" };
    let answer = client.get(path).map_err(|e| e.text(cat))?;
    if args.json {
        println!("{answer:#}");
        return Ok(());
    }
    let rows = if args.workers {
        worker_rows(&client.typed::<Vec<WorkerStatus>>(answer).map_err(|e| e.text(cat))?, cat)
    } else {
        model_rows(&client.typed::<ModelList>(answer).map_err(|e| e.text(cat))?.into_models(), cat)
    };
    table(&rows);
    Ok(())
}

/// `xinf terminate`.
pub(crate) fn terminate(args: TerminateArgs, cat: &Catalog) -> Result<(), String> {
    let client = args.endpoint.client();
    let uid = args.uid();
    client.delete(&format!("/v1/models/{uid}")).map_err(|e| e.text(cat))?;
    eprintln!("{}", cat.text("cli-terminated", &[("uid", uid)]));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::status_name;
    use serde_json::json;
    use xinf_actors::ModelStatus;

    #[test]
    fn rows_from_the_api_answers() {
        let models = json!({"object": "list", "data": [{"id": "m", "object": "model", "created": 1,
            "owned_by": "xinf", "xinf": {"uid": "m", "model_name": "smollm2", "status": "loading",
            "replicas": 1, "replica_details": [{"replica_uid": "m-0", "role": "prefill", "worker_id": "w1",
            "gpus": [0], "engine": "vllm", "gpu_memory_utilization": 0.4, "status": "alive",
            "kv_layout": "paged-packed/NHD/B=16"},
            {"replica_uid": "m-1", "role": "decode", "worker_id": "w1", "gpus": [0], "engine": "sglang",
            "gpu_memory_utilization": 0.4, "status": "alive", "kv_layout": "token-pool/NHD/B=1"}],
            "engine": "vllm", "context_length": null, "created": 1, "model_format": "pytorch",
            "model_size_in_billions": "0_5", "quantization": "none"}}, {"id": "one", "object": "model",
            "created": 1, "owned_by": "xinf", "xinf": {"uid": "one", "model_name": "qwen3", "status": "ready",
            "replicas": 1, "engine": "native", "context_length": 4096, "created": 1}}]});
        let models = serde_json::from_value::<ModelList>(models).map(ModelList::into_models);
        let models = models.unwrap_or_default();
        let en = Catalog::new("en");
        let rows = model_rows(&models, &en);
        assert_eq!(
            rows[0],
            [
                "UID",
                "NAME",
                "STATUS",
                "CONTEXT",
                "FORMAT",
                "SIZE",
                "QUANTIZATION",
                "ENGINE",
                "LAYOUT",
                "REPLICAS"
            ]
        );
        assert_eq!(
            rows[1],
            [
                "m",
                "smollm2",
                "loading",
                "-",
                "pytorch",
                "0_5",
                "none",
                "vllm/sglang",
                "paged-packed/NHD/B=16 → token-pool/NHD/B=1",
                "m-0(prefill alive w1) m-1(decode alive w1)"
            ]
        );
        assert_eq!(rows[2], ["one", "qwen3", "ready", "4096", "-", "-", "-", "native", "-", "1"]);

        let workers = json!([{"info": {"worker_id": "w1", "host": "h", "gpus": [0, 1], "gpu_details": [
            {"index": 0, "name": "NVIDIA H200", "total_memory": 150_000_000_000u64},
            {"index": 1, "name": null, "total_memory": null}], "allow_gpu_sharing": false},
            "alive": true, "last_heartbeat_ms": 3, "replicas": ["m-0", "m-1"],
            "gpu_usage": [{"index": 0, "replicas": ["m-0"], "memory_fraction": 0.8}]}]);
        let workers = serde_json::from_value::<Vec<WorkerStatus>>(workers).unwrap_or_default();
        let rows = worker_rows(&workers, &en);
        assert_eq!(rows[0], ["WORKER", "ALIVE", "GPUS", "REPLICAS"]);
        assert_eq!(rows[1], ["w1", "true", "0 (NVIDIA H200, 139.7 GiB, used 0.8); 1", "m-0,m-1"]);

        // Headers, statuses and GPU use in the reader's language; ids, roles and numbers as sent.
        let ja = Catalog::new("ja");
        let rows = model_rows(&models, &ja);
        assert_eq!(
            rows[0],
            [
                "UID",
                "名前",
                "状態",
                "コンテキスト長",
                "形式",
                "サイズ",
                "量子化",
                "エンジン",
                "KV レイアウト",
                "レプリカ"
            ]
        );
        assert_eq!(rows[1][2], "読み込み中");
        assert_eq!(rows[1][9], "m-0(prefill 稼働中 w1) m-1(decode 稼働中 w1)");
        assert_eq!(rows[2][2], "準備完了");
        let rows = worker_rows(&workers, &Catalog::new("de"));
        assert_eq!(rows[1], ["w1", "ja", "0 (NVIDIA H200, 139.7 GiB, belegt 0.8); 1", "m-0,m-1"]);
    }

    #[test]
    fn terminate_takes_the_uid_either_way() {
        use crate::cli::{Cli, Command};
        use clap::Parser;
        let uid = |line: &[&str]| match Cli::try_parse_from(line) {
            Ok(Cli { command: Command::Terminate(args) }) => Some(args.uid().to_owned()),
            _ => None,
        };
        assert_eq!(uid(&["xinf", "terminate", "chat"]).as_deref(), Some("chat"));
        assert_eq!(uid(&["xinf", "terminate", "--model-uid", "chat"]).as_deref(), Some("chat"));
        assert_eq!(uid(&["xinf", "terminate", "-u", "chat", "-e", "http://h:1"]).as_deref(), Some("chat"));
        assert_eq!(uid(&["xinf", "terminate"]), None);
        assert_eq!(uid(&["xinf", "terminate", "a", "--model-uid", "b"]), None);
    }

    #[test]
    fn every_status_has_words_in_every_language() {
        let statuses = [
            ModelStatus::Launching,
            ModelStatus::Ready,
            ModelStatus::Degraded,
            ModelStatus::Unavailable,
            ModelStatus::Terminating,
        ];
        let en = Catalog::new("en");
        for status in statuses {
            // English keeps the API's names.
            assert_eq!(model_status_text(status, &en), status_name(status));
        }
        for lang in xinf_i18n::languages().filter(|l| *l != "en") {
            let cat = Catalog::new(lang);
            for status in statuses {
                assert_ne!(model_status_text(status, &cat), model_status_text(status, &en), "{lang}");
            }
        }
    }
}
