//! The two engines xinf runs as servers, and what differs between them: the command that
//! starts the OpenAI server, the flags xinf sets itself (and so refuses in `engine_config`), and
//! the flag table user flags are checked against.

use crate::flags::FlagTable;
use std::sync::OnceLock;
use xinf_engine::KvRole;

/// An engine xinf runs as its own server process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Flavor {
    /// vLLM 0.26 (`vllm.entrypoints.openai.api_server`).
    Vllm,
    /// SGLang 0.5.15 (`sglang.launch_server`).
    Sglang,
}

/// What the command line of one engine server is built from.
#[derive(Debug, Clone)]
pub(crate) struct ServerArgs<'a> {
    /// The Hugging Face folder of the weights.
    pub(crate) model_dir: &'a str,
    /// The name requests use for the model (the replica's uid).
    pub(crate) served_name: &'a str,
    /// The loopback port the server listens on.
    pub(crate) port: u16,
    /// The replica's share of its GPU's memory, as the engine's memory flag reads it
    /// ([`crate::memory`]).
    pub(crate) memory_share: Option<f64>,
    /// The context length cap.
    pub(crate) context_length: Option<usize>,
    /// The replica's side of handoffs: the server then runs with xinf's KV connector.
    pub(crate) kv_role: Option<KvRole>,
    /// Where the connector's page server listens (loopback when not given).
    pub(crate) page_ip: Option<std::net::IpAddr>,
    /// The user's own flags, as arguments already.
    pub(crate) user_args: Vec<String>,
}

impl Flavor {
    /// Both flavors.
    pub const ALL: [Flavor; 2] = [Flavor::Vllm, Flavor::Sglang];

    /// The `model_engine` name (`vllm`, `sglang`; launches may spell it `vLLM`, `SGLang`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Vllm => "vllm",
            Self::Sglang => "sglang",
        }
    }

    /// The release xinf's flag table and KV connector are made for (`0.26.0`).
    pub(crate) fn release(self) -> &'static str {
        match self {
            Self::Vllm => "0.26.0",
            Self::Sglang => "0.5.15",
        }
    }

    /// The engine and the version its flag table was made from, for messages.
    pub(crate) fn display(self) -> &'static str {
        match self {
            Self::Vllm => "vLLM 0.26.0",
            Self::Sglang => "SGLang 0.5.15",
        }
    }

    /// The engine's flags.
    pub(crate) fn table(self) -> &'static FlagTable {
        static VLLM: OnceLock<FlagTable> = OnceLock::new();
        static SGLANG: OnceLock<FlagTable> = OnceLock::new();
        match self {
            Self::Vllm => {
                VLLM.get_or_init(|| FlagTable::parse(self.display(), include_str!("flags/vllm-0.26.0.txt")))
            }
            Self::Sglang => SGLANG
                .get_or_init(|| FlagTable::parse(self.display(), include_str!("flags/sglang-0.5.15.txt"))),
        }
    }

    /// Why a flag may not be given in `engine_config`, if it may not: xinf sets it, or it asks
    /// for something xinf does not serve.
    pub(crate) fn reserved(self, flag: &str) -> Option<&'static str> {
        const SET: &str = "xinf sets it: it starts the server, on loopback, for this replica";
        const ONE_GPU: &str = "a replica runs on one GPU (tensor, pipeline and data parallel size 1)";
        const QUANT: &str =
            "quantized weights and KV caches are not served: KV moves between engines as FP16/BF16 pages";
        const LORA: &str = "LoRA adapters are not served";
        const PD: &str = "xinf sets it for prefill/decode replicas";
        const AUTH: &str =
            "the server listens on loopback for xinf only; xinf's own --api-key guards the API";
        let common = match flag {
            "host" | "port" | "served-model-name" => Some(SET),
            "quantization" | "kv-cache-dtype" => Some(QUANT),
            "enable-lora" | "max-loras" | "max-lora-rank" => Some(LORA),
            "api-key" | "ssl-keyfile" | "ssl-certfile" => Some(AUTH),
            _ => None,
        };
        common.or(match self {
            Self::Vllm => match flag {
                "model" | "tokenizer" | "uds" | "headless" | "api-server-count" => Some(SET),
                "tensor-parallel-size"
                | "tp"
                | "pipeline-parallel-size"
                | "pp"
                | "data-parallel-size"
                | "dp" => Some(ONE_GPU),
                "quantization-config" => Some(QUANT),
                "lora-modules" => Some(LORA),
                "kv-transfer-config" => Some(PD),
                "max-model-len" => Some("use engine_config.context_length"),
                "gpu-memory-utilization" => Some("use engine_config.gpu_memory_utilization"),
                _ => None,
            },
            Self::Sglang => match flag {
                "model-path"
                | "model"
                | "tokenizer-path"
                | "skip-tokenizer-init"
                | "incremental-streaming-output" => Some(SET),
                "tp-size"
                | "tensor-parallel-size"
                | "tp"
                | "pp-size"
                | "pipeline-parallel-size"
                | "dp-size"
                | "data-parallel-size"
                | "dp"
                | "ep-size" => Some(ONE_GPU),
                "lora-paths" => Some(LORA),
                f if f.starts_with("disaggregation-") => Some(PD),
                "page-size" => Some("xinf's transfer backend moves SGLang's KV with page size 1"),
                "context-length" => Some("use engine_config.context_length"),
                "mem-fraction-static" => Some("use engine_config.gpu_memory_utilization"),
                _ => None,
            },
        })
    }

    /// The Python module that runs the server.
    fn module(self) -> &'static str {
        match self {
            Self::Vllm => "vllm.entrypoints.openai.api_server",
            Self::Sglang => "sglang.launch_server",
        }
    }

    /// The interpreter arguments that start the server: xinf's flags, then the user's.
    pub(crate) fn command_args(self, a: &ServerArgs<'_>) -> Vec<String> {
        let mut out: Vec<String> = vec!["-m".into(), self.module().into()];
        let mut push = |flag: &str, value: String| {
            out.push(format!("--{flag}"));
            out.push(value);
        };
        let model_flag = match self {
            Self::Vllm => "model",
            Self::Sglang => "model-path",
        };
        push(model_flag, a.model_dir.to_owned());
        push("host", "127.0.0.1".into());
        push("port", a.port.to_string());
        push("served-model-name", a.served_name.to_owned());
        if let Some(share) = a.memory_share {
            let flag = match self {
                Self::Vllm => "gpu-memory-utilization",
                Self::Sglang => "mem-fraction-static",
            };
            push(flag, format!("{share}"));
        }
        if let Some(n) = a.context_length {
            let flag = match self {
                Self::Vllm => "max-model-len",
                Self::Sglang => "context-length",
            };
            push(flag, n.to_string());
        }
        match (self, a.kv_role) {
            (Self::Vllm, Some(role)) => push("kv-transfer-config", vllm_connector_config(role, a.page_ip)),
            (Self::Sglang, Some(role)) => {
                // xinf's transfer backend (xinf_kv's SGLang plugin; page size 1 is SGLang's own
                // default on CUDA, set here so no other default can change it).
                let mode = match role {
                    KvRole::Producer => "prefill",
                    KvRole::Consumer => "decode",
                };
                push("disaggregation-mode", mode.into());
                push("disaggregation-transfer-backend", "xinf".into());
                push("page-size", "1".into());
                if role == KvRole::Producer {
                    // SGLang's prefill mode turns its prefill CUDA graph off, which an ordinary
                    // server keeps on: a 733-token prompt's prefill leg took 35.7 ms (median) on
                    // an H200 against 14.1 ms with the graph. The backend is the ordinary CUDA
                    // server's own, `breakable`: with it C1 TTFT p50 was 0.71× that with
                    // `tc_piecewise` (five paired runs, H100). A user's own setting comes later
                    // and wins.
                    push("cuda-graph-backend-prefill", "breakable".into());
                }
            }
            (_, None) => {}
        }
        if self == Self::Sglang {
            // Streamed chunks carry only the new tokens (the default repeats all of them).
            out.push("--incremental-streaming-output".into());
        }
        // xinf asks the server's `/health` every few seconds (`health.rs`); an access-log line
        // for each would fill the log whose last lines tell why a server failed. A user's own
        // setting comes later and wins.
        match self {
            Self::Vllm => out.extend(["--disable-access-log-for-endpoints".into(), "/health".into()]),
            Self::Sglang => out.extend(["--uvicorn-access-log-exclude-prefixes".into(), "/health".into()]),
        }
        out.extend(a.user_args.iter().cloned());
        out
    }
}

/// vLLM's `--kv-transfer-config` for xinf's KV connector on one side of handoffs. A decode
/// whose load fails computes the prompt instead of failing the request.
fn vllm_connector_config(role: KvRole, page_ip: Option<std::net::IpAddr>) -> String {
    let role = match role {
        KvRole::Producer => "kv_producer",
        KvRole::Consumer => "kv_consumer",
    };
    let ip = page_ip.map_or_else(|| "127.0.0.1".to_owned(), |ip| ip.to_string());
    serde_json::json!({
        "kv_connector": "XinfConnector",
        "kv_connector_module_path": "xinf_kv.vllm_connector",
        "kv_role": role,
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": { "page_ip": ip },
    })
    .to_string()
}

impl std::fmt::Display for Flavor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests;
