//! `xinf generate` (one prompt, no server) and `xinf serve` (one engine behind the REST API,
//! without the actor cluster).

use super::server::HttpArgs;
use super::shutdown_signal;
use crate::api::{self, LocalService};
use crate::engine_error_text;
use clap::Args;
use futures::StreamExt;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;
use xinf_engine::{ChatMessage, Engine, EngineError, GenerateRequest, Prompt, SamplingParams, TokenEvent};
use xinf_engine_native::{EngineOptions, NativeEngine};
use xinf_i18n::Catalog;
use xinf_models::{ModelRequest, resolve};

/// Which model to load.
#[derive(Debug, Args)]
pub(crate) struct ModelArgs {
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
pub(crate) struct LayoutArgs {
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
    /// An engine option, KEY=VALUE (repeatable; VALUE is read as JSON when it parses, else as a
    /// string), as `xinf launch` takes it: --engine-option kv_cache_tokens=16384. The flags
    /// above win over the same key here.
    #[arg(long = "engine-option", value_name = "KEY=VALUE")]
    engine_option: Vec<String>,
}

#[derive(Debug, Args)]
pub(crate) struct GenerateArgs {
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

#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    layout: LayoutArgs,
    /// The id clients pass as `model` (default: the model name).
    #[arg(short = 'u', long, env = "XINF_MODEL_UID")]
    model_uid: Option<String>,
    #[command(flatten)]
    http: HttpArgs,
    /// Print load figures to stderr.
    #[arg(short, long)]
    verbose: bool,
}

/// The native engine's `engine_config` of `--engine-option` and the layout flags (which win).
fn engine_config(layout: &LayoutArgs, cat: &Catalog) -> Result<serde_json::Value, EngineError> {
    let (mut cfg, renamed) = super::launch::engine_options(&layout.engine_option, true, cat)
        .map_err(|text| EngineError::invalid("--engine-option", text))?;
    super::launch::alias_hints(&renamed, cat);
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
    Ok(serde_json::Value::Object(cfg))
}

fn load(
    model: &ModelArgs,
    layout: &LayoutArgs,
    cat: &Catalog,
    verbose: bool,
) -> Result<NativeEngine, EngineError> {
    let options = EngineOptions::from_engine_config(&engine_config(layout, cat)?)?;
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
    let resolved = resolve(&request).map_err(EngineError::from)?;
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

pub(crate) async fn generate(args: GenerateArgs, cat: &Catalog) -> Result<(), EngineError> {
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
            TokenEvent::Prompt(_) => {}
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

/// Loads the model and serves it until Ctrl-C (or SIGTERM); errors come back as text.
pub(crate) async fn serve(args: ServeArgs, cat: &Catalog) -> Result<(), String> {
    let engine =
        load(&args.model, &args.layout, cat, args.verbose).map_err(|e| engine_error_text(cat, &e))?;
    let uid = args.model_uid.clone().unwrap_or_else(|| args.model.model_name.clone());
    let service =
        LocalService::new().with_model(uid.clone(), args.model.model_name.clone(), Arc::new(engine));
    let config = args.http.config();
    let mut server = api::serve(config, Arc::new(service)).await.map_err(|e| {
        let addr = format!("{}:{}", args.http.host, args.http.port);
        cat.text("cli-bind-failed", &[("addr", &addr), ("detail", &e.to_string())])
    })?;
    let addr = server.local_addr().to_string();
    eprintln!(
        "{}",
        cat.text("cli-serving", &[("model", &args.model.model_name), ("uid", &uid), ("addr", &addr)])
    );
    tokio::select! {
        result = server.stopped() => return result.map_err(|e| cat.text("error-internal", &[("detail", &e.to_string())])),
        () = shutdown_signal() => {}
    }
    super::server::drain_server(&server, &args.http, cat).await;
    eprintln!("{}", cat.text("cli-stopping", &[]));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command};
    use clap::Parser;

    #[test]
    fn engine_options_of_serve_and_generate() {
        let line = [
            "xinf",
            "serve",
            "--engine-option",
            "kv_cache_tokens=1024",
            "--engine-option",
            "max_model_len=64",
            "--engine-option",
            "block_size=16",
            "--block-size",
            "32",
        ];
        let Ok(Cli { command: Command::Serve(args) }) = Cli::try_parse_from(line) else { panic!("serve") };
        let en = Catalog::new("en");
        let config = engine_config(&args.layout, &en).map_err(|e| e.to_string());
        let expected = serde_json::json!({"kv_cache_tokens": 1024, "context_length": 64, "block_size": 32});
        assert_eq!(config, Ok(expected.clone()));
        assert!(EngineOptions::from_engine_config(&expected).is_ok());

        let line = ["xinf", "generate", "--prompt", "hi", "--engine-option", "max_batch_tokens=32"];
        let Ok(Cli { command: Command::Generate(args) }) = Cli::try_parse_from(line) else {
            panic!("generate")
        };
        let config = engine_config(&args.layout, &en).map_err(|e| e.to_string());
        assert_eq!(config, Ok(serde_json::json!({"max_batch_tokens": 32})));
        let line = ["xinf", "generate", "--prompt", "hi", "--engine-option", "max_batch_tokens"];
        let Ok(Cli { command: Command::Generate(args) }) = Cli::try_parse_from(line) else {
            panic!("generate")
        };
        assert!(engine_config(&args.layout, &en).is_err());
    }
}
