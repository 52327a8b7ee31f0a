//! vLLM and SGLang as xinf engines: each replica runs the engine's own OpenAI server as a child
//! process on loopback, and xinf proxies requests to it.
//!
//! xinf keeps what makes replicas of different engines interchangeable: it tokenizes every
//! prompt itself (the ids go to the server, so a prefill and a decode of different engines see
//! the same ids), it checks launch options against the engine's flag table before anything
//! starts, and it computes the model contract (weights digest, tokenizer, shape) the same way
//! the native engine does. The server's process group lives and dies with the replica: its
//! death stops the replica at once, and terminating the replica stops every process it started.

mod engine;
mod flags;
mod flavor;
mod handoff;
mod health;
mod lead;
mod loader;
mod memory;
mod prefill;
mod process;
mod prompt;
mod protocol;
mod sse;
mod stream;
mod version;

pub use engine::ServerEngine;
pub use flavor::Flavor;
pub use loader::ServerLoader;

use std::sync::Arc;
use xinf_engine::EngineLoader;

/// The loaders of both engine servers (`vllm`, `sglang`).
pub fn loaders() -> Vec<Arc<dyn EngineLoader>> {
    Flavor::ALL.iter().map(|f| Arc::new(ServerLoader::new(*f)) as Arc<dyn EngineLoader>).collect()
}
