"""Acceptance rules: which path of the candidate tree the target keeps.

Every rule walks the tree from the root. At the current node it looks at the target's
distribution for the next token (the verification logits at that node) and either moves
to one of the node's children or stops; the token it then produces itself is the
*bonus token*. Each rule is its own small function with its own test.

* :func:`accept_greedy` - exact: the output equals plain greedy decoding.
* :func:`accept_sample` - lossless speculative sampling over the tree (multi-candidate
  rejection sampling with deterministic candidates, cf. SpecInfer arXiv 2305.09781
  §4.2 and Sequoia arXiv 2402.12374 §3.2): the output has exactly the distribution of
  plain sampling with the same temperature / top-k / top-p.
* :func:`accept_typical` - Medusa's typical acceptance (arXiv 2401.10774 §2.3.1).
  **Lossy**: faster, but the output distribution differs from plain sampling.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from clover.tree import Tree


# temperatures below this are greedy decoding (see SamplingConfig)
GREEDY_BELOW = 1e-4


@dataclass(frozen=True)
class SamplingConfig:
    """How tokens are chosen.

    Attributes:
        temperature: 0 means greedy; > 0 samples from softmax(logits / temperature).
            Temperatures below :data:`GREEDY_BELOW` are taken as 0 (greedy); infinite or
            NaN ones raise ``ValueError``.
        top_k: keep the k most likely tokens before sampling (0 = off).
        top_p: nucleus: keep the smallest set of tokens whose probability reaches top_p.
        acceptance: "auto" (greedy at temperature 0, else lossless "sample"), "greedy",
            "sample", or "typical" (Medusa's, lossy).
        typical_threshold / typical_alpha: Medusa's epsilon and delta: a drafted token
            is accepted when its target probability exceeds
            ``min(threshold, alpha * exp(-entropy))``.
        seed: seed of the run's random generator (None = nondeterministic).
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    acceptance: str = "auto"
    typical_threshold: float = 0.09
    typical_alpha: float = 0.3
    seed: int | None = None

    def __post_init__(self):
        if not (0.0 <= self.temperature < math.inf):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if 0.0 < self.temperature < GREEDY_BELOW:
            # softmax(logits / 1e-38) overflows to inf / nan; at such temperatures sampling
            # is greedy decoding, so take the greedy path (and its exact acceptance)
            object.__setattr__(self, "temperature", 0.0)
            if self.acceptance in ("sample", "typical"):
                object.__setattr__(self, "acceptance", "auto")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.acceptance not in ("auto", "greedy", "sample", "typical"):
            raise ValueError(
                f"acceptance must be auto, greedy, sample or typical, got {self.acceptance!r}"
            )
        if self.acceptance in ("sample", "typical") and self.temperature == 0.0:
            raise ValueError(f"{self.acceptance} acceptance needs temperature > 0")

    @property
    def rule(self) -> str:
        """The acceptance rule actually used: greedy, sample or typical."""
        if self.acceptance == "auto":
            return "greedy" if self.temperature == 0.0 else "sample"
        return self.acceptance

    @property
    def lossless(self) -> bool:
        """False only for typical acceptance."""
        return self.rule != "typical"


@dataclass
class Acceptance:
    """Result of an acceptance rule.

    Attributes:
        path: accepted node ids, root first.
        bonus_token: the token the target produced after the last accepted node.
    """

    path: list[int]
    bonus_token: int


def logits_to_probs(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """Target distribution used for sampling: temperature, then top-k, then top-p.

    Args:
        logits: (..., V) float.
    Returns:
        (..., V) float32 probabilities summing to 1 on the last axis. With temperature 0
        the plain softmax is returned (used only for display).
    """
    logits = logits.float()
    if cfg.temperature > 0:
        logits = logits / cfg.temperature
    if cfg.top_k > 0 and cfg.top_k < logits.shape[-1]:
        kth = logits.topk(cfg.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if cfg.top_p < 1.0:
        sorted_p, idx = probs.sort(dim=-1, descending=True)
        # drop a token when the mass before it already reaches top_p
        drop = (sorted_p.cumsum(-1) - sorted_p) >= cfg.top_p
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, idx, sorted_p)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """Draw one token id from a (V,) probability vector."""
    return int(torch.multinomial(probs, 1, generator=generator).item())


def accept_greedy(tree: Tree, logits: torch.Tensor) -> Acceptance:
    """Greedy acceptance: follow the child equal to the target's argmax.

    Args:
        tree: the verified tree.
        logits: (N, V) target logits, row i = next-token logits after node i.
    """
    return greedy_walk(tree, logits.argmax(dim=-1).tolist())  # one host sync


def greedy_walk(tree: Tree, best: list[int]) -> Acceptance:
    """:func:`accept_greedy` given the target's argmax token after each node (N ints)."""
    path = tree.follow(lambda node, depth: best[node])
    return Acceptance(path, best[path[-1]])


def _walk(tree: Tree, logits: torch.Tensor, cfg: SamplingConfig, choose) -> Acceptance:
    """Walk from the root: at each node, ``choose(p, children, tokens)`` returns the
    child to move to, or ``(None, bonus_token)`` to stop; p is the target's (V,)
    distribution there. Shared by the sampling rules."""
    kids = tree.children()
    tokens = tree.tokens.tolist()
    path = [0]
    while True:
        child, bonus = choose(logits_to_probs(logits[path[-1]], cfg), kids[path[-1]], tokens)
        if child is None:
            return Acceptance(path, bonus)
        path.append(child)


def accept_sample(
    tree: Tree, logits: torch.Tensor, cfg: SamplingConfig, generator: torch.Generator | None
) -> Acceptance:
    """Lossless speculative sampling over the tree's siblings.

    At the current node with target distribution p: try its children c1, c2, ... in
    order of draft probability. Accept c_j with probability p(c_j); on rejection set
    p(c_j) = 0 and renormalise p (the residual). If every child is rejected, the bonus
    token is drawn from the residual. Each candidate is a deterministic function of the
    accepted prefix (a one-hot draft), so the committed token has exactly distribution p.

    Args:
        logits: (N, V) target logits.
    """
    def choose(p, children, tokens):
        for c in children:
            pc = float(p[tokens[c]])
            if float(torch.rand((), generator=generator, device=p.device)) < pc:
                return c, None
            # p(c) < 1 here, so the residual keeps some mass
            p[tokens[c]] = 0.0
            p = p / p.sum()
        return None, sample(p, generator)

    return _walk(tree, logits, cfg, choose)


def accept_typical(
    tree: Tree, logits: torch.Tensor, cfg: SamplingConfig, generator: torch.Generator | None
) -> Acceptance:
    """Medusa's typical acceptance (LOSSY: the output distribution is not the target's).

    A child is acceptable when the target gives it probability above
    ``min(typical_threshold, typical_alpha * exp(-H(p)))``; the acceptable child with
    the highest target probability is taken. The bonus token is sampled from p.
    """
    def choose(p, children, tokens):
        entropy = float(-(p * torch.log(p.clamp_min(1e-20))).sum())
        bar = min(cfg.typical_threshold, cfg.typical_alpha * math.exp(-entropy))
        ok = [(float(p[tokens[c]]), c) for c in children if float(p[tokens[c]]) > bar]
        return (max(ok)[1], None) if ok else (None, sample(p, generator))

    return _walk(tree, logits, cfg, choose)


def accept_rows(trees: list[Tree], logits: torch.Tensor, cfg: SamplingConfig,
                generators: list[torch.Generator | None]) -> list[Acceptance]:
    """:func:`accept` for every row of a batch: row b's tree on its first N_b logits, with
    its own generator. Greedy acceptance takes every row's argmax in one host sync.

    Args:
        logits: (B, N, V), trees padded to N nodes.
    Raises:
        ValueError: when the trees, logits rows and generators differ in number.
    """
    if not len(trees) == logits.shape[0] == len(generators):
        raise ValueError(f"{len(trees)} trees, {logits.shape[0]} logits rows and {len(generators)} generators")
    if cfg.rule == "greedy":
        best = logits.argmax(dim=-1).tolist()  # (B, N), one host sync
        return [greedy_walk(tree, row[:len(tree)]) for tree, row in zip(trees, best)]
    return [accept(tree, logits[b, :len(tree)], cfg, g) for b, (tree, g) in enumerate(zip(trees, generators))]


def accept(
    tree: Tree, logits: torch.Tensor, cfg: SamplingConfig, generator: torch.Generator | None
) -> Acceptance:
    """Dispatch to the rule named by ``cfg.rule``."""
    rule = cfg.rule
    if rule == "greedy":
        return accept_greedy(tree, logits)
    if rule == "sample":
        return accept_sample(tree, logits, cfg, generator)
    return accept_typical(tree, logits, cfg, generator)
