#!/usr/bin/env bash
# Runs every test of xinf. Sets up the Python reference environment the golden tests compare
# against (Hugging Face transformers on CPU, from PyPI; about 6 GB, once), the official `openai`
# client the REST API tests drive and Selenium (with Debian's Chromium) for the Web UI's test,
# then runs the Python package's tests (its extension module built into that environment with
# maturin) and cargo test.
# The default model is fetched by xinf itself on first use (into $XINF_HOME, default ~/.xinf).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/system-packages.sh
xinf_system_packages

VENV="${XINF_VENV:-$HOME/.cache/xinf-venv}"
xinf_test_system_packages
if ! "$VENV/bin/python" -c "import torch, transformers, gguf, openai, xinference_client, nixl_cu12, maturin, pytest, selenium" 2>/dev/null; then
    echo "setting up the reference Python environment in $VENV" >&2
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet torch transformers gguf accelerate numpy openai xinference-client nixl-cu12==1.5.1 \
        'maturin>=1.5,<2' pytest selenium
fi
export XINF_TEST_PYTHON="$VENV/bin/python"
# NIXL (the nixl-cu12 wheel's libraries) for the NIXL transfer tests, which fail without it.
XINF_NIXL_LIB_DIR="$("$VENV/bin/python" -c 'import importlib.util, os
print(os.path.join(os.path.dirname(os.path.dirname(importlib.util.find_spec("nixl_cu12").origin)), ".nixl_cu12.mesonpy.libs"))')"
export XINF_NIXL_LIB_DIR XINF_TEST_NIXL=1
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/xinf-target}"

# The KV connectors' package (python/): pages between the page plane and caches laid out as
# vLLM and SGLang lay them out, room and load lifecycles, the connectors' scheduler rules.
(cd python && VIRTUAL_ENV="$VENV" "$VENV/bin/maturin" develop --quiet --locked)
"$VENV/bin/python" -m pytest -q python/tests

# The documentation site: every page in every language, links, anchors, cited paths; mdBook
# builds each book.
scripts/docs.sh

cargo test --workspace --locked -- --test-threads="${XINF_TEST_THREADS:-2}"
