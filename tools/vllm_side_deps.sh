#!/usr/bin/env bash
# Put kvpool's own dependencies *beside* a vLLM kit venv (../shared/vllm-kit), never into it.
#
#   bash tools/vllm_side_deps.sh /tmp/anchors/vllm025     # -> /tmp/anchors/vllm025/kvpool-deps
#
# The kit's venvs pin numpy 2.2.6; kvpool's fast backend then needs numba 0.61.x, which is
# installed with `pip --target` into DEST/kvpool-deps together with kvpool's pure-Python
# test dependencies that vLLM does not bring, and einops, which vLLM 0.25.1 imports when its
# ModelConfig inspects a model (kvpool.vllm.scheduler_run builds one). Use it as
#
#   PYTHONPATH=src:/tmp/anchors/vllm025/kvpool-deps /tmp/anchors/vllm025/venv/bin/python ...
#
# (the optional test tiers and the vs-vLLM benchmark run kvpool this way). Idempotent: a
# second run only re-checks the imports.
set -euo pipefail
DEST="${1:?usage: vllm_side_deps.sh KIT_DEST (e.g. /tmp/anchors/vllm025)}"
PY="$DEST/venv/bin/python"
TARGET="$DEST/kvpool-deps"
[ -x "$PY" ] || { echo "vllm_side_deps.sh: no kit venv at $DEST/venv (run ../shared/vllm-kit/setup.sh first)" >&2; exit 2; }
check() {
  PYTHONPATH="$TARGET" "$PY" -c 'import numba, hypothesis, icontract, pytest, numpy, cbor2, xxhash, einops; print("  ok: numba", numba.__version__, "numpy", numpy.__version__, "hypothesis", hypothesis.__version__)'
}
if [ -f "$TARGET/.complete" ] && check 2>/dev/null; then exit 0; fi
rm -rf "$TARGET"
numpy_version=$("$PY" -c 'import numpy; print(numpy.__version__)')
# numpy is listed so that pip resolves numba against the venv's numpy; it is then removed from
# the target (the venv's own copy stays the one imported).
"$PY" -m pip install -q --disable-pip-version-check --target "$TARGET" \
  "numpy==$numpy_version" "numba>=0.61,<0.62" "hypothesis>=6.100" "icontract>=2.6" \
  "pytest>=8" "xxhash>=3.0" "cbor2>=5.4" "einops" > "$DEST/kvpool-deps.log" 2>&1 \
  || { echo "vllm_side_deps.sh: pip failed; see $DEST/kvpool-deps.log" >&2; tail -n 20 "$DEST/kvpool-deps.log" >&2; exit 1; }
rm -rf "$TARGET"/numpy "$TARGET"/numpy-*.dist-info "$TARGET"/numpy.libs "$TARGET"/bin
check
touch "$TARGET/.complete"
