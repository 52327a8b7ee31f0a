//! The `xinf` command line.

mod bench;
mod chat;
mod client;
mod columns;
mod generate;
mod launch;
mod logging;
mod models;
mod mps;
mod random_checkpoint;
mod registry;
mod server;
mod status;

use crate::engine_error_text;
use clap::{CommandFactory, Parser, Subcommand};
use std::process::ExitCode;
use xinf_i18n::Catalog;

/// xinf: prefill/decode disaggregated LLM serving.
#[derive(Debug, Parser)]
#[command(name = "xinf", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a whole cluster in this process (supervisor + worker) behind the REST API, and
    /// optionally launch a model (-n ...) once it is up.
    Local(server::LocalArgs),
    /// Run a cluster's supervisor and its REST API; workers join it on the cluster port.
    Supervisor(server::SupervisorArgs),
    /// Run a worker that joins a supervisor and hosts the replicas placed on it.
    Worker(server::WorkerArgs),
    /// Launch a model on a running server (local or supervisor) and wait until it serves.
    /// Options it does not know (`--max_model_len 4096`) are passed as engine options.
    Launch(launch::LaunchArgs),
    /// List a server's models (or, with --workers, its workers).
    List(models::ListArgs),
    /// Terminate a model on a running server.
    Terminate(models::TerminateArgs),
    /// List the model registry: of a server, or of this binary when no endpoint is given.
    Registrations(registry::RegistrationsArgs),
    /// List the engines that serve a registry model, with the variants each takes.
    Engine(registry::EngineArgs),
    /// Chat with a served model: one message per line, answers streamed.
    Chat(chat::ChatArgs),
    /// Generate text with a model on this machine, without a server, and stream it to stdout.
    Generate(generate::GenerateArgs),
    /// Load one model and serve it over the REST API without the actor cluster.
    Serve(generate::ServeArgs),
    /// Measure a served model under load: time to first token, time per output token and
    /// output tokens/s at each concurrency level, over any OpenAI-compatible endpoint.
    Bench(bench::BenchArgs),
    /// Write a Hugging Face checkpoint with random weights for a model's config.json, to
    /// measure speed and memory for models whose weights are not at hand (never a real model).
    RandomCheckpoint(random_checkpoint::RandomCheckpointArgs),
}

/// Xinference's two-letter short flags, which clap cannot express, as their long forms.
fn expand_short_flags(args: impl Iterator<Item = std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    args.map(|a| match a.to_str() {
        Some("-en") => "--model-engine".into(),
        Some("-ak") => "--api-key".into(),
        _ => a,
    })
    .collect()
}

/// Raises the process's soft limit on open files to its hard limit, as servers do: every HTTP
/// connection, cluster link, engine server and page transfer holds descriptors, and the soft
/// limit many systems start a process with (1,024) is a few hundred clients. The HTTP server
/// sizes its connection cap from the limit it finds (`api::serve`).
fn raise_open_file_limit() {
    use nix::sys::resource::{RLIM_INFINITY, Resource, getrlimit, setrlimit};
    // Linux refuses a soft limit past `fs.nr_open` (2^20 unless raised), an infinite one too.
    const NR_OPEN: u64 = 1 << 20;
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) => {
            let to = if hard == RLIM_INFINITY { NR_OPEN } else { hard };
            if soft >= to {
                return;
            }
            match setrlimit(Resource::RLIMIT_NOFILE, to, hard) {
                Ok(()) => tracing::debug!(target: "xinf", from = soft, to, "raised the open-file limit"),
                Err(e) => {
                    tracing::warn!(target: "xinf", limit = soft, error = %e, "cannot raise the open-file limit")
                }
            }
        }
        Err(e) => tracing::warn!(target: "xinf", error = %e, "cannot read the open-file limit"),
    }
}

/// Runs the command line and returns the process exit code.
pub fn main() -> ExitCode {
    let args = launch::extra_engine_options(expand_short_flags(std::env::args_os()), &Cli::command());
    let cli = Cli::parse_from(args);
    logging::init();
    raise_open_file_limit();
    let cat = Catalog::from_env();
    // Before anything in this process touches CUDA, so that it is a client of the daemon too;
    // dropped last, once the cluster has stopped its engine servers.
    let node = match &cli.command {
        Command::Local(args) => Some(&args.node),
        Command::Worker(args) => Some(&args.node),
        _ => None,
    };
    let _mps = match node.filter(|n| n.mps()).map(|_| mps::Mps::start()) {
        None => None,
        Some(Ok((mps, found))) => {
            let key = match found {
                mps::Found::Started => "cli-mps-started",
                mps::Found::Running => "cli-mps-running",
            };
            eprintln!("{}", cat.text(key, &[]));
            Some(mps)
        }
        Some(Err(detail)) => {
            eprintln!(
                "{}: {}",
                cat.text("error-prefix", &[]),
                cat.text("cli-mps-failed", &[("detail", &detail)])
            );
            return ExitCode::FAILURE;
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("{}: {e}", cat.text("error-prefix", &[]));
            return ExitCode::FAILURE;
        }
    };
    let result = match cli.command {
        Command::Local(args) => runtime.block_on(server::local(args, &cat)),
        Command::Supervisor(args) => runtime.block_on(server::supervisor(args, &cat)),
        Command::Worker(args) => runtime.block_on(server::worker(args, &cat)),
        Command::Launch(args) => launch::launch(args, &cat),
        Command::List(args) => models::list(args, &cat),
        Command::Terminate(args) => models::terminate(args, &cat),
        Command::Registrations(args) => registry::registrations(args, &cat),
        Command::Engine(args) => registry::engine(args, &cat),
        Command::Chat(args) => chat::chat(args, &cat),
        Command::Generate(args) => {
            runtime.block_on(generate::generate(args, &cat)).map_err(|e| engine_error_text(&cat, &e))
        }
        Command::Serve(args) => runtime.block_on(generate::serve(args, &cat)),
        Command::Bench(args) => bench::bench(args, &cat),
        Command::RandomCheckpoint(args) => random_checkpoint::random_checkpoint(args, &cat),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(text) => {
            eprintln!("{}: {text}", cat.text("error-prefix", &[]));
            ExitCode::FAILURE
        }
    }
}

/// Resolves on Ctrl-C or, on Unix, SIGTERM.
pub(crate) async fn shutdown_signal() {
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(s) => s,
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
                return;
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
