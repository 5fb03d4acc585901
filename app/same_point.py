"""Clover and Medusa at the same point: both methods' candidate trees drafted from the
same committed text, side by side, with one sentence on what differs.

This is the paper's point made visible (Clover, arXiv 2405.00263, Sec. 3): Medusa's
heads all guess from one hidden state, while Clover's heads read the token drafted just
before theirs (the Regressive Connection), so its deeper drafts follow its own earlier
ones. Under greedy decoding both methods write the same text, so their traces start
steps at many common points (the same number of committed tokens); the pair shown is the
displayed step's, or the nearest earlier point both started a step at. Pure functions of
the traces, like :mod:`app.step_panels`; nothing is recomputed with the model.
"""
from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Mapping, Sequence

from app.figures import escape_token
from app.metrics import token_origins
from clover.methods import METHOD_LABELS, split_method, with_lookup
from clover.trace import StepTrace


@dataclass(frozen=True)
class SamePoint:
    """Two methods' steps that started from the same committed text.

    Attributes:
        clover / medusa: the methods compared (e.g. "clover" and "medusa", or both with
            "+lookup").
        clover_step / medusa_step: 0-based indices into their traces.
        tokens: committed tokens before both steps.
        exact: True when the step on display is one of the two (else the nearest earlier
            common point is shown).
    """

    clover: str
    medusa: str
    clover_step: int
    medusa_step: int
    tokens: int
    exact: bool


def _starts(steps: Sequence[StepTrace]) -> dict[int, int]:
    """Committed tokens before each step -> the step's index (single-row traces)."""
    return {s.total_tokens - s.accepted_length: i for i, s in enumerate(steps)}


def pair_for(method: str, available: Sequence[str]) -> tuple[str, str] | None:
    """The (Clover-kind, Medusa) methods to compare while ``method``'s trace is on
    display: Clover-2 against Medusa when Clover-2 is on display, else Clover; the heads'
    lookup variants together (prompt lookup alone: the plain pair). None where the run
    lacks either."""
    kind, lookup = split_method(method)
    lookup = lookup and kind is not None  # prompt lookup alone: the heads' plain pair
    clover = method if kind in ("clover", "clover2") else with_lookup("clover", lookup)
    medusa = with_lookup("medusa", lookup)
    for c, m in ((clover, medusa), ("clover", "medusa")):
        if c in available and m in available:
            return c, m
    return None


def same_point(runs: Mapping[str, Sequence[StepTrace]], method: str, i: int) -> SamePoint | None:
    """The Clover and Medusa steps that started from the same text as step ``i`` of
    ``method``'s trace (0-based), or from the nearest earlier text both started a step
    at; None where the run lacks Clover or Medusa."""
    pair = pair_for(method, [m for m, s in runs.items() if s])
    if pair is None:
        return None
    clover, medusa = pair
    steps = runs[method] if runs.get(method) else runs[clover]
    i = min(max(i, 0), len(steps) - 1)
    at = steps[i].total_tokens - steps[i].accepted_length
    c, m = _starts(runs[clover]), _starts(runs[medusa])
    common = [t for t in c if t in m and t <= at]
    tokens = max(common) if common else 0  # both first steps start at 0
    if tokens not in c or tokens not in m:
        return None
    return SamePoint(clover, medusa, c[tokens], m[tokens], tokens, tokens == at)


def _tok(text: str) -> str:
    return f"“{html.escape(escape_token(text), quote=False)}”"


def _drafts_at(step: StepTrace, depth: int) -> list[str]:
    """The texts of the drafts at ``depth`` under the step's accepted path (children of
    its accepted node at ``depth - 1``)."""
    if depth - 1 >= len(step.accepted):
        return []
    parent = step.accepted[depth - 1]
    return [n.text for n in step.nodes if n.parent == parent and n.depth == depth]


def describe(point: SamePoint, runs: Mapping[str, Sequence[StepTrace]]) -> str:
    """One sentence (Markdown) on what differs between the two trees of ``point``: how
    many drafts each had accepted, and at the first depth where one method missed, what
    the target wanted and what each drafted there, naming Clover's regressive input."""
    cs, ms = runs[point.clover][point.clover_step], runs[point.medusa][point.medusa_step]
    names = METHOD_LABELS[point.clover], METHOD_LABELS[point.medusa]
    # the committed text, token by token (greedy: one text for both methods)
    texts = [t.text for t in token_origins(runs[point.clover])]
    tail = "".join(texts[:point.tokens])[-24:]
    where = (f"After {point.tokens} tokens (…{_tok(tail)})" if point.tokens
             else "At the first step (right after the prompt)")
    if not point.exact:
        where += ", the nearest point both methods started a step at"
    a_c, a_m = len(cs.accepted) - 1, len(ms.accepted) - 1
    counts = (f"{where}: {names[0]} drafted {len(cs.nodes) - 1} tokens and had **{a_c}** "
              f"accepted, {names[1]} drafted {len(ms.nodes) - 1} and had **{a_m}** accepted.")
    after = texts[point.tokens:]  # the target's continuation from this point
    d = min(a_c, a_m) + 1
    if d > len(after):
        return counts
    wanted = _tok(after[d - 1])
    if a_c == a_m:
        return (counts + f" At depth {d} the target wanted {wanted}, which neither tree "
                f"had drafted there.")
    win, lose = (cs, ms) if a_c > a_m else (ms, cs)
    win_name, lose_name = names if a_c > a_m else names[::-1]
    lost = _drafts_at(lose, d)
    lost_text = (f"{lose_name}'s draft{'s' if len(lost) > 1 else ''} there "
                 f"{'were' if len(lost) > 1 else 'was'} {', '.join(_tok(t) for t in lost[:3])}"
                 if lost else f"{lose_name}'s tree drafted nothing there")
    if win is cs:
        came = ("the root token " + _tok(cs.nodes[0].text) if d == 1
                else "its own depth-" + str(d - 1) + " draft " + _tok(after[d - 2]))
        why = (f"{win_name}'s head {d} drafted {wanted}, reading {came} as its regressive "
               f"input; {lost_text}, each of {lose_name}'s heads guessing from the same hidden "
               f"state alone.")
    else:
        why = f"{win_name} drafted {wanted} there; {lost_text}."
    return counts + f" At depth {d} the target wanted {wanted}: " + why
