//! `xinf bench` as a user runs it: against a real `xinf local` server, with the JSON report
//! checked, and a model uid the server does not know.

use crate::util;
use crate::util::procs::{local, xinf};
use serde_json::Value;
use std::process::Output;

/// `xinf bench -e ENDPOINT` with `args` split at spaces.
fn bench(endpoint: &str, args: &str) -> Output {
    xinf().args(["bench", "-e", endpoint]).args(args.split_whitespace()).output().expect("run xinf bench")
}

/// The JSON report a successful `--json -` run printed on stdout.
fn report(out: &Output) -> Value {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "xinf bench failed:\n{stderr}");
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}\n{stderr}", String::from_utf8_lossy(&out.stdout)))
}

#[test]
fn bench_measures_a_served_model_and_counts_errors() {
    let _ = util::smollm2();
    let (_server, addr) = local("m", &[]);
    let endpoint = format!("http://{addr}");

    // One model at two concurrency levels: the report has a result per level, no errors,
    // and prompts of the lengths asked for as the server counts them.
    let out = bench(
        &endpoint,
        "-u m --concurrency 1,2 --requests 4 --prompt-tokens 40,173 --output-tokens 8 --warmup 1 --json -",
    );
    let json = report(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("TTFT P50 (ms)"), "the table goes to stderr with --json -:\n{stderr}");
    assert_eq!(json["endpoint"], endpoint.as_str(), "{json:#}");
    assert_eq!(json["output_tokens"], 8, "{json:#}");
    let lengths: Vec<u64> =
        json["prompt_tokens"].as_array().expect("prompt_tokens").iter().filter_map(Value::as_u64).collect();
    assert_eq!(lengths.len(), 2, "{json:#}");
    for (length, wanted) in lengths.iter().zip([40.0, 173.0]) {
        let ratio = *length as f64 / wanted;
        assert!((0.8..=1.2).contains(&ratio), "{length} tokens for {wanted}: {json:#}");
    }
    let results = json["results"].as_array().expect("results");
    assert_eq!(results.len(), 2, "{json:#}");
    for (r, concurrency) in results.iter().zip([1, 2]) {
        assert_eq!(r["model_uid"], "m", "{r:#}");
        assert_eq!(r["concurrency"], concurrency, "{r:#}");
        assert_eq!(r["requests"], 4, "{r:#}");
        assert_eq!(r["errors"], 0, "{r:#}");
        let p50 = r["ttft_ms"]["p50"].as_f64().expect("ttft p50");
        let p95 = r["ttft_ms"]["p95"].as_f64().expect("ttft p95");
        assert!(p50 > 0.0 && p95 >= p50, "{r:#}");
        assert!(r["tpot_ms"]["p50"].as_f64().is_some_and(|v| v > 0.0), "{r:#}");
        assert!(r["output_tokens_per_s"].as_f64().is_some_and(|v| v > 0.0), "{r:#}");
        assert!(r["wall_s"].as_f64().is_some_and(|v| v > 0.0), "{r:#}");
    }
    // Each level says when it started (what lines a server's log up with it): the second
    // once the first had ended, both within this test's run.
    let now =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_secs_f64();
    let started: Vec<f64> = results.iter().filter_map(|r| r["started_unix_s"].as_f64()).collect();
    assert_eq!(started.len(), 2, "{json:#}");
    let first_end = started[0] + results[0]["wall_s"].as_f64().unwrap_or(0.0);
    assert!(started[0] > now - 600.0 && started[1] <= now, "{started:?} against {now}");
    assert!(
        started[1] + 0.002 >= first_end,
        "level 2 started at {} before level 1 ended at {first_end}",
        started[1]
    );

    // A second uid the server does not know: its requests are errors, named in the report,
    // and the run goes on to the end.
    let out = bench(
        &endpoint,
        "-u m -u nosuch --concurrency 1 --requests 2 --prompt-tokens 40 --output-tokens 4 --warmup 0 --json -",
    );
    let json = report(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let results = json["results"].as_array().expect("results");
    assert_eq!(results.len(), 2, "{json:#}");
    assert_eq!((results[0]["model_uid"].clone(), results[0]["errors"].clone()), ("m".into(), 0.into()));
    assert_eq!(results[1]["model_uid"], "nosuch", "{json:#}");
    assert_eq!(results[1]["errors"], 2, "{json:#}");
    assert_eq!(results[1]["ttft_ms"]["p50"], Value::Null, "{json:#}");
    let messages = results[1]["error_messages"].to_string();
    assert!(messages.contains("nosuch"), "{messages}");
    assert!(stderr.contains("TTFT p50 of `nosuch` / `m` at concurrency 1: -"), "{stderr}");

    // A shared prefix: every prompt begins with the same 96 tokens, which the server's prefix
    // cache computes once; the lengths still count them. A prefix that leaves no room is
    // refused by name.
    let stats = |s: &str| -> u64 {
        let body = util::http::get(addr, "/v1/models/m/stats").json();
        body[s].as_u64().unwrap_or(0)
    };
    let cached_before = stats("cached_prompt_tokens");
    let out = bench(
        &endpoint,
        "-u m --concurrency 2 --requests 4 --prompt-tokens 173 --output-tokens 4 --warmup 0 \
         --shared-prefix-tokens 96 --json -",
    );
    let json = report(&out);
    assert_eq!(json["shared_prefix_tokens"], 96, "{json:#}");
    let length = json["prompt_tokens"][0].as_u64().unwrap_or(0) as f64;
    assert!((0.8..=1.2).contains(&(length / 173.0)), "{json:#}");
    assert_eq!(json["results"][0]["errors"], 0, "{json:#}");
    assert!(stats("cached_prompt_tokens") >= cached_before + 3 * 64, "the prefix was computed once");
    let out = bench(&endpoint, "-u m --requests 1 --prompt-tokens 40 --shared-prefix-tokens 96 --warmup 0");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("--shared-prefix-tokens 96"), "{stderr}");

    // Only unknown uids: nothing to size the prompts with, a clear failure naming the model.
    let out = bench(&endpoint, "-u nosuch --requests 2 --warmup 0");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("nosuch") && !stderr.contains("panicked"), "{stderr}");
}
