//! Routes of Xinference's REST API that its own client calls and that have no OpenAI
//! counterpart: whether the cluster wants a key, a launch's progress and its cancellation, the
//! engines that serve a registry model, and the registry itself. The answers have Xinference's shapes, so that
//! `xinference_client` reads them unchanged.

use super::localized;
use crate::api::error::{ApiError, Problem};
use crate::api::shown::Logged;
use crate::api::{AppState, ServiceError};
use actix_web::{HttpRequest, HttpResponse, web};
use serde_json::{Map, Value, json};
use xinf_actors::{ModelStatus, ReplicaStatus};
use xinf_engine::ModelSource;
use xinf_models::{ModelFamily, ModelSpec};

/// `GET /v1/cluster/auth`: `{"auth": true}` when the `/v1` routes need a key. Open to all, as in
/// Xinference: its client asks before it sends any key, and sends the key only when told so.
pub(crate) async fn cluster_auth(state: web::Data<AppState>) -> HttpResponse {
    HttpResponse::Ok().json(json!({ "auth": state.api_key.is_some() }))
}

/// `GET /v1/models/{uid}/progress`: `{"progress": p}`, p from 0 to 1. A model that serves (even
/// degraded) is done; one that is loading has loaded the share of its replicas that serve.
pub(crate) async fn progress(
    req: HttpRequest,
    uid: web::Path<String>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let result = state.service.get(&uid).await.map_err(Problem::from);
    localized(&req, result).map(|info| {
        let progress = match info.status {
            ModelStatus::Ready | ModelStatus::Degraded => 1.0,
            _ if info.replica_details.is_empty() => 0.0,
            _ => {
                let alive = info.replica_details.iter().filter(|r| r.status == ReplicaStatus::Alive).count();
                alive as f64 / info.replica_details.len() as f64
            }
        };
        HttpResponse::Ok().json(json!({ "progress": progress }))
    })
}

/// `POST /v1/models/{uid}/cancel` (Xinference's `cancel_launch_model`): cancels the launch of
/// a model still loading, as `DELETE /v1/models/{uid}` does, and answers `null` once its loads
/// are told to stop. A model past loading has no launch to cancel: 400, naming its status.
pub(crate) async fn cancel(
    req: HttpRequest,
    uid: web::Path<String>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let result = async {
        let info = state.service.get(&uid).await?;
        if !matches!(info.status, ModelStatus::Launching | ModelStatus::Terminating) {
            let status = ("status", info.status.to_string());
            return Err(Problem::field_with(
                "model_uid",
                "api-cancel-not-loading",
                "model_not_loading",
                status,
            ));
        }
        state.service.terminate(&uid).await?;
        Ok(())
    }
    .await;
    localized(&req, result).map(|()| {
        tracing::info!(target: "xinf::api", model = %Logged(&uid), "launch cancelled");
        HttpResponse::Ok().json(Value::Null)
    })
}

/// The registry family `name` of Xinference model type `model_type` (xinf's registry holds
/// LLMs only); else "not found" (404, as for a model uid), blamed on `param`.
fn family(model_type: &str, name: &str, param: &str) -> Result<&'static ModelFamily, Problem> {
    xinf_models::find_family(name)
        .filter(|_| model_type.eq_ignore_ascii_case("llm"))
        .ok_or_else(|| Problem::at_param(ServiceError::NotFound(name.to_owned()), param))
}

/// A registry size as Xinference writes it: a number when whole (`7`), else the text (`"0_5"`).
fn size_json(size: &str) -> Value {
    size.parse::<u64>().map_or_else(|_| Value::from(size), Value::from)
}

/// The family as Xinference describes an LLM registration.
fn family_json(family: &ModelFamily) -> Value {
    let specs: Vec<Value> = family
        .specs
        .iter()
        .map(|s| {
            json!({
                "model_format": s.format,
                "model_size_in_billions": size_json(s.size),
                "quantization": s.quantization,
                "model_src": s.source_label(),
            })
        })
        .collect();
    let mut out = json!({
        "version": 2,
        "model_type": "LLM",
        "model_name": family.name,
        "model_ability": crate::api::openai::model_ability(Some(family)),
        "model_description": family.description,
        "context_length": family.context_length,
        "model_specs": specs,
        "is_builtin": true,
    });
    // As Xinference describes a reasoning family: its marks.
    if let (Some(marks), Some(o)) = (family.reasoning, out.as_object_mut()) {
        o.insert("reasoning_start_tag".into(), json!(marks.start));
        o.insert("reasoning_end_tag".into(), json!(marks.end));
    }
    out
}

/// Whether `detailed` of the query string is true (Xinference's client sends `true`/`false`).
fn detailed(req: &HttpRequest) -> bool {
    web::Query::<Vec<(String, String)>>::from_query(req.query_string()).is_ok_and(|q| {
        q.iter().any(|(k, v)| k == "detailed" && matches!(v.to_ascii_lowercase().as_str(), "true" | "1"))
    })
}

/// `GET /v1/model_registrations/{model_type}` (`?detailed=true`): the registry's families,
/// `[{"model_name", "is_builtin"}]`, or each whole when detailed. Empty for types other than
/// `LLM`.
pub(crate) async fn registrations(req: HttpRequest, model_type: web::Path<String>) -> HttpResponse {
    let list: Vec<Value> = if detailed(&req) {
        registrations_json(&model_type)
    } else {
        families_of(&model_type).map(|f| json!({ "model_name": f.name, "is_builtin": true })).collect()
    };
    HttpResponse::Ok().json(list)
}

/// The registry's families of `model_type` (none but for `LLM`).
fn families_of(model_type: &str) -> impl Iterator<Item = &'static ModelFamily> {
    let llm = model_type.eq_ignore_ascii_case("llm");
    xinf_models::families().iter().filter(move |_| llm)
}

/// The registry's families of `model_type`, each whole as Xinference describes it: the detailed
/// registrations route's answer, and what `xinf registrations` lists without a server.
pub(crate) fn registrations_json(model_type: &str) -> Vec<Value> {
    families_of(model_type).map(family_json).collect()
}

/// `GET /v1/model_registrations/{model_type}/{model_name}`: one family, whole.
pub(crate) async fn registration(
    req: HttpRequest,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let (model_type, name) = path.into_inner();
    let result = family(&model_type, &name, "model_name").map(|f| HttpResponse::Ok().json(family_json(f)));
    localized(&req, result)
}

/// `GET /v1/engines/{model_type}/{model_name}`: the engines that serve the registry model, each
/// with the variants it takes, `{engine: [{"model_name", "model_format",
/// "model_size_in_billions", "quantizations"}]}`, variants of one format and size grouped.
pub(crate) async fn engines(
    req: HttpRequest,
    path: web::Path<(String, String)>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let (model_type, name) = path.into_inner();
    localized(&req, engine_params(&state, &model_type, &name))
}

/// `GET /v1/engines/{model_name}`: as [`engines`], for an LLM.
pub(crate) async fn llm_engines(
    req: HttpRequest,
    name: web::Path<String>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    localized(&req, engine_params(&state, "LLM", &name))
}

fn engine_params(state: &AppState, model_type: &str, name: &str) -> Result<HttpResponse, Problem> {
    let family = family(model_type, name, "model_name")?;
    let mut out = Map::new();
    for loader in state.service.engines().loaders() {
        let takes = |s: &ModelSpec| {
            let source = ModelSource {
                model_name: family.name.to_owned(),
                size_in_billions: Some(s.size.to_owned()),
                model_format: Some(s.format.to_owned()),
                quantization: Some(s.quantization.to_owned()),
                model_path: None,
            };
            loader.check_model(&source).is_ok()
        };
        let mut params: Vec<(&str, &str, Vec<&str>)> = Vec::new();
        for spec in family.specs.iter().filter(|s| takes(s)) {
            match params.iter_mut().find(|(f, s, _)| *f == spec.format && *s == spec.size) {
                Some((_, _, quantizations)) => quantizations.push(spec.quantization),
                None => params.push((spec.format, spec.size, vec![spec.quantization])),
            }
        }
        if params.is_empty() {
            continue;
        }
        let params: Vec<Value> = params
            .into_iter()
            .map(|(format, size, quantizations)| {
                json!({
                    "model_name": family.name,
                    "model_format": format,
                    "model_size_in_billions": size_json(size),
                    "quantizations": quantizations,
                })
            })
            .collect();
        out.insert(loader.name().to_owned(), Value::Array(params));
    }
    Ok(HttpResponse::Ok().json(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_families_in_xinference_shapes() {
        assert_eq!(size_json("7"), json!(7));
        assert_eq!(size_json("0_135"), json!("0_135"));
        let f = family("LLM", "SmolLM2-Instruct", "model_name").map(family_json).ok();
        let f = f.unwrap_or_default();
        assert_eq!(f["model_name"], "smollm2-instruct");
        assert!(f["model_specs"].as_array().is_some_and(|s| !s.is_empty()), "{f}");
        assert!(family("embedding", "smollm2-instruct", "model_name").is_err());
        assert!(family("LLM", "no-such-model", "model_name").is_err());
    }
}
