//! vLLM and SGLang behind the cluster's engine seam: launch options checked against the
//! engine's flag table, models checked to be what xinf serves (FP16/BF16 dense Llama, Qwen2,
//! Qwen3 from a Hugging Face folder), and a replica loaded by starting the engine's server.

use crate::Flavor;
use crate::engine::{Parts, ServerEngine};
use crate::process::{ServerProcess, Spawn};
use serde_json::{Map, Value};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use xinf_engine::{
    ComputeDevice, Engine, EngineConfig, EngineError, EngineLoader, KvDtype, KvRole, ModelContract,
    ModelSource, ServerConfig,
};
use xinf_models::{ModelConfig, ModelRequest, TextTokenizer, WeightsFormat};
use xinf_transfer::LayoutDescriptor;

/// How long a server may take to become healthy unless `launch_timeout_s` says otherwise:
/// vLLM compiles and captures CUDA graphs, SGLang captures its own, each for a minute or more.
const DEFAULT_LAUNCH_TIMEOUT: Duration = Duration::from_secs(900);

/// The [`EngineLoader`] of one engine server kind.
#[derive(Debug, Clone, Copy)]
pub struct ServerLoader {
    flavor: Flavor,
}

impl ServerLoader {
    /// The loader of `flavor`.
    pub fn new(flavor: Flavor) -> Self {
        Self { flavor }
    }
}

fn field(key: &str) -> String {
    format!("engine_config.{key}")
}

/// Reads xinf's own keys of a server engine's `engine_config`.
fn read_own_key(config: &mut ServerConfig, key: &str, value: &Value) -> Result<(), EngineError> {
    let bad = |what: &str| Err(EngineError::invalid(field(key), format!("must be {what}")));
    let whole = |min: u64| value.as_u64().filter(|n| *n >= min);
    match key {
        "python" => match value.as_str().map(str::trim).filter(|s| !s.is_empty()) {
            Some(p) => config.python = Some(p.to_owned()),
            None => return bad("the path or name of a Python interpreter"),
        },
        "env" => {
            let Some(map) = value.as_object() else { return bad("an object of environment variables") };
            for (k, v) in map {
                let Some(v) = v.as_str() else {
                    return Err(EngineError::invalid(field(&format!("env.{k}")), "must be a string"));
                };
                if k.is_empty() || k.contains('=') || k.contains('\0') || v.contains('\0') {
                    return Err(EngineError::invalid(field(&format!("env.{k}")), "is not a valid variable"));
                }
                if k == "CUDA_VISIBLE_DEVICES" {
                    return Err(EngineError::invalid(
                        field("env.CUDA_VISIBLE_DEVICES"),
                        "xinf sets it from the replica's placement (gpu_idx)",
                    ));
                }
                config.env.push((k.clone(), v.to_owned()));
            }
        }
        "launch_timeout_s" => match whole(1) {
            Some(n) => config.launch_timeout_s = Some(n),
            None => return bad("a whole number of seconds ≥ 1"),
        },
        "health_timeout_s" => match whole(0) {
            Some(n) => config.health_timeout_s = Some(n),
            None => return bad("a whole number of seconds (0 turns the health watch off)"),
        },
        "context_length" => match whole(2) {
            Some(n) => config.context_length = Some(n as usize),
            None => return bad("an integer ≥ 2"),
        },
        "gpu_memory_utilization" => match value.as_f64().filter(|f| *f > 0.0 && *f <= 1.0) {
            Some(f) => config.gpu_memory_utilization = Some(f),
            None => return bad("a number in (0, 1]"),
        },
        "device" => match value.as_str().map(str::parse::<ComputeDevice>) {
            Some(Ok(ComputeDevice::Cuda(n))) => config.device = Some(ComputeDevice::Cuda(n)),
            Some(Ok(ComputeDevice::Cpu)) => {
                return bad("a GPU (cuda or cuda:N): the engine computes on GPUs");
            }
            Some(Err(e)) => return Err(EngineError::invalid(field(key), e)),
            None => return bad("a string (cuda or cuda:N)"),
        },
        _ => return Err(EngineError::Internal(format!("{key} is not one of xinf's keys"))),
    }
    Ok(())
}

/// The KV element type the server will use: its `dtype` flag, else the checkpoint's
/// (`config_json`, the folder's `config.json`).
fn kv_dtype(config_json: &Value, config: &ServerConfig) -> Result<KvDtype, EngineError> {
    let flag = config.flags.iter().find(|(k, _)| crate::flags::flag_name(k) == "dtype");
    let from_flag = match flag {
        Some((_, xinf_engine::FlagValue::Text(t))) if t != "auto" => Some((t.clone(), "engine_config.dtype")),
        _ => None,
    };
    let from_checkpoint = || {
        let v = config_json;
        let name = v.get("torch_dtype").or_else(|| v.get("dtype")).and_then(Value::as_str)?;
        Some((name.to_owned(), "torch_dtype of config.json"))
    };
    let (name, source) = from_flag.or_else(from_checkpoint).unwrap_or(("bfloat16".into(), "the default"));
    match name.as_str() {
        "float16" | "half" | "fp16" => Ok(KvDtype::F16),
        "bfloat16" | "bf16" => Ok(KvDtype::Bf16),
        other => Err(EngineError::Model(format!(
            "{source} is {other}: replicas of external engines serve FP16 and BF16 models (their KV moves \
             between engines as 16-bit pages)"
        ))),
    }
}

/// What a model's folder holds, read once: its config (refusing what xinf does not serve), its
/// tokenizer, and the contract peers compare.
fn read_model(dir: &Path, config: &ServerConfig) -> Result<(TextTokenizer, ModelContract), EngineError> {
    let model = EngineError::from;
    let cfg_path = dir.join("config.json");
    let text =
        std::fs::read_to_string(&cfg_path).map_err(|e| model(xinf_models::ModelError::io(&cfg_path, e)))?;
    let cfg = ModelConfig::from_hf_json(&text, &cfg_path.display().to_string()).map_err(model)?;
    let dtype = kv_dtype(&serde_json::from_str(&text).unwrap_or(Value::Null), config)?;
    let tokenizer = TextTokenizer::from_hf_dir(dir, &cfg.eos_token_ids).map_err(model)?;
    let files = xinf_models::safetensors_files(dir).map_err(model)?;
    let weights_digest = xinf_models::weights_digest(&files).map_err(model)?;
    let context_length =
        config.context_length.map_or(cfg.max_position_embeddings, |c| c.min(cfg.max_position_embeddings));
    let contract = cfg.contract(&tokenizer, dtype, context_length, weights_digest);
    Ok((tokenizer, contract))
}

impl ServerLoader {
    /// The layout of the server's KV cache, as xinf's layout set names it. The block count is the
    /// server's own; xinf learns it only through the KV connector.
    fn layout(&self, c: &ModelContract) -> Result<LayoutDescriptor, EngineError> {
        let layout = xinf_engine::config::server_layout(self.flavor.name())
            .ok_or_else(|| EngineError::Internal(format!("no KV layout known for {}", self.flavor)))?;
        layout
            .describe(c.num_layers, c.kv_heads, c.head_dim, 1)
            .map_err(|e| EngineError::Internal(e.to_string()))
    }

    /// The folder of the weights: a Hugging Face folder, never a GGUF file.
    fn model_dir(&self, model: &ModelSource) -> Result<std::path::PathBuf, EngineError> {
        let request = ModelRequest {
            model_name: model.model_name.clone(),
            size_in_billions: model.size_in_billions.clone(),
            model_format: Some(model.model_format.clone().unwrap_or_else(|| "pytorch".into())),
            quantization: model.quantization.clone(),
            model_path: model.model_path.as_ref().map(Into::into),
        };
        let resolved = xinf_models::resolve(&request).map_err(EngineError::from)?;
        if resolved.format != WeightsFormat::Safetensors {
            return Err(self.gguf_refused());
        }
        Ok(resolved.path)
    }

    fn gguf_refused(&self) -> EngineError {
        EngineError::invalid(
            "model_format",
            format!(
                "{} replicas load Hugging Face folders (config.json and FP16/BF16 safetensors); GGUF \
                 files are quantized",
                self.flavor
            ),
        )
    }
}

impl EngineLoader for ServerLoader {
    fn name(&self) -> &str {
        self.flavor.name()
    }

    fn serves_pd(&self) -> bool {
        // Through xinf's KV connector (python/xinf_kv): vLLM's KV connector, SGLang's transfer
        // backend.
        true
    }

    fn needs_gpu(&self) -> bool {
        true
    }

    fn decode_computes_prompts(&self) -> bool {
        // A vLLM decode server (`kv_consumer`) computes a request that names no room like an
        // ordinary one; SGLang's decode mode waits for a prefill server's KV for every request.
        self.flavor != Flavor::Sglang
    }

    fn check_model(&self, model: &ModelSource) -> Result<(), EngineError> {
        let gguf = |s: &str| {
            let s = s.trim().to_ascii_lowercase();
            s == "gguf" || s == "ggufv2"
        };
        if model.model_format.as_deref().is_some_and(gguf)
            || model.model_path.as_deref().is_some_and(|p| p.trim().to_ascii_lowercase().ends_with(".gguf"))
        {
            return Err(self.gguf_refused());
        }
        if let Some(q) =
            model.quantization.as_deref().map(str::trim).filter(|q| !q.is_empty() && *q != "none")
        {
            return Err(EngineError::invalid(
                "quantization",
                format!("{q}: {} replicas serve unquantized FP16/BF16 models", self.flavor),
            ));
        }
        if model.model_path.as_deref().is_some_and(|p| !p.trim().is_empty()) {
            return Ok(());
        }
        match xinf_models::find_family(&model.model_name) {
            Some(f) if f.specs.iter().any(|s| s.format == "pytorch") => Ok(()),
            Some(f) => Err(EngineError::invalid(
                "model_name",
                format!(
                    "{} has no Hugging Face (pytorch) weights in the registry, and {} replicas load those; \
                     give model_path",
                    f.name, self.flavor
                ),
            )),
            None => Err(EngineError::UnknownModel {
                name: model.model_name.clone(),
                known: xinf_models::families().iter().map(|f| f.name.to_owned()).collect(),
            }),
        }
    }

    fn check_config(&self, map: &Map<String, Value>) -> Result<EngineConfig, EngineError> {
        let mut config = ServerConfig::default();
        for (key, value) in map {
            if ServerConfig::KEYS.contains(&key.as_str()) {
                if !value.is_null() {
                    read_own_key(&mut config, key, value)?;
                }
                continue;
            }
            let flag = crate::flags::flag_name(key);
            if let Some(why) = self.flavor.reserved(&flag) {
                return Err(EngineError::invalid(field(key), format!("--{flag} may not be set: {why}")));
            }
            if let Some(v) = self.flavor.table().read(key, value)? {
                config.flags.push((key.clone(), v));
            }
        }
        Ok(EngineConfig::Server(config))
    }

    fn load(&self, model: &ModelSource, config: &EngineConfig) -> Result<Arc<dyn Engine>, EngineError> {
        Ok(Arc::new(self.load_server(model, config)?))
    }
}

impl ServerLoader {
    /// [`EngineLoader::load`], as the concrete engine (its log and address are there).
    pub fn load_server(
        &self,
        model: &ModelSource,
        config: &EngineConfig,
    ) -> Result<ServerEngine, EngineError> {
        let EngineConfig::Server(config) = config else {
            return Err(EngineError::Internal(format!(
                "the {} engine was given another engine's options",
                self.flavor
            )));
        };
        let gpu = match config.device {
            Some(ComputeDevice::Cuda(n)) => n,
            _ => {
                return Err(EngineError::Model(format!(
                    "{} computes on a GPU, and this replica was placed on none (give it gpu_idx, or run it on \
                     a worker with a free GPU)",
                    self.flavor.display()
                )));
            }
        };
        let dir = self.model_dir(model)?;
        let (tokenizer, contract) = read_model(&dir, config)?;
        let layout = self.layout(&contract)?;
        let port = free_port()?;
        let dir_text = dir.display().to_string();
        let served_name = format!("{}-{port}", sanitize(&model.model_name));
        let mut args = crate::flavor::ServerArgs {
            model_dir: &dir_text,
            served_name: &served_name,
            port,
            // Set once this server may start on its GPU (below), from the memory free then.
            memory_share: None,
            context_length: config.context_length,
            kv_role: config.kv_role,
            page_ip: config.page_ip,
            user_args: self.flavor.table().args(&config.flags),
        };
        let mut env = vec![
            // The host's name of the GPU: the server does not see this process's numbering.
            ("CUDA_VISIBLE_DEVICES".to_owned(), xinf_engine::host_gpu(gpu)?),
            // The machines xinf runs on are often offline; neither engine needs to phone home.
            ("VLLM_NO_USAGE_STATS".to_owned(), "1".to_owned()),
            ("DO_NOT_TRACK".to_owned(), "1".to_owned()),
        ];
        if self.flavor == Flavor::Sglang {
            // Log-probabilities before temperature, as vLLM and the native engine report them
            // (SGLang's own default is after it).
            env.push(("SGLANG_RETURN_ORIGINAL_LOGPROB".to_owned(), "1".to_owned()));
        }
        if config.kv_role.is_some() {
            // The page plane's key of this process: the server's connector serves and fetches
            // pages with xinf and its other engine servers, and with no one else.
            env.push(("XINF_KV_KEY".to_owned(), xinf_transfer::transport::process_key_hex()));
        }
        // An SGLang prefill server's transfer backend says here where its page server is.
        let endpoint_file = (self.flavor == Flavor::Sglang && config.kv_role == Some(KvRole::Producer))
            .then(|| xinf_models::xinf_home().join("run").join(format!("{served_name}.kv-endpoint.json")));
        if let Some(path) = &endpoint_file {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)
                    .map_err(|e| EngineError::Process(format!("creating {}: {e}", dir.display())))?;
            }
            // A file of an earlier server of the same port must not be read for this one.
            let _ = std::fs::remove_file(path);
            env.push(("XINF_KV_ENDPOINT_FILE".to_owned(), path.display().to_string()));
            if let Some(ip) = config.page_ip {
                env.push(("XINF_KV_HOST".to_owned(), ip.to_string()));
            }
        }
        env.extend(config.env.iter().cloned());
        let program = config
            .python
            .clone()
            .or_else(|| std::env::var("XINF_PYTHON").ok().filter(|p| !p.trim().is_empty()))
            .unwrap_or_else(|| "python3".to_owned());
        crate::version::check(self.flavor, &program, &env, config.kv_role.is_some())?;
        let log = xinf_models::xinf_home().join("logs").join(format!("{}-{served_name}.log", self.flavor));
        let what = format!("the {} server of {} (port {port})", self.flavor.display(), model.model_name);
        let base_url = format!("http://127.0.0.1:{port}");
        let timeout = config.launch_timeout_s.map_or(DEFAULT_LAUNCH_TIMEOUT, Duration::from_secs);
        let process = {
            // One engine starts at a time on a GPU: both engines size their KV cache from the
            // memory free while they start, and two starting together each count the other's
            // allocations against themselves (SGLang then refuses to start, vLLM runs out).
            let _starting = xinf_engine::gpu_start_gate(gpu, timeout)?;
            args.memory_share = match config.gpu_memory_utilization {
                Some(share) => Some(crate::memory::engine_fraction(
                    self.flavor,
                    share,
                    gpu,
                    (self.flavor == Flavor::Sglang).then(|| crate::memory::probe(gpu)).flatten(),
                )?),
                None => None,
            };
            let process = ServerProcess::spawn(Spawn {
                program,
                args: self.flavor.command_args(&args),
                env,
                log,
                what,
            })?;
            if let Err(e) = process.wait_healthy(&format!("{base_url}/health"), timeout) {
                process.stop(Duration::from_secs(10));
                return Err(e);
            }
            process
        };
        tracing::info!(engine = %self.flavor, %base_url, log = %process.log().display(), "engine server ready");
        let connector = config.kv_role.is_some();
        let page_host = match endpoint_file.as_deref().map(crate::handoff::PageHost::read).transpose() {
            Ok(host) => host,
            Err(e) => {
                process.stop(Duration::from_secs(10));
                return Err(e);
            }
        };
        let parts = Parts {
            flavor: self.flavor,
            process,
            health_timeout: config
                .health_timeout_s
                .map_or(crate::health::DEFAULT_TIMEOUT, Duration::from_secs),
            base_url,
            served_name,
            tokenizer,
            contract,
            layout,
            connector,
            page_host,
        };
        ServerEngine::new(parts)
    }
}

/// A port on loopback that was free a moment ago.
fn free_port() -> Result<u16, EngineError> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")
        .map_err(|e| EngineError::Process(format!("no free port on 127.0.0.1: {e}")))?;
    listener.local_addr().map(|a| a.port()).map_err(|e| EngineError::Process(format!("no free port: {e}")))
}

/// A model name as part of a file name.
fn sanitize(name: &str) -> String {
    let s: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '.' { c } else { '_' })
        .collect();
    if s.is_empty() { "model".into() } else { s.chars().take(64).collect() }
}
