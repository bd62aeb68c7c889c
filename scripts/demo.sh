#!/usr/bin/env bash
# Install, then run `vidql demo` on a generated synthetic video (no download needed).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
VENV="${VIDQL_VENV:-.venv}"
exec "$VENV/bin/vidql" demo "$@"
