//! `xinf list` and `xinf terminate`.

use super::client::ModelList;
use super::launch::EndpointArgs;
use crate::api::{ModelInfo, status_name};
use clap::Args;
use xinf_actors::{GpuInfo, GpuUsage, ReplicaStatus, WorkerStatus};
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
    model_uid: String,
    #[command(flatten)]
    endpoint: EndpointArgs,
}

/// Prints rows as columns padded to the widest cell.
fn table(rows: &[Vec<String>]) {
    let widths: Vec<usize> = (0..rows.first().map_or(0, Vec::len))
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    for row in rows {
        let cells: Vec<String> = row.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect();
        println!("{}", cells.join("  ").trim_end());
    }
}

/// A worker's GPUs for `xinf list --workers`: each index with its name, memory and the share of
/// its memory the replicas on it hold, where known (`0 (NVIDIA H200, 139.8 GiB, used 0.8)`), or
/// `cpu` when it has none.
fn gpus_cell(worker: &WorkerStatus) -> String {
    let cells: Vec<String> = if worker.info.gpu_details.is_empty() {
        worker.info.gpus.iter().map(u32::to_string).collect()
    } else {
        worker.info.gpu_details.iter().map(|g| gpu_cell(g, &worker.gpu_usage)).collect()
    };
    if cells.is_empty() { "cpu".into() } else { cells.join("; ") }
}

/// One GPU of [`gpus_cell`].
fn gpu_cell(gpu: &GpuInfo, usage: &[GpuUsage]) -> String {
    let mut about: Vec<String> = Vec::new();
    if let Some(name) = &gpu.name {
        about.push(name.clone());
    }
    if let Some(bytes) = gpu.total_memory {
        about.push(format!("{:.1} GiB", bytes as f64 / f64::from(1u32 << 30)));
    }
    let used = usage.iter().find(|u| u.index == gpu.index).map(|u| u.memory_fraction);
    if let Some(f) = used.filter(|f| *f > 0.0) {
        about.push(format!("used {}", (f * 100.0).round() / 100.0));
    }
    if about.is_empty() { gpu.index.to_string() } else { format!("{} ({})", gpu.index, about.join(", ")) }
}

/// A replica's status as the API writes it.
fn replica_status(status: ReplicaStatus) -> &'static str {
    match status {
        ReplicaStatus::Loading => "loading",
        ReplicaStatus::Alive => "alive",
        ReplicaStatus::Dead => "dead",
    }
}

/// The rows of `xinf list --workers`.
fn worker_rows(workers: &[WorkerStatus]) -> Vec<Vec<String>> {
    let mut rows = vec![vec!["WORKER".into(), "ALIVE".into(), "GPUS".into(), "REPLICAS".into()]];
    for w in workers {
        rows.push(vec![w.info.worker_id.clone(), w.alive.to_string(), gpus_cell(w), w.replicas.join(",")]);
    }
    rows
}

/// The rows of `xinf list`: each model, and where its replicas run (their count for a single
/// engine, which has no replica details).
fn model_rows(models: &[ModelInfo]) -> Vec<Vec<String>> {
    let mut rows = vec![vec!["UID".into(), "NAME".into(), "STATUS".into(), "REPLICAS".into()]];
    for m in models {
        let replicas = if m.replica_details.is_empty() {
            m.replicas.to_string()
        } else {
            let each = m.replica_details.iter().map(|r| {
                format!("{}({} {} {})", r.replica_uid, r.role, replica_status(r.status), r.worker_id)
            });
            each.collect::<Vec<_>>().join(" ")
        };
        rows.push(vec![m.uid.clone(), m.model_name.clone(), status_name(m.status).into(), replicas]);
    }
    rows
}

/// `xinf list`: the models (uid, name, status, replicas and where they run) or the workers.
pub(crate) fn list(args: ListArgs, _cat: &Catalog) -> Result<(), String> {
    let client = args.endpoint.client();
    let path = if args.workers { "/v1/workers" } else { "/v1/models" };
    let answer = client.get(path).map_err(|e| e.to_string())?;
    if args.json {
        println!("{answer:#}");
        return Ok(());
    }
    let rows = if args.workers {
        worker_rows(&client.typed::<Vec<WorkerStatus>>(answer).map_err(|e| e.to_string())?)
    } else {
        model_rows(&client.typed::<ModelList>(answer).map_err(|e| e.to_string())?.into_models())
    };
    table(&rows);
    Ok(())
}

/// `xinf terminate`.
pub(crate) fn terminate(args: TerminateArgs, cat: &Catalog) -> Result<(), String> {
    let client = args.endpoint.client();
    client.delete(&format!("/v1/models/{}", args.model_uid)).map_err(|e| e.to_string())?;
    eprintln!("{}", cat.text("cli-terminated", &[("uid", &args.model_uid)]));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn rows_from_the_api_answers() {
        let models = json!({"object": "list", "data": [{"id": "m", "object": "model", "created": 1,
            "owned_by": "xinf", "xinf": {"uid": "m", "model_name": "smollm2", "status": "loading",
            "replicas": 1, "replica_details": [{"replica_uid": "m-0", "role": "prefill", "worker_id": "w1",
            "gpus": [0], "engine": "native", "gpu_memory_utilization": 0.8, "status": "alive"}], "engine": "native",
            "context_length": null, "created": 1}}, {"id": "one", "object": "model", "created": 1,
            "owned_by": "xinf", "xinf": {"uid": "one", "model_name": "qwen3", "status": "ready",
            "replicas": 1, "engine": "native", "context_length": 4096, "created": 1}}]});
        let models = serde_json::from_value::<ModelList>(models).map(ModelList::into_models);
        let rows = model_rows(&models.unwrap_or_default());
        assert_eq!(rows[1], ["m", "smollm2", "loading", "m-0(prefill alive w1)"]);
        assert_eq!(rows[2], ["one", "qwen3", "ready", "1"]);

        let workers = json!([{"info": {"worker_id": "w1", "host": "h", "gpus": [0, 1], "gpu_details": [
            {"index": 0, "name": "NVIDIA H200", "total_memory": 150_000_000_000u64},
            {"index": 1, "name": null, "total_memory": null}], "allow_gpu_sharing": false},
            "alive": true, "last_heartbeat_ms": 3, "replicas": ["m-0", "m-1"],
            "gpu_usage": [{"index": 0, "replicas": ["m-0"], "memory_fraction": 0.8}]}]);
        let workers = serde_json::from_value::<Vec<WorkerStatus>>(workers).unwrap_or_default();
        let rows = worker_rows(&workers);
        assert_eq!(rows[1], ["w1", "true", "0 (NVIDIA H200, 139.7 GiB, used 0.8); 1", "m-0,m-1"]);
    }
}
