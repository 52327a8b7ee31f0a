//! xinf: prefill/decode disaggregated LLM serving across heterogeneous engines.
//!
//! This crate is the assembly: the `xinf` command line, the OpenAI-compatible REST API
//! ([`api`]) and the embedding facade. The engine trait, the native engine, the model hubs and
//! the KV layouts live in their own crates and are re-exported here.
//!
//! ```no_run
//! use futures::StreamExt;
//! use xinf::engine::{Engine, GenerateRequest, Prompt, SamplingParams, TokenEvent};
//! use xinf::models::{ModelRequest, resolve};
//! use xinf::native::{EngineOptions, NativeEngine};
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let model = resolve(&ModelRequest { model_name: "smollm2-instruct".into(), ..Default::default() })?;
//! let engine = NativeEngine::load(&model, EngineOptions::default())?;
//! let mut stream = engine.submit(GenerateRequest {
//!     request_id: "hello".into(),
//!     prompt: Prompt::Text("Once upon a time".into()),
//!     sampling: SamplingParams::greedy(16),
//! })?;
//! while let Some(event) = stream.next().await {
//!     if let TokenEvent::Delta { text, .. } = event? {
//!         print!("{text}");
//!     }
//! }
//! # Ok(()) }
//! ```

pub mod api;
pub mod cli;
mod messages;

pub use messages::{engine_error_text, service_error_text};
pub use xinf_actors as actors;
pub use xinf_engine as engine;
pub use xinf_engine_native as native;
pub use xinf_i18n as i18n;
pub use xinf_models as models;
pub use xinf_transfer as transfer;

/// The engines this build offers to launches (`model_engine`), the default first: xinf's
/// native engine, then vLLM and SGLang (their own servers, started by the worker; they must be
/// installed for the interpreter the launch names).
pub fn engines() -> xinf_engine::Engines {
    let mut loaders: Vec<std::sync::Arc<dyn xinf_engine::EngineLoader>> =
        vec![std::sync::Arc::new(xinf_engine_native::NativeLoader)];
    loaders.extend(xinf_engine_external::loaders());
    xinf_engine::Engines::new(loaders)
}
