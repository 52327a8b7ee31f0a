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

use super::client::Client;
use super::launch::EndpointArgs;
use clap::Args;
use clap::builder::RangedU64ValueParser;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{Value, json};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;
use xinf_i18n::Catalog;
use xinf_models::SplitMix64;

/// `xinf bench`.
#[derive(Debug, Args)]
pub(crate) struct BenchArgs {
    #[command(flatten)]
    endpoint: EndpointArgs,
    /// The model's uid (see `xinf list`). Repeat it to compare several models in one run: they
    /// are measured one after another, with the same prompts.
    #[arg(short = 'u', long, required = true)]
    model_uid: Vec<String>,
    /// Concurrency levels, comma-separated: the number of requests in flight at once. Each level
    /// sends --requests requests.
    #[arg(long, value_delimiter = ',', default_value = "1,16", value_parser = at_least_one())]
    concurrency: Vec<usize>,
    /// Requests measured at each concurrency level, for each model.
    #[arg(long, default_value_t = 128, value_parser = at_least_one())]
    requests: usize,
    /// Tokens every request generates: the end-of-sequence token is ignored, so each answer has
    /// exactly this length and the decode work is the same for every model.
    #[arg(long, default_value_t = 32, value_parser = at_least_one())]
    output_tokens: usize,
    /// Prompt lengths in tokens, comma-separated; requests take them in turn. Each is capped to
    /// the model's context (less the output tokens) when the server reports it.
    #[arg(long, value_delimiter = ',', default_value = "40,173,733,2833", value_parser = at_least_one())]
    prompt_tokens: Vec<usize>,
    /// Requests sent to each model before measuring, one at a time and not counted, so that
    /// first-use costs (allocations, compilation, cold caches) stay out of the numbers.
    #[arg(long, default_value_t = 4)]
    warmup: usize,
    /// Also write the report as JSON to PATH; `-` writes it to stdout (the table then goes to
    /// stderr).
    #[arg(long, value_name = "PATH")]
    json: Option<String>,
    /// Seed of the prompt text: the same seed gives the same prompts, run after run.
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

/// A parser of counts that must be at least one (zero requests or tokens measure nothing).
fn at_least_one() -> RangedU64ValueParser<usize> {
    RangedU64ValueParser::<usize>::new().range(1..)
}

/// Tokens a first guess of the prompt size assumes per English word.
const TOKENS_PER_WORD: f64 = 1.3;
/// Measurements at most per prompt length: the word count scales linearly enough that one or
/// two corrections land within the tolerance.
const SIZING_ROUNDS: usize = 4;
/// Room left in the context for the request number that starts every prompt, which can take a
/// token or two more than the number the prompt was measured with.
const TAG_SLACK: usize = 4;
/// Distinct error messages kept per result.
const ERROR_MESSAGES: usize = 3;

/// Words of the prompt text: common English, which tokenizers count at about
/// [`TOKENS_PER_WORD`] tokens each.
const WORDS: &str = "the of and to in is that for it as was with be by on not he this are or his from at which \
    but have an had they you were their one all we can her has there been if more when will \
    would who so no time people water river mountain city garden morning evening story number \
    music window light house road winter summer market letter question answer small large quiet \
    bright early late old new green blue walks reads builds finds carries opens watches \
    remembers slowly often together always never again under between across behind";

/// The first `n` words of the text of the `class`-th prompt length: sentences of 6 to 14
/// words. The text of `n` words starts the text of `n + 1` (but for its final period), so the
/// token count grows with `n` and sizing converges.
fn prompt_text(seed: u64, class: usize, n: usize) -> String {
    let words: Vec<&str> = WORDS.split_whitespace().collect();
    let mut rng = SplitMix64::new(seed ^ (class as u64).wrapping_mul(0xa076_1d64_78bd_642f));
    let mut out = String::new();
    let mut sentence_left = 0;
    for i in 0..n {
        let Some(word) = words.get(rng.below(words.len())) else { break };
        if i > 0 {
            out.push(' ');
        }
        if sentence_left == 0 {
            sentence_left = 6 + rng.below(9);
            let mut chars = word.chars();
            if let Some(c) = chars.next() {
                out.extend(c.to_uppercase());
                out.push_str(chars.as_str());
            }
        } else {
            out.push_str(word);
        }
        sentence_left -= 1;
        if sentence_left == 0 || i + 1 == n {
            out.push('.');
        }
    }
    out
}

/// The prompt of request `number`. Every request starts with its own number, so that a server
/// with a prefix cache computes each prompt in full, as it would for distinct users.
fn tagged(number: usize, body: &str) -> String {
    format!("Request {number:06}. {body}")
}

/// How far a measured length may be from the wanted one: 2 %, at least one token.
fn tolerance(target: usize) -> usize {
    (target / 50).max(1)
}

/// The word count a first measurement starts from.
fn initial_words(target: usize) -> usize {
    ((target as f64 / TOKENS_PER_WORD).round() as usize).max(1)
}

/// The word count to try after `words` words measured `tokens` tokens: scaled in proportion,
/// and at least one word toward the target unless it was hit, so that every round moves.
fn next_word_count(words: usize, tokens: usize, target: usize) -> usize {
    let scaled = ((words as f64 * target as f64 / tokens.max(1) as f64).round() as usize).max(1);
    if scaled != words {
        return scaled;
    }
    match tokens.cmp(&target) {
        std::cmp::Ordering::Less => words + 1,
        std::cmp::Ordering::Greater => words.saturating_sub(1).max(1),
        std::cmp::Ordering::Equal => words,
    }
}

/// The prompt length to aim at for `requested` tokens in a context of `context` tokens: the
/// output, the request number and the sizing tolerance must fit next to it. `None` when
/// nothing fits.
fn capped_length(requested: usize, context: Option<usize>, output_tokens: usize) -> Option<usize> {
    let Some(context) = context else { return Some(requested) };
    let room = context.saturating_sub(output_tokens + TAG_SLACK + tolerance(context));
    (room > 0).then_some(requested.min(room))
}

/// The word count whose prompt measures closest to `target` tokens, with its length, from at
/// most [`SIZING_ROUNDS`] measurements.
fn fit_words(
    target: usize,
    mut measure: impl FnMut(usize) -> Result<usize, String>,
) -> Result<(usize, usize), String> {
    let mut words = initial_words(target);
    let mut tokens = measure(words)?;
    let mut best = (words, tokens);
    for _ in 1..SIZING_ROUNDS {
        if tokens.abs_diff(target) <= tolerance(target) {
            break;
        }
        words = next_word_count(words, tokens, target);
        tokens = measure(words)?;
        if tokens.abs_diff(target) < best.1.abs_diff(target) {
            best = (words, tokens);
        }
    }
    Ok(best)
}

/// Nearest-rank percentile `p` (0 to 100) of sorted samples; `None` without samples.
fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p / 100.0 * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted.get(rank - 1).copied()
}

/// A prompt of one of the wanted lengths, without its request number.
struct Prompt {
    body: String,
    /// Its length as the server counts it, request number included.
    tokens: usize,
}

/// The prompt length, as the server counts it.
fn measure(client: &Client, uid: &str, prompt: &str, cat: &Catalog) -> Result<usize, String> {
    let body = json!({"model": uid, "prompt": prompt, "max_tokens": 1, "temperature": 0});
    let answer = client.post("/v1/completions", &body).map_err(|e| e.to_string())?;
    answer["usage"]["prompt_tokens"]
        .as_u64()
        .map(|n| n as usize)
        .ok_or_else(|| cat.text("cli-bench-no-usage", &[]))
}

/// A uid as one path segment: everything but unreserved characters percent-encoded.
fn path_segment(uid: &str) -> String {
    uid.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The model's context length, when the server reports it (xinf's `xinf.context_length`).
fn context_length(client: &Client, uid: &str) -> Option<usize> {
    let info = client.get(&format!("/v1/models/{}", path_segment(uid))).ok()?;
    info["xinf"]["context_length"].as_u64().map(|n| n as usize)
}

/// The prompts, sized with `uid`'s tokenizer to the wanted lengths capped to `context`.
fn size_prompts(
    args: &BenchArgs,
    client: &Client,
    uid: &str,
    context: Option<usize>,
    cat: &Catalog,
) -> Result<Vec<Prompt>, String> {
    let mut prompts = Vec::with_capacity(args.prompt_tokens.len());
    for (class, &requested) in args.prompt_tokens.iter().enumerate() {
        let target = capped_length(requested, context, args.output_tokens).ok_or_else(|| {
            let (output, context) = (args.output_tokens.to_string(), context.unwrap_or(0).to_string());
            cat.text("cli-bench-no-room", &[("output", &output), ("context", &context)])
        })?;
        let (words, tokens) = fit_words(target, |words| {
            measure(client, uid, &tagged(0, &prompt_text(args.seed, class, words)), cat)
        })
        .map_err(|detail| cat.text("cli-bench-measure-failed", &[("uid", uid), ("detail", &detail)]))?;
        prompts.push(Prompt { body: prompt_text(args.seed, class, words), tokens });
    }
    Ok(prompts)
}

/// What one successful request measured.
#[derive(Debug, Clone, Copy)]
struct Sample {
    /// Send to first text, in milliseconds.
    ttft_ms: f64,
    /// Mean time between output tokens after the first, in milliseconds; `None` for a single
    /// output token.
    tpot_ms: Option<f64>,
    output_tokens: usize,
}

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
/// sends none. A stream without text fails with `no_text` (a catalog text made beforehand: a
/// [`Catalog`] stays on its thread).
fn one_request(client: &Client, body: &Value, no_text: &str) -> Result<Sample, String> {
    let sent = Instant::now();
    let (mut first, mut last, mut deltas, mut usage) = (None, None, 0, None);
    client
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
        })
        .map_err(|e| e.to_string())?;
    let (Some(first), Some(last)) = (first, last) else {
        return Err(no_text.to_owned());
    };
    let output_tokens = usage.unwrap_or(deltas);
    let ttft_ms = first.duration_since(sent).as_secs_f64() * 1000.0;
    let tpot_ms = (output_tokens > 1)
        .then(|| last.duration_since(first).as_secs_f64() * 1000.0 / (output_tokens - 1) as f64);
    Ok(Sample { ttft_ms, tpot_ms, output_tokens })
}

/// The measurements of one model at one concurrency level.
#[derive(Debug)]
struct Level {
    model_uid: String,
    concurrency: usize,
    requests: usize,
    errors: usize,
    /// The first few distinct error messages.
    error_messages: Vec<String>,
    ttft_p50: Option<f64>,
    ttft_p95: Option<f64>,
    tpot_p50: Option<f64>,
    output_tokens_per_s: f64,
    wall_s: f64,
}

/// Sums up the outcomes of `requests` requests that took `wall_s` seconds in all. Requests
/// without an outcome count as errors.
fn summarize(
    model_uid: &str,
    concurrency: usize,
    requests: usize,
    outcomes: &[Result<Sample, String>],
    wall_s: f64,
) -> Level {
    let samples: Vec<Sample> = outcomes.iter().filter_map(|o| o.as_ref().ok().copied()).collect();
    let mut error_messages: Vec<String> = Vec::new();
    for message in outcomes.iter().filter_map(|o| o.as_ref().err()) {
        if error_messages.len() < ERROR_MESSAGES && !error_messages.contains(message) {
            error_messages.push(message.clone());
        }
    }
    let sorted = |values: Vec<f64>| {
        let mut v = values;
        v.sort_by(f64::total_cmp);
        v
    };
    let ttft = sorted(samples.iter().map(|s| s.ttft_ms).collect());
    let tpot = sorted(samples.iter().filter_map(|s| s.tpot_ms).collect());
    let output: usize = samples.iter().map(|s| s.output_tokens).sum();
    Level {
        model_uid: model_uid.to_owned(),
        concurrency,
        requests,
        errors: requests.saturating_sub(samples.len()),
        error_messages,
        ttft_p50: percentile(&ttft, 50.0),
        ttft_p95: percentile(&ttft, 95.0),
        tpot_p50: percentile(&tpot, 50.0),
        output_tokens_per_s: if wall_s > 0.0 { output as f64 / wall_s } else { 0.0 },
        wall_s,
    }
}

/// Rounds to microseconds (of milliseconds) or thousandths, which is all the JSON needs.
fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

impl Level {
    fn json(&self) -> Value {
        json!({
            "model_uid": self.model_uid,
            "concurrency": self.concurrency,
            "requests": self.requests,
            "errors": self.errors,
            "error_messages": self.error_messages,
            "ttft_ms": {"p50": self.ttft_p50.map(round3), "p95": self.ttft_p95.map(round3)},
            "tpot_ms": {"p50": self.tpot_p50.map(round3)},
            "output_tokens_per_s": round3(self.output_tokens_per_s),
            "wall_s": round3(self.wall_s),
        })
    }
}

/// Sends `args.requests` requests to `uid` from `concurrency` threads, each taking the next
/// request as soon as its previous one ends, so that `concurrency` requests are always in
/// flight. Request `i` uses the prompts in turn and the number `first_number + i`.
fn run_level(
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
    let no_text = cat.text("cli-bench-no-text", &[]);
    let next = AtomicUsize::new(0);
    let started = Instant::now();
    let outcomes: Vec<Result<Sample, String>> = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..concurrency.min(args.requests))
            .map(|_| {
                scope.spawn(|| {
                    // A client per thread: each keeps its own connection alive.
                    let client = args.endpoint.client();
                    let mut mine = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= args.requests {
                            break;
                        }
                        let Some(prompt) = prompts.get(i % prompts.len().max(1)) else { break };
                        let text = tagged(first_number + i, &prompt.body);
                        let body = request_body(uid, &text, args.output_tokens);
                        mine.push(one_request(&client, &body, &no_text));
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
    let level = summarize(uid, concurrency, args.requests, &outcomes, wall_s);
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
fn warm_up(
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
        let body = request_body(uid, &tagged(first_number + i, &prompt.body), args.output_tokens);
        if let Err(detail) = one_request(client, &body, &cat.text("cli-bench-no-text", &[])) {
            eprintln!("{}", cat.text("cli-bench-warmup-failed", &[("uid", uid), ("detail", &detail)]));
            break;
        }
    }
}

/// Milliseconds with one decimal, or `-` without samples.
fn ms(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.1}"))
}

/// Rows as columns padded to the widest cell: the first column to the left, numbers to the
/// right.
fn table(rows: &[Vec<String>]) -> String {
    let columns = rows.first().map_or(0, Vec::len);
    let widths: Vec<usize> = (0..columns)
        .map(|c| rows.iter().filter_map(|r| r.get(c)).map(|s| s.chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in rows {
        let cells: Vec<String> = row
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(i, (cell, w))| if i == 0 { format!("{cell:<w$}") } else { format!("{cell:>w$}") })
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

/// The report as text: the table, the TTFT ratios of the other models to the first, and the
/// first error messages. `levels` holds `per_model` levels for each model in turn.
fn report(levels: &[Level], per_model: usize, cat: &Catalog) -> String {
    let header = [
        "cli-bench-col-model",
        "cli-bench-col-concurrency",
        "cli-bench-col-requests",
        "cli-bench-col-errors",
        "cli-bench-col-ttft-p50",
        "cli-bench-col-ttft-p95",
        "cli-bench-col-tpot-p50",
        "cli-bench-col-throughput",
    ];
    let mut rows = vec![header.iter().map(|k| cat.text(k, &[])).collect::<Vec<_>>()];
    for l in levels {
        rows.push(vec![
            l.model_uid.clone(),
            l.concurrency.to_string(),
            l.requests.to_string(),
            l.errors.to_string(),
            ms(l.ttft_p50),
            ms(l.ttft_p95),
            ms(l.tpot_p50),
            format!("{:.1}", l.output_tokens_per_s),
        ]);
    }
    let mut out = table(&rows);
    // The levels come model by model, each with the same concurrency levels in the same order.
    let mut models = levels.chunks(per_model.max(1));
    if let Some(base) = models.next() {
        for model in models {
            for (l, b) in model.iter().zip(base) {
                let ratio = match (l.ttft_p50, b.ttft_p50) {
                    (Some(v), Some(b)) if b > 0.0 => format!("{:.2}", v / b),
                    _ => "-".into(),
                };
                let c = l.concurrency.to_string();
                let args = [
                    ("uid", l.model_uid.as_str()),
                    ("base", b.model_uid.as_str()),
                    ("concurrency", &c),
                    ("ratio", &ratio),
                ];
                out.push_str(&cat.text("cli-bench-ratio", &args));
                out.push('\n');
            }
        }
    }
    for l in levels {
        for message in &l.error_messages {
            let c = l.concurrency.to_string();
            let args = [("uid", l.model_uid.as_str()), ("concurrency", &c), ("message", message)];
            out.push_str(&cat.text("cli-bench-error", &args));
            out.push('\n');
        }
    }
    out
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentile_is_nearest_rank() {
        let v: Vec<f64> = (1..=10).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), Some(5.0));
        assert_eq!(percentile(&v, 95.0), Some(10.0));
        assert_eq!(percentile(&v, 90.0), Some(9.0));
        assert_eq!(percentile(&v, 0.0), Some(1.0));
        assert_eq!(percentile(&v, 100.0), Some(10.0));
        assert_eq!(percentile(&[7.0], 95.0), Some(7.0));
        assert_eq!(percentile(&[], 50.0), None);
        let w: Vec<f64> = (1..=20).map(f64::from).collect();
        assert_eq!(percentile(&w, 95.0), Some(19.0));
    }

    #[test]
    fn word_counts_scale_toward_the_target() {
        assert_eq!(initial_words(130), 100);
        assert_eq!(initial_words(1), 1);
        assert_eq!(next_word_count(100, 150, 120), 80);
        assert_eq!(next_word_count(100, 100, 200), 200);
        // Rounding that would not move steps one word toward the target.
        assert_eq!(next_word_count(100, 100, 100), 100);
        assert_eq!(next_word_count(100, 101, 100), 99);
        assert_eq!(next_word_count(100, 199, 200), 101);
        assert_eq!(next_word_count(1, 50, 10), 1);
        assert_eq!(tolerance(2833), 56);
        assert_eq!(tolerance(40), 1);
    }

    #[test]
    fn sizing_converges_on_a_tokenizer_like_count() {
        // 1.5 tokens a word plus 6 for the request number.
        let count = |words: usize| words * 3 / 2 + 6;
        for target in [40, 173, 733, 2833] {
            let mut calls = 0;
            let fitted = fit_words(target, |w| {
                calls += 1;
                Ok(count(w))
            });
            let Ok((words, tokens)) = fitted else { panic!("{fitted:?}") };
            assert_eq!(tokens, count(words));
            assert!(tokens.abs_diff(target) <= tolerance(target), "{target}: {tokens}");
            assert!(calls <= SIZING_ROUNDS, "{calls}");
        }
        assert_eq!(fit_words(40, |_| Err("down".into())), Err("down".into()));
    }

    #[test]
    fn lengths_are_capped_to_the_context() {
        assert_eq!(capped_length(2833, None, 32), Some(2833));
        assert_eq!(capped_length(2833, Some(8192), 32), Some(2833));
        // 2048 - 32 output - 4 tag - 40 tolerance.
        assert_eq!(capped_length(2833, Some(2048), 32), Some(1972));
        assert_eq!(capped_length(40, Some(2048), 32), Some(40));
        assert_eq!(capped_length(40, Some(32), 32), None);
    }

    #[test]
    fn prompt_text_is_deterministic_and_grows_by_prefix() {
        let long = prompt_text(7, 2, 50);
        assert_eq!(long, prompt_text(7, 2, 50));
        assert_ne!(long, prompt_text(8, 2, 50));
        assert_ne!(long, prompt_text(7, 3, 50));
        assert_eq!(long.split_whitespace().count(), 50);
        let short = prompt_text(7, 2, 20);
        assert!(long.starts_with(short.trim_end_matches('.')), "{short} / {long}");
        assert!(short.ends_with('.') && short.starts_with(char::is_uppercase), "{short}");
        assert_eq!(prompt_text(0, 0, 0), "");
        assert!(tagged(12, "Hello.").starts_with("Request 000012. "));
    }

    #[test]
    fn summary_counts_errors_and_throughput() {
        let ok = |ttft_ms, output_tokens| Ok(Sample { ttft_ms, tpot_ms: Some(2.0), output_tokens });
        let outcomes = vec![
            ok(10.0, 32),
            Err("boom".to_owned()),
            ok(30.0, 32),
            Err("boom".to_owned()),
            Err("bang".to_owned()),
            ok(20.0, 32),
        ];
        // Seven requests and six outcomes: the missing one is an error too.
        let level = summarize("m", 4, 7, &outcomes, 2.0);
        assert_eq!(level.errors, 4);
        assert_eq!(level.error_messages, ["boom", "bang"]);
        assert_eq!(level.ttft_p50, Some(20.0));
        assert_eq!(level.ttft_p95, Some(30.0));
        assert_eq!(level.tpot_p50, Some(2.0));
        assert_eq!(level.output_tokens_per_s, 48.0);
        let json = level.json();
        assert_eq!(json["ttft_ms"]["p50"], 20.0);
        let none = summarize("m", 1, 2, &[Err("x".into()), Err("x".into())], 0.5);
        assert_eq!((none.errors, none.ttft_p50, none.output_tokens_per_s), (2, None, 0.0));
        assert_eq!(none.json()["ttft_ms"]["p50"], Value::Null);
    }

    #[test]
    fn report_compares_models_by_ttft() {
        let ok = |ttft_ms| Ok(Sample { ttft_ms, tpot_ms: None, output_tokens: 1 });
        // Two models at concurrency 1 and 4, the second given twice: rows by position, not uid.
        let levels = [
            summarize("a", 1, 1, &[ok(10.0)], 1.0),
            summarize("a", 4, 1, &[ok(40.0)], 1.0),
            summarize("b", 1, 1, &[ok(25.0)], 1.0),
            summarize("b", 4, 1, &[Err("gone".into())], 1.0),
            summarize("b", 1, 1, &[ok(5.0)], 1.0),
            summarize("b", 4, 1, &[ok(20.0)], 1.0),
        ];
        let text = report(&levels, 2, &Catalog::new("en"));
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 1 + 6 + 4 + 1, "{text}");
        assert!(lines[0].starts_with("MODEL") && lines[0].ends_with("OUTPUT TOK/S"), "{text}");
        assert_eq!(
            &lines[7..],
            [
                "TTFT p50 of `b` / `a` at concurrency 1: 2.50",
                "TTFT p50 of `b` / `a` at concurrency 4: -",
                "TTFT p50 of `b` / `a` at concurrency 1: 0.50",
                "TTFT p50 of `b` / `a` at concurrency 4: 0.50",
                "`b` at concurrency 4: gone",
            ]
        );
        assert_eq!(report(&levels[..2], 2, &Catalog::new("en")).lines().count(), 3);
    }

    #[test]
    fn uids_are_escaped_in_paths() {
        assert_eq!(path_segment("Qwen/Qwen2.5 7B"), "Qwen%2FQwen2.5%207B");
        assert_eq!(path_segment("m-1_x~"), "m-1_x~");
    }
}
