"""Prompt lookup settings, measured without timing noise.

With greedy decoding, what lookup drafts and what the target accepts depend only on the
token sequence, so tokens per step can be replayed exactly from the plain greedy answers:
the target is run once per prompt (plain decoding), then each lookup setting drafts
against the known answer, step by step, as ``clover.lookup.LookupDrafter`` does in the
engine (accepted = the longest prefix of the chain that the answer continues with, plus
the bonus token). No timing is involved, so a busy machine gives the same numbers.

    python scripts/lookup_ablation.py --prompts ../shared/data/spec_bench/question.jsonl \\
        --max-prompts 39 --out runs/lookup-ablation.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def replay(prompt: list[int], answer: list[int], cfg, costs=()) -> tuple[int, int, float]:
    """(steps, tokens, modelled verify ms) of lookup decoding over a known greedy
    ``answer`` (:func:`clover.replay.replay_greedy`): a fixed chain length, or with
    ``cfg.costs`` the length that pays on that cost curve (as the engine sizes it), each
    step costing ``verify_ms`` of its tree on ``costs or cfg.costs`` (0 without either)."""
    costs = costs or cfg.costs
    from clover.lookup import LookupDrafter, verify_ms
    from clover.replay import replay_greedy

    steps = replay_greedy(LookupDrafter(cfg), prompt, answer)
    ms = sum(verify_ms(costs, len(s.tree)) for s in steps) if costs else 0.0
    return len(steps), len(answer), ms


def main(argv=None) -> int:
    import torch

    from clover import load_target
    from clover.training.prompts import interleave_categories, read_prompts
    from clover.lookup import PREFER, LookupConfig
    from clover.replay import greedy_answers, settings_table

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--max-prompts", type=int, default=39)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=str(ROOT / "runs" / "lookup-ablation.json"))
    ap.add_argument("--costs", default="",
                    help="verify cost curve, ms for 1, 2, ... tokens, comma-separated: also "
                         "replay each setting with chains sized to it, and report the "
                         "modelled speedup over plain decoding (tokens * costs[0] / verify ms)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    prompts = interleave_categories(read_prompts(args.prompts))[: args.max_prompts]
    # the greedy answers are kept beside the output, so later runs replay at once
    runs = greedy_answers(lambda: load_target(None, device="cpu"), prompts, args.max_new_tokens,
                          Path(args.out).with_suffix(".answers.json"))
    costs = tuple(float(c) for c in args.costs.split(",") if c.strip())
    settings = {f"{prefer}, n<={n}, L={L}": LookupConfig(max_ngram=n, max_tokens=L, prefer=prefer)
                for prefer in PREFER for n in (2, 3, 4) for L in (4, 10)}
    if costs:
        settings.update({f"{prefer}, n<={n}, sized": LookupConfig(max_ngram=n, max_tokens=len(costs) - 1,
                                                                   prefer=prefer, costs=costs)
                         for prefer in PREFER for n in (2, 3, 4)})
    tables: dict[str, dict] = {"tokens_per_step": {}, "modelled_speedup": {}}
    for name, cfg in settings.items():
        per_cat: dict[str, list[tuple[float, float]]] = {}
        for cat, ids, answer in runs:
            steps, tokens, ms = replay(ids, answer, cfg, costs)
            per_cat.setdefault(cat, []).append((tokens / steps, tokens * costs[0] / ms if ms else 0.0))
        per_cat["all"] = [x for v in per_cat.values() for x in v]
        for k, key in enumerate(tables):
            if key == "modelled_speedup" and not costs:
                continue
            tables[key][name] = {c: round(statistics.fmean(x[k] for x in v), 3)
                                 for c, v in sorted(per_cat.items())}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"prompts": args.prompts, "n": len(runs),
                                          "max_new_tokens": args.max_new_tokens, "costs": costs,
                                          **tables}, indent=1) + "\n")
    for key, table in tables.items():
        if not table:
            continue
        print(settings_table(key, table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
