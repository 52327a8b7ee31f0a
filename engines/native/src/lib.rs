//! xinf's embedded engine: Llama, Qwen2 and Qwen3 models from safetensors or GGUF, with a paged
//! KV cache laid out as vLLM (FlashAttention or FlashInfer, NHD or HND, block size 16/32/64)
//! or SGLang (token pool) would lay it out, continuous batching, and the prefill/decode hooks
//! of [`xinf_engine::Engine`].
//!
//! ```no_run
//! use futures::StreamExt;
//! use xinf_engine::{Engine, GenerateRequest, Prompt, SamplingParams, TokenEvent};
//! use xinf_engine_native::{EngineOptions, NativeEngine};
//! use xinf_models::{ModelRequest, resolve};
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let model = resolve(&ModelRequest { model_name: "smollm2-instruct".into(), ..Default::default() })?;
//! let engine = NativeEngine::load(&model, EngineOptions::default())?;
//! let mut stream = engine.submit(GenerateRequest {
//!     request_id: "r1".into(),
//!     prompt: Prompt::Text("The capital of France is".into()),
//!     sampling: SamplingParams::greedy(8),
//! })?;
//! while let Some(event) = stream.next().await {
//!     if let TokenEvent::Delta { text, .. } = event? {
//!         print!("{text}");
//!     }
//! }
//! # Ok(()) }
//! ```

mod detok;
mod engine;
mod gpu;
mod grammar;
mod grouped;
mod kv_cache;
mod loader;
mod logprobs;
pub mod memory;
mod model;
mod options;
mod q4_1;
mod q8_0;
mod sampler;
mod stop;
#[cfg(test)]
mod test_support;
mod weights;
mod widened;

pub use engine::NativeEngine;
pub use loader::NativeLoader;
pub use options::{ComputeDevice, ENGINE_CONFIG_KEYS, EngineOptions, GPU_MAX_BATCH_TOKENS};
