"""Teacher-forced acceptance of trained heads on a benchmark's own greedy answers.

A cheap, exact proxy of the greedy benchmark's acceptance, used for issue 14's learning
curve and ablations without a full ``clover bench`` run per checkpoint: the target's plain
greedy answers to the benchmark prompts (written once by ``scripts/lookup_ablation.py``,
``<out>.answers.json``) are scored like the training's held-out set
(:func:`clover.training.train.evaluate`): per head top-1 against the target's own next
token at every answer position, and the greedy chain's expected tokens per step
(``chain_tau``). Under greedy decoding a one-node tree's draft is accepted exactly when
head 1's top-1 is the target's next token, so head 1's top-1 here is the ``--tree
dynamic:budget=1,branching=1`` acceptance, averaged over all answer positions rather than
over the positions where steps happen to start.

Benchmark prompts are only measured here, never trained on.

    python scripts/heads_eval.py --answers runs/lookup-ablation-specbench.answers.json \\
        runs/pilot-v2-clover runs/full-v2-clover assets/heads/clover
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def answer_records(answers_file: str | Path) -> dict[str, list[dict]]:
    """Per category (and "all"), training-format records of the saved greedy answers:
    ``input_ids`` = prompt + answer, ``loss_mask`` 1 on the answer tokens."""
    runs = json.loads(Path(answers_file).read_text())["runs"]
    out: dict[str, list[dict]] = {"all": []}
    for i, (category, prompt, answer) in enumerate(runs):
        rec = {"key": f"bench:{i}", "input_ids": list(prompt) + list(answer),
               "loss_mask": [0] * len(prompt) + [1] * len(answer)}
        out.setdefault(category, []).append(rec)
        out["all"].append(rec)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--answers", required=True, help="a <out>.answers.json of scripts/lookup_ablation.py")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default="", help="also write the numbers to this file")
    ap.add_argument("heads", nargs="+", help="heads folders (clover train --out, assets/heads/<kind>)")
    args = ap.parse_args(argv)

    import torch

    from clover import load_heads, load_target
    from clover.training.train import TrainConfig, evaluate

    torch.set_num_threads(args.threads)
    target = load_target(None, device="cpu")
    pad = min(target.eos_token_ids) if target.eos_token_ids else 0
    records = answer_records(args.answers)
    cats = ["all"] + sorted(c for c in records if c != "all")
    table: dict = {}
    print("| heads | kind | chain tau | top-1 per head (%) | " + " | ".join(f"{c} head-1 top-1" for c in cats[1:]) + " |")
    print("|---|---|---|---|" + "---|" * (len(cats) - 1))
    for path in args.heads:
        heads = load_heads(path, target)
        cfg = TrainConfig(method=heads.config.kind, num_heads=heads.config.num_heads,
                          eval_conversations=10**9)
        res = {c: evaluate(heads, target, records[c], cfg, pad) for c in cats}
        table[path] = res
        a = res["all"]
        top1 = " / ".join(f"{100 * a[f'head{k + 1}']['top1']:.1f}" for k in range(heads.config.num_heads))
        per_cat = " | ".join(f"{100 * res[c]['head1']['top1']:.1f}" for c in cats[1:])
        print(f"| {path} | {heads.config.kind} | {a['chain_tau']:.3f} | {top1} | {per_cat} |", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(table, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
