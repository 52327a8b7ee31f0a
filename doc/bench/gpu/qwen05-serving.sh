#!/usr/bin/env bash
# Qwen2.5-0.5B-shaped random FP16 model on the GPU: transformers decode timing, then xinf
# (ordinary 2 hybrid replicas vs P/D vs cross-layout P/D) under `xinf bench`, all on one GPU.
set -u
B=$(cd "$(dirname "$0")" && pwd)
X=$B/xinf
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
M=/tmp/q05/model
rm -rf /tmp/q05; mkdir -p /tmp/q05
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 $B/make_q05.py $M 2>&1 | grep -v Warning
P=18090
# Every replica runs on the one GPU without stating a memory share: the worker must allow it.
XINF_ALLOW_MULTI_REPLICA_PER_GPU=1 XINF_LOG=warn $X local --port $P > /tmp/q05/local.log 2>&1 &
LP=$!
for i in $(seq 60); do grep -q "REST API" /tmp/q05/local.log && break; sleep 1; done
E="--engine-option device=cuda --engine-option kv_cache_tokens=65536"
G='"device":"cuda","kv_cache_tokens":65536'
$X launch -e http://127.0.0.1:$P -n qwen2.5-instruct -u ordinary --model-path $M -r 2 $E 2>&1 | tail -2
$X launch -e http://127.0.0.1:$P -n qwen2.5-instruct -u pd --model-path $M $E --replica-config '[{"role":"prefill"},{"role":"decode"}]' 2>&1 | tail -2
$X launch -e http://127.0.0.1:$P -n qwen2.5-instruct -u pdx --model-path $M --replica-config "[
  {\"role\":\"prefill\",\"engine_config\":{\"kv_layout\":\"paged-kv-first\",\"kv_order\":\"HND\",\"block_size\":16,$G}},
  {\"role\":\"decode\",\"engine_config\":{\"kv_layout\":\"token-pool\",$G}}]" 2>&1 | tail -2
nvidia-smi --query-gpu=memory.used --format=csv,noheader
timeout 420 $X bench -e http://127.0.0.1:$P -u ordinary -u pd -u pdx --concurrency 1,16 --requests ${REQ:-32} \
    --prompt-tokens 40,173,733,2833 --output-tokens 32 --warmup 2 --json $OUT/bench.json 2>&1 | grep -v "^\s*$" | tail -16
# Handoff of one 1,024-token prompt through the P/D deployments: the decode side's fetch time.
python3 - <<'PY'
import json, urllib.request
def get(p): return json.load(urllib.request.urlopen(f"http://127.0.0.1:18090{p}"))
def post(p, b):
    r = urllib.request.Request(f"http://127.0.0.1:18090{p}", json.dumps(b).encode(), {"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(r))
for uid in ("pd", "pdx"):
    xs = []
    for k in range(5):
        before = get(f"/v1/models/{uid}/stats")["handoff"]["latency"]["sum_us"]
        post("/v1/completions", {"model": uid, "prompt": [100 + (i * 7 + k) % 30000 for i in range(1024)], "max_tokens": 1})
        xs.append(get(f"/v1/models/{uid}/stats")["handoff"]["latency"]["sum_us"] - before)
    s = get(f"/v1/models/{uid}/stats")["handoff"]
    print(f"{uid}: 1024-token handoff fetch (gather on GPU, pages to host, in-process, scatter on GPU) us: {sorted(xs)} median {sorted(xs)[2]}; pages {s['pages_transferred']} bytes {s['bytes_transferred']} in-process {s['in_process_transfers']}")
PY
kill $LP; wait $LP 2>/dev/null
grep -i "error\|panic" /tmp/q05/local.log | head -5
cp /tmp/q05/hf.json $OUT/ 2>/dev/null; true
