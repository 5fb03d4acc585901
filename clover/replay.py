"""Greedy replay: a drafter's decoding steps over an answer already known, without
running the target step by step.

Under greedy decoding, what a drafter drafts and what verification accepts depend only on
the token sequence and the target's hidden states along it, and one target forward over
prompt + answer gives those states. So the engine's steps (:class:`clover.engine.Engine`:
draft a tree from the root, accept the longest drafted path the answer continues with,
commit it and the bonus token, let the drafter observe the committed positions) can be
replayed exactly, and cheaply: no verification forwards, no timing, so a busy machine
gives the same numbers. ``scripts/lookup_ablation.py`` replays prompt lookup settings this
way.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from clover.tree import Tree


@dataclass
class ReplayStep:
    """One replayed decoding step: the drafted ``tree`` (root = the last committed token)
    and how many of its drafts verification accepts (``accepted``; the step commits
    ``accepted + 1`` tokens with the bonus token)."""

    tree: Tree
    accepted: int


def replay_greedy(drafter, prompt: Sequence[int], answer: Sequence[int],
                  hidden_pre: torch.Tensor | None = None, hidden_post: torch.Tensor | None = None,
                  max_depth: int | None = None) -> list[ReplayStep]:
    """The engine's greedy steps for a fresh ``drafter`` producing ``answer`` after ``prompt``.

    Args:
        drafter: a fresh :class:`~clover.heads.drafter.Drafter` for one run.
        prompt: (P,) token ids, P >= 1.
        answer: the target's greedy continuation of ``prompt``.
        hidden_pre, hidden_post: (P + len(answer), D) the target's states before and
            after the final norm over prompt + answer (position p's state is the one
            that predicts token p + 1); None for drafters that read only tokens (prompt
            lookup).
        max_depth: the deepest draft of a step (default: the answer's remaining tokens
            less the bonus, as the engine caps it).
    Returns:
        one :class:`ReplayStep` per decoding step; their ``accepted + 1`` sum to
        ``len(answer)``.
    Raises:
        ValueError: for an empty prompt, or states that do not cover prompt + answer.
    """
    seq = [int(t) for t in prompt] + [int(t) for t in answer]
    n = len(prompt)
    if n < 1:
        raise ValueError("replay_greedy needs a prompt of at least one token")
    if hidden_pre is not None and (len(hidden_pre) < len(seq) or hidden_post is None or len(hidden_post) < len(seq)):
        raise ValueError(f"the hidden states cover {len(hidden_pre)} positions, not prompt + answer ({len(seq)})")

    def observe(start: int, end: int) -> None:  # the committed positions start .. end - 1
        pre = post = None
        if hidden_pre is not None:
            pre, post = hidden_pre[start:end], hidden_post[start:end]
        drafter.observe(pre, post, seq[start:end])

    observe(0, n - 1)
    pos, steps = n - 1, []  # pos: the root's position
    while pos < len(seq) - 1:
        left = len(seq) - 1 - pos  # tokens still to produce, the bonus one included
        depth = left - 1 if max_depth is None else min(max_depth, left - 1)
        tree = drafter.draft(seq[pos], depth)
        k = min(tree.matched_path(seq[pos + 1:]), left - 1)
        steps.append(ReplayStep(tree, k))
        observe(pos, pos + k + 1)
        pos += k + 1
    return steps


def greedy_answers(target, prompts: Sequence[dict], max_new_tokens: int, cache=None,
                   progress: bool = True) -> list[tuple[str, list[int], list[int]]]:
    """Plain greedy answers to the first turn of each Spec-Bench-format prompt, the
    input of :func:`replay_greedy`; kept in the JSON file ``cache`` (keyed by the prompts
    and ``max_new_tokens``) so later runs skip the target's decoding.

    Args:
        target: a :class:`~clover.models.target.TargetModel`, or a callable returning
            one (only called when the answers are not cached).
        prompts: records with ``"turns"`` and ``"category"``.
        max_new_tokens: answer length cap.
        cache: a JSON path or None.
    Returns:
        per prompt, (category, prompt ids, answer ids).
    """
    import hashlib
    import json
    from pathlib import Path

    from tqdm.auto import tqdm

    from clover.engine import Engine
    from clover.models import encode_prompt

    key = hashlib.sha256(json.dumps([[p["category"], p["turns"][0]] for p in prompts]).encode()).hexdigest()[:16]
    key = {"prompts": key, "n": len(prompts), "max_new_tokens": max_new_tokens}
    if cache is not None and Path(cache).is_file():
        saved = json.loads(Path(cache).read_text())
        if saved.get("key") == key:
            return [tuple(r) for r in saved["runs"]]
    if callable(target) and not hasattr(target, "tokenizer"):
        target = target()
    runs = []
    for p in tqdm(prompts, desc="greedy answers", disable=not progress):
        ids = encode_prompt(target.tokenizer, p["turns"][0])
        runs.append((p["category"], ids, Engine(target).generate(ids, max_new_tokens).token_ids))
    if cache is not None:
        Path(cache).parent.mkdir(parents=True, exist_ok=True)
        Path(cache).write_text(json.dumps({"key": key, "runs": runs}))
    return runs


def settings_table(title: str, table: dict[str, dict[str, float]], first: str = "setting") -> str:
    """A replay sweep's results as a Markdown table under ``title``: one row per setting
    (``table``'s keys, shown as given), one column per key of its rows (e.g. a category's
    mean tokens per step), two decimals."""
    cols = list(next(iter(table.values())))
    lines = [f"\n{title}\n", f"| {first} | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
    lines += [f"| {name} | " + " | ".join(f"{row[c]:.2f}" for c in cols) + " |" for name, row in table.items()]
    return "\n".join(lines)
