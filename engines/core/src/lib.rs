//! The engine trait of xinf and the types that cross it.
//!
//! An engine turns a [`GenerateRequest`] into a stream of [`TokenEvent`]s. Besides ordinary
//! generation it offers the two hooks that prefill/decode disaggregation needs: run a prompt
//! and keep its KV cache pinned for export ([`Engine::prefill_pinned`]), and admit a request
//! whose prompt KV arrives from elsewhere ([`Engine::submit_imported`]). The KV crosses the
//! boundary as canonical pages (`[layers][K, V][64][kv_heads][head_dim]`), so the two sides
//! may keep their caches in different layouts.

pub mod config;
mod contract;
mod error;
mod gate;
mod host_gpu;
mod loader;
mod request;

pub use config::{
    ComputeDevice, EngineConfig, FlagValue, KvDtypeChoice, KvRole, MockConfig, MockFaults, NativeConfig,
    ServerConfig,
};
pub use contract::{KvDtype, ModelContract};
pub use error::{EngineError, ErrorClass};
pub use gate::{GPU_START_PATIENCE, GpuStartGate, gpu_start_gate};
pub use host_gpu::host_gpu;
pub use loader::{EngineLoader, Engines, ModelSource};
pub use request::{
    ChatMessage, FinishReason, GenerateRequest, Logprob, MAX_CHOICES_TEXTS, MAX_LOGIT_BIAS, MAX_SCHEMA_BYTES,
    MAX_TOP_LOGPROBS, Prompt, PromptLogprobs, PromptReport, SamplingParams, StructuredOutput, TokenEvent,
    TokenLogprobs, ToolCall, Usage,
};

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use std::sync::Arc;
use xinf_transfer::LayoutDescriptor;
use xinf_transfer::device::{DeviceLease, DevicePages, DeviceRoute, DeviceSink, KvDevice};
use xinf_transfer::transport::Endpoint;

/// Tokens per canonical page.
pub use xinf_transfer::PAGE_TOKENS;

/// The events of one request, ending with [`TokenEvent::Finished`] or an error.
pub type TokenStream = BoxStream<'static, Result<TokenEvent, EngineError>>;

/// A prompt whose KV cache an engine holds pinned for export.
#[derive(Debug, Clone, PartialEq)]
pub struct PinnedPrefill {
    /// The request id the KV is pinned under; [`Engine::release_pinned`] frees it.
    pub request_id: String,
    /// The prompt token ids whose KV is held.
    pub prompt_ids: Vec<u32>,
    /// The first token the engine sampled after the prompt.
    pub first_token: u32,
    /// The first token's text, when it may be shown before the decode side answers: the
    /// prefill ended by its length (not a stop token), the request has no stop strings, and
    /// the text is whole (no partial character). `None` where the engine cannot tell.
    pub first_text: Option<String>,
    /// The first token's log-probabilities, when the request asked for them.
    pub first_logprobs: Option<Box<TokenLogprobs>>,
    /// The prompt as the engine took it, when the request asked for it
    /// ([`SamplingParams::reports_prompt`]): shown before the first token.
    pub prompt: Option<Box<PromptReport>>,
    /// Set by an engine that publishes the room itself, in its own process (an engine server
    /// through xinf's KV connector): where decode sides fetch the pages. `None`: the replica
    /// publishes the room and serves the pages out of [`Engine::export_pages`].
    pub remote: Option<RemoteRoom>,
}

/// A room an engine published in its own process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteRoom {
    /// The room's id at that page server.
    pub room: u64,
    /// The page server and provider serving it.
    pub endpoint: Endpoint,
    /// Where its staged pages are when on a GPU.
    pub device: Option<KvDevice>,
}

/// Prompt KV a decode engine fetches itself, in its own process, from the prefill side's room
/// (an engine server through xinf's KV connector; see [`Engine::fetches_kv`]).
#[derive(Debug, Clone, PartialEq)]
pub struct RemoteKv {
    /// Prompt token ids; the room holds the KV of every one of them.
    pub prompt_ids: Vec<u32>,
    /// The prefill side's first sampled token.
    pub first_token: u32,
    /// Set when the first token was already shown to the client, with this text: an engine
    /// that would sample the first token again (it recomputes the last prompt token) takes it
    /// as input instead and continues after it, so the output follows what was shown.
    pub first_text: Option<String>,
    /// The first token's log-probabilities as the prefill side reported them, for an engine
    /// that emits the first token from the handoff (SGLang's decode).
    pub first_logprobs: Option<Box<TokenLogprobs>>,
    /// The room, its page server, where its pages are staged, and its page count.
    pub room: u64,
    /// The page server and provider serving the room.
    pub endpoint: Endpoint,
    /// Where the room's pages are when on a GPU.
    pub device: Option<KvDevice>,
    /// Canonical pages in the room.
    pub pages: u32,
}

/// Prompt KV handed to a decode engine, in canonical pages.
#[derive(Debug)]
pub struct ImportedKv {
    /// Prompt token ids; the KV covers every one of them.
    pub prompt_ids: Vec<u32>,
    /// The prefill side's first sampled token. An engine that does not recompute the last
    /// prompt token emits it as its first output.
    pub first_token: u32,
    /// The first token's log-probabilities as the prefill side reported them, for an engine
    /// that emits it.
    pub first_logprobs: Option<Box<TokenLogprobs>>,
    /// `ceil(import_len / 64)` canonical pages (see [`Engine::import_len`]), back to back, as
    /// raw words of the KV dtype.
    pub pages: KvPages,
}

/// Where imported canonical pages are: host memory, or the decode engine's GPU (received there
/// by its [`Engine::device_sink`], never copied through the host).
#[derive(Debug)]
pub enum KvPages {
    /// Bytes in host memory.
    Host(Vec<u8>),
    /// Pages in the decode engine's GPU memory.
    Device(DevicePages),
}

impl KvPages {
    /// Bytes of pages.
    pub fn len(&self) -> usize {
        match self {
            Self::Host(b) => b.len(),
            Self::Device(d) => d.len(),
        }
    }

    /// Whether there are no pages.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes, when in host memory.
    pub fn host(&self) -> Option<&[u8]> {
        match self {
            Self::Host(b) => Some(b),
            Self::Device(_) => None,
        }
    }
}

impl From<Vec<u8>> for KvPages {
    fn from(bytes: Vec<u8>) -> Self {
        Self::Host(bytes)
    }
}

/// Load figures of an engine.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineStats {
    /// Requests being computed.
    pub running: usize,
    /// Requests waiting for admission.
    pub queued: usize,
    /// KV blocks in use (including pinned ones).
    pub used_blocks: usize,
    /// KV blocks held for export.
    pub pinned_blocks: usize,
    /// Blocks in the cache, less the reserved block 0.
    pub total_blocks: usize,
    /// Prompt tokens computed since start.
    pub prompt_tokens: u64,
    /// Prompt tokens taken from the prefix cache instead of computed, since start.
    pub cached_prompt_tokens: u64,
    /// Tokens generated since start.
    pub generated_tokens: u64,
}

/// An inference engine: one model replica's compute.
pub trait Engine: Send + Sync {
    /// What a peer must agree with to exchange KV with this engine.
    fn contract(&self) -> &ModelContract;

    /// How this engine's KV cache is laid out in memory.
    fn kv_layout(&self) -> &LayoutDescriptor;

    /// Starts a request. Validation and admission errors come back at once; later errors
    /// arrive on the stream. Dropping the stream aborts the request.
    fn submit(&self, request: GenerateRequest) -> Result<TokenStream, EngineError>;

    /// Aborts a running or queued request; `false` when no such request exists.
    fn abort(&self, request_id: &str) -> bool;

    /// Computes the prompt of `request` (its sampling settings give the first token) and keeps
    /// the prompt KV pinned under the request id until [`release_pinned`](Self::release_pinned).
    /// Its `max_tokens` is the whole request's (the decode side generates the rest): checked
    /// against the context as [`submit`](Self::submit) checks it, before anything is computed;
    /// one token is computed whatever it says.
    fn prefill_pinned(
        &self,
        request: GenerateRequest,
    ) -> BoxFuture<'static, Result<PinnedPrefill, EngineError>>;

    /// Like [`prefill_pinned`](Self::prefill_pinned), but the KV of the prompt's first
    /// `prefix_pages * 64` tokens is given as canonical pages (a snapshot-cache hit) and only
    /// the rest of the prompt is computed. At least one prompt token must remain to compute,
    /// since the first output token is sampled from its logits. An engine that cannot import
    /// a prefix computes the whole prompt.
    fn prefill_pinned_with_prefix(
        &self,
        request: GenerateRequest,
        prefix_pages: Vec<u8>,
    ) -> BoxFuture<'static, Result<PinnedPrefill, EngineError>> {
        let _ = prefix_pages;
        self.prefill_pinned(request)
    }

    /// The token ids a prompt becomes on this engine (its tokenizer and chat template): what
    /// KV content keys are computed from before any compute.
    fn prompt_token_ids(&self, prompt: &Prompt) -> Result<Vec<u32>, EngineError>;

    /// Copies canonical pages `first_page..first_page + count` of a pinned prompt.
    fn export_pages(
        &self,
        request_id: &str,
        first_page: usize,
        count: usize,
    ) -> BoxFuture<'static, Result<Vec<u8>, EngineError>>;

    /// Where the KV cache is when it is GPU memory; `None` for host memory. A decode replica
    /// with a [`device_sink`](Self::device_sink) then fetches pages GPU to GPU.
    fn kv_device(&self) -> Option<KvDevice> {
        None
    }

    /// Gathers canonical pages `first_page..first_page + count` of a pinned prompt into GPU
    /// staging memory for `route`; the gather is complete when the lease is returned. Only an
    /// engine with a [`kv_device`](Self::kv_device) can.
    fn export_pages_device(
        &self,
        request_id: &str,
        first_page: usize,
        count: usize,
        route: DeviceRoute,
    ) -> BoxFuture<'static, Result<DeviceLease, EngineError>> {
        let _ = (request_id, first_page, count, route);
        Box::pin(async { Err(EngineError::Internal("this engine's KV cache is in host memory".into())) })
    }

    /// Receives a peer's staged pages into this engine's GPU memory, as
    /// [`KvPages::Device`] for [`submit_imported`](Self::submit_imported); `None` for an engine
    /// whose KV cache is in host memory.
    fn device_sink(&self) -> Option<Arc<dyn DeviceSink>> {
        None
    }

    /// Frees a pinned prompt's KV; `false` when nothing was pinned under that id.
    fn release_pinned(&self, request_id: &str) -> bool;

    /// How many prompt tokens' KV this engine imports for a `prompt_len`-token prompt: all of
    /// them, or all but the last for an engine that recomputes the last prompt token (vLLM's
    /// behaviour). [`ImportedKv::pages`] holds `ceil(import_len / 64)` pages; when
    /// `prompt_len % 64 == 1` such an engine needs one page fewer than the prefill published,
    /// and the last page is never read.
    fn import_len(&self, prompt_len: usize) -> usize {
        prompt_len
    }

    /// Starts a request whose prompt KV is `kv` instead of computing it.
    fn submit_imported(&self, request: GenerateRequest, kv: ImportedKv) -> Result<TokenStream, EngineError>;

    /// Whether this engine fetches a handoff's pages itself ([`submit_remote`](Self::submit_remote))
    /// instead of being handed them: an engine server, whose KV cache is in its own process.
    fn fetches_kv(&self) -> bool {
        false
    }

    /// Starts a request whose prompt KV the engine loads itself from the prefill side's room.
    /// The stream's first event comes once the load is over (or has failed and the engine
    /// computed the prompt instead), so the room may be released after it.
    fn submit_remote(&self, request: GenerateRequest, kv: RemoteKv) -> Result<TokenStream, EngineError> {
        let _ = (request, kv);
        Err(EngineError::Internal("this engine is handed a handoff's pages; it fetches none itself".into()))
    }

    /// Current load.
    fn stats(&self) -> EngineStats;

    /// Resolves once the engine can serve nothing more (its server process exited), with why.
    /// The replica then stops, so the router stops sending to it and the model's status says
    /// so. An engine that lives as long as its handle never resolves it.
    fn exited(&self) -> BoxFuture<'static, EngineError> {
        Box::pin(futures::future::pending())
    }

    /// Stops the engine's own processes, if it has any (the replica is going away). Requests
    /// still running fail.
    fn shutdown(&self) {}
}
