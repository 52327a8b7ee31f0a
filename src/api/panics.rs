//! A handler that panics answers 500 in OpenAI's error shape, and the panic is logged with its
//! route. Without this, actix drops the connection and the client reads nothing at all, which
//! tells it neither what happened nor whether to retry.

use super::error::{ApiError, Problem, request_lang};
use super::service::ServiceError;
use actix_web::ResponseError;
use actix_web::body::{BoxBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::middleware::Next;
use futures::FutureExt;
use std::panic::AssertUnwindSafe;

/// The middleware (`middleware::from_fn(catch_panics)`), for a resource: the request is
/// cloned before the handler runs, which the router must be done with.
pub(crate) async fn catch_panics(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<BoxBody>, actix_web::Error> {
    let http = req.request().clone();
    match AssertUnwindSafe(next.call(req)).catch_unwind().await {
        Ok(res) => res.map(ServiceResponse::map_into_boxed_body),
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            tracing::error!(target: "xinf::api", method = %http.method(), path = %http.path(), panic = %what, "a request handler panicked");
            let problem = Problem::Service(ServiceError::Cluster(xinf_actors::ActorError::Internal(
                "the server failed while handling this request (logged); it keeps serving".into(),
            )));
            let res = ApiError::new(problem, request_lang(&http)).error_response();
            Ok(ServiceResponse::new(http, res))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::middleware::from_fn;
    use actix_web::{App, test, web};

    #[test]
    fn a_panicking_handler_answers_500_in_the_error_shape_and_the_server_goes_on() {
        actix_web::rt::System::new().block_on(run());
    }

    async fn boom() -> &'static str {
        panic!("boom")
    }

    async fn run() {
        let app = test::init_service(
            App::new()
                .service(web::resource("/boom").route(web::get().to(boom)).wrap(from_fn(catch_panics)))
                .service(
                    web::resource("/ok").route(web::get().to(|| async { "ok" })).wrap(from_fn(catch_panics)),
                ),
        )
        .await;
        let res = test::call_service(&app, test::TestRequest::get().uri("/boom").to_request()).await;
        assert_eq!(res.status(), 500);
        let body: serde_json::Value = test::read_body_json(res).await;
        assert_eq!(body["error"]["type"], "internal_error", "{body}");
        assert!(body["error"]["message"].as_str().is_some_and(|m| m.contains("keeps serving")), "{body}");
        let res = test::call_service(&app, test::TestRequest::get().uri("/ok").to_request()).await;
        assert_eq!(res.status(), 200);
    }
}
