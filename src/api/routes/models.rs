//! The model routes: list, get, launch (`POST /v1/models`), terminate (`DELETE`), scale up and
//! down (`/v1/models/{uid}/replicas`), stats, abort, and `GET /v1/workers`.

use super::{localized, parse_json, read_body};
use crate::api::error::{ApiError, Problem};
use crate::api::openai::{ModelList, ModelObject};
use crate::api::shown::Logged;
use crate::api::{AppState, ServiceError};
use actix_web::{HttpRequest, HttpResponse, web};
use serde::Serialize;
use xinf_actors::LaunchRequest;
use xinf_engine::EngineError;

/// Every model, in OpenAI's list shape.
pub(crate) async fn list(req: HttpRequest, state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let result = state.service.list().await.map_err(Problem::from);
    localized(&req, result).map(|models| {
        let data = models.into_iter().map(ModelObject::from).collect();
        HttpResponse::Ok().json(ModelList { object: "list", data })
    })
}

/// `wait_ready` of `POST /v1/models`: answer once the model serves (the default), or once it
/// is validated and loading. Spelled as Python's clients spell booleans too (`False`, `0`), and
/// refused in the API's error shape, naming the parameter, otherwise (as is any other key).
fn wait_ready(req: &HttpRequest) -> Result<bool, Problem> {
    let pairs = web::Query::<Vec<(String, String)>>::from_query(req.query_string())
        .map_err(|e| Problem::InvalidField { field: "query string".into(), detail: e.to_string() })?;
    let mut wait = true;
    for (key, value) in pairs.into_inner() {
        if key != "wait_ready" {
            return Err(Problem::UnknownField(key));
        }
        wait = match value.to_ascii_lowercase().as_str() {
            "true" | "1" | "yes" | "on" => true,
            "false" | "0" | "no" | "off" => false,
            _ => {
                return Err(Problem::InvalidField {
                    field: key,
                    detail: format!("`{value}` is neither true nor false"),
                });
            }
        };
    }
    Ok(wait)
}

/// Launches a model: `{"model_uid": ...}`. The body has the keys of Xinference's launch
/// request; keys it does not name are engine options.
pub(crate) async fn launch(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let result = async {
        let wait = wait_ready(&req)?;
        let body = read_body(&req, payload, (state.max_body_bytes, state.body_idle)).await?;
        let request: LaunchRequest = parse_json(&body)?;
        let name = request.model_name.clone();
        // Answers are read for the marks of the model's family (the engines never see them).
        let reasoning = request.extra.get("reasoning_content") == Some(&serde_json::Value::Bool(true));
        if reasoning && xinf_models::find_family(&name).is_some_and(|f| f.reasoning.is_none()) {
            return Err(Problem::field_with(
                "reasoning_content",
                "api-reasoning-unsupported",
                "invalid_value",
                ("model", name),
            ));
        }
        // Model files that do not load are the fault of the field that named them.
        let model_field = if request.model_path.is_some() { "model_path" } else { "model_name" };
        tracing::info!(target: "xinf::api", model_name = %Logged(&name), wait_ready = wait, "launch");
        let uid = state.service.launch(request, wait).await.map_err(|e| match e {
            ServiceError::Engine(EngineError::Model(_)) => Problem::at_param(e, model_field),
            other => other.into(),
        })?;
        Ok(HttpResponse::Ok().json(serde_json::json!({ "model_uid": uid })))
    }
    .await;
    localized(&req, result)
}

/// Adds replicas to a serving model: `{"model_uid", "replicas": [uid, …]}` once they serve. The
/// body is a [`ScaleRequest`](xinf_actors::ScaleRequest); engine settings are refused by name,
/// since new replicas copy the model's first replica of their role.
pub(crate) async fn scale(
    req: HttpRequest,
    uid: web::Path<String>,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let result = async {
        let body = read_body(&req, payload, (state.max_body_bytes, state.body_idle)).await?;
        let raw: serde_json::Map<String, serde_json::Value> = parse_json(&body)?;
        if let Some((key, why)) = raw.keys().find_map(|k| xinf_actors::scale_refused_key(k).map(|w| (k, w))) {
            return Err(Problem::field_with(
                key.as_str(),
                "api-scale-field-refused",
                "invalid_value",
                ("reason", why.into()),
            ));
        }
        let request: xinf_actors::ScaleRequest = parse_json(&body)?;
        tracing::info!(target: "xinf::api", model = %Logged(&uid), ?request, "scale");
        let added = state.service.scale(&uid, request).await?;
        Ok(HttpResponse::Ok().json(serde_json::json!({ "model_uid": uid.as_str(), "replicas": added })))
    }
    .await;
    localized(&req, result)
}

/// A model's replicas: uid, role, worker, GPUs, engine, status.
pub(crate) async fn replicas(
    req: HttpRequest,
    uid: web::Path<String>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let result =
        state.service.get(&uid).await.map_err(Problem::from).and_then(|m| sorted_json(&m.replica_details));
    localized(&req, result)
}

/// The longest `drain_timeout` a replica's removal may ask for, in seconds.
const MAX_DRAIN_SECS: u64 = 3600;

/// `drain_timeout` of a replica's removal: seconds its running requests get to finish (default
/// 30, at most an hour); any other key is refused.
fn drain_timeout(req: &HttpRequest) -> Result<std::time::Duration, Problem> {
    let pairs = web::Query::<Vec<(String, String)>>::from_query(req.query_string())
        .map_err(|e| Problem::InvalidField { field: "query string".into(), detail: e.to_string() })?;
    let mut secs = None;
    for (key, value) in pairs.into_inner() {
        if key != "drain_timeout" {
            return Err(Problem::UnknownField(key));
        }
        if secs.is_some() {
            return Err(Problem::InvalidField { field: key, detail: "given twice".into() });
        }
        let parsed = value.parse::<u64>().ok().filter(|s| *s <= MAX_DRAIN_SECS);
        secs = Some(parsed.ok_or_else(|| Problem::InvalidField {
            field: key,
            detail: format!("`{value}` is not a whole number of seconds from 0 to {MAX_DRAIN_SECS}"),
        })?);
    }
    Ok(std::time::Duration::from_secs(secs.unwrap_or(30)))
}

/// Removes one replica of a serving model (a scale-down): it takes no new requests, its
/// running ones get `drain_timeout` seconds to finish, then it stops. Answers
/// `{"model_uid", "replica_uid", "deleted": true}` once it is gone.
pub(crate) async fn remove_replica(
    req: HttpRequest,
    path: web::Path<(String, String)>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let (uid, replica_uid) = path.into_inner();
    let result = async {
        let drain = drain_timeout(&req)?;
        tracing::info!(target: "xinf::api", model = %Logged(&uid), replica = %Logged(&replica_uid), ?drain, "remove replica");
        state.service.remove_replica(&uid, &replica_uid, drain).await.map_err(|e| match e {
            ServiceError::Cluster(
                xinf_actors::ActorError::ReplicaNotFound { .. }
                | xinf_actors::ActorError::ReplicaNotRemovable { .. },
            ) => Problem::at_param(e, "replica_uid"),
            other => other.into(),
        })
    }
    .await;
    localized(&req, result).map(|()| {
        let body = serde_json::json!({ "model_uid": uid, "replica_uid": replica_uid, "deleted": true });
        HttpResponse::Ok().json(body)
    })
}

/// Terminates a model: OpenAI's delete shape `{"id", "object": "model", "deleted": true}`.
pub(crate) async fn terminate(
    req: HttpRequest,
    uid: web::Path<String>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let result = state.service.terminate(&uid).await.map_err(Problem::from);
    localized(&req, result).map(|()| {
        tracing::info!(target: "xinf::api", model = %Logged(&uid), "terminated");
        HttpResponse::Ok().json(serde_json::json!({ "id": uid.as_str(), "object": "model", "deleted": true }))
    })
}

/// The cluster's workers: id, address, GPUs, liveness, replicas.
pub(crate) async fn workers(req: HttpRequest, state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let result = state.service.workers().await.map_err(Problem::from).and_then(|w| sorted_json(&w));
    localized(&req, result)
}

/// One model.
pub(crate) async fn get(
    req: HttpRequest,
    uid: web::Path<String>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let result = state.service.get(&uid).await.map_err(Problem::from);
    localized(&req, result).map(|info| HttpResponse::Ok().json(ModelObject::from(info)))
}

/// A model's load figures.
pub(crate) async fn stats(
    req: HttpRequest,
    uid: web::Path<String>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let result = state.service.stats(&uid).await.map_err(Problem::from).and_then(|s| sorted_json(&s));
    localized(&req, result)
}

/// A 200 answer of `value` with the keys of every object sorted (as a `serde_json::Value`
/// writes them): the stats and workers answers keep one stable key order, whatever the field
/// order of the types behind them.
fn sorted_json<T: Serialize>(value: &T) -> Result<HttpResponse, Problem> {
    let value = serde_json::to_value(value).map_err(|e| ServiceError::Unavailable(e.to_string()))?;
    Ok(HttpResponse::Ok().json(value))
}

/// Aborts request `rid`, or every choice of it when it runs as several; `true` when one was
/// running.
async fn abort_choices(state: &AppState, uid: &str, rid: &str) -> Result<bool, ServiceError> {
    let mut done = state.service.abort(uid, rid).await?;
    for id in state.fanouts.choice_ids(rid) {
        done |= state.service.abort(uid, &id).await?;
    }
    Ok(done)
}

/// Aborts a request: `{"msg": "DONE"}`, or `{"msg": "NOT_FOUND"}` when no such request runs.
/// A body (Xinference sends `{"block_duration": ..}`) is ignored.
pub(crate) async fn abort(
    req: HttpRequest,
    path: web::Path<(String, String)>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let (uid, rid) = path.into_inner();
    let result = abort_choices(&state, &uid, &rid).await.map_err(Problem::from);
    localized(&req, result).map(|done| {
        tracing::debug!(target: "xinf::api", model = %Logged(&uid), request_id = %Logged(&rid), done, "abort");
        HttpResponse::Ok().json(serde_json::json!({ "msg": if done { "DONE" } else { "NOT_FOUND" } }))
    })
}
