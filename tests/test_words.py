"""The repository speaks of itself by version, date or commit, never by numbered work
period or issue number.

Forbidden, case-insensitive, in every git-tracked text file: a numbered session, issue,
stop, work period or sprint ("session 12", "Issue 14's", "issue #14", "issues 14 and
15", "stop 29") and a bare "#14"-style reference (one to three digits after a space or
an opening parenthesis). The project's own history belongs in git. Allowed: the word
"issue" without a number, arXiv ids, hex colours (letters follow the digits) and
version numbers. Skipped: binary files, the generated prompt sets
(``assets/prompts/*.jsonl``, text the target or ShareGPT wrote, not the project) and
this file's own examples.
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN = re.compile(
    r"\b(sessions?|issues?|stops?|work periods?|sprints?)[ -]*(#|no\.? ?)?[0-9]+"
    r"|\b(session|issue)s? [0-9]+ (and|to|-) [0-9]+"
    r"|(^|[ (])#[0-9]{1,3}\b",
    re.IGNORECASE)
SKIP = ("assets/prompts/",)


def offending_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) of every line with a forbidden reference."""
    return [(n, line) for n, line in enumerate(text.splitlines(), 1) if FORBIDDEN.search(line)]


def tracked_text_files() -> list[Path]:
    names = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.splitlines()
    out = []
    for name in names:
        path = ROOT / name
        if (any(name.startswith(s) and name.endswith(".jsonl") for s in SKIP) or not path.is_file()
                or name == "tests/test_words.py"):  # its own examples
            continue
        head = path.read_bytes()[:8192]
        if b"\0" in head or name.endswith((".gz", ".png", ".safetensors")):
            continue
        out.append(path)
    return out


def test_pattern_catches_the_shapes_it_forbids():
    bad = ["(session 9)", "Session 8, the hybrid", "issue 14's targets", "Issue #31", "issues 14 and 15",
           "stop 29: landed", "see #14 for", "(#7)", "work period 3", "issue-16"]
    good = ["an issue with the cache", "arXiv 2405.00263", "color #1f77b4", "v3 heads", "version 0.1.2",
            "sessions of the app", "top 5 tokens", "step 3,500"]
    assert all(FORBIDDEN.search(s) for s in bad), [s for s in bad if not FORBIDDEN.search(s)]
    assert not any(FORBIDDEN.search(s) for s in good), [s for s in good if FORBIDDEN.search(s)]


def test_no_numbered_work_periods_or_issues_in_the_repository():
    found = []
    for path in tracked_text_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        found += [f"{path.relative_to(ROOT)}:{n}: {line.strip()[:120]}" for n, line in offending_lines(text)]
    assert not found, "name things by version, date or commit instead:\n" + "\n".join(found)
