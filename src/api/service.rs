//! What the REST layer serves: the [`ModelService`] trait and its single-process
//! implementation, [`LocalService`].
//!
//! The REST layer never sees engines or actors. It asks a `ModelService` for models and token
//! streams; `LocalService` answers from engines held in this process, and
//! [`ClusterService`](crate::api::ClusterService) answers through the actor cluster
//! (supervisor, routers, replicas on any node).

use crate::api::ModelStats;
use futures::FutureExt;
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};
use xinf_actors::{ModelStatus, WorkerStatus};
use xinf_engine::{Engine, EngineError, ErrorClass, GenerateRequest, TokenStream};

/// The name `GET /v1/models` gives a model's status: `loading`, `ready`, `degraded` (some
/// replicas lost, every role served), `unavailable` (a role has no alive replica) or
/// `terminating`. Clients match on these (`xinf launch` shows the progress of the `loading`
/// model), so they are the REST API's own, not the actor layer's serde names.
pub(crate) fn status_name(status: ModelStatus) -> &'static str {
    match status {
        ModelStatus::Launching => "loading",
        ModelStatus::Ready => "ready",
        ModelStatus::Degraded => "degraded",
        ModelStatus::Unavailable => "unavailable",
        ModelStatus::Terminating => "terminating",
    }
}

/// [`ModelInfo::status`] as JSON: by [`status_name`].
mod status_serde {
    use super::{ModelStatus, status_name};
    use serde::{Deserialize, Deserializer, Serializer, de};

    const ALL: [ModelStatus; 5] = [
        ModelStatus::Launching,
        ModelStatus::Ready,
        ModelStatus::Degraded,
        ModelStatus::Unavailable,
        ModelStatus::Terminating,
    ];

    pub(super) fn serialize<S: Serializer>(status: &ModelStatus, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(status_name(*status))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<ModelStatus, D::Error> {
        let name = String::deserialize(d)?;
        ALL.into_iter().find(|s| status_name(*s) == name).ok_or_else(|| {
            de::Error::unknown_variant(&name, &["loading", "ready", "degraded", "unavailable", "terminating"])
        })
    }
}

/// A served model, as `GET /v1/models` describes it (under the `xinf` key).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelInfo {
    /// The id clients pass as `model`.
    pub uid: String,
    /// The registry name of the model (`smollm2-instruct`).
    pub model_name: String,
    /// Whether it can take requests; in JSON `loading`, `ready`, `degraded`, `unavailable` or
    /// `terminating`.
    #[serde(with = "status_serde")]
    pub status: ModelStatus,
    /// Replicas serving it (alive or loading).
    pub replicas: usize,
    /// Each replica: uid, role, worker, GPUs, status. Empty for a single in-process engine.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replica_details: Vec<xinf_actors::ReplicaInfo>,
    /// The engine kind (`native`, `vllm`, ...).
    pub engine: String,
    /// Longest prompt plus output, in tokens, where known.
    pub context_length: Option<usize>,
    /// When it was launched, in seconds since the Unix epoch.
    pub created: u64,
    /// The weights' format (`ggufv2`, `pytorch`), size in billions of parameters (`0_135`) and
    /// quantization (`Q4_1`, `none`), where known: the registry variant a launch picked, or
    /// the format of a `model_path`.
    #[serde(default, flatten)]
    pub weights: WeightsInfo,
    /// The P/D launch keys that change how its requests are routed, where given.
    #[serde(default, flatten)]
    pub pd: PdOptions,
}

/// A P/D model's launch keys that change how its requests are routed, shown in its description
/// where set (absent: the default, off).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PdOptions {
    /// Decode replicas compute whole requests while no prefill replica serves.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub prefill_fallback: bool,
    /// Prompts of at most this many tokens are computed by the decode replica.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub max_local_prefill_tokens: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// `items` without repeats, each where it first appears (a model's replicas' engines or
/// layouts, in launch order).
pub(crate) fn first_seen<'a>(items: impl IntoIterator<Item = &'a str>) -> Vec<&'a str> {
    let mut seen: Vec<&str> = Vec::new();
    for item in items {
        if !seen.contains(&item) {
            seen.push(item);
        }
    }
    seen
}

/// What a model's weights are, as `xinf list` shows them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WeightsInfo {
    /// `ggufv2` or `pytorch`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_format: Option<String>,
    /// Billions of parameters, `_` for the decimal point.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_size_in_billions: Option<String>,
    /// `none` or the GGUF quantization.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quantization: Option<String>,
}

impl WeightsInfo {
    /// From the launch's fields: the registry variant they pick, else what a `model_path`
    /// says by its name (a `.gguf` file or a safetensors folder).
    pub fn of(source: &xinf_engine::ModelSource) -> Self {
        if let Some(path) = source.model_path.as_deref().filter(|p| !p.trim().is_empty()) {
            let gguf = path.trim().to_ascii_lowercase().ends_with(".gguf");
            return Self {
                model_format: Some(if gguf { "ggufv2" } else { "pytorch" }.to_owned()),
                model_size_in_billions: source.size_in_billions.clone(),
                quantization: source.quantization.clone(),
            };
        }
        let picked = xinf_models::find_family(&source.model_name).and_then(|f| {
            f.select(
                source.size_in_billions.as_deref(),
                source.model_format.as_deref(),
                source.quantization.as_deref(),
            )
            .ok()
        });
        match picked {
            Some(spec) => Self {
                model_format: Some(spec.format.to_owned()),
                model_size_in_billions: Some(spec.size.to_owned()),
                quantization: Some(spec.quantization.to_owned()),
            },
            None => Self {
                model_format: source.model_format.clone(),
                model_size_in_billions: source.size_in_billions.clone(),
                quantization: source.quantization.clone(),
            },
        }
    }
}

/// Why a [`ModelService`] call failed. Classified like engine errors: the REST layer turns
/// [`class`](Self::class) into an HTTP status and [`code`](Self::code) into the OpenAI error
/// `code`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ServiceError {
    /// No model with this uid.
    #[error("model `{0}` not found")]
    NotFound(String),
    /// The model exists but cannot take requests yet.
    #[error("model `{0}` is not ready")]
    NotReady(String),
    /// The engine refused or failed the request.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// The service cannot answer (a replica or the cluster is unreachable); the text says why.
    #[error("service unavailable: {0}")]
    Unavailable(String),
    /// The actor cluster refused or failed the operation (a launch rule, a lost peer, ...).
    #[error(transparent)]
    Cluster(xinf_actors::ActorError),
    /// This service does not manage models (a single engine served as it is).
    #[error("this server does not support {0}")]
    Unsupported(&'static str),
}

impl From<xinf_actors::ActorError> for ServiceError {
    /// The errors the REST layer already knows keep their own variant.
    fn from(e: xinf_actors::ActorError) -> Self {
        use xinf_actors::ActorError as A;
        match e {
            A::ModelNotFound(uid) => Self::NotFound(uid),
            A::NotReady { model_uid, .. } => Self::NotReady(model_uid),
            A::Engine(e) => Self::Engine(e),
            other => Self::Cluster(other),
        }
    }
}

impl ServiceError {
    /// The class of this error.
    pub fn class(&self) -> ErrorClass {
        match self {
            Self::NotFound(_) => ErrorClass::NotFound,
            Self::NotReady(_) | Self::Unavailable(_) => ErrorClass::Unavailable,
            Self::Engine(e) => e.class(),
            Self::Cluster(e) => e.class(),
            Self::Unsupported(_) => ErrorClass::InvalidInput,
        }
    }

    /// A stable, machine-readable reason code.
    pub fn code(&self) -> &'static str {
        match self {
            Self::NotFound(_) => "model_not_found",
            Self::NotReady(_) => "model_not_ready",
            Self::Unavailable(_) => "service_unavailable",
            Self::Engine(e) => e.code(),
            Self::Cluster(e) => e.code(),
            Self::Unsupported(_) => "unsupported_operation",
        }
    }
}

/// A boxed future of a service call.
pub type ServiceFuture<T> = BoxFuture<'static, Result<T, ServiceError>>;

/// The models the REST layer serves and the operations on them.
///
/// Object safe: the server holds an `Arc<dyn ModelService>`. Every method returns a future,
/// since a cluster answers over actors that may live on other nodes; an in-process service
/// answers at once with a ready future.
///
/// Managing models (launch, terminate, workers) is optional: the default methods answer
/// [`ServiceError::Unsupported`], which the REST layer turns into 501.
pub trait ModelService: Send + Sync + 'static {
    /// Every model, ready or not.
    fn list(&self) -> ServiceFuture<Vec<ModelInfo>>;

    /// One model; [`ServiceError::NotFound`] when there is none with this uid.
    fn get(&self, uid: &str) -> ServiceFuture<ModelInfo>;

    /// Starts a request on model `uid`. Validation and admission errors come back from the
    /// future; later failures arrive on the stream. Dropping the stream aborts the request.
    fn generate(&self, uid: &str, req: GenerateRequest) -> ServiceFuture<TokenStream>;

    /// Starts the requests of one API call (its choices of `n`, its prompts) on model `uid`,
    /// all or none: one refused drops the others' streams, which aborts them. A service that
    /// limits a model's requests counts the call once, as Xinference does.
    fn generate_all(&self, uid: &str, reqs: Vec<GenerateRequest>) -> ServiceFuture<Vec<TokenStream>> {
        let starts: Vec<_> = reqs.into_iter().map(|r| self.generate(uid, r)).collect();
        futures::future::try_join_all(starts).boxed()
    }

    /// Aborts request `request_id` of model `uid`: `true` when it was running or queued.
    fn abort(&self, uid: &str, request_id: &str) -> ServiceFuture<bool>;

    /// Load figures of model `uid`: `GET /v1/models/{uid}/stats` shows them, `GET /metrics`
    /// exports them.
    fn stats(&self, uid: &str) -> ServiceFuture<ModelStats>;

    /// Validates and launches a model from a launch request (`POST /v1/models`); returns its
    /// uid. With `wait_ready` the future ends when the model serves; without, once the launch
    /// is validated and placed.
    fn launch(&self, request: xinf_actors::LaunchRequest, wait_ready: bool) -> ServiceFuture<String> {
        let _ = (request, wait_ready);
        unsupported("launching models")
    }

    /// Terminates a model (`DELETE /v1/models/{uid}`).
    fn terminate(&self, uid: &str) -> ServiceFuture<()> {
        let _ = uid;
        unsupported("terminating models")
    }

    /// The cluster's workers (`GET /v1/workers`).
    fn workers(&self) -> ServiceFuture<Vec<WorkerStatus>> {
        unsupported("listing workers")
    }

    /// The engines launches may name, the default first (`GET /v1/engines/...` lists those
    /// that take a registry model); none where models are not launched.
    fn engines(&self) -> xinf_engine::Engines {
        xinf_engine::Engines::default()
    }

    /// Adds replicas to a serving model (`POST /v1/models/{uid}/replicas`); returns their uids
    /// once they serve.
    fn scale(&self, uid: &str, request: xinf_actors::ScaleRequest) -> ServiceFuture<Vec<String>> {
        let _ = (uid, request);
        unsupported("scaling models")
    }

    /// Removes replica `replica_uid` of a serving model (`DELETE /v1/models/{uid}/replicas/{id}`)
    /// once its running requests end, waiting at most `drain` for them.
    fn remove_replica(&self, uid: &str, replica_uid: &str, drain: std::time::Duration) -> ServiceFuture<()> {
        let _ = (uid, replica_uid, drain);
        unsupported("removing replicas")
    }

    /// How model `uid`'s chat answers are made and read (its launch's `reasoning_content` and
    /// `enable_thinking`); asked once per chat request, so it must answer without a remote
    /// call. The default: nothing set, as for models that were not launched.
    fn chat_defaults(&self, uid: &str) -> ServiceFuture<xinf_actors::ChatDefaults> {
        let _ = uid;
        ready(Ok(xinf_actors::ChatDefaults::default()))
    }
}

fn unsupported<T: Send + 'static>(what: &'static str) -> ServiceFuture<T> {
    futures::future::ready(Err(ServiceError::Unsupported(what))).boxed()
}

fn ready<T: Send + 'static>(result: Result<T, ServiceError>) -> ServiceFuture<T> {
    futures::future::ready(result).boxed()
}

struct LocalModel {
    info: ModelInfo,
    engine: Arc<dyn Engine>,
    chat: xinf_actors::ChatDefaults,
}

/// A [`ModelService`] over engines held in this process: one engine (replica) per model uid.
#[derive(Default)]
pub struct LocalService {
    models: RwLock<BTreeMap<String, LocalModel>>,
}

impl std::fmt::Debug for LocalService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let uids: Vec<String> = self.read().keys().cloned().collect();
        f.debug_struct("LocalService").field("models", &uids).finish()
    }
}

fn now_secs() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or_default()
}

impl LocalService {
    /// A service without models.
    pub fn new() -> Self {
        Self::default()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<String, LocalModel>> {
        self.models.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Serves `engine` as model `uid` (registry name `model_name`), replacing any model with
    /// that uid.
    pub fn insert(&self, uid: impl Into<String>, model_name: impl Into<String>, engine: Arc<dyn Engine>) {
        let uid = uid.into();
        let model_name = model_name.into();
        let chat = xinf_actors::ChatDefaults { model_name: model_name.clone(), ..Default::default() };
        let info = ModelInfo {
            uid: uid.clone(),
            model_name,
            status: ModelStatus::Ready,
            replicas: 1,
            replica_details: Vec::new(),
            engine: "native".into(),
            context_length: Some(engine.contract().context_length),
            created: now_secs(),
            weights: WeightsInfo::default(),
            pd: PdOptions::default(),
        };
        self.models.write().unwrap_or_else(|p| p.into_inner()).insert(uid, LocalModel { info, engine, chat });
    }

    /// Sets how model `uid`'s chat answers are made and read (`reasoning_content`,
    /// `enable_thinking`, as a launch gives them); `false` when there is no such model.
    pub fn set_chat_defaults(&self, uid: &str, chat: xinf_actors::ChatDefaults) -> bool {
        let mut models = self.models.write().unwrap_or_else(|p| p.into_inner());
        models.get_mut(uid).map(|m| m.chat = chat).is_some()
    }

    /// Like [`insert`](Self::insert), for building a service in one expression.
    pub fn with_model(
        self,
        uid: impl Into<String>,
        model_name: impl Into<String>,
        engine: Arc<dyn Engine>,
    ) -> Self {
        self.insert(uid, model_name, engine);
        self
    }

    /// Stops serving model `uid`; `false` when there was none. Requests already running go on.
    pub fn remove(&self, uid: &str) -> bool {
        self.models.write().unwrap_or_else(|p| p.into_inner()).remove(uid).is_some()
    }

    fn engine(&self, uid: &str) -> Result<Arc<dyn Engine>, ServiceError> {
        self.read().get(uid).map(|m| m.engine.clone()).ok_or_else(|| ServiceError::NotFound(uid.to_owned()))
    }
}

impl ModelService for LocalService {
    fn list(&self) -> ServiceFuture<Vec<ModelInfo>> {
        ready(Ok(self.read().values().map(|m| m.info.clone()).collect()))
    }

    fn get(&self, uid: &str) -> ServiceFuture<ModelInfo> {
        ready(
            self.read()
                .get(uid)
                .map(|m| m.info.clone())
                .ok_or_else(|| ServiceError::NotFound(uid.to_owned())),
        )
    }

    fn generate(&self, uid: &str, req: GenerateRequest) -> ServiceFuture<TokenStream> {
        ready(self.engine(uid).and_then(|e| e.submit(req).map_err(ServiceError::Engine)))
    }

    fn abort(&self, uid: &str, request_id: &str) -> ServiceFuture<bool> {
        ready(self.engine(uid).map(|e| e.abort(request_id)))
    }

    fn stats(&self, uid: &str) -> ServiceFuture<ModelStats> {
        ready(self.engine(uid).map(|e| ModelStats::from(&e.stats())))
    }

    fn chat_defaults(&self, uid: &str) -> ServiceFuture<xinf_actors::ChatDefaults> {
        let found = self.read().get(uid).map(|m| m.chat.clone());
        ready(found.ok_or_else(|| ServiceError::NotFound(uid.to_owned())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_names_in_json() {
        let info = |status| ModelInfo {
            uid: "m".into(),
            model_name: "smollm2".into(),
            status,
            replicas: 1,
            replica_details: Vec::new(),
            engine: "native".into(),
            context_length: None,
            created: 0,
            weights: WeightsInfo::default(),
            pd: PdOptions::default(),
        };
        let names = [
            (ModelStatus::Launching, "loading"),
            (ModelStatus::Ready, "ready"),
            (ModelStatus::Degraded, "degraded"),
            (ModelStatus::Unavailable, "unavailable"),
            (ModelStatus::Terminating, "terminating"),
        ];
        for (status, name) in names {
            let json = serde_json::to_value(info(status)).unwrap_or_default();
            assert_eq!(json["status"], name);
            assert_eq!(serde_json::from_value::<ModelInfo>(json).ok(), Some(info(status)));
        }
        let mut json = serde_json::to_value(info(ModelStatus::Ready)).unwrap_or_default();
        json["status"] = "launching".into();
        let err = serde_json::from_value::<ModelInfo>(json).err().map(|e| e.to_string());
        assert!(err.is_some_and(|e| e.contains("unknown variant `launching`")));
    }
}
