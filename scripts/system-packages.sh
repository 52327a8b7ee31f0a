#!/usr/bin/env bash
# The system packages building and testing xinf needs beyond Rust and a C compiler, installed
# with apt where they are missing (Debian and Ubuntu; as root, or through sudo). Sourced by
# scripts/local.sh, scripts/test.sh and .ci/run; safe to run again (it installs only what is
# missing, and nothing when everything is there).
#
# - libclang: nixl-sys generates its bindings with bindgen at build time (its stub API needs no
#   NIXL, but bindgen needs libclang).
# - cmake: aws-lc-sys (under ractor_cluster's TLS) falls back to a CMake build where its cc
#   build cannot run.
# - pkg-config, unzip, and Python's venv module for the test environment.

xinf_system_packages() {
    local need=()
    command -v cc >/dev/null || need+=(build-essential)
    command -v pkg-config >/dev/null || need+=(pkg-config)
    command -v unzip >/dev/null || need+=(unzip)
    command -v cmake >/dev/null || need+=(cmake)
    python3 -m venv --help >/dev/null 2>&1 || need+=(python3-venv)
    # The unversioned libclang.so comes with the -dev package, and with it clang's own headers
    # (stddef.h), which bindgen needs as well; the runtime library alone is not enough.
    if [[ -z "${LIBCLANG_PATH:-}" ]] && ! compgen -G "/usr/lib/llvm-*/lib/libclang.so" >/dev/null; then
        need+=(libclang-dev)
    fi
    ((${#need[@]})) || return 0
    xinf_apt_install "${need[@]}"
}

# What the tests need besides: Chromium and its WebDriver for the Web UI's test (Selenium drives
# them headless).
xinf_test_system_packages() {
    local need=()
    [[ -x /usr/bin/chromium ]] || need+=(chromium)
    [[ -x /usr/bin/chromedriver ]] || need+=(chromium-driver)
    ((${#need[@]})) || return 0
    xinf_apt_install "${need[@]}"
}

# Installs the packages given with apt (as root, or through sudo).
xinf_apt_install() {
    local need=("$@")
    local sudo=()
    if [[ $(id -u) != 0 ]]; then
        if ! command -v sudo >/dev/null; then
            echo "xinf needs these system packages: ${need[*]} (install them as root: apt-get install ${need[*]})" >&2
            return 1
        fi
        sudo=(sudo)
    fi
    if ! command -v apt-get >/dev/null; then
        echo "xinf needs these system packages: ${need[*]} (no apt-get here: install them with the system's package manager)" >&2
        return 1
    fi
    echo "installing system packages: ${need[*]}" >&2
    # apt's progress goes to a log; its errors (and the log's end, on failure) to the terminal.
    local log
    log=$(mktemp)
    if ! { "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
        "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"; } \
        >"$log" 2>&1; then
        tail -20 "$log" >&2
        echo "installing ${need[*]} failed (log: $log)" >&2
        return 1
    fi
    rm -f "$log"
}
