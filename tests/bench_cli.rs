//! `xinf bench` as a user runs it: against a real `xinf local` server, with the JSON report
//! checked, and a model uid the server does not know.

use crate::util;
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn xinf() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_xinf"));
    c.env("LANG", "C").env_remove("XINF_API_KEY").env_remove("XINF_ENDPOINT");
    c
}

/// A running `xinf local` whose stderr is collected; killed when dropped.
struct Server {
    child: Child,
    stderr: Arc<Mutex<String>>,
}

impl Server {
    fn spawn(args: &[&str]) -> Self {
        let mut child =
            xinf().args(args).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().expect("spawn xinf");
        let stderr = Arc::new(Mutex::new(String::new()));
        let pipe = child.stderr.take().expect("stderr");
        let sink = stderr.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                let mut s = sink.lock().unwrap_or_else(|p| p.into_inner());
                s.push_str(&line);
                s.push('\n');
            }
        });
        Self { child, stderr }
    }

    /// The text after `prefix` up to the end of its line, once the server has printed it.
    fn wait_for(&mut self, prefix: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let log = self.stderr.lock().unwrap_or_else(|p| p.into_inner()).clone();
            if let Some(rest) = log.lines().find_map(|l| l.split_once(prefix).map(|(_, r)| r.to_owned())) {
                return rest;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("xinf exited ({status}) before printing {prefix:?}:\n{log}");
            }
            assert!(Instant::now() < deadline, "no {prefix:?} within 120 s:\n{log}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

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
    let mut server = Server::spawn(&["local", "--port", "0", "-n", "smollm2-instruct", "-u", "m"]);
    let rest = server.wait_for("REST API at http://");
    let endpoint = format!("http://{}", rest.trim().trim_end_matches("/v1"));
    server.wait_for("Model `m` is ready");

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

    // Only unknown uids: nothing to size the prompts with, a clear failure naming the model.
    let out = bench(&endpoint, "-u nosuch --requests 2 --warmup 0");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("nosuch") && !stderr.contains("panicked"), "{stderr}");
}
