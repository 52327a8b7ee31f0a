//! The load: streamed requests sent and timed, one at a time for the warm-up and from many
//! threads at once for a concurrency level.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{Value, json};
use xinf_i18n::Catalog;

use super::args::BenchArgs;
use super::prompts::Prompt;
use super::stats::{Level, Sample, summarize};
use crate::cli::client::Client;

/// The streamed completion request of a measured (or warm-up) request.
fn request_body(uid: &str, prompt: &str, output_tokens: usize) -> Value {
    json!({
        "model": uid,
        "prompt": prompt,
        "max_tokens": output_tokens,
        "ignore_eos": true,
        "temperature": 0,
        "stream": true,
        "stream_options": {"include_usage": true},
    })
}

/// Sends one streamed request and times it. The first and last non-empty text deltas give TTFT
/// and TPOT; the output length comes from the usage chunk, or from the deltas when a server
/// sends none. A failure is told in `cat`'s language.
fn one_request(client: &Client, body: &Value, cat: &Catalog) -> Result<Sample, String> {
    let sent = Instant::now();
    let (mut first, mut last, mut deltas, mut usage) = (None, None, 0, None);
    // Every event is taken: the stream always runs to its end.
    let _ = client
        .stream("/v1/completions", body, |event| {
            if event["choices"][0]["text"].as_str().is_some_and(|t| !t.is_empty()) {
                let now = Instant::now();
                first.get_or_insert(now);
                last = Some(now);
                deltas += 1;
            }
            if let Some(n) = event["usage"]["completion_tokens"].as_u64() {
                usage = Some(n as usize);
            }
            std::ops::ControlFlow::Continue(())
        })
        .map_err(|e| e.text(cat))?;
    let (Some(first), Some(last)) = (first, last) else {
        return Err(cat.text("cli-bench-no-text", &[]));
    };
    let output_tokens = usage.unwrap_or(deltas);
    let ttft_ms = first.duration_since(sent).as_secs_f64() * 1000.0;
    let tpot_ms = (output_tokens > 1)
        .then(|| last.duration_since(first).as_secs_f64() * 1000.0 / (output_tokens - 1) as f64);
    Ok(Sample { ttft_ms, tpot_ms, output_tokens })
}

/// Sends `args.requests` requests to `uid` from `concurrency` threads, each taking the next
/// request as soon as its previous one ends, so that `concurrency` requests are always in
/// flight. Request `i` uses the prompts in turn and the number `first_number + i`.
pub(super) fn run_level(
    args: &BenchArgs,
    uid: &str,
    concurrency: usize,
    prompts: &[Prompt],
    first_number: usize,
    cat: &Catalog,
) -> Level {
    let bar = ProgressBar::new(args.requests as u64);
    bar.set_style(
        ProgressStyle::with_template("{msg} {bar:24} {pos}/{len} [{elapsed}]")
            .unwrap_or(ProgressStyle::default_bar()),
    );
    let concurrency_text = concurrency.to_string();
    bar.set_message(cat.text("cli-bench-running", &[("uid", uid), ("concurrency", &concurrency_text)]));
    // A catalog stays on its thread: each sender makes its own, in the same language.
    let lang = cat.lang();
    let next = AtomicUsize::new(0);
    let started = Instant::now();
    let started_unix_s = SystemTime::now().duration_since(UNIX_EPOCH).ok().map(|d| d.as_secs_f64());
    let outcomes: Vec<Result<Sample, String>> = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..concurrency.min(args.requests))
            .map(|_| {
                scope.spawn(|| {
                    // A client per thread: each keeps its own connection alive.
                    let client = args.endpoint.client();
                    let cat = Catalog::new(lang);
                    let mut mine = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= args.requests {
                            break;
                        }
                        let Some(prompt) = prompts.get(i % prompts.len().max(1)) else { break };
                        let text = prompt.text(first_number + i);
                        let body = request_body(uid, &text, args.output_tokens);
                        mine.push(one_request(&client, &body, &cat));
                        bar.inc(1);
                    }
                    mine
                })
            })
            .collect();
        threads.into_iter().flat_map(|t| t.join().unwrap_or_default()).collect()
    });
    let wall_s = started.elapsed().as_secs_f64();
    bar.finish_and_clear();
    let mut level = summarize(uid, concurrency, args.requests, &outcomes, wall_s);
    level.started_unix_s = started_unix_s;
    let (requests, errors, secs) =
        (level.requests.to_string(), level.errors.to_string(), format!("{wall_s:.1}"));
    eprintln!(
        "{}",
        cat.text(
            "cli-bench-level-done",
            &[
                ("uid", uid),
                ("concurrency", &concurrency_text),
                ("requests", &requests),
                ("errors", &errors),
                ("secs", &secs)
            ],
        )
    );
    level
}

/// Sends `args.warmup` requests to `uid`, one at a time, with numbers from `first_number`.
/// A failure ends the warm-up with a warning: the measured requests will show the errors.
pub(super) fn warm_up(
    args: &BenchArgs,
    client: &Client,
    uid: &str,
    prompts: &[Prompt],
    first_number: usize,
    cat: &Catalog,
) {
    if args.warmup == 0 || prompts.is_empty() {
        return;
    }
    eprintln!("{}", cat.text("cli-bench-warmup", &[("uid", uid), ("count", &args.warmup.to_string())]));
    for i in 0..args.warmup {
        let Some(prompt) = prompts.get(i % prompts.len()) else { break };
        let body = request_body(uid, &prompt.text(first_number + i), args.output_tokens);
        if let Err(detail) = one_request(client, &body, cat) {
            eprintln!("{}", cat.text("cli-bench-warmup-failed", &[("uid", uid), ("detail", &detail)]));
            break;
        }
    }
}
