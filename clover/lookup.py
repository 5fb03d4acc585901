"""Prompt lookup drafting: propose what followed an earlier occurrence of the last tokens.

No training and no model: at each step, find an earlier place in the prompt or the text
generated so far where the last n tokens (n from ``max_ngram`` down to ``min_ngram``)
occurred, and propose the tokens that followed it as a chain (prompt lookup decoding,
Saxena 2023, as in transformers' ``prompt_lookup_num_tokens``). Strong where the output
copies its input: summaries, retrieval-augmented answers, code edits.

Two ways to use it, both on the one engine (``clover.engine``):

* the method ``lookup`` on its own: :class:`LookupDrafter` drafts the chain;
* a lookup *branch* inside Medusa's or Clover's tree (``Engine(..., lookup=...)`` with
  heads): :class:`HybridDrafter` merges the chain into the heads' tree, sharing the
  nodes where both propose the same token, and keeps the tree within the heads' node
  budget by joint probability (:func:`merge_branch`).

The chain length adapts to this machine: with the verify cost curve ``costs`` (ms for a
forward over 1, 2, ... tokens, from ``clover.autotree.verify_costs``) and the running
rate at which lookup tokens are accepted, it drafts the length that maximises expected
tokens per ms, which on a CPU is often short and sometimes zero. Lookup tokens are
deterministic proposals, so greedy and lossless sampling acceptance stay exact
(``clover.acceptance``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from clover.tree import Tree, root_only

LOOKUP = "lookup"  # the node source of lookup tokens; "head" for the heads', "both" for shared


@dataclass(frozen=True)
class LookupConfig:
    """How lookup drafts.

    Attributes:
        max_ngram / min_ngram: the longest and shortest tail matched (longest first).
        max_tokens: the most tokens proposed per step.
        prefer: which earlier occurrence proposes the continuation: "latest" (the most
            recent, usually the most relevant in generated text) or "earliest" (as
            transformers' implementation does).
        costs: verify cost curve in ms for 1, 2, ... tokens; empty = always propose
            ``max_tokens`` (no adaptation).
    Raises:
        ValueError: for sizes out of range or an unknown ``prefer``.
    """

    max_ngram: int = 3
    min_ngram: int = 1
    max_tokens: int = 10
    prefer: str = "latest"
    costs: tuple[float, ...] = ()

    def __post_init__(self):
        if not 1 <= self.min_ngram <= self.max_ngram <= 16:
            raise ValueError(f"lookup n-gram sizes must satisfy 1 <= min <= max <= 16, "
                             f"got {self.min_ngram}..{self.max_ngram}")
        if not 1 <= self.max_tokens <= 64:
            raise ValueError(f"lookup max_tokens must be in [1, 64], got {self.max_tokens}")
        if self.prefer not in ("latest", "earliest"):
            raise ValueError(f"lookup prefer must be 'latest' or 'earliest', got {self.prefer!r}")
        if any(not c > 0 for c in self.costs):
            raise ValueError("lookup costs must be positive times in ms")


class NgramIndex:
    """Where each n-gram of a growing token sequence ends (all occurrences, in order).

    Extending by T tokens costs O(T * (max_n - min_n + 1)) dictionary updates, so a step's
    lookup never rescans the text.
    """

    def __init__(self, min_n: int, max_n: int):
        self.min_n, self.max_n = min_n, max_n
        self.tokens: list[int] = []
        self.ends: dict[tuple[int, ...], list[int]] = {}

    def extend(self, tokens: Sequence[int]) -> None:
        for t in tokens:
            self.tokens.append(int(t))
            i = len(self.tokens) - 1
            for n in range(self.min_n, min(self.max_n, i + 1) + 1):
                self.ends.setdefault(tuple(self.tokens[i - n + 1:]), []).append(i)

    def find(self, root: int, length: int, prefer: str = "latest") -> tuple[list[int], int]:
        """The tokens that followed an earlier occurrence of the tail of
        ``tokens + [root]``, longest tail first.

        The continuation is an overlapping copy, as in LZ77: when the occurrence ends p
        tokens before the root, the text since then repeats with period p, so a loop such
        as ``7 7 7`` proposes ``7 7 7 ...`` rather than stopping at the root.

        Returns:
            (up to ``length`` proposed tokens, the matched n), or ([], 0) when no tail of
            ``min_n``..``max_n`` tokens occurred before.
        """
        full = self.tokens + [int(root)]
        for n in range(min(self.max_n, len(full) - 1), self.min_n - 1, -1):
            ends = self.ends.get(tuple(full[-n:]))
            if not ends:
                continue
            end = ends[-1] if prefer == "latest" else ends[0]
            period = len(full) - end - 1  # >= 1: the occurrence ends before the root
            return [full[end + 1 + j % period] for j in range(length)], n
        return [], 0


def find_continuation(tokens: Sequence[int], max_ngram: int = 3, min_ngram: int = 1,
                      length: int = 10, prefer: str = "latest") -> tuple[list[int], int]:
    """One-shot lookup over ``tokens`` (the last token is the query's end): the tokens
    that followed an earlier occurrence of its last n tokens (see :class:`NgramIndex`)."""
    if len(tokens) < 2:
        return [], 0
    index = NgramIndex(min_ngram, max_ngram)
    index.extend(tokens[:-1])
    return index.find(tokens[-1], length, prefer)


def best_length(costs: Sequence[float], rate: float, max_len: int) -> int:
    """The chain length L in [0, max_len] that maximises expected tokens per ms,
    ``(1 + a + ... + a^L) / costs[L]`` with ``a = rate`` the chance that each next lookup
    token is accepted and ``costs[L]`` the verify time for the root plus L tokens.
    Without costs: ``max_len``."""
    if not costs:
        return max_len
    best, best_speed, expected = 0, 1.0 / costs[0], 1.0
    for n in range(1, min(max_len, len(costs) - 1) + 1):
        expected += rate ** n
        if expected / costs[n] > best_speed:
            best, best_speed = n, expected / costs[n]
    return best


class LookupDrafter:
    """Per-run lookup state: an n-gram index of the prompt and the committed text, and
    how often its proposals were accepted (per matched n, so long matches earn long
    chains). Implements the :class:`clover.heads.base.Drafter` protocol."""

    def __init__(self, cfg: LookupConfig):
        self.cfg = cfg
        self.index = NgramIndex(cfg.min_ngram, cfg.max_ngram)
        # accepted / tried lookup tokens per matched n, with a prior of 1 of 2
        self.stats = {n: [1.0, 2.0] for n in range(cfg.min_ngram, cfg.max_ngram + 1)}
        self.pending: tuple[list[int], int] | None = None  # last chain proposed, its n
        # a continuation found but not drafted (too costly at its rate): its first token is
        # still scored against the next root, so a rate that fell can recover
        self.shadow: tuple[int, int] | None = None

    def rate(self, n: int) -> float:
        accepted, tried = self.stats[n]
        return accepted / tried

    def _score_shadow(self, actual: int) -> None:
        token, n = self.shadow
        self.stats[n][0] += token == int(actual)
        self.stats[n][1] += 1
        self.shadow = None

    def observe(self, hidden_pre: torch.Tensor, hidden_post: torch.Tensor,
                tokens: Sequence[int]) -> None:
        """Index the newly committed tokens (the prompt, then each step's root and
        accepted drafts) and score the last proposal against them."""
        tokens = [int(t) for t in tokens]
        if self.shadow is not None and len(tokens) > 1:  # the heads' drafts moved past it
            self._score_shadow(tokens[1])
        if self.pending is not None:
            chain, n = self.pending
            got = tokens[1:]  # the accepted drafts after the root
            k = 0
            while k < min(len(chain), len(got)) and chain[k] == got[k]:
                k += 1
            self.stats[n][0] += k
            self.stats[n][1] += min(k + 1, len(chain))
            self.pending = None
        self.index.extend(tokens)

    def propose(self, root_token: int, max_len: int) -> tuple[list[int], float]:
        """The chain to draft after ``root_token`` (possibly empty) and the acceptance
        rate it was sized with."""
        if self.shadow is not None:  # nothing was accepted: the root is the next token
            self._score_shadow(root_token)
        chain, n = self.index.find(root_token, min(max_len, self.cfg.max_tokens), self.cfg.prefer)
        if not chain:
            return [], 0.0
        rate = self.rate(n)
        kept = chain[:best_length(self.cfg.costs, rate, len(chain))]
        self.pending = (kept, n) if kept else None
        if not kept:
            self.shadow = (chain[0], n)
        return kept, rate

    def draft(self, root_token: int, max_depth: int) -> Tree:
        chain, rate = self.propose(root_token, max_depth)
        if not chain:
            return root_only(root_token)
        n = len(chain)
        return Tree(torch.tensor([root_token] + chain), list(range(-1, n)), list(range(n + 1)),
                    [1.0] + [rate] * n, ["root"] + [LOOKUP] * n)


def _joint(tree_parents: list[int], probs: list[float]) -> list[float]:
    joint = [1.0] * len(probs)
    for i in range(1, len(probs)):
        joint[i] = joint[tree_parents[i]] * probs[i]
    return joint


def merge_branch(tree: Tree, chain: Sequence[int], prob: float, budget: int) -> Tree:
    """The heads' ``tree`` with a lookup ``chain`` added as a branch from its root.

    Where a chain token equals a child of the node reached so far, the chain follows that
    head node (its source becomes "both" and its draft probability the larger of the two);
    from the first token the heads did not propose, the rest of the chain hangs below as
    new "lookup" nodes, each with conditional probability ``prob`` (the lookup acceptance
    rate). If the tree then has more than ``budget`` drafted nodes, the ``budget`` best by
    joint probability are kept (ties to the shallower node, so every kept node's parent
    is kept too). Nodes come out in breadth-first order.

    Args:
        tree: the heads' candidate tree (node 0 the root).
        chain: lookup tokens after the root.
        prob: conditional probability given to lookup nodes, in (0, 1].
        budget: most drafted nodes (root excluded) in the result.
    Returns:
        the merged Tree, with ``sources`` per node ("root", "head", "lookup", "both").
    """
    tokens = tree.tokens.tolist()
    parents, depths, probs = list(tree.parents), list(tree.depths), list(tree.draft_probs)
    sources = list(tree.sources) if tree.sources else ["root"] + ["head"] * (len(tokens) - 1)
    kids = tree.children()
    kids += [[] for _ in range(len(chain))]
    node = 0
    for tok in chain:
        hit = next((c for c in kids[node] if tokens[c] == tok), None)
        if hit is not None:
            sources[hit] = "both" if sources[hit] == "head" else sources[hit]
            probs[hit] = max(probs[hit], prob)
            node = hit
            continue
        new = len(tokens)
        tokens.append(int(tok))
        parents.append(node)
        depths.append(depths[node] + 1)
        probs.append(prob)
        sources.append(LOOKUP)
        kids[node].append(new)
        node = new
    keep = list(range(len(tokens)))
    if len(tokens) - 1 > budget:
        joint = _joint(parents, probs)
        ranked = sorted(range(1, len(tokens)), key=lambda i: (-joint[i], depths[i], i))
        keep = [0] + sorted(ranked[:budget])
    order = sorted(keep, key=lambda i: (depths[i], i))  # breadth-first, parents first
    new_id = {old: k for k, old in enumerate(order)}
    return Tree(torch.tensor([tokens[i] for i in order]),
                [-1 if parents[i] < 0 else new_id[parents[i]] for i in order],
                [depths[i] for i in order], [probs[i] for i in order], [sources[i] for i in order])


class HybridDrafter:
    """Medusa's or Clover's drafter plus a lookup branch in the same tree, within the
    heads' node budget (see :func:`merge_branch`)."""

    def __init__(self, inner, lookup: LookupDrafter, budget: int):
        self.inner, self.lookup, self.budget = inner, lookup, budget

    def observe(self, hidden_pre: torch.Tensor, hidden_post: torch.Tensor,
                tokens: Sequence[int]) -> None:
        self.inner.observe(hidden_pre, hidden_post, tokens)
        self.lookup.observe(hidden_pre, hidden_post, tokens)

    def draft(self, root_token: int, max_depth: int) -> Tree:
        tree = self.inner.draft(root_token, max_depth)
        chain, rate = self.lookup.propose(root_token, min(max_depth, self.budget))
        if not chain:
            return tree
        merged = merge_branch(tree, chain, rate, max(self.budget, len(tree) - 1))
        # score the lookup drafter on the chain as it survived the budget
        kept = _chain_in(merged, chain)
        self.lookup.pending = (chain[:kept], self.lookup.pending[1]) if kept else None
        return merged


def _chain_in(tree: Tree, chain: Sequence[int]) -> int:
    """How many leading tokens of ``chain`` the tree holds as a path from the root."""
    kids = tree.children()
    tokens = tree.tokens.tolist()
    node, n = 0, 0
    for tok in chain:
        node = next((c for c in kids[node] if tokens[c] == tok), None)
        if node is None:
            break
        n += 1
    return n
