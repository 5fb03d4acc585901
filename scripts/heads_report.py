"""A Markdown table of head training runs (learning curves and ablations).

Reads each run's ``training.json`` (written by ``clover train``) and prints, per run: the
head kind, the training conversations, steps, wall time, the selected step and its
held-out chain acceptance (``chain_tau``), and each head's held-out top-1. Runs compared
in one table should share their held-out conversations (``--eval-conversations``).

    python scripts/heads_report.py runs/pilot-v2-clover runs/full-v2-clover ...
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def row(run: Path) -> str:
    """One table row for the run folder ``run``.

    Raises:
        FileNotFoundError: when the run has no training.json (unfinished).
    """
    t = json.loads((run / "training.json").read_text())
    cfg, sel = t["config"], t.get("selected") or {}
    best = next((e for e in t["evals"] if e["step"] == sel.get("step")), t["evals"][-1])
    heads = sorted(k for k in best if k.startswith("head"))
    top1 = " / ".join(f"{100 * best[h]['top1']:.1f}" for h in heads)
    return (f"| {run.name} | {cfg['method']} | {t['train_conversations']:,} | {t['steps']:,} | "
            f"{t['wall_s'] / 60:.0f} min | {best['step']:,} | {best['chain_tau']:.3f} | {top1} |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="run folders (clover train --out)")
    args = ap.parse_args(argv)
    print("| run | kind | conversations | steps | wall | selected step | held-out chain tau | "
          "top-1 per head (%) |")
    print("|---|---|---|---|---|---|---|---|")
    for run in map(Path, args.runs):
        try:
            print(row(run))
        except FileNotFoundError:
            print(f"| {run.name} | (not finished) | | | | | | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
