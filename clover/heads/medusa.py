"""Medusa heads (Cai et al., arXiv 2401.10774 §2.1.1): the baseline.

Head k (k = 1..K) maps the target's last normed hidden state h_t (what lm_head reads)
to logits for the token k positions after the root: ``lm_head(ResBlock_k(h_t))``. The
heads never see each other's guesses, so one distribution per depth serves the whole
tree level.
"""
from __future__ import annotations

import torch
from torch import nn

from clover.heads.base import DraftHeads, ResBlock
from clover.heads.config import HeadConfig
from clover.heads.drafter import HeadsDrafter
from clover.tree import Tree, TreeConfig, grow_tree


class MedusaHeads(DraftHeads):
    """K Medusa heads sharing the frozen lm_head (or each with its own projection).

    Args:
        config: HeadConfig with kind "medusa".
    """

    kind = "medusa"

    @classmethod
    def from_config(cls, config: HeadConfig, target) -> "MedusaHeads":
        """Medusa heads need only their config."""
        return cls(config)

    def __init__(self, config: HeadConfig):
        super().__init__(config)
        d, v = config.hidden_size, config.draft_vocab_size or config.vocab_size
        self.blocks = nn.ModuleList([ResBlock(d) for _ in range(config.num_heads)])
        self.lm_heads = (nn.ModuleList([nn.Linear(d, v, bias=False) for _ in range(config.num_heads)])
                         if config.own_lm_head else None)

    def init_from_target(self, target) -> "MedusaHeads":
        """Own projections (when configured) start as copies of the target's lm_head."""
        if self.lm_heads is not None:
            with torch.no_grad():
                w = target.lm_head.weight
                for head in self.lm_heads:
                    head.weight.copy_(w if self.draft_vocab is None else w[self.draft_vocab])
        return self

    def forward(self, hidden_post: torch.Tensor, target, num_heads: int | None = None) -> torch.Tensor:
        """Draft logits of the first ``num_heads`` heads (default: all K).

        Args:
            hidden_post: (..., D) normed last hidden states of the target.
            num_heads: how many heads to run, 1..K (a tree one level deep needs only head 1).
        Returns:
            (..., k, V') logits over the draft vocabulary (V' = V without one), k =
            ``num_heads``; head k (index k-1) predicts the token k positions after the
            token that ``hidden_post`` predicts.
        Raises:
            ValueError: when ``num_heads`` is outside 1..K.
        """
        k = len(self.blocks) if num_heads is None else num_heads
        if not 1 <= k <= len(self.blocks):
            raise ValueError(f"num_heads must be in [1, {len(self.blocks)}], got {num_heads}")
        h = torch.stack([block(hidden_post) for block in self.blocks[:k]], dim=-2)  # (..., k, D)
        if self.lm_heads is None:  # one product over the k heads: the weights are read once
            return self.vocab_logits(h, target)
        return torch.stack([head(h[..., i, :]) for i, head in enumerate(self.lm_heads[:k])], dim=-2)

    def training_outputs(self, target, ids, hidden_pre, rows, cols, features=None):
        """The training forward (see :meth:`DraftHeads.training_outputs`): every head reads
        the target's normed state at s, perturbed by ``features`` after the norm."""
        h = target.final_norm(hidden_pre[rows, cols])  # (M, D), what lm_head reads at s
        if features is not None:
            h = features(h)
        outs = []
        for k, block in enumerate(self.blocks):
            z = block(h)
            logits = self.lm_heads[k](z) if self.lm_heads is not None else self.vocab_logits(z, target)
            outs.append((logits, z))
        return outs

    def drafter(self, target, tree: TreeConfig) -> "MedusaDrafter":
        return MedusaDrafter(self, target, tree)


class MedusaDrafter(HeadsDrafter):
    """Per-run Medusa state: the last verified normed hidden state."""

    def __init__(self, heads: MedusaHeads, target, tree: TreeConfig):
        super().__init__(heads, target, tree)
        self.last_hidden: torch.Tensor | None = None  # (D,)

    def observe(self, hidden_pre: torch.Tensor, hidden_post: torch.Tensor, tokens=()) -> None:
        self.last_hidden = hidden_post[-1]

    @property
    def state(self) -> torch.Tensor | None:
        return self.last_hidden

    def _grow(self, root_token: int, max_depth: int, probs: torch.Tensor) -> Tree:
        """The tree from the heads' (k, V') draft probabilities (k: the levels it can reach)."""
        def expand(depth, node_ids, parent_ids, tokens):
            return probs[depth].expand(len(node_ids), -1)  # (n, V)

        return grow_tree(root_token, self.tree, expand, min(max_depth, len(probs)),
                         self.heads.draft_vocab)

    @classmethod
    def grow(cls, drafters: list["MedusaDrafter"], roots: list[int], max_depths: list[int]) -> list[Tree]:
        """The rows' trees from one heads call over their last hidden states, (B, D) ->
        (B, k, V'), so the heads' weights (above all the vocabulary projection) are read
        once per step, not once per row; only the k heads the trees can reach run (at a
        budget of 1, head 1 alone)."""
        first = drafters[0]
        k = min(first.heads.config.num_heads, max(max_depths), first.tree.deepest)
        hidden = torch.stack([d.last_hidden for d in drafters])  # (B, D)
        probs = torch.softmax(first.heads(hidden, first.target, k).float(), dim=-1)  # (B, k, V')
        return [d._grow(r, m, p) for d, r, m, p in zip(drafters, roots, max_depths, probs)]
