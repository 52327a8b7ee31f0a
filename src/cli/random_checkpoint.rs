//! `xinf random-checkpoint`: a Hugging Face checkpoint with random weights for a model's
//! `config.json`, to measure speed and memory for models whose weights are not at hand.

use clap::Args;
use std::path::PathBuf;
use xinf_i18n::Catalog;
use xinf_models::{ModelRequest, RandomDtype, TextTokenizer, resolve, write_random_checkpoint};

/// `xinf random-checkpoint`.
#[derive(Debug, Args)]
pub(crate) struct RandomCheckpointArgs {
    /// The model's `config.json` (Llama, Qwen2 or Qwen3), for example Qwen2.5-0.5B-Instruct's
    /// published one.
    #[arg(long)]
    config: PathBuf,
    /// The folder to write (created; must be empty).
    #[arg(long)]
    out: PathBuf,
    /// Weight type: f16, bf16 or f32 (default: the config's torch_dtype, else f16).
    #[arg(long)]
    dtype: Option<String>,
    /// Seed of the weights: the same seed writes the same checkpoint.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// A model whose tokenizer to save with the checkpoint (its token ids must fit the config's
    /// vocabulary).
    #[arg(long, default_value = "smollm2-instruct")]
    tokenizer_from: String,
}

/// Writes the checkpoint and says what it is.
pub(crate) fn random_checkpoint(args: RandomCheckpointArgs, cat: &Catalog) -> Result<(), String> {
    let path = args.config.display().to_string();
    let bad_config =
        |detail: String| cat.text("cli-random-bad-config", &[("path", &path), ("detail", &detail)]);
    let text = std::fs::read_to_string(&args.config).map_err(|e| bad_config(e.to_string()))?;
    let config: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad_config(e.to_string()))?;
    let named = args.dtype.clone().or_else(|| config["torch_dtype"].as_str().map(str::to_owned));
    let dtype = match named {
        None => RandomDtype::F16,
        Some(d) => {
            RandomDtype::parse(&d).ok_or_else(|| cat.text("cli-random-bad-dtype", &[("dtype", &d)]))?
        }
    };
    let request = ModelRequest { model_name: args.tokenizer_from.clone(), ..Default::default() };
    let tokenizer = resolve(&request).and_then(|m| TextTokenizer::load(&m)).map_err(|e| e.to_string())?;
    let written = write_random_checkpoint(&config, dtype, args.seed, &tokenizer, &args.out)
        .map_err(|e| e.to_string())?;
    let dtype_name = format!("{dtype:?}").to_lowercase();
    eprintln!(
        "{}",
        cat.text(
            "cli-random-written",
            &[
                ("out", &args.out.display().to_string()),
                ("params", &written.parameters.to_string()),
                ("bytes", &written.bytes.to_string()),
                ("dtype", &dtype_name),
            ],
        )
    );
    Ok(())
}
