//! `xinf list` and `xinf terminate`.

use super::launch::EndpointArgs;
use clap::Args;
use serde_json::Value;
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

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
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
fn gpus_cell(worker: &Value) -> String {
    let details = worker["info"]["gpu_details"].as_array().map(Vec::as_slice).unwrap_or_default();
    let usage = worker["gpu_usage"].as_array().map(Vec::as_slice).unwrap_or_default();
    let cells: Vec<String> = if details.is_empty() {
        worker["info"]["gpus"].as_array().map(Vec::as_slice).unwrap_or_default().iter().map(text).collect()
    } else {
        details
            .iter()
            .map(|g| {
                let mut about: Vec<String> = Vec::new();
                if let Some(name) = g["name"].as_str() {
                    about.push(name.to_owned());
                }
                if let Some(bytes) = g["total_memory"].as_u64() {
                    about.push(format!("{:.1} GiB", bytes as f64 / f64::from(1u32 << 30)));
                }
                let used = usage
                    .iter()
                    .find(|u| u["index"] == g["index"])
                    .and_then(|u| u["memory_fraction"].as_f64());
                if let Some(f) = used.filter(|f| *f > 0.0) {
                    about.push(format!("used {}", (f * 100.0).round() / 100.0));
                }
                if about.is_empty() {
                    text(&g["index"])
                } else {
                    format!("{} ({})", text(&g["index"]), about.join(", "))
                }
            })
            .collect()
    };
    if cells.is_empty() { "cpu".into() } else { cells.join("; ") }
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
    if args.workers {
        let mut rows = vec![vec!["WORKER".into(), "ALIVE".into(), "GPUS".into(), "REPLICAS".into()]];
        for w in answer.as_array().map(Vec::as_slice).unwrap_or_default() {
            rows.push(vec![
                text(&w["info"]["worker_id"]),
                text(&w["alive"]),
                gpus_cell(w),
                w["replicas"]
                    .as_array()
                    .map_or(String::new(), |r| r.iter().map(text).collect::<Vec<_>>().join(",")),
            ]);
        }
        table(&rows);
        return Ok(());
    }
    let mut rows = vec![vec!["UID".into(), "NAME".into(), "STATUS".into(), "REPLICAS".into()]];
    for m in answer["data"].as_array().map(Vec::as_slice).unwrap_or_default() {
        let x = &m["xinf"];
        let replicas = x["replica_details"].as_array().map_or_else(
            || text(&x["replicas"]),
            |rs| {
                rs.iter()
                    .map(|r| {
                        format!(
                            "{}({} {} {})",
                            text(&r["replica_uid"]),
                            text(&r["role"]),
                            text(&r["status"]),
                            text(&r["worker_id"])
                        )
                    })
                    .collect::<Vec<_>>()
                    .join(" ")
            },
        );
        rows.push(vec![text(&x["uid"]), text(&x["model_name"]), text(&x["status"]), replicas]);
    }
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
