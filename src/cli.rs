//! The `xinf` command line.

use crate::engine_error_text;
use clap::{Args, Parser, Subcommand};
use futures::StreamExt;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;
use xinf_engine::{ChatMessage, Engine, EngineError, GenerateRequest, Prompt, SamplingParams, TokenEvent};
use xinf_engine_native::{EngineOptions, NativeEngine};
use xinf_i18n::Catalog;
use xinf_models::{ModelRequest, resolve};

/// xinf: prefill/decode disaggregated LLM serving.
#[derive(Debug, Parser)]
#[command(name = "xinf", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Generate text with a model on this machine and stream it to stdout.
    Generate(GenerateArgs),
}

/// Which model to load.
#[derive(Debug, Args)]
struct ModelArgs {
    /// Model name from the builtin registry (for example smollm2-instruct, qwen2.5-instruct).
    #[arg(short = 'n', long, env = "XINF_MODEL_NAME", default_value = "smollm2-instruct")]
    model_name: String,
    /// Model size in billions of parameters, as in the registry (0_135, 0_5, 7).
    #[arg(short = 's', long)]
    size_in_billions: Option<String>,
    /// Weights format: pytorch (safetensors) or ggufv2.
    #[arg(short = 'f', long)]
    model_format: Option<String>,
    /// Quantization of the weights (none, Q4_1, ...).
    #[arg(short = 'q', long)]
    quantization: Option<String>,
    /// A Hugging Face folder or GGUF file to load instead of the registry's source.
    #[arg(long)]
    model_path: Option<PathBuf>,
}

/// The KV cache layout of the engine.
#[derive(Debug, Args)]
struct LayoutArgs {
    /// KV layout: paged-kv-first (vLLM FlashAttention), paged-block-first (FlashInfer) or
    /// token-pool (SGLang).
    #[arg(long)]
    kv_layout: Option<String>,
    /// Token/head order of paged layouts: NHD or HND.
    #[arg(long)]
    kv_order: Option<String>,
    /// Tokens per block: 16, 32 or 64 (paged); 1 or 64 (token pool).
    #[arg(long)]
    block_size: Option<usize>,
    /// KV element type: auto, f32, f16 or bf16.
    #[arg(long)]
    kv_dtype: Option<String>,
}

#[derive(Debug, Args)]
struct GenerateArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    layout: LayoutArgs,
    /// Plain text prompt (completion).
    #[arg(long, conflicts_with = "chat")]
    prompt: Option<String>,
    /// A user message, rendered with the model's chat template.
    #[arg(long)]
    chat: Option<String>,
    /// A system message for --chat.
    #[arg(long, requires = "chat")]
    system: Option<String>,
    /// Tokens to generate at most.
    #[arg(long, default_value_t = 256)]
    max_tokens: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Nucleus sampling mass.
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// Sample among the k most likely tokens (0: all).
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    /// Seed for reproducible sampling.
    #[arg(long)]
    seed: Option<u64>,
    /// Stop string (repeatable).
    #[arg(long)]
    stop: Vec<String>,
    /// Print load and speed figures to stderr.
    #[arg(short, long)]
    verbose: bool,
}

/// Runs the command line and returns the process exit code.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing();
    let cat = Catalog::from_env();
    let runtime = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("{}: {e}", cat.text("error-prefix", &[]));
            return ExitCode::FAILURE;
        }
    };
    let result = match cli.command {
        Command::Generate(args) => runtime.block_on(generate(args, &cat)),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{}: {}", cat.text("error-prefix", &[]), engine_error_text(&cat, &e));
            ExitCode::FAILURE
        }
    }
}

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("XINF_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
}

fn engine_options(layout: &LayoutArgs) -> Result<EngineOptions, EngineError> {
    let mut cfg = serde_json::Map::new();
    if let Some(l) = &layout.kv_layout {
        cfg.insert("kv_layout".into(), l.clone().into());
    }
    if let Some(o) = &layout.kv_order {
        cfg.insert("kv_order".into(), o.clone().into());
    }
    if let Some(b) = layout.block_size {
        cfg.insert("block_size".into(), b.into());
    }
    if let Some(d) = &layout.kv_dtype {
        cfg.insert("kv_dtype".into(), d.clone().into());
    }
    EngineOptions::from_engine_config(&serde_json::Value::Object(cfg))
}

fn load(
    model: &ModelArgs,
    layout: &LayoutArgs,
    cat: &Catalog,
    verbose: bool,
) -> Result<NativeEngine, EngineError> {
    let options = engine_options(layout)?;
    if verbose {
        eprintln!("{}", cat.text("cli-resolving", &[("name", &model.model_name)]));
    }
    let request = ModelRequest {
        model_name: model.model_name.clone(),
        size_in_billions: model.size_in_billions.clone(),
        model_format: model.model_format.clone(),
        quantization: model.quantization.clone(),
        model_path: model.model_path.clone(),
    };
    let resolved = resolve(&request).map_err(|e| EngineError::Model(e.to_string()))?;
    if verbose {
        eprintln!(
            "{}",
            cat.text(
                "cli-loading",
                &[("path", &resolved.path.display().to_string()), ("origin", &resolved.origin)]
            )
        );
    }
    let t = Instant::now();
    let engine = NativeEngine::load(&resolved, options)?;
    if verbose {
        let c = engine.contract();
        eprintln!(
            "{}",
            cat.text(
                "cli-loaded",
                &[
                    ("arch", &c.architecture),
                    ("layers", &c.num_layers.to_string()),
                    ("secs", &format!("{:.1}", t.elapsed().as_secs_f64())),
                    ("layout", &engine.kv_layout().layout.to_string()),
                    ("dtype", &c.dtype.to_string()),
                ],
            )
        );
    }
    Ok(engine)
}

async fn generate(args: GenerateArgs, cat: &Catalog) -> Result<(), EngineError> {
    let prompt = match (&args.prompt, &args.chat) {
        (Some(p), None) => Prompt::Text(p.clone()),
        (None, Some(c)) => {
            let mut messages = Vec::new();
            if let Some(s) = &args.system {
                messages.push(ChatMessage::new("system", s.clone()));
            }
            messages.push(ChatMessage::new("user", c.clone()));
            Prompt::Chat(messages)
        }
        _ => return Err(EngineError::invalid("--prompt", cat.text("cli-prompt-or-chat", &[]))),
    };
    let sampling = SamplingParams {
        max_tokens: Some(args.max_tokens),
        temperature: args.temperature,
        top_p: args.top_p,
        top_k: args.top_k,
        seed: args.seed,
        stop: args.stop.clone(),
        ..SamplingParams::default()
    };
    let engine = load(&args.model, &args.layout, cat, args.verbose)?;
    let started = Instant::now();
    let mut stream = engine.submit(GenerateRequest { request_id: "cli".into(), prompt, sampling })?;
    let mut out = std::io::stdout().lock();
    while let Some(event) = stream.next().await {
        match event? {
            TokenEvent::Delta { text, .. } => {
                let _ = out.write_all(text.as_bytes());
                let _ = out.flush();
            }
            TokenEvent::Finished { reason, usage } => {
                let _ = writeln!(out);
                if args.verbose {
                    let secs = started.elapsed().as_secs_f64().max(1e-9);
                    eprintln!(
                        "{}",
                        cat.text(
                            "cli-finished",
                            &[
                                ("reason", reason.as_str()),
                                ("prompt", &usage.prompt_tokens.to_string()),
                                ("completion", &usage.completion_tokens.to_string()),
                                ("tps", &format!("{:.1}", usage.completion_tokens as f64 / secs)),
                            ],
                        )
                    );
                }
            }
        }
    }
    Ok(())
}
