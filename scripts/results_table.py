"""The README's results table, rendered from a committed ``clover bench`` results.json.

    python scripts/results_table.py assets/bench/specbench.json            # print it
    python scripts/results_table.py assets/bench/specbench.json --write    # into README.md

The README holds it between ``<!-- results:start -->`` and ``<!-- results:end -->``;
``tests/test_docs.py`` fails when the two differ, so the README never quotes a number
that the committed file does not hold.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
START, END = "<!-- results:start -->", "<!-- results:end -->"
NAMES = {"ar": "plain (autoregressive)", "lookup": "prompt lookup", "medusa": "Medusa",
         "clover": "Clover", "clover2": "Clover-2", "medusa+lookup": "Medusa + lookup",
         "clover+lookup": "Clover + lookup", "clover2+lookup": "Clover-2 + lookup"}


def render(results: dict, source: str) -> str:
    """Markdown: one row per method of ``summary["all"]`` (tokens/s, tokens per step,
    speedup over plain, same text as plain), then where the numbers come from."""
    meta, rows = results["meta"], results["summary"]["all"]
    lines = ["| method | tokens/s | tokens per step | speedup vs plain | same text as plain |",
             "|---|---|---|---|---|"]
    for method, e in rows.items():
        same = "-" if method == "ar" else ("yes" if e.get("all_match_plain") else "**no**")
        lines.append(f"| {NAMES.get(method, method)} | {e['tokens_per_second']:.1f} | "
                     f"{e['mean_accepted_length']:.2f} | {e['speedup']:.2f}x | {same} |")
    versions = ", ".join(f"{k} {meta[k]}" for k in ("python", "torch", "transformers") if k in meta)
    date = meta.get("date") or (re.findall(r"\d{4}-\d{2}-\d{2}", meta["command"]) or [""])[-1]
    n = meta.get("n_prompts")
    lines += ["", f"Greedy, {n} Spec-Bench questions, {meta['config']['max_new_tokens']} new tokens, "
              f"on {meta.get('processor') or 'a CPU'} ({meta.get('cpu_count')} cores, "
              f"{meta.get('torch_threads')} torch threads, {meta.get('dtype')}), {date}; "
              f"{versions}. Speedup is the mean over questions of each one's tokens/s over plain's. "
              f"From [`{source}`]({source}), made with:", "", "```bash", meta["command"], "```"]
    return "\n".join(lines)


def readme_block(text: str) -> str:
    """The README's text between the markers (stripped)."""
    m = re.search(re.escape(START) + r"\n(.*?)\n" + re.escape(END), text, re.S)
    if not m:
        raise ValueError(f"README.md has no {START} ... {END} block")
    return m.group(1).strip()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="?", default="assets/bench/specbench.json")
    ap.add_argument("--write", action="store_true", help="replace the README's block")
    args = ap.parse_args(argv)
    table = render(json.loads((ROOT / args.results).read_text()), args.results)
    if args.write:
        text = README.read_text(encoding="utf-8")
        readme_block(text)  # raises without markers
        text = re.sub(re.escape(START) + r"\n.*?\n" + re.escape(END),
                      lambda _: f"{START}\n{table}\n{END}", text, flags=re.S)
        README.write_text(text, encoding="utf-8")
    else:
        print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
