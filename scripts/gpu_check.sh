#!/usr/bin/env bash
# The prepared device check (issue 18): scripts/gpu_check.sh --out DIR [--dry-run]
# On a machine with one NVIDIA GPU it runs in at most 8 minutes and writes
# DIR/gpu_check.json; --dry-run does the same on the CPU with small sizes (CI runs it).
set -euo pipefail
cd "$(dirname "$0")/.."
exec timeout 480 python scripts/gpu_check.py "$@"
