use super::*;

fn args(kv_role: Option<KvRole>) -> ServerArgs<'static> {
    ServerArgs {
        model_dir: "/m",
        served_name: "m-1",
        port: 4000,
        memory_share: Some(0.25),
        context_length: Some(2048),
        kv_role,
        page_ip: Some([10, 0, 0, 5].into()),
        user_args: vec!["--enforce-eager".into()],
    }
}

#[test]
fn the_command_names_xinf_s_settings_then_the_user_s() {
    let a = Flavor::Vllm.command_args(&args(None));
    assert_eq!(
        a,
        [
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            "/m",
            "--host",
            "127.0.0.1",
            "--port",
            "4000",
            "--served-model-name",
            "m-1",
            "--gpu-memory-utilization",
            "0.25",
            "--max-model-len",
            "2048",
            "--disable-access-log-for-endpoints",
            "/health",
            "--enforce-eager",
        ]
    );
    let s = Flavor::Sglang.command_args(&args(None));
    assert!(s.windows(2).any(|w| w == ["--mem-fraction-static", "0.25"]), "{s:?}");
    assert!(s.windows(2).any(|w| w == ["--uvicorn-access-log-exclude-prefixes", "/health"]), "{s:?}");
    assert!(s.contains(&"--incremental-streaming-output".to_owned()), "{s:?}");
}

#[test]
fn a_p_d_replica_s_server_runs_with_xinf_s_connector() {
    for (role, name) in [(KvRole::Producer, "kv_producer"), (KvRole::Consumer, "kv_consumer")] {
        let a = Flavor::Vllm.command_args(&args(Some(role)));
        let i = a.iter().position(|x| x == "--kv-transfer-config").expect("the connector flag");
        let cfg: serde_json::Value = serde_json::from_str(&a[i + 1]).expect("JSON");
        assert_eq!(cfg["kv_connector"], "XinfConnector");
        assert_eq!(cfg["kv_connector_module_path"], "xinf_kv.vllm_connector");
        assert_eq!(cfg["kv_role"], name);
        assert_eq!(cfg["kv_load_failure_policy"], "recompute");
        assert_eq!(cfg["kv_connector_extra_config"]["page_ip"], "10.0.0.5");
        // The user's flags still come last, so none of xinf's can be overridden by position.
        assert_eq!(a.last().map(String::as_str), Some("--enforce-eager"));
    }
}

#[test]
fn a_p_d_sglang_server_runs_with_xinf_s_transfer_backend() {
    for (role, mode) in [(KvRole::Producer, "prefill"), (KvRole::Consumer, "decode")] {
        let a = Flavor::Sglang.command_args(&args(Some(role)));
        assert!(a.windows(2).any(|w| w == ["--disaggregation-mode", mode]), "{a:?}");
        assert!(a.windows(2).any(|w| w == ["--disaggregation-transfer-backend", "xinf"]), "{a:?}");
        assert!(a.windows(2).any(|w| w == ["--page-size", "1"]), "{a:?}");
        // A prefill server keeps the prefill CUDA graph SGLang's prefill mode turns off.
        let graph = a.windows(2).any(|w| w == ["--cuda-graph-backend-prefill", "breakable"]);
        assert_eq!(graph, role == KvRole::Producer, "{a:?}");
        assert_eq!(a.last().map(String::as_str), Some("--enforce-eager"));
    }
    let plain = Flavor::Sglang.command_args(&args(None));
    assert!(!plain.iter().any(|x| x.starts_with("--disaggregation")), "{plain:?}");
    assert!(Flavor::Sglang.reserved("page-size").is_some());
}
