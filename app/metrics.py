"""Numbers the app shows, computed from :class:`~clover.trace.StepTrace` records only.

No Gradio, no torch: a list of step traces in, plain Python values out. Times are the
engine's own per-step ``draft_ms + verify_ms`` (what decoding cost), never the time the
app spent rendering between steps.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

from clover.trace import (StepTrace, acceptance_by_depth, engine_ms, speedup,  # noqa: F401  (the one
                          time_to_tokens, timeline, tokens_at)                  # definitions)

# Status of a node in a step's candidate tree (plus the bonus token drawn after it).
# CUT: accepted by verification but after the end of generation, so never committed.
ROOT, ACCEPTED, BONUS, REJECTED, CUT = "root", "accepted", "bonus", "rejected", "cut"



def node_statuses(step: StepTrace) -> list[str]:
    """Status of every node of ``step.nodes``: root, accepted (committed) draft, draft
    accepted after the end of generation (cut) or rejected draft."""
    accepted, cut = set(step.accepted), set(step.cut)
    return [ROOT if n.parent < 0 else ACCEPTED if n.id in accepted else CUT if n.id in cut
            else REJECTED for n in step.nodes]


@dataclass
class RunStats:
    """Headline figures of a (possibly unfinished) run.

    Attributes:
        steps: decode steps so far.
        tokens: tokens committed so far.
        engine_ms: total engine time (draft + verify), ms.
        tokens_per_step: mean tokens committed per step (tau), bonus included.
        tokens_per_second: tokens per second of engine time.
        draft_ms / verify_ms: mean drafting and verification time per step, ms.
    """

    steps: int
    tokens: int
    engine_ms: float
    tokens_per_step: float
    tokens_per_second: float
    draft_ms: float
    verify_ms: float


def run_stats(steps: Sequence[StepTrace]) -> RunStats:
    """Headline figures of the steps so far (all zero for no steps)."""
    if not steps:
        return RunStats(0, 0, 0.0, 0.0, 0.0, 0.0, 0.0)
    n, total = len(steps), sum(engine_ms(s) for s in steps)
    tokens = steps[-1].total_tokens
    return RunStats(
        steps=n, tokens=tokens, engine_ms=total, tokens_per_step=tokens / n,
        tokens_per_second=tokens / (total / 1e3) if total > 0 else 0.0,
        draft_ms=sum(s.draft_ms for s in steps) / n,
        verify_ms=sum(s.verify_ms for s in steps) / n,
    )


def best_step(steps: Sequence[StepTrace]) -> int:
    """Index of the step with the longest accepted path (the first such), 0 for none."""
    return max(range(len(steps)), key=lambda i: (len(steps[i].accepted), -i), default=0)


def accepted_length_counts(steps: Sequence[StepTrace]) -> dict[int, int]:
    """How many steps committed 1, 2, 3, ... tokens (accepted drafts + bonus)."""
    counts: dict[int, int] = {}
    for s in steps:
        counts[s.accepted_length] = counts.get(s.accepted_length, 0) + 1
    return dict(sorted(counts.items()))


@dataclass
class TokenOrigin:
    """How one generated token came about.

    Attributes:
        text: the token decoded on its own.
        depth: the draft depth it was accepted at; 0 when the target produced it itself
            (the bonus token, or every token of plain decoding).
        step: the decode step that committed it.
    """

    text: str
    depth: int
    step: int


def token_origins(steps: Sequence[StepTrace]) -> list[TokenOrigin]:
    """Every committed token in order, with the depth it was drafted at (0 = target).

    Texts are the step's ``new_text`` pieces (a multi-token character appears with the
    token that completes it), so they join to the decoded output; traces without them
    fall back to each token decoded on its own."""
    out: list[TokenOrigin] = []
    for s in steps:
        path = s.accepted[1:]  # committed drafts after the root
        for j, _ in enumerate(s.new_tokens):
            if j < len(path):
                node = s.nodes[path[j]]
                text, depth = node.text, node.depth
            else:
                text, depth = s.bonus_text, 0
            if len(s.new_text) == len(s.new_tokens):
                text = s.new_text[j]
            out.append(TokenOrigin(text, depth, s.step))
    return out


MIN_RATIO_STEPS = 8  # a speedup card shows its ratio once both runs have this many steps
REFERENCE_FILE = "bench/specbench.json"  # under clover.assets_dir(): the README's table


@lru_cache(maxsize=1)
def _reference_summary() -> dict:
    from clover.assets import assets_dir

    try:
        return json.loads((assets_dir() / REFERENCE_FILE).read_text())["summary"]["all"]
    except (OSError, KeyError, ValueError):  # no committed table: the cards show none
        return {}


def reference_speedups(method: str) -> tuple[float | None, float | None]:
    """The committed idle Spec-Bench speedups of ``method`` (the README's table, one
    ``clover bench`` run on a quiet machine): over plain decoding, and over Medusa (with
    its lookup branch when ``method`` has one). None where the table has no figure, and
    for a method against itself."""
    table = _reference_summary()
    mine = table.get(method, {}).get("speedup")
    medusa = "medusa+lookup" if method.endswith("+lookup") else "medusa"
    base = table.get(medusa, {}).get("speedup")
    vs_plain = mine if method != "ar" else None
    vs_medusa = mine / base if mine and base and method != medusa else None
    return vs_plain, vs_medusa
