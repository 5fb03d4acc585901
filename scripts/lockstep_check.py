"""The page's way of timing (methods in lockstep) against the bench's (each method alone),
in one process with no server and no browser.

    python scripts/lockstep_check.py --rounds 5

Each round, on one prompt and tree: the five methods in lockstep as the page runs them
(:func:`app.runner.run_methods`'s loop), the three of the bench in lockstep, and the three
one after another, each alone; the speedups over plain decoding are
:func:`clover.trace.speedup`, over the rounds both ran for lockstep runs (as the page's
cards), at the same token count for solo runs (as ``clover bench``). Prints each round
and the medians: where "lock5" and "solo" agree, the page's mechanism says what the bench
says, and a gap between the page and ``clover bench`` (``scripts/page_check.py``) comes
from what runs beside the page (its server, a browser).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PROMPT = "Why do we see lightning before we hear thunder?"
MEASURED = ("medusa", "clover")


def main() -> None:
    from app import registry, runner
    from app.settings import parse_settings
    from clover.trace import engine_ms, speedup

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--tree", default="dynamic:budget=2")
    ap.add_argument("--prompt", default=PROMPT)
    args = ap.parse_args()
    loaded = registry.register_model("lockstep-check", registry.open_target(None), warm_up=True)
    settings = parse_settings(args.prompt, "clover", 0.0, args.tokens, args.tree, True, "", "",
                              None, False)
    ids = runner.encode(loaded, settings)

    def decode(methods: list[str]) -> dict:
        runs: dict = {}
        for ev in runner._events(methods, loaded, settings, ids):
            if ev.kind == "start":
                runs[ev.method] = []
            elif ev.kind == "step":
                runs[ev.method].append(ev.step)
        return runs

    modes = {"lock5": ["clover", "ar", "lookup", "medusa", "clover2"],
             "lock3": ["ar", "medusa", "clover"], "solo": None}
    out: dict = {mode: [] for mode in modes}
    for r in range(args.rounds):
        for mode, methods in modes.items():
            if methods is None:
                runs = {m: decode([m])[m] for m in ("ar", *MEASURED)}
            else:
                runs = decode(methods)
            ratios = {m: speedup(runs[m], runs["ar"], lockstep=methods is not None)
                      for m in MEASURED}
            out[mode].append(ratios)
            step = {m: round(statistics.median(engine_ms(s) for s in runs[m]), 1)
                    for m in ("ar", *MEASURED)}
            print(f"round {r + 1} {mode}: " + ", ".join(f"{m} {x:.3f}x" for m, x in ratios.items())
                  + f" (median step ms {step})", flush=True)
    for mode, rounds in out.items():
        print(f"{mode} medians: " + ", ".join(
            f"{m} {statistics.median(x[m] for x in rounds):.3f}x" for m in MEASURED))


if __name__ == "__main__":
    main()
