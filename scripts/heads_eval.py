"""Score heads on the yardstick: teacher-forced acceptance on the target's greedy answers.

All 480 Spec-Bench questions (per category, per task and the six-task mean), the held-out
prompts and the 48 held-out training conversations; see :mod:`clover.training.yardstick`.
Head 1's top-1 is exactly the greedy acceptance of a one-node tree; ``chain tau`` is the
expected tokens per step of a greedy chain of the heads' top-1 drafts.

The first call answers the prompts with the batched data path and computes their hidden
states (a few minutes, once; kept under ``$CLOVER_CACHE_DIR/yardstick``); later calls cost
the heads' forward only.

    python scripts/heads_eval.py assets/heads/clover assets/heads/medusa --json out.json
    python scripts/heads_eval.py ~/.cache/clover-studio/runs/curve-clover/steps/*
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("heads", nargs="+", help="heads folders (clover train --out, assets/heads/<kind>)")
    ap.add_argument("--sets", default="spec-bench,heldout,train-heldout",
                    help="comma-separated: spec-bench, heldout, train-heldout")
    ap.add_argument("--spec-bench", default=None, help="Spec-Bench question.jsonl (default: ../shared)")
    ap.add_argument("--prompt-vocab", action="store_true",
                    help="also score each heads folder with its draft vocabulary extended by each "
                         "prompt's own tokens (no retraining; a row '<folder> +prompt')")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default="", help="also write every figure to this file")
    args = ap.parse_args(argv)

    import torch

    from clover import load_heads, load_target
    from clover.training.hidden_cache import HiddenCache
    from clover.training.yardstick import SPEC_BENCH_TASKS, cache_dir, load_sets, score

    torch.set_num_threads(args.threads)
    target = load_target(None, device="cpu")
    pad = min(target.eos_token_ids) if target.eos_token_ids else 0
    sets = load_sets(target, [s.strip() for s in args.sets.split(",") if s.strip()], args.spec_bench)
    caches: dict[tuple, HiddenCache] = {}

    def hidden_for(heads) -> HiddenCache:  # heads with fuse_layers read those layers too
        layers = tuple(heads.config.fuse_layers)
        if layers not in caches:
            caches[layers] = HiddenCache(target, path=cache_dir() / "hidden.safetensors", layers=layers)
            caches[layers].fill([r for recs in sets.values() for r in recs], pad)
        return caches[layers]

    table: dict = {}
    cols = []
    if "spec-bench" in sets:
        cols += ["spec-bench six-task", *SPEC_BENCH_TASKS]
    cols += [s for s in sets if s != "spec-bench"]
    print("| heads | kind | " + " | ".join(cols) + " | chain tau (Spec-Bench six-task) |")
    print("|---|---|" + "---|" * (len(cols) + 1))
    for folder in args.heads:
        heads = load_heads(folder, target)
        for prompt_vocab in ((False, True) if args.prompt_vocab else (False,)):
            res = {name: score(heads, target, recs, hidden_for(heads), prompt_vocab) for name, recs in sets.items()}
            path = f"{folder} +prompt" if prompt_vocab else folder
            table[str(path)] = res
            cells, tau = [], ""
            if "spec-bench" in res:
                sb = res["spec-bench"]
                cells.append(f"**{100 * sb['six_task']['head1_top1']:.1f}**")
                cells += [f"{100 * sb[t]['head1']['top1']:.1f}" for t in SPEC_BENCH_TASKS]
                tau = f"{sb['six_task']['chain_tau']:.3f}"
            cells += [f"{100 * res[s]['all']['head1']['top1']:.1f}" for s in res if s != "spec-bench"]
            print(f"| {path} | {heads.config.kind} | " + " | ".join(cells) + f" | {tau} |", flush=True)
    print("(head 1 top-1, %: the greedy acceptance of one drafted token)")
    if args.json:
        Path(args.json).write_text(json.dumps(table, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
