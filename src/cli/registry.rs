//! `xinf registrations` (the model registry) and `xinf engine` (the engines that serve a
//! registry model), as Xinference's commands of the same names.

use super::client::Client;
use super::launch::EndpointArgs;
use super::models::{header, table};
use clap::Args;
use serde::Deserialize;
use serde_json::Value;
use std::collections::BTreeMap;
use xinf_i18n::Catalog;

/// `xinf registrations`.
#[derive(Debug, Args)]
pub(crate) struct RegistrationsArgs {
    /// The model type, as Xinference names it; xinf's registry holds `LLM` models only.
    #[arg(short = 't', long, default_value = "LLM")]
    model_type: String,
    /// A server's REST endpoint; without one, the registry built into this binary is listed.
    #[arg(short = 'e', long, env = "XINF_ENDPOINT")]
    endpoint: Option<String>,
    /// API key of the server (also `-ak`).
    #[arg(long, env = "XINF_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// Print the registry as JSON (the server's answer as it is).
    #[arg(long)]
    json: bool,
}

/// `xinf engine`.
#[derive(Debug, Args)]
pub(crate) struct EngineArgs {
    /// The registry model (see `xinf registrations`).
    #[arg(short = 'n', long)]
    model_name: String,
    /// Only this engine (also `-en`).
    #[arg(long)]
    model_engine: Option<String>,
    /// Only variants of this weights format (pytorch, ggufv2).
    #[arg(short = 'f', long)]
    model_format: Option<String>,
    /// Only variants of this size in billions of parameters (0_135, 0_5, 7).
    #[arg(short = 's', long)]
    size_in_billions: Option<String>,
    /// Only variants with this quantization (none, Q4_1, ...).
    #[arg(short = 'q', long)]
    quantization: Option<String>,
    #[command(flatten)]
    endpoint: EndpointArgs,
    /// Print the server's JSON answer as it is.
    #[arg(long)]
    json: bool,
}

/// One variant of a registration, as `GET /v1/model_registrations/LLM?detailed=true` writes it.
#[derive(Debug, Deserialize)]
struct Spec {
    model_format: String,
    /// A number when whole (`7`), else the text (`"0_5"`).
    model_size_in_billions: Value,
    quantization: String,
}

/// One registration, as `GET /v1/model_registrations/LLM?detailed=true` writes it.
#[derive(Debug, Deserialize)]
struct Registration {
    model_name: String,
    #[serde(default)]
    model_description: String,
    context_length: Option<u64>,
    #[serde(default)]
    model_specs: Vec<Spec>,
}

/// The variants an engine takes, as `GET /v1/engines/LLM/{name}` writes them.
#[derive(Debug, Deserialize)]
struct EngineParams {
    model_format: String,
    model_size_in_billions: Value,
    #[serde(default)]
    quantizations: Vec<String>,
}

/// A size as the registry spells it (`0_5`, `7`).
fn size_text(size: &Value) -> String {
    match size {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The distinct items of `items`, in their first order, joined by `, `.
fn distinct(items: impl Iterator<Item = String>) -> String {
    let mut out: Vec<String> = Vec::new();
    for item in items {
        if !out.contains(&item) {
            out.push(item);
        }
    }
    out.join(", ")
}

/// The registry built into this binary, in the server's JSON shape, for `model_type`.
fn local_registry(model_type: &str) -> Value {
    Value::Array(crate::api::registrations_json(model_type))
}

/// The rows of `xinf registrations`: name, context length, formats, sizes, quantizations and
/// description.
fn registration_rows(registrations: &[Registration], cat: &Catalog) -> Vec<Vec<String>> {
    let columns = [
        "cli-list-col-name",
        "cli-list-col-context",
        "cli-list-col-formats",
        "cli-list-col-sizes",
        "cli-list-col-quantizations",
        "cli-list-col-description",
    ];
    let mut rows = vec![header(&columns, cat)];
    for r in registrations {
        rows.push(vec![
            r.model_name.clone(),
            r.context_length.map_or_else(|| "-".to_owned(), |n| n.to_string()),
            distinct(r.model_specs.iter().map(|s| s.model_format.clone())),
            distinct(r.model_specs.iter().map(|s| size_text(&s.model_size_in_billions))),
            distinct(r.model_specs.iter().map(|s| s.quantization.clone())),
            r.model_description.clone(),
        ]);
    }
    rows
}

/// `xinf registrations`: the server's registry, or this binary's without an endpoint.
pub(crate) fn registrations(args: RegistrationsArgs, cat: &Catalog) -> Result<(), String> {
    let answer = match &args.endpoint {
        Some(endpoint) => {
            let client = Client::new(endpoint, args.api_key.clone());
            client.get(&registrations_path(&args.model_type)).map_err(|e| e.text(cat))?
        }
        None => local_registry(&args.model_type),
    };
    if args.json {
        println!("{answer:#}");
        return Ok(());
    }
    let list: Vec<Registration> = serde_json::from_value(answer).map_err(|e| {
        let endpoint = args.endpoint.clone().unwrap_or_default();
        cat.text("cli-bad-answer", &[("endpoint", &endpoint), ("detail", &e.to_string())])
    })?;
    table(&registration_rows(&list, cat));
    Ok(())
}

/// The registry's path for `model_type`, each registration whole.
fn registrations_path(model_type: &str) -> String {
    format!("/v1/model_registrations/{model_type}?detailed=true")
}

/// The rows of `xinf engine`: each engine's variants, one format and size a row, with the
/// filters of `args`.
fn engine_rows(
    answer: &BTreeMap<String, Vec<EngineParams>>,
    args: &EngineArgs,
    cat: &Catalog,
) -> Vec<Vec<String>> {
    let columns = [
        "cli-list-col-name",
        "cli-list-col-engine",
        "cli-list-col-format",
        "cli-list-col-size",
        "cli-list-col-quantizations",
    ];
    let same =
        |want: &Option<String>, have: &str| want.as_deref().is_none_or(|w| w.eq_ignore_ascii_case(have));
    let mut rows = vec![header(&columns, cat)];
    for (engine, params) in answer.iter().filter(|(e, _)| same(&args.model_engine, e)) {
        for p in params {
            let size = size_text(&p.model_size_in_billions);
            if !same(&args.model_format, &p.model_format) || !same(&args.size_in_billions, &size) {
                continue;
            }
            let quantizations: Vec<&str> =
                p.quantizations.iter().map(String::as_str).filter(|q| same(&args.quantization, q)).collect();
            if quantizations.is_empty() {
                continue;
            }
            rows.push(vec![
                args.model_name.clone(),
                engine.clone(),
                p.model_format.clone(),
                size,
                quantizations.join(", "),
            ]);
        }
    }
    rows
}

/// `xinf engine`: `GET /v1/engines/LLM/{name}` as a table.
pub(crate) fn engine(args: EngineArgs, cat: &Catalog) -> Result<(), String> {
    let client = args.endpoint.client();
    let answer = client.get(&engines_path(&args.model_name)).map_err(|e| e.text(cat))?;
    if args.json {
        println!("{answer:#}");
        return Ok(());
    }
    let answer: BTreeMap<String, Vec<EngineParams>> = client.typed(answer).map_err(|e| e.text(cat))?;
    table(&engine_rows(&answer, &args, cat));
    Ok(())
}

/// The path of the engines that serve registry model `name`.
fn engines_path(name: &str) -> String {
    format!("/v1/engines/LLM/{name}")
}

#[cfg(test)]
mod tests;
