//! The routes, and what the generation routes share: reading a bounded JSON body, request
//! ids, and the one handler that checks and runs a generation of either API.

pub(crate) mod chat;
pub(crate) mod completions;
pub(crate) mod health;
pub(crate) mod models;
mod ui;
pub(crate) mod xinference;

pub(crate) use xinference::registrations_json;

use crate::api::choices;
use crate::api::error::{ApiError, Problem, request_lang};
use crate::api::openai::{
    ChatChoice, ChatCompletion, ChatCompletionRequest, Completion, CompletionRequest, OutMessage,
    StreamOptions, TextChoice, UsageOut,
};
use crate::api::sampling::WithSampling;
use crate::api::shown::Logged;
use crate::api::sse::{self, Flavor, ResponseMeta};
use crate::api::{AppState, ServiceError};
use actix_web::http::header;
use actix_web::web::{self, Bytes, BytesMut};
use actix_web::{HttpRequest, HttpResponse};
use futures::StreamExt;
use serde::de::DeserializeOwned;
use std::time::{SystemTime, UNIX_EPOCH};
use tracing::Instrument;
use xinf_engine::EngineError;

/// Registers every route.
pub(crate) fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(resource("/").route(web::get().to(ui::index)))
        .service(resource("/ui").route(web::get().to(ui::index)))
        .service(resource("/ui/{file}").route(web::get().to(ui::file)))
        .service(resource("/health").route(web::get().to(health::health)))
        .service(resource("/metrics").route(web::get().to(health::metrics)))
        // Before the `/v1` scope, whose key check it must escape: clients ask it before sending a key.
        .service(resource("/v1/cluster/auth").route(web::get().to(xinference::cluster_auth)))
        .service(
            web::scope("/v1")
                .wrap(actix_web::middleware::from_fn(crate::api::auth::require_api_key))
                .service(resource("/chat/completions").route(web::post().to(create::<ChatCompletionRequest>)))
                .service(resource("/completions").route(web::post().to(create::<CompletionRequest>)))
                .service(
                    resource("/models")
                        .route(web::get().to(models::list))
                        .route(web::post().to(models::launch)),
                )
                .service(
                    resource("/models/{uid}")
                        .route(web::get().to(models::get))
                        .route(web::delete().to(models::terminate)),
                )
                .service(resource("/workers").route(web::get().to(models::workers)))
                .service(resource("/models/{uid}/stats").route(web::get().to(models::stats)))
                .service(
                    resource("/models/{uid}/replicas")
                        .route(web::get().to(models::replicas))
                        .route(web::post().to(models::scale)),
                )
                .service(
                    resource("/models/{uid}/replicas/{replica_uid}")
                        .route(web::delete().to(models::remove_replica)),
                )
                .service(resource("/models/{uid}/requests/{rid}/abort").route(web::post().to(models::abort)))
                .service(resource("/models/{uid}/progress").route(web::get().to(xinference::progress)))
                .service(resource("/models/{uid}/cancel").route(web::post().to(xinference::cancel)))
                .service(resource("/engines/{model_name}").route(web::get().to(xinference::llm_engines)))
                .service(
                    resource("/engines/{model_type}/{model_name}").route(web::get().to(xinference::engines)),
                )
                .service(
                    resource("/model_registrations/{model_type}")
                        .route(web::get().to(xinference::registrations)),
                )
                .service(
                    resource("/model_registrations/{model_type}/{model_name}")
                        .route(web::get().to(xinference::registration)),
                )
                .default_service(web::to(not_found)),
        );
}

/// A resource that answers other methods with 405 in the OpenAI error shape, and a handler
/// that panics with 500 (see [`catch_panics`](crate::api::panics::catch_panics); it wraps each
/// resource because routing needs the request to itself until the resource is found).
fn resource(
    path: &str,
) -> actix_web::Resource<
    impl actix_web::dev::ServiceFactory<
        actix_web::dev::ServiceRequest,
        Config = (),
        Response = actix_web::dev::ServiceResponse,
        Error = actix_web::Error,
        InitError = (),
    >,
> {
    web::resource(path)
        .default_service(web::to(method_not_allowed))
        .wrap(actix_web::middleware::from_fn(crate::api::panics::catch_panics))
}

/// A known path asked with a method it does not take.
pub(crate) async fn method_not_allowed(req: HttpRequest) -> Result<HttpResponse, ApiError> {
    let problem = Problem::MethodNotAllowed { method: req.method().to_string(), path: req.path().to_owned() };
    Err(ApiError::new(problem, request_lang(&req)))
}

/// Any path without a route.
pub(crate) async fn not_found(req: HttpRequest) -> Result<HttpResponse, ApiError> {
    let problem = Problem::RouteNotFound { method: req.method().to_string(), path: req.path().to_owned() };
    Err(ApiError::new(problem, request_lang(&req)))
}

/// Bodies past the limit are still read (and dropped) up to this many bytes, so that the
/// client, which is still sending, sees the 413 answer instead of a reset connection.
const DRAIN_LIMIT: usize = 64 << 20;

/// Reads the body, refusing more than `limit` bytes and a body that goes `idle` without a byte
/// (`ApiConfig::body_idle`).
pub(crate) async fn read_body(
    req: &HttpRequest,
    mut payload: web::Payload,
    (limit, idle): (usize, std::time::Duration),
) -> Result<Bytes, Problem> {
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<usize>().ok());
    let mut body = BytesMut::new();
    let mut seen = 0usize;
    let mut too_large = declared.is_some_and(|n| n > limit);
    loop {
        let Ok(next) = tokio::time::timeout(idle, payload.next()).await else {
            return Err(Problem::BodyStalled { secs: idle.as_secs() });
        };
        let Some(chunk) = next else { break };
        let chunk = match chunk {
            Ok(c) => c,
            Err(_) if too_large => break,
            Err(e) => return Err(Problem::BadBody(e.to_string())),
        };
        seen += chunk.len();
        if seen > limit {
            too_large = true;
        }
        if too_large {
            body.clear();
            if seen > DRAIN_LIMIT {
                break;
            }
            continue;
        }
        body.extend_from_slice(&chunk);
    }
    if too_large {
        return Err(Problem::TooLarge { limit });
    }
    Ok(body.freeze())
}

/// Parses a JSON body into a request type; errors name the offending field.
pub(crate) fn parse_json<T: DeserializeOwned>(body: &[u8]) -> Result<T, Problem> {
    // serde would take an array as the fields in order; refuse it plainly instead.
    let not_object = || Problem::field("body", "api-body-not-object", "invalid_type");
    if body.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'[') {
        return Err(not_object());
    }
    let mut de = serde_json::Deserializer::from_slice(body);
    let value: T = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        // JSON that is not an object (`null`, `3`, `"text"`): said so, without serde's words
        // (which name xinf's own types).
        match serde_json::from_slice::<serde_json::Value>(body) {
            Ok(v) if !v.is_object() => not_object(),
            Ok(_) => Problem::from_json_of(e, true),
            Err(_) => Problem::from_json(e),
        }
    })?;
    de.end().map_err(|e| Problem::InvalidJson(e.to_string()))?;
    Ok(value)
}

/// Seconds since the Unix epoch.
pub(crate) fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or_default()
}

/// The request id: the `X-Request-Id` header, else the body's `request_id`, else
/// `<prefix>-<32 random hex digits>`. A client-supplied id is used unchanged, as the engine's
/// request id (what the abort route takes) and as the response `id`.
pub(crate) fn request_id(
    req: &HttpRequest,
    body_id: Option<String>,
    prefix: &str,
) -> Result<String, Problem> {
    let header_id = req.headers().get("x-request-id").map(|v| v.to_str().map(str::to_owned));
    let (id, field) = match header_id {
        Some(Ok(id)) => (Some(id), "X-Request-Id"),
        Some(Err(_)) => {
            return Err(Problem::field("X-Request-Id", "api-request-id-invalid", "invalid_request_id"));
        }
        None => (body_id, "request_id"),
    };
    match id {
        Some(id) => {
            let ok = !id.is_empty() && id.len() <= 256 && id.chars().all(|c| c.is_ascii_graphic());
            if ok {
                Ok(id)
            } else {
                Err(Problem::field(field, "api-request-id-invalid", "invalid_request_id"))
            }
        }
        None => Ok(format!("{prefix}-{:032x}", rand::random::<u128>())),
    }
}

/// Whether an optional JSON value asks for something (not absent, null, empty or "none").
pub(crate) fn is_set(v: &Option<serde_json::Value>) -> bool {
    match v {
        None | Some(serde_json::Value::Null) => false,
        Some(serde_json::Value::Array(a)) => !a.is_empty(),
        Some(serde_json::Value::Object(o)) => !o.is_empty(),
        Some(serde_json::Value::String(s)) => s != "none",
        Some(_) => true,
    }
}

/// The request type of a generation API: what it makes of a parsed body.
pub(crate) trait GenerationRequest: DeserializeOwned {
    /// The checked generation that `body` asks for; the error names the refused field.
    fn generation(req: &HttpRequest, body: WithSampling<Self>) -> Result<Generation, Problem>;
}

/// The handler of both generation APIs, `R` being the API's request type: reads and checks the
/// body, then runs the generation.
async fn create<R: GenerationRequest>(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let result = async {
        let body = read_body(&req, payload, (state.max_body_bytes, state.body_idle)).await?;
        let job = R::generation(&req, parse_json(&body)?)?;
        generate(&state, &req, job).await
    }
    .await;
    localized(&req, result)
}

/// Runs a generation request: the common part of both APIs once the prompt is built.
async fn generate(state: &AppState, req: &HttpRequest, mut job: Generation) -> Result<HttpResponse, Problem> {
    let lang = request_lang(req);
    let mut reasoning = None;
    if job.flavor == Flavor::Chat {
        let defaults = state.service.chat_defaults(&job.model).await?;
        for request in &mut job.requests {
            reasoning = crate::api::reasoning::apply(&defaults, &mut request.prompt);
            // A shape asked of a reasoning model's answer holds after its reasoning.
            if let (Some(marks), Some(_)) = (reasoning, &request.sampling.structured) {
                request.sampling.structured_after = Some(marks.end.to_owned());
            }
        }
    }
    let first =
        job.requests.first().ok_or_else(|| Problem::field("prompt", "api-prompt-empty", "invalid_value"))?;
    let meta = ResponseMeta { id: first.request_id.clone(), model: job.model.clone(), created: now() };
    // The request span is born here; the service call runs inside it.
    let span = tracing::info_span!(target: "xinf::api", "request", request_id = %meta.id, model = %Logged(&job.model));
    tracing::debug!(parent: &span, stream = job.stream, "generate");
    let asked_logprobs = first.sampling.logprobs.is_some();
    let per_prompt = job.choices;
    let engine_requests = choices::split(job.requests, per_prompt);
    // A request of several choices or prompts is in the abort route's table while it runs.
    let fanout = (engine_requests.len() > 1).then(|| state.fanouts.register(&meta.id, engine_requests.len()));
    // One choice refused stops the others (dropping their streams aborts them). An id still
    // running from the client's attempt before is waited for, briefly.
    let mut streams = crate::api::retries::generate_all(state.service.as_ref(), &job.model, engine_requests)
        .instrument(span.clone())
        .await
        .map_err(|e| blame_context(e, job.flavor, &job.shape_param))?;
    if job.shown.prompt_only {
        streams = streams.into_iter().map(crate::api::echo::prompt_only).collect();
    }
    if job.stream {
        let streamed = sse::Streamed {
            choices: streams,
            flavor: job.flavor,
            meta,
            include_usage: job.include_usage,
            per_prompt,
            lang,
            fanout,
            tools: job.tools,
            shown: job.shown,
            reasoning,
        };
        return Ok(sse::response(streamed));
    }
    // A client that goes away ends the generation (dropping its tokens aborts the request);
    // its answer has nobody to go to.
    let peer = req.conn_data::<crate::api::peer::Peer>().cloned();
    let gone = async {
        match &peer {
            Some(p) => p.gone().await,
            None => std::future::pending().await,
        }
    };
    let outs = tokio::select! {
        outs = sse::collect_all(streams) => outs?,
        () = gone => {
            tracing::debug!(target: "xinf::api", request_id = %meta.id, "the client went away; the request is aborted");
            return Err(EngineError::Aborted.into());
        }
    };
    drop(fanout);
    let answer = Answer {
        per_prompt,
        logprobs: asked_logprobs,
        tools: job.tools.as_deref(),
        shown: &job.shown,
        reasoning,
    };
    Ok(whole_response(meta, job.flavor, outs, answer))
}

/// How the choices of a request that did not stream are answered.
struct Answer<'a> {
    /// Choices per prompt (`n`).
    per_prompt: usize,
    /// Whether the request asked for the output tokens' log-probabilities.
    logprobs: bool,
    /// The chat request's tools, by which each choice's output is read for calls.
    tools: Option<&'a crate::api::tools::Tools>,
    /// What the answer shows of the prompt.
    shown: &'a crate::api::echo::PromptShown,
    /// The marks of the model's reasoning, when the answer shows it apart.
    reasoning: Option<xinf_models::ReasoningMarks>,
}

/// The answer of a request that did not stream: every choice's whole output.
fn whole_response(
    meta: ResponseMeta,
    flavor: Flavor,
    outs: Vec<sse::Collected>,
    a: Answer<'_>,
) -> HttpResponse {
    let Answer { per_prompt, logprobs, tools, shown, reasoning } = a;
    // Each prompt counted once (its first choice's count), the outputs of every choice summed.
    let usage = UsageOut::from(xinf_engine::Usage {
        prompt_tokens: outs.iter().step_by(per_prompt.max(1)).map(|o| o.usage.prompt_tokens).sum(),
        completion_tokens: outs.iter().map(|o| o.usage.completion_tokens).sum(),
    });
    let mut res = HttpResponse::Ok();
    res.insert_header(("X-Request-Id", meta.id.clone()));
    match flavor {
        Flavor::Chat => res.json(ChatCompletion {
            id: meta.id,
            object: "chat.completion",
            created: meta.created,
            model: meta.model,
            // One prompt, which every choice computed alike: the first choice's.
            prompt_logprobs: outs.first().and_then(|o| shown.vllm(o.prompt.as_deref())),
            choices: outs
                .into_iter()
                .enumerate()
                .map(|(index, out)| {
                    let logprobs = out.chat_logprobs(logprobs);
                    let (reasoning_content, text) = match reasoning {
                        Some(marks) => {
                            let split = crate::api::reasoning::ReasoningStream::split_whole(marks, &out.text);
                            ((!split.reasoning.is_empty()).then_some(split.reasoning), split.content)
                        }
                        None => (None, out.text),
                    };
                    let (message, finish_reason) = match tools {
                        Some(tools) => {
                            let (content, tool_calls) = tools.answer(text);
                            let finish = tools.finish_name(out.finish, !tool_calls.is_empty());
                            (OutMessage { role: "assistant", content, reasoning_content, tool_calls }, finish)
                        }
                        None => {
                            let message = OutMessage {
                                role: "assistant",
                                content: Some(text),
                                reasoning_content,
                                tool_calls: Vec::new(),
                            };
                            (message, sse::finish_name(out.finish))
                        }
                    };
                    ChatChoice { index: index as u32, logprobs, finish_reason, message }
                })
                .collect(),
            usage,
        }),
        Flavor::Completion => res.json(Completion {
            id: meta.id,
            object: "text_completion",
            created: meta.created,
            model: meta.model,
            choices: outs
                .into_iter()
                .enumerate()
                .map(|(index, out)| {
                    let report = out.prompt.as_deref();
                    let echoed = shown.text_logprobs(report);
                    let start = echoed.as_ref().map_or(0, |(_, width)| *width);
                    let output = out.text_logprobs(logprobs, start);
                    let logprobs = match (echoed, output) {
                        (Some((mut prompt, _)), Some(output)) => {
                            prompt.extend(output);
                            Some(prompt)
                        }
                        (_, output) => output,
                    };
                    let text = match shown.text(index, per_prompt, report) {
                        Some(echo) => echo + &out.text,
                        None => out.text,
                    };
                    let finish_reason = Some(sse::finish_name(out.finish));
                    let prompt_logprobs = shown.vllm(report);
                    TextChoice { index: index as u32, logprobs, finish_reason, text, prompt_logprobs }
                })
                .collect(),
            usage: Some(usage),
        }),
    }
}

/// A context overflow named by its field: the prompt (`messages` or `prompt`) when it fills the
/// context alone, else `max_tokens`; a shape the engine refused (which it calls
/// `response_format`) by the parameter that gave it (`shape_param`: `structured_outputs.regex`,
/// say, or `tools`); other failures as they are.
fn blame_context(e: ServiceError, flavor: Flavor, shape_param: &str) -> Problem {
    let param = match e {
        ServiceError::Engine(EngineError::ContextLength { prompt_tokens, context_length, .. }) => {
            match flavor {
                _ if prompt_tokens < context_length => "max_tokens",
                Flavor::Chat => "messages",
                Flavor::Completion => "prompt",
            }
        }
        ServiceError::Engine(EngineError::InvalidRequest { field, reason }) if field == "response_format" => {
            return ServiceError::Engine(EngineError::invalid(shape_param, reason)).into();
        }
        _ => return e.into(),
    };
    Problem::at_param(e, param)
}

/// Whether a streamed answer ends with a usage chunk. `stream_options` is refused unless
/// `stream` is true, as OpenAI and vLLM refuse it: a client that sends it expects chunks.
fn include_usage(options: Option<StreamOptions>, stream: bool) -> Result<bool, Problem> {
    match options {
        Some(_) if !stream => {
            Err(Problem::field("stream_options", "api-stream-options-without-stream", "invalid_value"))
        }
        o => Ok(o.and_then(|o| o.include_usage).unwrap_or(false)),
    }
}

/// A validated generation request.
pub(crate) struct Generation {
    pub(crate) model: String,
    /// One request per prompt (several only in a completions batch), all with the request's id.
    pub(crate) requests: Vec<xinf_engine::GenerateRequest>,
    /// Choices to generate per prompt (`n`), each an engine request of its own.
    pub(crate) choices: usize,
    pub(crate) stream: bool,
    pub(crate) include_usage: bool,
    pub(crate) flavor: Flavor,
    /// The chat request's tools, by which each choice's output is read for calls.
    pub(crate) tools: Option<std::sync::Arc<crate::api::tools::Tools>>,
    /// The parameter an engine's refusal of the output's shape names: `response_format`, the
    /// key of `structured_outputs` that gave it, or `tools`.
    pub(crate) shape_param: String,
    /// What the answer shows of the prompt (`echo`, `prompt_logprobs`).
    pub(crate) shown: crate::api::echo::PromptShown,
}

/// Wraps a handler body: reads the state and language, localizes the failure.
pub(crate) fn localized<T>(req: &HttpRequest, result: Result<T, Problem>) -> Result<T, ApiError> {
    result.map_err(|p| ApiError::new(p, request_lang(req)))
}
