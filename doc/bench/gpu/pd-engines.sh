#!/usr/bin/env bash
# P/D across engines on one GPU, as the reference measures it: ordinary vLLM, ordinary SGLang,
# vLLM → SGLang, SGLang → vLLM, native → vLLM and vLLM → native, under one `xinf bench` run
# (same prompts for every model: 40/173/733/2833 tokens, 32 output tokens, 128 requests per
# level, C1 and C16, prefix caching off), on a Qwen2.5-0.5B-shaped random FP16 model. Prints the
# table of the reference (C1 TTFT p50, C16 TTFT p95, C16 output tok/s) with the ratios to the
# ordinary replicas.
#
# Needs a `--features cuda` xinf (XINF_BIN), vLLM 0.26 and SGLang 0.5.15 with xinf_kv
# (VLLM_PYTHONPATH, SGLANG_PYTHONPATH; ../../engines.md says how). Two steps, each a few
# minutes: `pd-engines.sh launch` (xinf local in the background, the model, the six models) then
# `pd-engines.sh bench`; `pd-engines.sh stop` ends xinf. `pd-engines.sh alone` measures each
# model alone on the GPU instead (its own xinf, launched, benched, stopped; one table at the
# end), so that idle engine servers beside it do not take host time from the one measured.
# MODELS picks models (`no` is an ordinary native replica), CONC the concurrency levels
# (default 1,16), REQ the requests per level, MEM each replica's share of the GPU's memory
# (default 0.08), MODEL_ARGS the model's shape (`make_model.py`'s flags; default `--qwen05`,
# e.g. `--qwen05 --vocab 151936` or `--llama8b --device cuda`, with
# MODEL_NAME=llama-3.2-instruct); a folder already in WORK/model is used as it is. Per-leg
# timings: XINF_LOG=info,xinf_engine_external=debug (xinf's log) and XINF_KV_LOG=info (the
# connectors' load and publish times, in the engine servers' logs under ~/.xinf/logs).
# VLLM_EXTRA and SGLANG_EXTRA add keys to every vLLM or SGLang replica's engine_config, e.g.
# SGLANG_EXTRA='"enable_request_time_stats_logging":true' (SGLang's per-request stage times);
# VLLM_ENV and SGLANG_ENV add variables to their servers' environment, e.g.
# VLLM_ENV='"XINF_KV_SYNC_LOAD_MAX_LIVE":"-1"' (vLLM decode legs always load asynchronously).
# Prefix caching is off in every engine; PREFIX_CACHE=1 turns it on in all of them (vLLM's
# enable_prefix_caching, SGLang's radix cache, the native engine's enable_prefix_caching), and
# SHARED_PREFIX=N makes every prompt begin with the same N tokens (`xinf bench
# --shared-prefix-tokens`), a shared system prompt.
# MPS=1 runs xinf with --mps (the servers on the GPU under NVIDIA's Multi-Process Service).
# LOCAL_PREFILL=N launches the P/D models with `max_local_prefill_tokens: N` (prompts of at most N
# tokens computed by the decode replica, without a handoff).
# `pd-engines.sh add` launches MODELS into the running xinf, e.g. an `svb` (any suffix after the
# two engine letters) with another SGLANG_PYTHONPATH, to compare two connector builds in one run.
set -u
R=$(cd "$(dirname "$0")/../../.." && pwd)
X=${XINF_BIN:-$R/target/release/xinf}
W=${WORK:-/tmp/pd-engines}
OUT=${OUT:-$W}
P=18191
E=http://127.0.0.1:$P
M=$W/model
MODELS=${MODELS:-vo so vs sv nv vn}
MEM=${MEM:-0.08}
NAME=${MODEL_NAME:-qwen2.5-instruct}
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
mkdir -p "$W" "$OUT"

CACHE=$([ "${PREFIX_CACHE:-0}" = 1 ] && echo true || echo false)
NO_CACHE=$([ "$CACHE" = true ] && echo false || echo true)
vllm() {  # engine_config of a vLLM replica
    echo "{\"env\":{\"PYTHONPATH\":\"${VLLM_PYTHONPATH:-}\",\"XINF_KV_LOG\":\"${XINF_KV_LOG:-}\",\"VLLM_USE_FLASHINFER_SAMPLER\":\"0\"${VLLM_ENV:+,$VLLM_ENV}},\"gpu_memory_utilization\":$MEM,\"enable_prefix_caching\":$CACHE,\"context_length\":4096${VLLM_EXTRA:+,$VLLM_EXTRA}}"
}
sglang() {
    echo "{\"env\":{\"PYTHONPATH\":\"${SGLANG_PYTHONPATH:-}\",\"XINF_KV_LOG\":\"${XINF_KV_LOG:-}\"${SGLANG_ENV:+,$SGLANG_ENV}},\"gpu_memory_utilization\":$MEM,\"attention_backend\":\"triton\",\"sampling_backend\":\"pytorch\",\"disable_radix_cache\":$NO_CACHE,\"context_length\":4096${SGLANG_EXTRA:+,$SGLANG_EXTRA}}"
}
native() {  # NATIVE_CONFIG replaces it
    echo "${NATIVE_CONFIG:-{\"gpu_memory_utilization\":$MEM,\"enable_prefix_caching\":$CACHE,\"context_length\":4096\}}"
}
engine() { case $1 in v) echo vllm ;; s) echo sglang ;; n) echo native ;; esac; }

launch_one() {  # uid: vo/so/no ordinary, else prefill engine + decode engine
    local uid=$1 p=${1:0:1} d=${1:1:1} body
    if [ "$d" = o ]; then
        body="{\"model_uid\":\"$uid\",\"model_name\":\"$NAME\",\"model_path\":\"$M\",\"model_engine\":\"$(engine $p)\",\"gpu_idx\":[0],\"engine_config\":$($(engine $p))}"
    else
        body="{\"model_uid\":\"$uid\",\"model_name\":\"$NAME\",\"model_path\":\"$M\",\"model_engine\":\"$(engine $p)\",${LOCAL_PREFILL:+\"max_local_prefill_tokens\":$LOCAL_PREFILL,}\"replica_config\":[
          {\"role\":\"prefill\",\"model_engine\":\"$(engine $p)\",\"devices\":[{\"worker_ip\":\"127.0.0.1\",\"gpu_idx\":[0]}],\"engine_config\":$($(engine $p))},
          {\"role\":\"decode\",\"model_engine\":\"$(engine $d)\",\"devices\":[{\"worker_ip\":\"127.0.0.1\",\"gpu_idx\":[0]}],\"engine_config\":$($(engine $d))}]}"
    fi
    local t0=$SECONDS
    curl -s -m 1200 "$E/v1/models" -H 'Content-Type: application/json' -d "$body" | head -c 400
    echo " ($uid: $((SECONDS - t0)) s)"
}

start_xinf() {  # the model folder, then xinf local in the background
    [ -f "$M/config.json" ] || python3 "$R/tests/engines/make_model.py" "$M" ${MODEL_ARGS:---qwen05} | tail -1
    local mps=()
    [ "${MPS:-0}" = 1 ] && mps=(--mps)
    XINF_GPUS=0 XINF_LOG=${XINF_LOG:-warn} setsid "$X" local --port $P "${mps[@]}" > "$W/xinf.log" 2>&1 < /dev/null &
    echo $! > "$W/xinf.pid"
    for _ in $(seq 60); do curl -sf "$E/v1/models" > /dev/null && break; sleep 1; done
}

bench_models() {  # bench_models JSON UID...: one `xinf bench` run over the models
    local json=$1 args=()
    shift
    for uid in "$@"; do args+=(-u "$uid"); done
    "$X" bench -e "$E" "${args[@]}" --concurrency "${CONC:-1,16}" --requests "${REQ:-128}" --prompt-tokens "${PROMPTS:-40,173,733,2833}" \
        --output-tokens 32 --warmup 4 ${SHARED_PREFIX:+--shared-prefix-tokens "$SHARED_PREFIX"} --json "$json" 2>&1 | grep -v "^\s*$" | tail -20
}

stop_xinf() {  # ends xinf (it stops its engine servers) and waits for the GPU's memory
    local pid
    pid=$(cat "$W/xinf.pid")
    kill "$pid" 2>/dev/null
    # Its exit, so that an MPS daemon it started is gone before the next xinf looks for one.
    for _ in $(seq 120); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    for _ in $(seq 120); do
        command -v nvidia-smi > /dev/null || break
        [ "$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1)" -lt 2000 ] && break
        sleep 1
    done
    cp -r /root/.xinf/logs "$OUT/" 2>/dev/null
    true
}

table() {  # the reference's table from $OUT/bench.json
    python3 - "$OUT/bench.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))["results"]
def get(model, c, *path):
    for x in r:
        if x.get("model_uid") == model and x.get("concurrency") == c:
            for p in path:
                x = (x or {}).get(p)
            return x
    return None
rows = []
for m in [x["model_uid"] for x in r if x.get("concurrency") == 1]:
    ttft1, ttft16, tps = get(m, 1, "ttft_ms", "p50"), get(m, 16, "ttft_ms", "p95"), get(m, 16, "output_tokens_per_s")
    rows.append((m, ttft1, ttft16, tps))
def best(pick, lower):
    vals = [v for m, *vs in rows if m in ("vo", "so") for v in [vs[pick]] if v]
    return (min(vals) if lower else max(vals)) if vals else None
b1, b16 = best(0, True), best(2, False)
print("| model | C1 TTFT p50 ms | C16 TTFT p95 ms | C16 output tok/s | C1 TTFT / faster ordinary | C16 tok/s / better ordinary |")
print("|---|---|---|---|---|---|")
for m, a, b, c in rows:
    ra = f"{a / b1:.2f}×" if a and b1 else "–"
    rc = f"{c / b16:.2f}×" if c and b16 else "–"
    print(f"| {m} | {a} | {b} | {c} | {ra} | {rc} |")
PY
}

case ${1:-} in
launch)
    start_xinf
    for uid in $MODELS; do launch_one "$uid"; done
    nvidia-smi --query-gpu=memory.used --format=csv,noheader
    ;;
add)  # more models into the xinf `launch` started (a model's uid may carry a suffix: svb is an sv)
    for uid in $MODELS; do launch_one "$uid"; done
    ;;
bench)
    bench_models "$OUT/bench.json" $MODELS
    table
    ;;
alone)  # each model alone on the GPU: its own xinf, launched, benched and stopped in turn
    for uid in $MODELS; do
        start_xinf
        launch_one "$uid"
        bench_models "$OUT/alone-$uid.json" "$uid"
        stop_xinf
        cp "$W/xinf.log" "$OUT/xinf-$uid.log"
    done
    python3 - "$OUT" $MODELS <<'PY'
import json, os, sys
out, models = sys.argv[1], sys.argv[2:]
runs = [f"{out}/alone-{m}.json" for m in models if os.path.exists(f"{out}/alone-{m}.json")]
results = [x for f in runs for x in json.load(open(f))["results"]]
json.dump({"results": results}, open(f"{out}/bench.json", "w"), indent=1)
PY
    table
    ;;
stop)
    stop_xinf
    ;;
*)
    echo "usage: pd-engines.sh launch | add | bench | stop | alone" >&2
    exit 2
    ;;
esac
