//! The native engine: a handle that validates and tokenizes requests, and one compute thread
//! that schedules them with continuous batching over the paged KV cache.
//!
//! The compute thread owns the model and the cache; everything reaches it through a command
//! channel, so nothing is locked on the hot path. Each step it admits waiting requests while
//! KV blocks and the sequence limit allow, gives every decoding sequence one token, fills the
//! rest of the token budget with prompt chunks (first come, first served), runs one forward
//! and samples. When the cache runs out of blocks, the most recently admitted sequence is
//! preempted (its blocks freed, its tokens recomputed later) so older requests keep going.
//!
//! - `handle`: [`NativeEngine`], what callers hold, and its [`xinf_engine::Engine`] impl;
//! - `load`: building the parts of an engine from a resolved model and its options;
//! - `pool`: the KV cache's block accounting, as the scheduler reads it;
//! - `scheduler`: the step's decisions (admission, the step's token plan, preemption) over
//!   block counts alone, with no model and no memory;
//! - `worker`: the compute thread, which carries out those decisions on the model and cache;
//! - `prompt`: a prompt's report (`echo`, `prompt_logprobs`), gathered as the prompt is computed;
//! - `seq` and `shared`: a request inside the engine, and what the handle and the thread share.

mod handle;
mod load;
pub(crate) use load::cpu_weights;
mod pool;
mod prompt;
mod scheduler;
mod seq;
mod shared;
mod step_trace;
mod worker;

pub use handle::NativeEngine;
