#!/usr/bin/env bash
# The one prepared GPU check of kvpool.gpu (issue 11), for a session that has a CUDA machine:
#   1. the GPU-layer tests with every tensor on CUDA (KVPOOL_GPU_DEVICE=cuda): paged KV
#      tensors, block-table upload, the numba-cuda copy/swap kernel on real device and pinned
#      memory, and the end-to-end decoder test on every backend with its planted bugs;
#   2. benchmarks/gpu_copy.py on CUDA: GB/s against block size for copy and swap, with
#      device-to-device and pinned host<->device copy_ bandwidth as the bound.
# About 1-3 minutes for the tests and under 5 for the benchmark (each has its own timeout).
#
#   bash benchmarks/gpu_check.sh [OUTDIR]          # from the repository root
#
# Needs a python3 with a CUDA build of torch and numba-cuda (the H200 image has both:
# PYTHON=... to pick another). kvpool's pure-Python dependencies missing there (cbor2) travel
# as wheels in .whl/ (docs/gpu.md shows the pip download line); they are installed first.
# Writes tests.log, gpu_copy.txt and gpu_copy.json to OUTDIR (default $OUT, else /tmp).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-/tmp/kvpool-gpu-check}}
mkdir -p "$out"
py=${PYTHON:-python3}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/kvpool-site .whl/*.whl && export PYTHONPATH="$PYTHONPATH:/tmp/kvpool-site"
fi
"$py" - <<'PY' || { echo "gpu_check: the environment is not ready (see above)" >&2; exit 2; }
import sys
import torch
from numba import cuda
print("python", sys.version.split()[0], "| torch", torch.__version__, "| cuda",
      torch.version.cuda, "| device", torch.cuda.get_device_name(0) if torch.cuda.is_available()
      else None)
assert torch.cuda.is_available(), "torch sees no CUDA device"
assert cuda.is_available(), "numba-cuda sees no CUDA device"
import kvpool.gpu  # noqa: F401  (cbor2 and numba must import)
PY
status=0
KVPOOL_GPU_DEVICE=cuda timeout 240 "$py" -m pytest -q -p no:cacheprovider tests/gpu 2>&1 \
  | tee "$out/tests.log" || status=1
timeout 270 "$py" benchmarks/gpu_copy.py --device all --rounds 7 --json "$out/gpu_copy.json" \
  2>&1 | tee "$out/gpu_copy.txt" || status=1
exit "$status"
