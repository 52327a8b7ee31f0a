#!/usr/bin/env bash
# The anchor of the cross-engine table: vLLM's own P/D (NixlConnector, D reads from P) on one GPU,
# a prefill and a decode vLLM server with the same memory shares and flags as pd-engines.sh's
# replicas, and nixl_proxy.py playing vLLM's example proxy. Measured with the same `xinf bench`
# load as pd-engines.sh, so the two tables compare row for row.
#
# Needs vLLM 0.26 (VLLM_PYTHONPATH) and NIXL's Python package (NIXL_PYTHONPATH: `nixl` and
# `nixl-cu13` installed with `pip install --target`), and the model pd-engines.sh made.
# `vllm-nixl.sh launch` starts the three processes in the background, `vllm-nixl.sh bench`
# measures, `vllm-nixl.sh stop` ends them. UCX reads between two processes of one GPU only over
# cuda_ipc when get-zcopy is on (UCX turns it off without NVLink), as xinf's own NIXL route does.
set -u
R=$(cd "$(dirname "$0")/../../.." && pwd)
X=${XINF_BIN:-$R/target/release/xinf}
W=${WORK:-/tmp/pd-engines}
OUT=${OUT:-$W}
M=$W/model
PX=18300
mkdir -p "$W" "$OUT"

serve() {  # name port side-channel-port
    PYTHONPATH=${NIXL_PYTHONPATH:-}:${VLLM_PYTHONPATH:-} VLLM_NIXL_SIDE_CHANNEL_PORT=$3 \
        VLLM_USE_FLASHINFER_SAMPLER=0 UCX_CUDA_IPC_ENABLE_GET_ZCOPY=${UCX_CUDA_IPC_ENABLE_GET_ZCOPY:-y} \
        setsid python3 -m vllm.entrypoints.openai.api_server --model "$M" --host 127.0.0.1 --port "$2" \
        --served-model-name vllm-nixl --gpu-memory-utilization 0.08 --max-model-len 4096 \
        --no-enable-prefix-caching \
        --kv-transfer-config '{"kv_connector":"NixlConnector","kv_role":"kv_both"}' \
        > "$W/vllm-nixl-$1.log" 2>&1 < /dev/null &
    echo $! > "$W/vllm-nixl-$1.pid"
}

case ${1:-} in
launch)
    serve prefill 18301 5601
    serve decode 18302 5602
    setsid python3 "$R/doc/bench/gpu/nixl_proxy.py" $PX http://127.0.0.1:18301 http://127.0.0.1:18302 \
        > "$W/vllm-nixl-proxy.log" 2>&1 < /dev/null &
    echo $! > "$W/vllm-nixl-proxy.pid"
    ;;
wait)
    for _ in $(seq 600); do
        curl -sf http://127.0.0.1:18301/health > /dev/null && curl -sf http://127.0.0.1:18302/health > /dev/null && break
        sleep 1
    done
    curl -sf http://127.0.0.1:18302/health > /dev/null && echo ready || { tail -5 "$W"/vllm-nixl-*.log; exit 1; }
    ;;
bench)
    "$X" bench -e http://127.0.0.1:$PX -u vllm-nixl --concurrency 1,16 --requests "${REQ:-128}" \
        --prompt-tokens "${PROMPTS:-40,173,733,2833}" --output-tokens 32 --warmup 4 \
        --json "$OUT/bench-nixl.json" 2>&1 | grep -v "^\s*$" | tail -12
    grep -c "NIXL\|nixl" "$W/vllm-nixl-decode.log" | sed 's/^/decode log lines naming NIXL: /'
    ;;
stop)
    for p in "$W"/vllm-nixl-*.pid; do kill -- -"$(cat "$p")" 2>/dev/null; done
    true
    ;;
*)
    echo "usage: vllm-nixl.sh launch | wait | bench | stop" >&2
    exit 2
    ;;
esac
