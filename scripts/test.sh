#!/usr/bin/env bash
# Install, lint (ruff: pyflakes, bugbear, complexity), then run the whole test suite (slow
# statistical checks included). Extra arguments go to pytest, e.g.
# `bash scripts/test.sh -m "not slow"`.
set -euo pipefail
cd "$(dirname "$0")/.."
VIDQL_EXTRAS="dev,ray" bash scripts/install.sh  # the Ray executor's tests run too
VENV="${VIDQL_VENV:-.venv}"
"$VENV/bin/python" -m ruff check .
"$VENV/bin/python" -m pytest -q -p no:cacheprovider --durations=15 "$@"
