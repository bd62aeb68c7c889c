#!/usr/bin/env bash
# Install, lint (ruff: pyflakes, bugbear, complexity), then run the whole test suite (slow
# statistical checks included). Extra arguments go to pytest, e.g.
# `bash scripts/test.sh -m "not slow"`.
set -euo pipefail
cd "$(dirname "$0")/.."
VIDQL_EXTRAS="dev,ray" bash scripts/install.sh  # the Ray executor's tests run too
VENV="${VIDQL_VENV:-.venv}"
# The export page's browser test needs Chromium: Debian's package where we are root or have
# sudo; elsewhere that test skips and says why.
if ! command -v chromium >/dev/null && command -v apt-get >/dev/null; then
    AS_ROOT=""
    if [ "$(id -u)" = 0 ]; then AS_ROOT=env; elif sudo -n true 2>/dev/null; then AS_ROOT="sudo -n"; fi
    if [ -n "$AS_ROOT" ]; then
        { $AS_ROOT apt-get update -qq && $AS_ROOT DEBIAN_FRONTEND=noninteractive apt-get install \
            -y -qq chromium >/dev/null; } || echo "could not install chromium: the browser test skips"
    fi
fi
"$VENV/bin/python" -m ruff check .
"$VENV/bin/python" -m pytest -q -p no:cacheprovider --durations=15 "$@"
