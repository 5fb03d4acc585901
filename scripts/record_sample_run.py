"""Record the run a fresh page plays before any press (``assets/sample_run.json``).

    python scripts/record_sample_run.py            # on an idle machine

Loads the embedded model with its shipped heads, sizes the auto trees as the app does at
start-up (a stored sizing is reused), then decodes the first example prompt
(``assets/examples.json``) greedily with every method, as the page's Run does
(:func:`app.sample_run.record`). Re-run it whenever the shipped heads change: a page
whose heads differ from the recorded ones does not show the recording, and
``tests/test_sample_run.py`` fails until it is re-recorded. Its timings are this
machine's, so record on an idle machine.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    from app import registry, sample_run
    from app.decode_tab import load_examples
    from app.settings import DEFAULT_MAX_NEW_TOKENS
    from clover.machine import machine_busy
    from clover.trace import speedup

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None,
                        help="where to write it (default: assets/sample_run.json)")
    parser.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS)
    args = parser.parse_args()
    if machine_busy():
        print("warning: other processes are using the CPU; the recorded timings will be "
              "slower than this machine's idle ones", file=sys.stderr)
    target = registry.open_target(None)
    loaded = registry.register_model("record", target, warm_up=True)
    prompt = load_examples()[0]["prompt"]
    sample = sample_run.record(loaded, prompt, max_new_tokens=args.max_new_tokens)
    path = sample_run.save(sample, args.out)
    plain = sample.runs.get("ar", [])
    for m, steps in sample.runs.items():
        ratio = speedup(steps, plain, lockstep=True) if m != "ar" else None  # as the page
        print(f"{m:>14}: {len(steps):3d} steps, {sample.results[m].mean_accepted_length:.2f} "
              f"tokens/step" + (f", {ratio:.2f}x plain" if ratio else ""))
    print(f"wrote {path} ({path.stat().st_size / 1e3:.0f} kB), recorded {sample.where()}")


if __name__ == "__main__":
    main()
