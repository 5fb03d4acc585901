#!/usr/bin/env python3
"""Prompts for the task kinds where the draft heads are weakest on Spec-Bench: translation
into English and summarisation of long passages (the task-mix lever, docs/training.md).

The project's templated set has 430 short invented prompts per kind; Spec-Bench asks the
target to translate real German sentences (WMT) and to summarise news articles, and the
target's answers to those (copying the German, "The German word ... translates to ...",
long summaries) are what the heads must learn. The source text here is real but not the
project's, so the prompt file is written under the cache directory, never committed:

* **German sentences** from the Debian package ``fortunes-de`` (GPL-2+; its ``*.u8``
  files, copied to ``$CLOVER_CACHE_DIR/sources/fortunes-de``: ``apt-get download
  fortunes-de && dpkg-deb -x fortunes-de_*.deb x``) and the German human turns of the
  ShareGPT package, cut into sentences of 5 to 40 words, each wrapped in a translation
  instruction (most in Spec-Bench's own short form, "Translate German to English: ...").
* **Long English passages**: ShareGPT human turns of 800 to 2,600 characters that read
  as prose (no code, few line breaks), wrapped in a summarisation instruction.

Every prompt near a Spec-Bench or held-out prompt is dropped (``overlap_filter``).

Usage::

    python scripts/weak_task_prompts.py --out ~/.cache/clover-studio/prompts/weak-v1.jsonl
    python scripts/weak_task_prompts.py --out ~/.cache/clover-studio/prompts/weak-v2.jsonl \
        --translation-from 2000 --translation 4000 --summaries-from 450 --summaries 600

The same seed shuffles the same sources the same way, so a later set (``--*-from``) never
repeats an earlier one's sentences or passages, and its question ids continue theirs.
"""
from __future__ import annotations

import argparse
import json
import random
import re
from pathlib import Path

from clover.assets import cache_root
from clover.training.prompts import (iter_json_array, is_english, normalise, overlap_filter,
                                     reference_texts, sharegpt_path)

CACHE = cache_root()
DE_WORDS = set("der die das und ist nicht ich sie wir mit für auf ein eine den dem des zu von "
               "sich auch es wie bei oder aus werden wird sind".split())
TRANSLATE = ["Translate German to English: {s}"] * 6 + [
    "Translate this German sentence into English: {s}",
    "Please translate into English:\n{s}",
    "What does this mean in English? {s}",
    "German: {s}\nEnglish:",
]
SUMMARISE = ["Summarize: {s}"] * 4 + [
    "Summarize the following text:\n\n{s}",
    "Write a short summary of this:\n{s}",
    "{s}\n\nSummarize the text above in a few sentences.",
    "TL;DR of the following:\n{s}",
]


def sentences(text: str, lo: int = 5, hi: int = 40) -> list[str]:
    """Sentences of ``lo`` to ``hi`` words that start with a capital, without markup."""
    out = []
    for s in re.split(r"(?<=[.!?])\s+|\n\s*\n", text):
        s = " ".join(s.split())
        if lo <= len(s.split()) <= hi and re.match(r"^[A-ZÄÖÜ]", s) and not re.search(r"[{}<>#`|@\\]|http|--", s):
            out.append(s)
    return out


def fortune_sentences(folder: Path) -> list[str]:
    out = []
    for f in sorted(folder.glob("*.u8")):
        for entry in f.read_text(encoding="utf-8", errors="ignore").split("\n%\n"):
            out += sentences(entry)
    return out


def sharegpt_texts() -> tuple[list[str], list[str]]:
    """(German sentences, long English prose passages) from ShareGPT human turns."""
    text = Path(sharegpt_path()).read_text(encoding="utf-8")
    german, prose = [], []
    for conv in iter_json_array(text):
        if not isinstance(conv, dict):
            continue
        for m in conv.get("conversations") or []:
            if not isinstance(m, dict) or m.get("from") != "human" or not isinstance(m.get("value"), str):
                continue
            v = m["value"]
            w = re.findall(r"[a-zäöüß]+", v.lower())
            if len(w) >= 8 and sum(x in DE_WORDS for x in w) / len(w) > 0.15:
                german += sentences(v)
            elif (800 <= len(v) <= 2600 and is_english(v) and v.count("\n") <= 12
                  and not re.search(r"```|[{}<>;=]|http|\bdef\b|\bfunction\b", v)
                  and sum(ch.isalpha() or ch.isspace() for ch in v) / len(v) > 0.93):
                prose.append(v.strip())
    return german, prose


def unique(texts: list[str]) -> list[str]:
    seen, out = set(), []
    for t in texts:
        k = normalise(t)
        if k not in seen:
            seen.add(k)
            out.append(t)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(CACHE / "prompts" / "weak-v1.jsonl"))
    ap.add_argument("--fortunes", default=str(CACHE / "sources" / "fortunes-de"))
    ap.add_argument("--translation", type=int, default=2000, help="most translation prompts")
    ap.add_argument("--summaries", type=int, default=450, help="most summarisation prompts")
    ap.add_argument("--translation-from", type=int, default=0,
                    help="skip this many German sentences (a later set: weak-v2 starts at 2000)")
    ap.add_argument("--summaries-from", type=int, default=0,
                    help="skip this many passages (a later set: weak-v2 starts at 450)")
    ap.add_argument("--exclude", action="append",
                    default=["../shared/data/spec_bench/question.jsonl", "assets/prompts/heldout.jsonl"])
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    german, prose = sharegpt_texts()
    if Path(a.fortunes).is_dir():
        german += fortune_sentences(Path(a.fortunes))
    german, prose = unique(german), unique(prose)
    rng.shuffle(german)
    rng.shuffle(prose)
    rows = [{"question_id": f"weak-translation:{i}", "category": "translation",
             "turns": [rng.choice(TRANSLATE).format(s=s)]} for i, s in enumerate(german[a.translation_from: a.translation_from + a.translation],
                                                    start=a.translation_from)]
    rows += [{"question_id": f"weak-summarization:{i}", "category": "summarization",
              "turns": [rng.choice(SUMMARISE).format(s=s)]} for i, s in enumerate(prose[a.summaries_from: a.summaries_from + a.summaries],
                                                     start=a.summaries_from)]
    kept, dropped = overlap_filter(rows, reference_texts(a.exclude))
    rng.shuffle(kept)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    with open(a.out, "w", encoding="utf-8") as f:
        for p in kept:
            f.write(json.dumps(p, ensure_ascii=False) + "\n")
    by = {}
    for p in kept:
        by[p["category"]] = by.get(p["category"], 0) + 1
    print(f"German sentences {len(german)}, prose passages {len(prose)}; wrote {len(kept)} "
          f"({by}), dropped {len(dropped)} near the benchmark -> {a.out}")


if __name__ == "__main__":
    main()
