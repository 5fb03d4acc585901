#!/usr/bin/env bash
# The prepared device check: scripts/gpu_check.sh --out DIR [--dry-run]
# On a machine with one NVIDIA GPU it runs in at most 8 minutes and writes
# DIR/gpu_check.json; --dry-run does the same on the CPU with small sizes (CI runs it).
#
# The GPU machine has its own PyTorch but an older transformers: bring the pinned one as
# a wheel first (once, here): scripts/gpu_check.sh --fetch-wheels, then carry `.whl`.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="$(command -v python || command -v python3)"
if [ "${1:-}" = "--fetch-wheels" ]; then
  grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .whl "transformers==5.24.0"
  ls -l .whl
  exit 0
fi
if compgen -G ".whl/*.whl" > /dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/clover-site .whl/*.whl
  export PYTHONPATH="/tmp/clover-site${PYTHONPATH:+:$PYTHONPATH}"
fi
exec timeout 480 "$PY" scripts/gpu_check.py "$@"
