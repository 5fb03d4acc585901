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


def summary(results: dict) -> dict:
    """``summary["all"]`` as ``clover.bench.summarize`` computes it today, from the run
    records the file holds (files written before the speedup became a ratio of totals
    hold the per-prompt mean in their own summary)."""
    from clover.bench import BenchConfig, RunRecord, summarize

    records = [RunRecord(**r) for r in results["runs"]]
    cfg = BenchConfig(methods=tuple(results["summary"]["all"]),
                      temperature=results["meta"]["config"]["temperature"])
    return summarize(records, cfg)["all"]


def render(results: dict, source: str) -> str:
    """Markdown: one row per method of the summary over all prompts (tokens/s, tokens per
    step, speedup over plain, same text as plain), then where the numbers come from."""
    meta, rows = results["meta"], summary(results)
    lines = ["| method | tokens/s | tokens per step | speedup vs plain | per question: geo-mean "
             "(p10-p90) | same text as plain |", "|---|---|---|---|---|---|"]
    for method, e in rows.items():
        same = "-" if method == "ar" else ("yes" if e.get("all_match_plain") else "**no**")
        lines.append(f"| {NAMES.get(method, method)} | {e['tokens_per_second']:.1f} | "
                     f"{e['mean_accepted_length']:.2f} | {e['speedup']:.2f}x | "
                     f"{e['speedup_geomean']:.2f}x ({e['speedup_p10']:.2f}-{e['speedup_p90']:.2f}) | "
                     f"{same} |")
    versions = ", ".join(f"{k} {meta[k]}" for k in ("python", "torch", "transformers") if k in meta)
    date = meta.get("date") or (re.findall(r"\d{4}-\d{2}-\d{2}", meta["command"]) or [""])[-1]
    n = meta.get("n_prompts")
    lines += ["", f"Greedy, {n} Spec-Bench questions, {meta['config']['max_new_tokens']} new tokens, "
              f"on {meta.get('processor') or 'a CPU'} ({meta.get('cpu_count')} cores, "
              f"{meta.get('torch_threads')} torch threads, {meta.get('dtype')}), {date}; "
              f"{versions}. Tokens/s and speedup are ratios of totals: all questions' tokens over all "
              f"their decode time, and that over plain decoding's. "
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
