//! `GET /v1/models`, `GET /v1/models/{uid}`, `GET /v1/models/{uid}/stats` and
//! `POST /v1/models/{uid}/requests/{rid}/abort`.

use super::localized;
use crate::api::AppState;
use crate::api::error::{ApiError, Problem};
use crate::api::openai::{ModelList, ModelObject};
use actix_web::{HttpRequest, HttpResponse, web};

/// Every model, in OpenAI's list shape.
pub(crate) async fn list(state: web::Data<AppState>) -> HttpResponse {
    let data = state.service.list().into_iter().map(ModelObject::from).collect();
    HttpResponse::Ok().json(ModelList { object: "list", data })
}

/// One model.
pub(crate) async fn get(
    req: HttpRequest,
    uid: web::Path<String>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let result = state.service.get(&uid).map_err(Problem::from);
    localized(&req, result).map(|info| HttpResponse::Ok().json(ModelObject::from(info)))
}

/// A model's load figures.
pub(crate) async fn stats(
    req: HttpRequest,
    uid: web::Path<String>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let result = state.service.stats(&uid).map_err(Problem::from);
    localized(&req, result).map(|stats| HttpResponse::Ok().json(stats))
}

/// Aborts a request: `{"msg": "DONE"}`, or `{"msg": "NOT_FOUND"}` when no such request runs.
/// A body (Xinference sends `{"block_duration": ..}`) is ignored.
pub(crate) async fn abort(
    req: HttpRequest,
    path: web::Path<(String, String)>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let (uid, rid) = path.into_inner();
    let result = state.service.abort(&uid, &rid).await.map_err(Problem::from);
    localized(&req, result).map(|done| {
        tracing::debug!(target: "xinf::api", model = %uid, request_id = %rid, done, "abort");
        HttpResponse::Ok().json(serde_json::json!({ "msg": if done { "DONE" } else { "NOT_FOUND" } }))
    })
}
