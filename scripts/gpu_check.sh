#!/usr/bin/env bash
# Run vidql's GPU paths against its CPU paths on this machine; JSON report to $1.
#   bash scripts/gpu_check.sh OUT.json [CLIP] [MODEL]
# Needs vidql's dependencies with the GPU extra (nvidia-dali, onnxruntime-gpu, faiss-gpu);
# a wheel folder in VIDQL_WHEELS is installed first into a scratch site (for machines
# without a package index). Without ../shared, give a clip and the YOLOX-Nano ONNX model.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: gpu_check.sh OUT.json [CLIP] [MODEL]}"
clip="${2:-../shared/data/residential_street.mp4}"
model="${3:-../shared/models/yolox_nano.onnx}"
if [ -n "${VIDQL_WHEELS:-}" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/vidql-site "$VIDQL_WHEELS"/*.whl
    export PYTHONPATH="/tmp/vidql-site${PYTHONPATH:+:$PYTHONPATH}"
fi
if ! python3 -c "import vidql.engine" 2>/dev/null; then
    # not installed: import the checkout through a package folder of links
    pkg=/tmp/vidql-src/vidql
    rm -rf /tmp/vidql-src && mkdir -p "$pkg"
    cp -r vidql/. "$pkg"
    for d in base engine indexes preprocess queries datasets bench; do ln -s "$PWD/$d" "$pkg/$d"; done
    export PYTHONPATH="/tmp/vidql-src${PYTHONPATH:+:$PYTHONPATH}"
fi
PYTHONUNBUFFERED=1 python3 scripts/gpu_check.py --clip "$clip" --model "$model" --out "$out" \
    ${VIDQL_GPU_CHECK_ARGS:-}
