#!/usr/bin/env bash
# Checks the documentation site (doc/site/, one mdBook per language): makes sure mdbook
# $MDBOOK_VERSION is available, then runs scripts/docs.py, which checks pages, links, anchors and
# cited paths and builds every book. Arguments go to docs.py (`--out DIR` keeps the built site).
#
# mdbook comes from, in order: PATH, when it is the pinned version; a previous install in the
# cache folder; Debian's package, where apt offers the same minor version; else
# `cargo install mdbook --locked` into the cache folder (a few minutes on two cores).
set -euo pipefail
cd "$(dirname "$0")/.."

MDBOOK_VERSION=0.5.4
cache="${XINF_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/xinf}/mdbook-$MDBOOK_VERSION"

version_of() { "$1" --version 2>/dev/null | awk '{print $2}' | sed 's/^v//'; }

find_mdbook() {
    local found
    found=$(command -v mdbook || true)
    if [[ -n "$found" && "$(version_of "$found")" == "$MDBOOK_VERSION" ]]; then
        echo "$found"
        return
    fi
    if [[ -x "$cache/bin/mdbook" && "$(version_of "$cache/bin/mdbook")" == "$MDBOOK_VERSION" ]]; then
        echo "$cache/bin/mdbook"
        return
    fi
}

from_apt() {
    command -v apt-cache >/dev/null && command -v apt-get >/dev/null || return 1
    local candidate
    candidate=$(apt-cache policy mdbook 2>/dev/null | awk '/Candidate:/ {print $2}')
    # The books are written for mdbook 0.5; another minor version may render them differently.
    [[ -n "$candidate" && "$candidate" != "(none)" && "$candidate" == "${MDBOOK_VERSION%.*}".* ]] || return 1
    local sudo=()
    if [[ $(id -u) != 0 ]]; then
        command -v sudo >/dev/null || return 1
        sudo=(sudo)
    fi
    echo "installing mdbook $candidate with apt" >&2
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends mdbook >&2 || return 1
}

from_cargo() {
    if ! command -v cargo >/dev/null; then
        echo "docs: mdbook $MDBOOK_VERSION is needed and cargo is not installed to build it" >&2
        return 1
    fi
    echo "installing mdbook $MDBOOK_VERSION into $cache (cargo install, a few minutes)" >&2
    local log
    log=$(mktemp)
    if ! cargo install mdbook --locked --version "$MDBOOK_VERSION" --no-default-features \
        --features search --root "$cache" >"$log" 2>&1; then
        tail -30 "$log" >&2
        echo "docs: cargo install mdbook $MDBOOK_VERSION failed (log: $log)" >&2
        return 1
    fi
    rm -f "$log"
}

mdbook=$(find_mdbook)
if [[ -z "$mdbook" ]]; then
    if from_apt; then
        mdbook=$(command -v mdbook)
    else
        from_cargo
        mdbook=$(find_mdbook)
    fi
fi
if [[ -z "$mdbook" ]]; then
    echo "docs: no mdbook $MDBOOK_VERSION after installing it" >&2
    exit 1
fi

MDBOOK="$mdbook" exec python3 scripts/docs.py "$@"
