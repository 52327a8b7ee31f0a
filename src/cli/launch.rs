//! `xinf launch`, and the launch flags `xinf local` shares: flags → a checked
//! [`LaunchRequest`], then `POST /v1/models` with progress while the model loads.

use super::client::{Client, ClientError};
use super::status::model_status_text;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Deserialize;
use serde_json::{Map, Value};
use std::ffi::OsString;
use std::time::{Duration, Instant};
use xinf_actors::{GpuCount, GpuIdx, LaunchRequest, ModelSize, ModelStatus, ReplicaConfig, ReplicaStatus};
use xinf_i18n::Catalog;

/// What to launch. The flags mirror Xinference's `launch` command.
#[derive(Debug, Args, Default)]
pub(crate) struct LaunchSource {
    /// Model name from the builtin registry (smollm2-instruct, qwen2.5-instruct, qwen3,
    /// llama-3.2-instruct), or any name together with --model-path.
    #[arg(short = 'n', long)]
    pub(crate) model_name: Option<String>,
    /// Engine of every replica (also `-en`): `native` (the default), `vllm` or `sglang`.
    #[arg(long)]
    pub(crate) model_engine: Option<String>,
    /// The uid clients pass as `model` (default: the model name, or the name plus a suffix when
    /// that is taken).
    #[arg(short = 'u', long)]
    pub(crate) model_uid: Option<String>,
    /// Model size in billions of parameters, as the registry spells it (0_135, 0_5, 7).
    #[arg(short = 's', long)]
    pub(crate) size_in_billions: Option<String>,
    /// Weights format: pytorch (safetensors) or ggufv2.
    #[arg(short = 'f', long)]
    pub(crate) model_format: Option<String>,
    /// Quantization of the weights (none, Q4_1, ...).
    #[arg(short = 'q', long)]
    pub(crate) quantization: Option<String>,
    /// Number of replicas (default 1, or the number of --replica-config entries).
    #[arg(short = 'r', long)]
    pub(crate) replica: Option<u32>,
    /// GPUs per replica: a count, or `auto` (legacy placement; not with --replica-config).
    #[arg(long)]
    pub(crate) n_gpu: Option<String>,
    /// GPU indexes for the replicas, comma-separated (legacy placement).
    #[arg(long, value_delimiter = ',')]
    pub(crate) gpu_idx: Vec<u32>,
    /// Worker for every replica, as `ip:port` from `GET /v1/workers` (legacy placement).
    #[arg(long)]
    pub(crate) worker_ip: Option<String>,
    /// Workers per replica; only 1 is supported (sharded launches are refused).
    #[arg(long)]
    pub(crate) n_worker: Option<u32>,
    /// A Hugging Face folder or GGUF file to load instead of the registry's source.
    #[arg(long)]
    pub(crate) model_path: Option<String>,
    /// Per-replica worker and GPU placement as a non-empty JSON array, one object per replica:
    /// {"replica_uid", "role" (hybrid, or prefill/decode), "model_engine", "engine_config",
    /// "devices": [{"worker_ip", "n_gpu", "gpu_idx"}]}. Not with --worker-ip, --gpu-idx,
    /// --n-gpu or --n-worker.
    #[arg(long = "replica-config", visible_alias = "replica_config", value_name = "JSON")]
    pub(crate) replica_config: Option<String>,
    /// An engine option for every replica, KEY=VALUE (repeatable; VALUE is read as JSON when it
    /// parses, else as a string), for example --engine-option kv_cache_tokens=16384.
    #[arg(long = "engine-option", value_name = "KEY=VALUE")]
    pub(crate) engine_option: Vec<String>,
    /// Chat answers show a reasoning model's thinking apart, as `reasoning_content`
    /// (`--reasoning-content` alone means true).
    #[arg(long, visible_alias = "reasoning_content", num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub(crate) reasoning_content: Option<bool>,
    /// The chat template's `enable_thinking` for requests that leave it out.
    #[arg(long, visible_alias = "enable_thinking", value_name = "BOOL")]
    pub(crate) enable_thinking: Option<bool>,
    /// The most requests the model serves at once; one more is refused (429), not queued.
    #[arg(long, visible_alias = "request_limits", value_name = "N")]
    pub(crate) request_limits: Option<u32>,
}

/// `xinf launch`.
#[derive(Debug, Args)]
pub(crate) struct LaunchArgs {
    #[command(flatten)]
    pub(crate) source: LaunchSource,
    #[command(flatten)]
    pub(crate) endpoint: EndpointArgs,
    /// Return as soon as the launch is accepted, without waiting for the model to load.
    #[arg(long)]
    pub(crate) no_wait: bool,
}

/// Which server a client command talks to.
#[derive(Debug, Args)]
pub(crate) struct EndpointArgs {
    /// The server's REST endpoint.
    #[arg(short = 'e', long, env = "XINF_ENDPOINT", default_value = "http://127.0.0.1:9997")]
    pub(crate) endpoint: String,
    /// API key of the server (also `-ak`).
    #[arg(long, env = "XINF_API_KEY", hide_env_values = true)]
    pub(crate) api_key: Option<String>,
}

impl EndpointArgs {
    pub(crate) fn client(&self) -> Client {
        Client::new(&self.endpoint, self.api_key.clone())
    }
}

/// Parses and checks `--replica-config` as the reference CLI does.
fn replica_config(text: &str, source: &LaunchSource, cat: &Catalog) -> Result<Vec<ReplicaConfig>, String> {
    let value: Value = serde_json::from_str(text)
        .map_err(|e| cat.text("cli-replica-config-json", &[("detail", &e.to_string())]))?;
    let Value::Array(entries) = value else {
        return Err(cat.text("cli-replica-config-array", &[]));
    };
    if entries.is_empty() {
        return Err(cat.text("cli-replica-config-empty", &[]));
    }
    let mut out = Vec::with_capacity(entries.len());
    for (i, entry) in entries.into_iter().enumerate() {
        let parsed = serde_path_to_error::deserialize::<_, ReplicaConfig>(entry).map_err(|e| {
            let path = e.path().to_string();
            let field = if path == "." { format!("[{i}]") } else { format!("[{i}].{path}") };
            cat.text(
                "cli-replica-config-entry",
                &[("field", &field), ("detail", &e.into_inner().to_string())],
            )
        })?;
        out.push(parsed);
    }
    if let Some(r) = source.replica
        && r as usize != out.len()
    {
        let (r, n) = (r.to_string(), out.len().to_string());
        return Err(cat.text("cli-replica-config-count", &[("replica", &r), ("entries", &n)]));
    }
    let legacy = source.worker_ip.is_some()
        || !source.gpu_idx.is_empty()
        || source.n_gpu.is_some()
        || source.n_worker.is_some_and(|n| n != 1);
    if legacy {
        return Err(cat.text("cli-replica-config-legacy", &[]));
    }
    Ok(out)
}

/// vLLM's, SGLang's and Xinference's names of options that xinf names otherwise, with xinf's
/// name; `true` where the name is one for every engine, `false` where it is one only for the
/// native engine (vLLM and SGLang replicas take their own flags by their own names).
const OPTION_ALIASES: &[(&str, &str, bool)] = &[
    ("max_model_len", "context_length", true),
    ("mem_fraction_static", "gpu_memory_utilization", true),
    ("max_num_batched_tokens", "max_batch_tokens", false),
    ("chunked_prefill_size", "max_batch_tokens", false),
    ("max_running_requests", "max_num_seqs", false),
    ("kv_cache_dtype", "kv_dtype", false),
    ("page_size", "block_size", false),
];

/// xinf's name of engine option `key` where another engine's name is given; `native` tells
/// whether every replica runs the native engine.
fn option_alias(key: &str, native: bool) -> Option<&'static str> {
    OPTION_ALIASES.iter().find(|(from, _, all)| *from == key && (*all || native)).map(|(_, to, _)| *to)
}

/// Options given by another engine's name, as (the name given, xinf's name).
pub(crate) type Renamed = Vec<(String, &'static str)>;

/// The engine options of `KEY=VALUE` texts: VALUE is read as JSON when it parses, else as a
/// string; `-` in a key is read as `_` (`max-model-len` is `max_model_len`). Keys that other
/// engines name otherwise are renamed to xinf's names; each renaming is returned as (given,
/// xinf's), for a hint.
pub(crate) fn engine_options(
    options: &[String],
    native: bool,
    cat: &Catalog,
) -> Result<(Map<String, Value>, Renamed), String> {
    let mut out = Map::new();
    let mut renamed = Vec::new();
    for o in options {
        let Some((key, value)) = o.split_once('=') else {
            return Err(cat.text("cli-engine-option", &[("option", o)]));
        };
        let value = serde_json::from_str(value).unwrap_or_else(|_| Value::String(value.to_owned()));
        let key = key.trim().replace('-', "_");
        let key = match option_alias(&key, native) {
            Some(xinf) => {
                renamed.push((key, xinf));
                xinf.to_owned()
            }
            None => key,
        };
        // Two values for one key: the command line is ambiguous, so neither is picked.
        if out.contains_key(&key) {
            return Err(cat.text("cli-option-twice", &[("key", &key)]));
        }
        out.insert(key, value);
    }
    Ok((out, renamed))
}

/// Prints a hint for each option given by another engine's name.
pub(crate) fn alias_hints(renamed: &[(String, &'static str)], cat: &Catalog) {
    for (given, key) in renamed {
        eprintln!("{}", cat.text("cli-engine-option-alias", &[("given", given), ("key", key)]));
    }
}

/// The command line with each `--key value` (or `--key=value`, or a `--key` without a value,
/// read as `true`) that `xinf launch` does not know rewritten as `--engine-option key=value`, as
/// Xinference passes extra options to the engine (`xinf launch -n m --max_model_len 4096`).
/// Other commands' lines are returned as they are.
pub(crate) fn extra_engine_options(args: Vec<OsString>, cli: &clap::Command) -> Vec<OsString> {
    let Some(launch) = cli.find_subcommand("launch") else { return args };
    if args.get(1).and_then(|a| a.to_str()) != Some("launch") {
        return args;
    }
    let mut known: Vec<&str> = vec!["help", "version"];
    for arg in launch.get_arguments() {
        known.extend(arg.get_long());
        known.extend(arg.get_all_aliases().unwrap_or_default());
    }
    let is_value = |a: &str| !a.starts_with('-') || a.parse::<f64>().is_ok();
    let mut out = Vec::with_capacity(args.len());
    let mut rest = args.into_iter();
    while let Some(arg) = rest.next() {
        let Some(text) = arg.to_str() else {
            out.push(arg);
            continue;
        };
        if text == "--" {
            out.push(arg);
            out.extend(rest.by_ref());
            break;
        }
        let Some(flag) = text.strip_prefix("--") else {
            out.push(arg);
            continue;
        };
        let (name, inline) = match flag.split_once('=') {
            Some((n, v)) => (n, Some(v.to_owned())),
            None => (flag, None),
        };
        if known.contains(&name) {
            out.push(arg);
            continue;
        }
        let value = match inline {
            Some(v) => v,
            None => {
                let mut peek = rest.clone();
                match peek.next().and_then(|a| a.to_str().filter(|a| is_value(a)).map(str::to_owned)) {
                    Some(v) => {
                        rest = peek;
                        v
                    }
                    None => "true".to_owned(),
                }
            }
        };
        out.push("--engine-option".into());
        out.push(format!("{name}={value}").into());
    }
    out
}

impl LaunchSource {
    /// The launch keys of the flags that are neither placement nor engine options.
    fn launch_keys(&self) -> Map<String, Value> {
        let mut keys = Map::new();
        if let Some(on) = self.reasoning_content {
            keys.insert("reasoning_content".into(), Value::Bool(on));
        }
        if let Some(on) = self.enable_thinking {
            keys.insert("enable_thinking".into(), Value::Bool(on));
        }
        if let Some(n) = self.request_limits {
            keys.insert("request_limits".into(), Value::from(n));
        }
        keys
    }

    /// The launch request these flags describe, checked as far as a client can (the same
    /// rules and messages as the server's, without the cluster's state).
    pub(crate) fn request(&self, cat: &Catalog) -> Result<LaunchRequest, String> {
        let model_name = self.model_name.clone().ok_or_else(|| cat.text("cli-model-name-required", &[]))?;
        let replica_config = match &self.replica_config {
            Some(text) => Some(replica_config(text, self, cat)?),
            None => None,
        };
        let n_gpu = match self.n_gpu.as_deref() {
            None => None,
            Some(v) if v.eq_ignore_ascii_case("auto") => Some(GpuCount::Auto),
            Some(v) => Some(GpuCount::Count(v.parse().map_err(|_| cat.text("cli-n-gpu", &[("value", v)]))?)),
        };
        let native = |engine: Option<&str>| engine.is_none_or(|e| e.eq_ignore_ascii_case("native"));
        let all_native = native(self.model_engine.as_deref())
            && replica_config.iter().flatten().all(|r| native(r.model_engine.as_deref()));
        let (mut options, renamed) = engine_options(&self.engine_option, all_native, cat)?;
        alias_hints(&renamed, cat);
        // Launch keywords given as options (`--max_local_prefill_tokens 256`) are the launch's,
        // not the engine's.
        let mut extra = self.launch_keys();
        for key in xinf_actors::LAUNCH_KEYWORDS {
            if let Some(value) = options.remove(*key) {
                if extra.contains_key(*key) {
                    return Err(cat.text("cli-option-twice", &[("key", key)]));
                }
                extra.insert((*key).to_owned(), value);
            }
        }
        let request = LaunchRequest {
            model_uid: self.model_uid.clone(),
            model_name,
            model_engine: self.model_engine.clone(),
            model_size_in_billions: self.size_in_billions.clone().map(ModelSize),
            model_format: self.model_format.clone(),
            quantization: self.quantization.clone(),
            replica: self.replica,
            n_gpu,
            n_worker: self.n_worker,
            gpu_idx: (!self.gpu_idx.is_empty()).then(|| GpuIdx(self.gpu_idx.clone())),
            worker_ip: self.worker_ip.clone(),
            model_path: self.model_path.clone(),
            replica_config,
            engine_config: (!options.is_empty()).then_some(options),
            extra,
            ..LaunchRequest::default()
        };
        request.check(&crate::engines()).map_err(|e| e.to_string())?;
        Ok(request)
    }
}

/// The progress line of a model that is loading, from `GET /v1/models`.
fn progress(client: &Client, uid: Option<&str>, name: &str, cat: &Catalog) -> Option<String> {
    let models = client.models().ok()?;
    let model = models.iter().find(|m| match uid {
        Some(uid) => m.uid == uid,
        None => m.model_name == name && m.status == ModelStatus::Launching,
    })?;
    let replicas = &model.replica_details;
    let alive = replicas.iter().filter(|r| r.status == ReplicaStatus::Alive).count();
    let args = [
        ("uid", model.uid.as_str()),
        ("status", &model_status_text(model.status, cat)),
        ("alive", &alive.to_string()),
        ("total", &replicas.len().to_string()),
    ];
    Some(cat.text("cli-launch-progress", &args))
}

/// The answer of `POST /v1/models`.
#[derive(Deserialize)]
struct Launched {
    model_uid: String,
}

/// `xinf launch`: sends the request and shows progress until the model serves. Prints the
/// model's uid on stdout.
pub(crate) fn launch(args: LaunchArgs, cat: &Catalog) -> Result<(), String> {
    let request = args.source.request(cat)?;
    let client = args.endpoint.client();
    let body = serde_json::to_value(&request).map_err(|e| e.to_string())?;
    let name = request.model_name.clone();
    let path = if args.no_wait { "/v1/models?wait_ready=false" } else { "/v1/models" };
    let (tx, rx) = std::sync::mpsc::channel();
    let poster = client.clone();
    std::thread::spawn(move || {
        let _ = tx.send(poster.post(path, &body));
    });
    let bar = ProgressBar::new_spinner();
    bar.set_style(
        ProgressStyle::with_template("{spinner} {msg} [{elapsed}]")
            .unwrap_or(ProgressStyle::default_spinner()),
    );
    bar.set_message(cat.text("cli-launching", &[("name", &name)]));
    let started = Instant::now();
    let result = loop {
        match rx.recv_timeout(Duration::from_millis(500)) {
            Ok(result) => break result,
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                break Err(ClientError::NoAnswer { endpoint: client.endpoint().to_owned() });
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                bar.tick();
                if let Some(line) = progress(&client, request.model_uid.as_deref(), &name, cat) {
                    bar.set_message(line);
                }
            }
        }
    };
    bar.finish_and_clear();
    let answer = result.map_err(|e| e.text(cat))?;
    let uid = Launched::deserialize(&answer).map(|a| a.model_uid).unwrap_or_default();
    if args.no_wait {
        eprintln!("{}", cat.text("cli-launch-accepted", &[("uid", &uid)]));
    } else {
        let secs = format!("{:.1}", started.elapsed().as_secs_f64());
        eprintln!("{}", cat.text("cli-launch-done", &[("uid", &uid), ("secs", &secs)]));
        let models = client.models().unwrap_or_default();
        if let Some(tokens) = models.iter().find(|m| m.uid == uid).and_then(|m| m.context_length) {
            eprintln!("{}", cat.text("cli-model-context", &[("tokens", &tokens.to_string())]));
        }
    }
    println!("{uid}");
    Ok(())
}

#[cfg(test)]
mod tests;
