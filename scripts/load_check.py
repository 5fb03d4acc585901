"""The app's speed cards on an idle machine and beside CPU hogs, for the same prompt.

    python scripts/load_check.py --runs 3 --hogs 2 --out ~/.cache/clover-studio/load-check.json

Runs the app's Run handler (default settings: watch Clover, compare with the others,
64 new tokens, greedy, auto tree) ``--runs`` times idle, then as many times with
``--hogs`` CPU-bound processes beside it, and reports each run's "speedup vs plain" and
"speedup vs Medusa" cards, their medians and the loaded/idle ratio (1.0 = unchanged by
the load). The hogs are stopped however the script ends.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

PROMPT = "Explain why the sky is blue in two sentences."


def paired(steps, base) -> float:
    """The alternative estimator: the median over lockstep rounds of the baseline's step
    time over the method's, times the ratio of their tokens per step."""
    ratios = [(b.draft_ms + b.verify_ms) / (s.draft_ms + s.verify_ms) for s, b in zip(steps, base)]
    tau = (steps[-1].total_tokens / len(steps)) / (base[-1].total_tokens / len(base))
    return statistics.median(ratios) * tau


def cards(on_run, visitor_cls, tokens: int) -> dict:
    from app.metrics import speedup

    out = list(on_run(PROMPT, "clover", 0, tokens, "auto", True, "", "", 0, False, visitor_cls()))
    st = out[-1][-1]
    live = st.runs["clover"]
    return {"vs_plain": speedup(live, st.runs["ar"]), "vs_medusa": speedup(live, st.runs["medusa"]),
            "vs_plain_paired": paired(live, st.runs["ar"]),
            "vs_medusa_paired": paired(live, st.runs["medusa"]),
            "plain_step_ms": statistics.median(s.draft_ms + s.verify_ms for s in st.runs["ar"]),
            "same_text": len({tuple(r.token_ids) for r in st.results.values()}) == 1}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--hogs", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--out", default=None)
    ap.add_argument("--loaded-threads", type=int, default=0,
                    help="torch threads while the hogs run (0: unchanged)")
    args = ap.parse_args(argv)

    from app.run_handler import Visitor
    from app.ui import build_demo

    demo = build_demo(warm_up=True)
    on_run = next(f.fn for f in demo.fns.values() if f.fn is not None and f.fn.__name__ == "on_run")
    report: dict = {"prompt": PROMPT, "tokens": args.tokens, "hogs": args.hogs}
    report["idle"] = [cards(on_run, Visitor, args.tokens) for _ in range(args.runs)]
    import torch

    threads = torch.get_num_threads()
    report["threads"] = {"idle": threads, "loaded": args.loaded_threads or threads}
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.hogs)]
    try:
        if args.loaded_threads:
            torch.set_num_threads(args.loaded_threads)
        report["loaded"] = [cards(on_run, Visitor, args.tokens) for _ in range(args.runs)]
    finally:
        torch.set_num_threads(threads)
        for h in hogs:
            h.kill()
    for card in ("vs_plain", "vs_medusa", "vs_plain_paired", "vs_medusa_paired", "plain_step_ms"):
        idle = statistics.median(r[card] for r in report["idle"])
        loaded = statistics.median(r[card] for r in report["loaded"])
        report[card] = {"idle": round(idle, 3), "loaded": round(loaded, 3),
                        "loaded_over_idle": round(loaded / idle, 3)}
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        Path(args.out).expanduser().write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
