//! `xinf bench`: a load generator against any OpenAI-compatible endpoint.
//!
//! It sends streamed `/v1/completions` requests of mixed prompt lengths and a fixed number of
//! output tokens (`ignore_eos`, greedy) at each concurrency level, and reports time to first
//! token, time per output token, output throughput and errors, as a table and as JSON. Several
//! model uids are measured one after another with the same prompts, so that they compare.
//!
//! Only the OpenAI API is used, so the same command measures xinf and any other server:
//! prompt lengths are counted by the server itself (`usage.prompt_tokens`), and the context
//! length is read from xinf's `GET /v1/models/{uid}` when the server tells it.

mod args;
mod load;
mod prompts;
mod report;
mod stats;

use serde_json::json;
use xinf_i18n::Catalog;

pub(crate) use self::args::BenchArgs;
use self::load::{run_level, warm_up};
use self::prompts::{capped_length, context_length, size_prompts};
use self::report::report;
use self::stats::Level;

/// `xinf bench`: sizes the prompts with the first model, then warms up and measures each model
/// at each concurrency level in turn, and prints the report.
pub(crate) fn bench(args: BenchArgs, cat: &Catalog) -> Result<(), String> {
    let client = args.endpoint.client();
    let Some(first) = args.model_uid.first() else {
        return Err(cat.text("cli-bench-model-required", &[]));
    };
    // One set of prompts for every model, so it must fit the smallest context.
    let context = args.model_uid.iter().filter_map(|uid| context_length(&client, uid)).min();
    eprintln!("{}", cat.text("cli-bench-sizing", &[("uid", first)]));
    let prompts = size_prompts(&args, &client, first, context, cat)?;
    if let Some(context) = context
        && args.prompt_tokens.iter().any(|&t| capped_length(t, Some(context), args.output_tokens) != Some(t))
    {
        eprintln!("{}", cat.text("cli-bench-capped", &[("context", &context.to_string())]));
    }
    let lengths = prompts.iter().map(|p| p.tokens.to_string()).collect::<Vec<_>>().join(", ");
    eprintln!("{}", cat.text("cli-bench-prompts", &[("lengths", &lengths), ("uid", first)]));

    // Request numbers: each level's, then the warm-up's; the same for every model.
    let warmup_number = args.concurrency.len() * args.requests;
    let mut levels = Vec::new();
    for uid in &args.model_uid {
        warm_up(&args, &client, uid, &prompts, warmup_number, cat);
        for (i, &concurrency) in args.concurrency.iter().enumerate() {
            levels.push(run_level(&args, uid, concurrency, &prompts, i * args.requests, cat));
        }
    }

    let text = report(&levels, args.concurrency.len(), cat);
    let json = json!({
        "endpoint": args.endpoint.endpoint,
        "output_tokens": args.output_tokens,
        "prompt_tokens": prompts.iter().map(|p| p.tokens).collect::<Vec<_>>(),
        "shared_prefix_tokens": args.shared_prefix_tokens,
        "results": levels.iter().map(Level::json).collect::<Vec<_>>(),
    });
    let json = format!("{json:#}\n");
    match args.json.as_deref() {
        Some("-") => {
            eprint!("{text}");
            print!("{json}");
        }
        Some(path) => {
            print!("{text}");
            std::fs::write(path, json).map_err(|e| {
                cat.text("cli-bench-write-failed", &[("path", path), ("detail", &e.to_string())])
            })?;
        }
        None => print!("{text}"),
    }
    Ok(())
}
