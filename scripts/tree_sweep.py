"""Candidate-tree settings for draft heads, measured without timing noise.

Under greedy decoding the tokens a step accepts depend only on the token sequence and the
target's hidden states along it (:mod:`clover.replay`), so each tree setting's tokens per
step is replayed exactly from the plain greedy answers: one target decode per prompt
(cached beside the output), one forward over prompt + answer for the states, then each
setting drafts step by step as the engine would. No timing is involved, so a busy machine
gives the same numbers; what a setting costs in time is ``clover bench``'s to measure.

    python scripts/tree_sweep.py --methods clover,medusa \\
        --tree dynamic:budget=10 --tree dynamic:budget=10,min_ratio=0 \\
        --max-prompts 40 --out ~/.cache/clover-studio/runs/tree-sweep.json

Prompts default to the held-out set (``assets/prompts/heldout.jsonl``): tune there, then
confirm on Spec-Bench.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv=None) -> int:
    import torch
    from tqdm.auto import tqdm

    from clover import load_target, parse_tree_spec
    from clover.assets import assets_dir
    from clover.heads import load_heads, shipped_heads_for
    from clover.replay import greedy_answers, replay_greedy, settings_table
    from clover.training.prompts import interleave_categories, read_prompts

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--methods", default="clover,medusa", help="head kinds, comma-separated")
    ap.add_argument("--heads", action="append", default=[], metavar="KIND=DIR",
                    help="heads folder for a kind (default: the shipped heads)")
    ap.add_argument("--tree", action="append", required=True, help="a tree spec, as for generate; repeat")
    ap.add_argument("--prompts", default=str(assets_dir() / "prompts" / "heldout.jsonl"))
    ap.add_argument("--max-prompts", type=int, default=40)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", required=True, help="results JSON; the greedy answers are kept beside it")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    trees = {spec: parse_tree_spec(spec) for spec in args.tree}
    if any(t.kind == "off" or t.auto for t in trees.values()):
        ap.error("--tree takes concrete trees (dynamic:..., a preset or a path list), not auto or off")
    folders = dict(h.split("=", 1) for h in args.heads)
    prompts = interleave_categories(read_prompts(args.prompts))[: args.max_prompts]
    target = load_target(None, device="cpu")
    runs = greedy_answers(target, prompts, args.max_new_tokens,
                          Path(args.out).expanduser().with_suffix(".answers.json"))
    table: dict[str, dict[str, dict[str, float]]] = {}
    used: dict[str, str] = {}  # kind -> its heads folder
    for kind in args.methods.split(","):
        folder = folders.get(kind) or shipped_heads_for(kind, target)
        if folder is None:
            ap.error(f"no shipped {kind} heads for this target: name a folder with --heads {kind}=DIR")
        used[kind] = str(folder)
        heads = load_heads(folder, target).eval()
        states = []
        for _, ids, answer in tqdm(runs, desc=f"{kind}: target states"):
            with torch.no_grad():
                pre, post = target.hidden_states(torch.tensor([ids + answer]), heads.config.fuse_layers)
            states.append((pre[0], post[0]))
        for spec, tree in trees.items():
            per_cat: dict[str, list[float]] = {}
            with torch.no_grad():
                for (cat, ids, answer), (pre, post) in zip(runs, states):
                    steps = replay_greedy(heads.drafter(target, tree), ids, answer, pre, post)
                    per_cat.setdefault(cat, []).append(len(answer) / len(steps))
            # the mean over prompts, per category and over all of them
            row = {c: round(statistics.fmean(v), 3) for c, v in sorted(per_cat.items())}
            row["all"] = round(statistics.fmean(x for v in per_cat.values() for x in v), 3)
            table.setdefault(kind, {})[spec] = row
            print(f"{kind:8s} {spec:48s} {row['all']:.3f}", flush=True)
    out = Path(args.out).expanduser()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"prompts": args.prompts, "n": len(runs), "max_new_tokens": args.max_new_tokens,
                               "heads": used,
                               "tokens_per_step": table}, indent=1) + "\n")
    for kind, rows in table.items():
        print(settings_table(f"{kind}: tokens per step", {f"`{spec}`": row for spec, row in rows.items()}, "tree"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
