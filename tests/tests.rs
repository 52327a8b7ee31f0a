//! End-to-end tests of xinf: real model weights, real processes, checked against Hugging Face
#![allow(unreachable_pub, missing_docs)]
//! transformers where numbers are involved.

mod util;

mod api;
mod bench_cli;
mod cli;
mod cluster;
mod engine;
mod golden;
mod gpu;
mod pd;
mod prompt;
