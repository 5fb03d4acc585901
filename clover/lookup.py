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
  nodes where both propose the same token (:func:`merge_branch`). Each step it drafts
  the heads' tree, the chain alone or both, whichever promises the most tokens per ms
  on this machine (:func:`plan_step`).

The chain length adapts to this machine: with the verify cost curve ``costs`` (ms for a
forward over 1, 2, ... tokens, from ``clover.calibration.verify_costs``) and the running
rate at which lookup tokens are accepted, it drafts the length that maximises expected
tokens per ms, which on a CPU is often short and sometimes zero. Lookup tokens are
deterministic proposals, so greedy and lossless sampling acceptance stay exact
(``clover.acceptance``).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

import torch

from clover.tree import Tree, best_by_joint, joint_probs, root_only

PREFER = ("latest", "earliest", "longest")
LOOKUP = "lookup"  # the node source of lookup tokens; "head" for the heads', "both" for shared


@dataclass(frozen=True)
class LookupConfig:
    """How lookup drafts.

    Attributes:
        max_ngram / min_ngram: the longest and shortest tail matched (longest first).
        max_tokens: the most tokens proposed per step.
        prefer: which earlier occurrence proposes the continuation: "latest" (the most
            recent, usually the most relevant in generated text), "earliest" (as
            transformers' implementation does) or "longest" (of the latest
            ``max_candidates`` occurrences of the matched tail, the one whose context
            agrees furthest back, up to ``max_match`` tokens; ties to the latest).
        max_match: how far back "longest" compares contexts, in tokens.
        max_candidates: how many occurrences "longest" compares.
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
    max_match: int = 32
    max_candidates: int = 64

    def __post_init__(self):
        if not 1 <= self.min_ngram <= self.max_ngram <= 16:
            raise ValueError(f"lookup n-gram sizes must satisfy 1 <= min <= max <= 16, "
                             f"got {self.min_ngram}..{self.max_ngram}")
        if not 1 <= self.max_tokens <= 64:
            raise ValueError(f"lookup max_tokens must be in [1, 64], got {self.max_tokens}")
        if self.prefer not in PREFER:
            raise ValueError(f"lookup prefer must be one of {PREFER}, got {self.prefer!r}")
        if self.max_match < self.max_ngram or self.max_candidates < 1:
            raise ValueError(f"lookup max_match must be >= max_ngram ({self.max_ngram}) and "
                             f"max_candidates >= 1, got {self.max_match}, {self.max_candidates}")
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

    def find(self, root: int, length: int, prefer: str = "latest", max_match: int = 32,
             max_candidates: int = 64) -> tuple[list[int], int]:
        """The tokens that followed an earlier occurrence of the tail of
        ``tokens + [root]``, longest tail first.

        The continuation is an overlapping copy, as in LZ77: when the occurrence ends p
        tokens before the root, the text since then repeats with period p, so a loop such
        as ``7 7 7`` proposes ``7 7 7 ...`` rather than stopping at the root.

        Args:
            prefer: "latest", "earliest" or "longest" (see :class:`LookupConfig`).
            max_match, max_candidates: the reach of "longest".
        Returns:
            (up to ``length`` proposed tokens, the match length: the matched n, or with
            "longest" how many tokens agree before the root, up to ``max_match``), or
            ([], 0) when no tail of ``min_n``..``max_n`` tokens occurred before.
        """
        full = self.tokens + [int(root)]
        for n in range(min(self.max_n, len(full) - 1), self.min_n - 1, -1):
            ends = self.ends.get(tuple(full[-n:]))
            if not ends:
                continue
            if prefer == "longest":
                end, matched = ends[-1], -1
                for e in reversed(ends[-max_candidates:]):
                    m = n
                    while m < max_match and e - m >= 0 and full[e - m] == full[-1 - m]:
                        m += 1
                    if m > matched:
                        end, matched = e, m
                n = matched
            else:
                end = ends[-1] if prefer == "latest" else ends[0]
            period = len(full) - end - 1  # >= 1: the occurrence ends before the root
            return [full[end + 1 + j % period] for j in range(length)], n
        return [], 0


def match_bucket(matched: int) -> int:
    """The group of a match length whose acceptance rate is tracked together:
    1, 2, 3, 4, then 5-7, 8-15 and 16 or more (keyed by their smallest length)."""
    return matched if matched <= 4 else 5 if matched < 8 else 8 if matched < 16 else 16


def find_continuation(tokens: Sequence[int], max_ngram: int = 3, min_ngram: int = 1,
                      length: int = 10, prefer: str = "latest") -> tuple[list[int], int]:
    """One-shot lookup over ``tokens`` (the last token is the query's end): the tokens
    that followed an earlier occurrence of its last n tokens (see :class:`NgramIndex`)."""
    if len(tokens) < 2:
        return [], 0
    index = NgramIndex(min_ngram, max_ngram)
    index.extend(tokens[:-1])
    return index.find(tokens[-1], length, prefer, max(32, max_ngram))


def expected_accepted(rate: float, length: int) -> float:
    """Expected accepted tokens of a ``length``-token chain whose tokens are each accepted
    with probability ``rate`` given the previous one was: ``rate + rate^2 + ... +
    rate^length``."""
    return sum(rate ** k for k in range(1, length + 1))


def best_length(costs: Sequence[float], rate: float, max_len: int) -> int:
    """The chain length L in [0, max_len] that maximises expected tokens per ms,
    ``(1 + expected_accepted(rate, L)) / costs[L]``, ``costs[L]`` being the verify time
    for the root plus L tokens. Without costs: ``max_len``."""
    if not costs:
        return max_len
    lengths = range(min(max_len, len(costs) - 1) + 1)
    return max(lengths, key=lambda n: ((1 + expected_accepted(rate, n)) / costs[n], -n))


class LookupDrafter:
    """Per-run lookup state: an n-gram index of the prompt and the committed text, and
    how often its proposals were accepted (per match length, :func:`match_bucket`, so
    long matches earn long chains). Implements the :class:`clover.heads.drafter.Drafter` protocol."""

    def __init__(self, cfg: LookupConfig):
        self.cfg = cfg
        self.index = NgramIndex(cfg.min_ngram, cfg.max_ngram)
        # accepted / tried lookup tokens per match length bucket, with a prior of 1 of 2
        self.stats: dict[int, list[float]] = {}
        self.pending: tuple[list[int], int] | None = None  # last chain proposed, its n
        # a continuation found but not drafted (too costly at its rate): its first token is
        # still scored against the next root, so a rate that fell can recover
        self.shadow: tuple[int, int] | None = None

    def _stat(self, matched: int) -> list[float]:
        return self.stats.setdefault(match_bucket(matched), [1.0, 2.0])

    def rate(self, matched: int) -> float:
        """The acceptance rate per lookup token of chains with this match length."""
        accepted, tried = self._stat(matched)
        return accepted / tried

    def _score_shadow(self, actual: int) -> None:
        token, n = self.shadow
        stat = self._stat(n)
        stat[0] += token == int(actual)
        stat[1] += 1
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
            stat = self._stat(n)
            stat[0] += k
            stat[1] += min(k + 1, len(chain))
            self.pending = None
        self.index.extend(tokens)

    def candidates(self, root_token: int, max_len: int) -> tuple[list[int], int]:
        """The continuation an earlier occurrence proposes after ``root_token`` (up to
        ``max_len`` and ``max_tokens`` tokens; [] when nothing matched) and the matched n.
        Call :meth:`commit` with what was drafted of it before the next step."""
        if self.shadow is not None:  # nothing was accepted: the root is the next token
            self._score_shadow(root_token)
        cfg = self.cfg
        return self.index.find(root_token, min(max_len, cfg.max_tokens), cfg.prefer,
                               cfg.max_match, cfg.max_candidates)

    def commit(self, chain: Sequence[int], n: int, drafted: int) -> None:
        """Record that the first ``drafted`` tokens of ``chain`` (from :meth:`candidates`,
        matched with an n-gram of ``n``) went into this step's tree, so that the next
        :meth:`observe` scores them; a chain not drafted at all still scores its first
        token (a shadow), so the rate of a tail that was too uncertain to draft can rise."""
        self.pending = (list(chain[:drafted]), n) if drafted else None
        self.shadow = (int(chain[0]), n) if chain and not drafted else None

    def propose(self, root_token: int, max_len: int) -> tuple[list[int], float]:
        """The chain to draft after ``root_token`` (possibly empty), sized by
        :func:`best_length`, and the acceptance rate it was sized with."""
        chain, n = self.candidates(root_token, max_len)
        if not chain:
            return [], 0.0
        rate = self.rate(n)
        kept = best_length(self.cfg.costs, rate, len(chain))
        self.commit(chain, n, kept)
        return chain[:kept], rate

    def draft(self, root_token: int, max_depth: int) -> Tree:
        chain, rate = self.propose(root_token, max_depth)
        return chain_tree(root_token, chain, rate)


def chain_tree(root_token: int, chain: Sequence[int], rate: float) -> Tree:
    """The root followed by a lookup ``chain`` (each node's draft probability ``rate``);
    just the root when the chain is empty."""
    if not chain:
        return root_only(root_token)
    n = len(chain)
    return Tree(torch.tensor([root_token, *chain]), list(range(-1, n)), list(range(n + 1)),
                [1.0] + [rate] * n, ["root"] + [LOOKUP] * n)


def verify_ms(costs: Sequence[float], nodes: float) -> float:
    """Verify time in ms of a tree of ``nodes`` tokens (root included; a mean may be
    fractional) from the cost curve ``costs`` (ms for 1, 2, ... tokens): interpolated
    between its points and extended linearly past its end."""
    if nodes <= 1:
        return costs[0]
    if nodes <= len(costs):
        lo = int(nodes)
        frac = nodes - lo
        return costs[lo - 1] if not frac else costs[lo - 1] * (1 - frac) + costs[lo] * frac
    slope = (costs[-1] - costs[0]) / (len(costs) - 1) if len(costs) > 1 else costs[0]
    return costs[-1] + (nodes - len(costs)) * slope


def plan_step(costs: Sequence[float], rate: float, chain_len: int, head_gain: float,
              head_nodes: float, head_ms: float) -> tuple[bool, int]:
    """What a hybrid step drafts: ``(draft the heads?, lookup tokens)``, whichever of
    the heads' tree alone, the lookup chain alone (the heads skip drafting) or both
    promises the most tokens per ms on this machine.

    Expected tokens per step: ``1 + head_gain`` for the heads' tree; ``1 + E(L)`` with
    ``E(L) = rate + rate^2 + ... + rate^L`` for L lookup tokens; ``1 + E(L) + (1 - rate)
    * head_gain`` for both (the heads' own path pays off only when the chain's first
    token is rejected). Time per step: the verify cost of the tree's nodes
    (:func:`verify_ms`) plus ``head_ms`` whenever the heads draft.

    Args:
        costs: verify cost curve in ms for 1, 2, ... tokens (non-empty).
        rate: lookup acceptance rate per token of this chain's matched n, in [0, 1].
        chain_len: lookup tokens available (0 = no match).
        head_gain: the heads' expected accepted drafts per step (their running mean).
        head_nodes: the heads' drafted nodes per step (running mean).
        head_ms: the heads' drafting time per step in ms (running mean).
    Returns:
        (True, 0) heads only, (False, L) lookup only, (True, L) both.
    """
    best, plan = (1 + head_gain) / (verify_ms(costs, 1 + head_nodes) + head_ms), (True, 0)
    for n in range(1, chain_len + 1):
        expected = expected_accepted(rate, n)
        alone = (1 + expected) / verify_ms(costs, 1 + n)
        both = (1 + expected + (1 - rate) * head_gain) / (verify_ms(costs, 1 + head_nodes + n) + head_ms)
        for speed, choice in ((alone, (False, n)), (both, (True, n))):
            if speed > best:
                best, plan = speed, choice
    return plan


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
        keep = [0] + sorted(best_by_joint(joint_probs(parents, probs), depths, budget))
    order = sorted(keep, key=lambda i: (depths[i], i))  # breadth-first, parents first
    new_id = {old: k for k, old in enumerate(order)}
    return Tree(torch.tensor([tokens[i] for i in order]),
                [-1 if parents[i] < 0 else new_id[parents[i]] for i in order],
                [depths[i] for i in order], [probs[i] for i in order], [sources[i] for i in order])


class HybridDrafter:
    """Medusa's or Clover's drafter plus a lookup branch in the same tree.

    With a verify cost curve (``LookupConfig.costs``) each step takes the heads' tree,
    the lookup chain (the heads then skip drafting) or both, by expected tokens per ms
    (:func:`plan_step`): a sure, long match drafts a long chain even when the heads'
    budget is one node, and a weak one leaves the heads alone. The heads' expected gain
    is their running mean of accepted drafts, counted on their own tree whatever the
    merged tree was (exact under greedy decoding), from a prior of ``head_gain``; their
    drafting time is measured here. Without costs, the chain is merged within the
    heads' node budget (:func:`merge_branch`).
    """

    PRIOR_STEPS = 8  # weight of the head_gain prior, in steps

    def __init__(self, inner, lookup: LookupDrafter, budget: int, head_gain: float = 0.3):
        self.inner, self.lookup, self.budget = inner, lookup, budget
        self.costs = lookup.cfg.costs
        self.gain = [head_gain * self.PRIOR_STEPS, self.PRIOR_STEPS]  # accepted drafts, steps
        self.nodes = [float(budget), 1]  # drafted nodes, trees
        self.draft_ms = [0.0, 0]  # ms, drafts
        self.last_heads: Tree | None = None  # the heads' own tree of the last step
        self.accepted: list[int] = []  # the drafts accepted in the last step

    def observe(self, hidden_pre: torch.Tensor, hidden_post: torch.Tensor,
                tokens: Sequence[int]) -> None:
        self.inner.observe(hidden_pre, hidden_post, tokens)
        self._observe_lookup(hidden_pre, hidden_post, tokens)

    def _observe_lookup(self, hidden_pre, hidden_post, tokens: Sequence[int]) -> None:
        """What :meth:`observe` does besides the inner drafter's observe."""
        self.lookup.observe(hidden_pre, hidden_post, tokens)
        self.accepted = [int(t) for t in tokens[1:]]

    @staticmethod
    def observe_many(drafters: list["HybridDrafter"], hidden_pre, hidden_post, tokens) -> None:
        """:meth:`observe` for several rows whose inner drafters observe together (their
        class's ``observe_many``); each row's lookup observes its own tokens."""
        inner = [d.inner for d in drafters]
        type(inner[0]).observe_many(inner, hidden_pre, hidden_post, tokens)
        for d, pre, post, toks in zip(drafters, hidden_pre, hidden_post, tokens):
            d._observe_lookup(pre, post, toks)

    @property
    def batch_key(self):
        """Rows whose inner drafters draft together draft together (None: alone)."""
        inner = getattr(self.inner, "batch_key", None)
        return None if inner is None else (HybridDrafter, inner)

    def _record_heads(self, tree: Tree, ms: float) -> None:
        self.draft_ms[0] += ms
        self.draft_ms[1] += 1
        self.nodes[0] += len(tree) - 1
        self.nodes[1] += 1
        self.last_heads = tree

    def _heads(self, root_token: int, max_depth: int) -> Tree:
        t = time.perf_counter()
        tree = self.inner.draft(root_token, max_depth)
        self._record_heads(tree, (time.perf_counter() - t) * 1e3)
        return tree

    def _plan(self, root_token: int, max_depth: int) -> tuple[bool, list[int], float, int]:
        """This step's plan: (draft the heads?, the lookup tokens to draft, their rate,
        their match length);
        scores the heads' last tree and records what lookup drafts (``commit``)."""
        if self.last_heads is not None:  # what the heads alone would have had accepted
            self.gain[0] += self.last_heads.matched_path(self.accepted + [int(root_token)])
            self.gain[1] += 1
            self.last_heads = None
        chain, n = self.lookup.candidates(root_token, max_depth)
        rate = self.lookup.rate(n) if chain else 0.0
        if not self.costs:  # no cost curve: the chain shares the heads' budget (see _merge)
            return True, chain[:self.budget], rate, n
        use_heads, length = plan_step(
            self.costs, rate, len(chain), self.gain[0] / self.gain[1],
            self.nodes[0] / self.nodes[1], self.draft_ms[0] / max(self.draft_ms[1], 1))
        self.lookup.commit(chain, n, length)
        return use_heads, chain[:length], rate, n

    def _merge(self, root_token: int, heads_tree: Tree | None, chain: list[int], rate: float,
               n: int) -> Tree:
        """The step's tree from the heads' tree (None: not drafted) and the lookup chain."""
        if heads_tree is None:
            return chain_tree(root_token, chain, rate)
        if not chain:
            return heads_tree
        if not self.costs:
            merged = merge_branch(heads_tree, chain, rate, max(self.budget, len(heads_tree) - 1))
            self.lookup.commit(chain, n, merged.matched_path(chain))
            return merged
        return merge_branch(heads_tree, chain, rate, len(heads_tree) - 1 + len(chain))

    def draft(self, root_token: int, max_depth: int) -> Tree:
        use_heads, chain, rate, n = self._plan(root_token, max_depth)
        tree = self._heads(root_token, max_depth) if use_heads else None
        return self._merge(root_token, tree, chain, rate, n)

    @staticmethod
    def draft_many(drafters: list["HybridDrafter"], roots: list[int], max_depths: list[int]) -> list[Tree]:
        """:meth:`draft` for several rows of a batch whose inner drafters share one set of
        heads: each row plans its step alone; the rows that draft their heads do so
        together (their inner class's ``draft_many`` where it has one, the drafting time
        shared evenly between them), then each row merges its own lookup chain."""
        plans = [d._plan(r, m) for d, r, m in zip(drafters, roots, max_depths)]
        rows = [i for i, plan in enumerate(plans) if plan[0]]
        trees: list[Tree | None] = [None] * len(drafters)
        if rows:
            inner = [drafters[i].inner for i in rows]
            many = getattr(type(inner[0]), "draft_many", None)
            t = time.perf_counter()
            if many is not None and len(rows) > 1:
                grown = many(inner, [roots[i] for i in rows], [max_depths[i] for i in rows])
            else:
                grown = [d.draft(roots[i], max_depths[i]) for d, i in zip(inner, rows)]
            ms = (time.perf_counter() - t) * 1e3 / len(rows)
            for i, tree in zip(rows, grown):
                drafters[i]._record_heads(tree, ms)
                trees[i] = tree
        return [d._merge(r, tree, chain, rate, n)
                for d, r, tree, (_, chain, rate, n) in zip(drafters, roots, trees, plans)]
