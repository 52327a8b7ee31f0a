#!/usr/bin/env bash
# The main job: builds xinf (release) and runs a local cluster serving the default model,
# SmolLM2-135M-Instruct (fetched into ~/.xinf on first use), as one prefill and one decode
# replica on http://127.0.0.1:9997/v1. Installs the system packages the build needs first
# (scripts/system-packages.sh). Extra arguments go to `xinf local` (e.g. `--port 8000`).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/system-packages.sh
xinf_system_packages
exec cargo run --release --locked -- local -n smollm2-instruct -u smollm2 \
    --replica-config '[{"role": "prefill"}, {"role": "decode"}]' "$@"
