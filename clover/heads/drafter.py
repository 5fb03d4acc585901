"""Drafters: the per-run drafting state of a method, and how a batch's rows draft together.

A *method* is a set of draft heads (an ``nn.Module``) that, for one generation run,
hands out a :class:`Drafter`: a small stateful object with two calls,

* ``observe(hidden_pre, hidden_post, tokens)`` - the target's verified hidden states
  and the token ids of the positions just committed to the KV cache (the prompt after
  prefill, then the accepted path after every step);
* ``draft(root_token, max_depth)`` - the candidate tree for the next step.

The engine owns everything else (verification, acceptance, KV cache), so every method is
compared on identical machinery. Plain decoding is :class:`PlainDrafter`: the empty tree.

A batched run (``clover.engine``) keeps one drafter per row. A drafter may name a
``batch_key``: rows whose drafters have the same key are served together by their
class's ``draft_many(drafters, roots, max_depths)`` and ``observe_many(drafters,
hidden_pre, hidden_post, tokens)`` (the arguments one per row: e.g. one heads call over
all rows); :func:`draft_rows` and :func:`observe_rows` group the rows that way, and every
other row drafts and observes alone. The head methods' drafters derive from
:class:`HeadsDrafter`, whose key is (class, heads) and whose ``draft`` is ``draft_many``
of one row: one batching path, each class supplying only how its ready rows grow.
"""
from __future__ import annotations

from typing import Protocol, Sequence

import torch

from clover.tree import Tree, TreeConfig, grow_trees, root_only


class Drafter(Protocol):
    """Per-run drafting state; see the module docstring."""

    def observe(self, hidden_pre: torch.Tensor, hidden_post: torch.Tensor,
                tokens: Sequence[int]) -> None:
        """Take the target's verified hidden states, each (T, D), and the T token ids at
        those new positions (the prompt but its last token, then each step's root and
        accepted drafts)."""

    def draft(self, root_token: int, max_depth: int) -> Tree:
        """The candidate tree rooted at ``root_token``, at most ``max_depth`` deep."""


def _groups(drafters: Sequence[Drafter]) -> list[list[int]]:
    """Row indices of drafters with the same ``batch_key``; a drafter without one alone."""
    groups: dict = {}
    for i, d in enumerate(drafters):
        key = getattr(d, "batch_key", None)
        groups.setdefault(("alone", i) if key is None else key, []).append(i)
    return list(groups.values())


def observe_rows(drafters: Sequence[Drafter], hidden_pre: Sequence[torch.Tensor],
                 hidden_post: Sequence[torch.Tensor], tokens: Sequence[Sequence[int]]) -> None:
    """Each row's ``observe`` for one step of a batch (the arguments one per row: (T_b, D)
    states and T_b token ids); rows whose drafters share a ``batch_key`` observe together
    (their class's ``observe_many``).

    Raises:
        ValueError: when the lists differ in length.
    """
    if not len(drafters) == len(hidden_pre) == len(hidden_post) == len(tokens):
        raise ValueError("observe_rows needs one drafter, state pair and token list per row")
    for rows in _groups(drafters):
        if len(rows) == 1:
            i = rows[0]
            drafters[i].observe(hidden_pre[i], hidden_post[i], tokens[i])
        else:
            type(drafters[rows[0]]).observe_many([drafters[i] for i in rows], [hidden_pre[i] for i in rows],
                                                 [hidden_post[i] for i in rows], [tokens[i] for i in rows])


def draft_rows(drafters: Sequence[Drafter], roots: Sequence[int], max_depths: Sequence[int]) -> list[Tree]:
    """Each row's candidate tree for one step of a batch, row b's from ``drafters[b]``.

    Rows whose drafters share a ``batch_key`` are drafted together in one ``draft_many``
    call of their class; every other row (and a lone row of a key) by its own ``draft``.

    Raises:
        ValueError: when the three lists differ in length.
    """
    if not len(drafters) == len(roots) == len(max_depths):
        raise ValueError(f"{len(drafters)} drafters, {len(roots)} roots and {len(max_depths)} depths")
    trees: list[Tree | None] = [None] * len(drafters)
    for rows in _groups(drafters):
        if len(rows) == 1:
            trees[rows[0]] = drafters[rows[0]].draft(roots[rows[0]], max_depths[rows[0]])
            continue
        many = type(drafters[rows[0]]).draft_many
        for i, tree in zip(rows, many([drafters[i] for i in rows], [roots[i] for i in rows],
                                      [max_depths[i] for i in rows])):
            trees[i] = tree
    return trees


class PlainDrafter:
    """Plain autoregressive decoding: always the empty tree (root only)."""

    def observe(self, hidden_pre: torch.Tensor, hidden_post: torch.Tensor,
                tokens: Sequence[int]) -> None:
        pass

    def draft(self, root_token: int, max_depth: int) -> Tree:
        return root_only(root_token)


class HeadsDrafter:
    """Base of the head methods' per-run drafters (Medusa, Clover, Clover-2).

    Holds the heads (a :class:`clover.heads.base.DraftHeads`; typed as a module here, so
    that this module does not import the one that imports it), the target and the tree
    settings. Rows of a batch whose drafters are
    of one class with the same heads share a ``batch_key`` and draft together: a
    subclass says which rows have a state to draft from (:meth:`prepare`) and how those
    rows' trees grow together (:meth:`grow`); the others draft their root alone. A single
    row's :meth:`draft` is the same path with one row. :meth:`observe_many` defaults to
    each row's own :meth:`observe`; a subclass may run its rows together.
    """

    def __init__(self, heads: "torch.nn.Module", target, tree: TreeConfig):
        self.heads, self.target, self.tree = heads, target, tree

    @property
    def batch_key(self) -> tuple:
        """(class, heads): the rows that can draft and observe together."""
        return type(self), id(self.heads)

    def observe(self, hidden_pre: torch.Tensor, hidden_post: torch.Tensor,
                tokens: Sequence[int]) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def draft(self, root_token: int, max_depth: int) -> Tree:
        return self.draft_many([self], [root_token], [max_depth])[0]

    @classmethod
    def draft_many(cls, drafters: Sequence["HeadsDrafter"], roots: Sequence[int],
                   max_depths: Sequence[int]) -> list[Tree]:
        """Each row's tree, the rows with a state (:meth:`prepare`) grown together."""
        trees = [root_only(r) for r in roots]
        ready = cls.prepare(drafters, roots, max_depths)
        if ready:
            grown = cls.grow([drafters[i] for i in ready], [roots[i] for i in ready],
                             [max_depths[i] for i in ready])
            for i, tree in zip(ready, grown):
                trees[i] = tree
        return trees

    @classmethod
    def observe_many(cls, drafters: Sequence["HeadsDrafter"], hidden_pre: Sequence[torch.Tensor],
                     hidden_post: Sequence[torch.Tensor], tokens: Sequence[Sequence[int]]) -> None:
        for d, pre, post, toks in zip(drafters, hidden_pre, hidden_post, tokens):
            d.observe(pre, post, toks)

    @classmethod
    def prepare(cls, drafters: Sequence["HeadsDrafter"], roots: Sequence[int],
                max_depths: Sequence[int]) -> list[int]:
        """The indices of the rows with a state to draft from and depth to draft."""
        return [i for i, d in enumerate(drafters) if max_depths[i] > 0 and d.state is not None]

    @property
    def state(self) -> torch.Tensor | None:  # pragma: no cover - abstract
        """What the next tree grows from, None before anything was observed."""
        raise NotImplementedError

    @classmethod
    def grow(cls, drafters: Sequence["HeadsDrafter"], roots: Sequence[int],
             max_depths: Sequence[int]) -> list[Tree]:  # pragma: no cover - abstract
        """The trees of rows that all have a state, grown together."""
        raise NotImplementedError


class RecurrentDrafter(HeadsDrafter):
    """Drafters of heads that carry a state down each branch (Clover, Clover-2): rows grow
    together by :func:`grow_recurrent_trees` from their ``state``."""

    @classmethod
    def grow(cls, drafters, roots, max_depths):
        first = drafters[0]
        return grow_recurrent_trees(first.heads, first.target, first.tree, list(roots),
                                    [d.state for d in drafters], list(max_depths))


def grow_recurrent_trees(heads: "torch.nn.Module", target, tree: TreeConfig, roots: Sequence[int],
                         root_states: Sequence[torch.Tensor], max_depths: Sequence[int]) -> list[Tree]:
    """The candidate trees of heads that carry a state down each branch (Clover, Clover-2),
    for the rows of a batch at once.

    A node's state is ``heads.step(parent's state, the node's token, depth)``; a root's
    parent state is its row's entry of ``root_states``. The trees grow in lock step
    (:func:`clover.tree.grow_trees`, static or dynamic), at most ``heads.config.num_heads``
    deep, and each depth calls the step once over every row's expanded nodes:
    ``heads.step(prev (n, D), tokens (n,) long, depth, target)`` returns their states
    (n, D) and draft logits (n, V') for their children. Each tree is the one its row
    grows alone.

    Args:
        root_states: (D,) per row.
    Raises:
        ValueError: when the lists differ in length.
    """
    if not len(roots) == len(root_states) == len(max_depths):
        raise ValueError(f"{len(roots)} roots, {len(root_states)} states and {len(max_depths)} depths")
    states: list[dict[int, torch.Tensor]] = [{} for _ in roots]  # per row: node id -> state

    def expand_many(depth, requests):
        prev = torch.cat([torch.stack([root_states[row] if p < 0 else states[row][p] for p in parent_ids])
                          for row, _, parent_ids, _ in requests])  # (n, D) over all rows
        tokens = torch.tensor([t for *_, toks in requests for t in toks], device=prev.device)
        h, logits = heads.step(prev, tokens, depth, target)
        probs = torch.softmax(logits.float(), dim=-1)  # (n, V')
        out, start = [], 0
        for row, node_ids, _, _ in requests:
            for i, nid in enumerate(node_ids):
                states[row][nid] = h[start + i]
            out.append(probs[start:start + len(node_ids)])
            start += len(node_ids)
        return out

    return grow_trees(roots, tree, expand_many, [min(d, heads.config.num_heads) for d in max_depths],
                      heads.draft_vocab)
