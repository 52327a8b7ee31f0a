#!/usr/bin/env bash
# Two builds of the native engine's GPU test binary compared on decode step times, alternating
# in one run so that both meet the same GPU: per-token p50 of a batch-1 decode (graphs on and
# off) and of decode-only batches of 1 to 64 sequences with 1,000-token contexts and of the
# serving mix, on each shape of SHAPES (`XINF_BENCH_SHAPE`: q05, q05v, l8b; default "q05 l8b"),
# ROUNDS times each (default 2). TESTS picks the timings (default "decode_step_time_at_batch_1
# decode_step_time_by_batch"; the second alone takes seconds a round on the 0.5B shape). Prints
# every line, then the medians over the rounds side by side with the ratio of the last build
# to the first.
#
#     ab-decode.sh A=path/to/gpu-<hash> B=path/to/other/gpu-<hash>
#
# The binaries come from `cargo test --release --features cuda -p xinf-engine-native --test gpu
# --no-run` on each commit. Needs the GPU; the weights are random, made by the tests.
set -u
export XINF_TEST_GPU=1 LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
declare -A BIN
names=()
for arg in "$@"; do
    names+=("${arg%%=*}")
    BIN[${arg%%=*}]=${arg#*=}
done
[ ${#names[@]} -ge 1 ] || { echo "usage: ab-decode.sh NAME=BINARY..." >&2; exit 2; }
log=$(mktemp)
for shape in ${SHAPES:-q05 l8b}; do
    for _ in $(seq "${ROUNDS:-2}"); do
        for name in "${names[@]}"; do
            for t in ${TESTS:-decode_step_time_at_batch_1 decode_step_time_by_batch}; do
                XINF_BENCH_SHAPE=$shape timeout 300 "${BIN[$name]}" --test-threads=1 --nocapture --exact "timing::$t" 2>&1 |
                    grep -E "per-token|panicked" | sed "s/^/$name $shape | /" | tee -a "$log"
            done
        done
    done
done
python3 - "$log" "${names[@]}" <<'PY'
import re, statistics, sys
log, names = sys.argv[1], sys.argv[2:]
seen, times = [], {}
for line in open(log):
    m = re.match(r"(\S+) (\S+) \| .*?(cuda_graphs \w+|decode-only batch \d+): per-token p50 ([\d.]+) ms", line)
    if not m:
        continue
    name, shape, what, ms = m.group(1), m.group(2), m.group(3), float(m.group(4))
    if "40/173" in line:  # the serving mix's batches, apart from the 1,000-token ones
        what = what.replace("decode-only", "serving mix,")
    key = (shape, what)
    if key not in seen:
        seen.append(key)
    times.setdefault((key, name), []).append(ms)
print("| shape | step | " + " | ".join(f"{n} ms" for n in names) + (f" | {names[-1]} / {names[0]} |" if len(names) > 1 else " |"))
print("|---" * (len(names) + 2 + (len(names) > 1)) + "|")
for key in seen:
    med = [statistics.median(times[(key, n)]) if (key, n) in times else None for n in names]
    cells = [f"{m:.3f}" if m else "–" for m in med]
    ratio = f" | {med[-1] / med[0]:.3f}" if len(names) > 1 and med[0] and med[-1] else (" | –" if len(names) > 1 else "")
    print(f"| {key[0]} | {key[1]} | " + " | ".join(cells) + ratio + " |")
PY
rm -f "$log"
