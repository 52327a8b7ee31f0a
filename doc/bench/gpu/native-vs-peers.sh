#!/usr/bin/env bash
# The native engine against vLLM and SGLang on one GPU: an ordinary replica of each (`no`, `vo`,
# `so`) on the same Qwen2.5-0.5B-shaped random FP16 model under one `xinf bench` run (prompts of
# 40/173/733/2833 tokens, 32 output tokens, C1/C16/C64, prefix caching off in all three), then
# one table with the native engine's ratios to the better peer in each column. With
# PREFIX_CACHE=1 SHARED_PREFIX=N (see pd-engines.sh) the three compare their prefix caches on
# prompts that share N tokens.
#
# Other shapes with pd-engines.sh's MODEL_ARGS, MEM and MODEL_NAME (the real vocabulary:
# MODEL_ARGS="--qwen05 --vocab 151936"; the Llama-3.1-8B shape: MODEL_ARGS="--llama8b --device
# cuda" MEM=0.2 MODEL_NAME=llama-3.2-instruct), each in its own WORK.
# Needs what `pd-engines.sh` needs (a `--features cuda` xinf in XINF_BIN, vLLM 0.26 and SGLang
# 0.5.15 in VLLM_PYTHONPATH / SGLANG_PYTHONPATH). `native-vs-peers.sh launch`, then `bench`,
# then `stop`; or `native-vs-peers.sh alone`, each server alone on the GPU in turn; or
# `native-vs-peers.sh all`: launch, bench, then the native replica's steps level by level
# (`steps.py`, from xinf's log: run with XINF_LOG=warn,xinf::step=trace), then stop. On the 8B
# shape `launch` alone takes about nine minutes on an H100 (the checkpoint written in a minute,
# then the three servers one after another: 80, 165 and 270 s), and `bench` under a minute with
# REQ=48.
set -u
D=$(cd "$(dirname "$0")" && pwd)
W=${WORK:-/tmp/pd-engines}
export MODELS=${MODELS:-no vo so} OUT=${OUT:-$W}
case ${1:-} in
launch | stop) exec bash "$D/pd-engines.sh" "$1" ;;
bench | alone)
    CONC=${CONC:-1,16,64} REQ=${REQ:-64} bash "$D/pd-engines.sh" "$1" | grep -v "^|"
    python3 - "$OUT/bench.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))["results"]
def get(model, c, metric, q=None):
    for x in r:
        if x.get("model_uid") == model and x.get("concurrency") == c:
            v = x.get(metric)
            return v.get(q) if q else v
cols = [("C1 TTFT p95 ms", 1, "ttft_ms", "p95", True), ("C1 TPOT ms", 1, "tpot_ms", "p50", True),
        ("C16 TTFT p50 ms", 16, "ttft_ms", "p50", True), ("C16 TPOT ms", 16, "tpot_ms", "p50", True),
        ("C16 tok/s", 16, "output_tokens_per_s", None, False), ("C64 tok/s", 64, "output_tokens_per_s", None, False)]
names = {"no": "xinf native", "vo": "vLLM", "so": "SGLang"}
print("| | " + " | ".join(c[0] for c in cols) + " |")
print("|---" * (len(cols) + 1) + "|")
for m in ("no", "vo", "so"):
    print(f"| {names[m]} | " + " | ".join(str(get(m, c, k, q)) for _, c, k, q, _ in cols) + " |")
ratios = []
for _, c, k, q, lower in cols:
    mine, peers = get("no", c, k, q), [v for v in (get("vo", c, k, q), get("so", c, k, q)) if v]
    best = (min if lower else max)(peers) if peers else None
    ratios.append(f"{mine / best:.2f}×" if mine and best else "–")
print("| native / better peer | " + " | ".join(ratios) + " |")
PY
    ;;
all)
    bash "$D/pd-engines.sh" launch
    bash "$0" bench
    grep -q "xinf::step" "$W/xinf.log" 2>/dev/null && python3 "$D/steps.py" "$W/xinf.log" --bench "$OUT/bench.json"
    bash "$D/pd-engines.sh" stop
    ;;
*)
    echo "usage: native-vs-peers.sh launch | bench | stop | alone | all" >&2
    exit 2
    ;;
esac
