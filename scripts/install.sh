#!/usr/bin/env bash
# Create the in-repo virtualenv .venv (or $VIDQL_VENV) and install vidql into it, editable,
# with the extras in $VIDQL_EXTRAS (default: dev; scripts/test.sh adds ray).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VIDQL_VENV:-.venv}"
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q -e ".[${VIDQL_EXTRAS:-dev}]"
echo "installed vidql into $VENV"
