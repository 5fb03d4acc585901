"""Clover-2 heads (Xiao et al., arXiv 2408.00264; ``../shared/CLOVER2.md`` §2): an
RNN-like draft, the Clover authors' successor to Clover-1.

What changes from Clover-1 (CLOVER2.md §2.1, the forward pass of §2.2). Notation: X_t
the target's last-layer output at position t, before the final norm; x_{t+1} the token
the target produced from it (for the last verified position: the root); E[y] the raw,
unnormalised row y of the frozen lm_head weight; head k (1-based here, CLOVER2.md counts
from 0) predicts x_{t+k+1}, the token k positions after the root.

* **Information extraction order**: an Attention Decoder runs *before* the Augmenting
  Block and fuses the next token into every position: ``u_t = AttnDec1(X_t, E[x_{t+1}])``.
* **Augmenting Block** of 2 decoder layers of the target's architecture, with its own KV
  cache, then an RMSNorm: ``Z = norm(layers(u))``. It runs once per verification step,
  over the newly verified positions only.
* **Plain FC projectors, shared recurrence**: head 1 ``g_1 = head_norm(W_1 Z_t + b_1)``;
  heads k >= 2 share one set of weights:
  ``r_k = AttnDec2(r_{k-1}, E[c])``, ``g_k = head_norm(W_2 [r_k ; E[c]] + b_2)``, with
  r_1 = Z_t and c the token chosen for depth k-1 (drafted, or the true one in training).
* Every head reads the target's frozen, shared lm_head: ``logits_k = W_lm g_k``.
* **Distillation** (§2.3): g_k is regressed onto the target's normed hidden state at
  t+k and its logits are fitted to the target's distribution there (soft
  cross-entropy), head k weighted by decay^(k-1); see :meth:`Clover2Heads.training_outputs`.

Both Attention Decoders are Clover's :class:`~clover.heads.clover.AttentionDecoder` with
biases and a gate epsilon equal to the norm's (the reference ``ResAttentionBlock``).
Released checkpoints load with :mod:`clover.heads.clover2_checkpoint`.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch import nn

from clover.heads.base import DraftHeads
from clover.heads.config import HeadConfig
from clover.heads.drafter import RecurrentDrafter
from clover.heads.clover import (AttentionDecoder, block_at, block_embeddings, build_augmenting_block, copy_last_layer,
                                 run_augmenting_block, run_augmenting_rows)
from clover.tree import TreeConfig


class Clover2Heads(DraftHeads):
    """Attention Decoder -> Augmenting Block -> K heads with a shared recurrent projector.

    Modules (CLOVER2.md §3 names in brackets; D hidden size):

    * ``decoder``: AttnDec1 [``clover_head_mlp_rnn``], fuses the next token into X;
    * ``augment``: the Augmenting Block [``layers.0``, ``layers.1``] (a base model of the
      target's architecture fed with hidden states) and ``augment_norm`` [``clover_norm``];
    * ``first_fc``: head 1's projector, D -> D [``clover_head_mlp``];
    * ``recurrent_decoder``: AttnDec2 [``clover_head_mlp_rnn2``] and ``recurrent_fc``, 2D -> D
      [``clover_head_mlp2``], input [r ; E[c]]: one set for heads 2..K;
    * ``head_norm`` [``clover_head_norm``], before the target's lm_head.

    With ``config.shared_recurrence`` off (an ablation, not the design), heads 2..K get
    one AttnDec2 and FC each instead: ``recurrent_decoders`` and ``recurrent_fcs``.

    Args:
        config: HeadConfig with kind "clover2" (``augment_layers`` defaults to 2).
        target_config: the target's transformers config (to build the Augmenting Block).
    """

    kind = "clover2"

    def __init__(self, config: HeadConfig, target_config):
        super().__init__(config)
        d, eps = config.hidden_size, config.norm_eps
        self.decoder = AttentionDecoder(d, config.num_attention_heads, eps, bias=True, gate_eps=eps)
        self.augment = build_augmenting_block(target_config, config.augment_layers, config.augment_config)
        self.augment_norm = nn.RMSNorm(d, eps=eps)
        self.first_fc = nn.Linear(d, d)
        # the design: one (AttnDec2, FC) set for heads 2..K; the ablation: set k - 2 for head k
        n = 1 if config.shared_recurrence else max(config.num_heads - 1, 0)
        decoders = [AttentionDecoder(d, config.num_attention_heads, eps, bias=True, gate_eps=eps)
                    for _ in range(n)]
        fcs = [nn.Linear(2 * d, d) for _ in range(n)]
        if config.shared_recurrence:
            self.recurrent_decoder, self.recurrent_fc = decoders[0], fcs[0]
        else:
            self.recurrent_decoders, self.recurrent_fcs = nn.ModuleList(decoders), nn.ModuleList(fcs)
        self.head_norm = nn.RMSNorm(d, eps=eps)
        # the reference initialisation (CLOVER2.md §2.2): near-identity projectors, and
        # small positive values so the token embedding enters from the first step
        with torch.no_grad():
            for dec in (self.decoder, *decoders):
                nn.init.uniform_(dec.w_v.weight, 0.0, 0.01)
            for fc in (self.first_fc, *fcs):
                nn.init.uniform_(fc.weight, 0.0, 0.01)
                fc.weight[:, :d] += torch.eye(d)
                nn.init.zeros_(fc.bias)

    def recurrent(self, depth: int) -> tuple[AttentionDecoder, nn.Linear]:
        """(AttnDec2, FC) of head ``depth + 1`` (``depth`` >= 1): the shared set, or that
        head's own when ``config.shared_recurrence`` is off."""
        if self.config.shared_recurrence:
            return self.recurrent_decoder, self.recurrent_fc
        return self.recurrent_decoders[depth - 1], self.recurrent_fcs[depth - 1]

    def init_from_target(self, target) -> "Clover2Heads":
        """Augmenting layers from the target's last decoder layer; both norms from the
        target's final-norm weight (CLOVER2.md §2.2 step 5)."""
        copy_last_layer(self.augment, target)
        with torch.no_grad():
            for norm in (self.augment_norm, self.head_norm):
                norm.weight.copy_(target.final_norm.weight)
        return self.to(device=target.device, dtype=target.dtype)

    def token_embedding(self, tokens: torch.Tensor, target) -> torch.Tensor:
        """E[y]: raw rows of the frozen lm_head weight, (...,) long -> (..., D)."""
        return target.lm_head.weight[tokens]

    def context(self, hidden_pre: torch.Tensor, next_tokens: torch.Tensor, cache, start: int,
                target) -> torch.Tensor:
        """Z: AttnDec1 then the Augmenting Block and its norm, causally over new positions.

        Args:
            hidden_pre: (B, T, D) target hidden states before the final norm, positions
                ``start .. start + T - 1``.
            next_tokens: (B, T) long, the token after each position (x_{t+1}).
            cache: the block's own DynamicCache (``start`` positions cached), or None.
        Returns:
            (B, T, D) Z, the state r_1 that head 1 reads at each position.
        """
        u = self.decoder(hidden_pre, self.token_embedding(next_tokens, target))
        return self.augment_norm(run_augmenting_block(self.augment, u, cache, start))

    def head(self, prev: torch.Tensor, tokens: torch.Tensor, depth: int, target):
        """Head ``depth + 1``'s state and normed output.

        Args:
            prev: (n, D) r_{k-1}; for head 1 (``depth`` 0) Z itself.
            tokens: (n,) long, c: the tokens at depth ``depth`` (ignored by head 1, whose
                Z already holds the root).
        Returns:
            (r_k (n, D), g_k (n, D)); g_k is in the space of the target's normed states.
        """
        if depth == 0:
            return prev, self.head_norm(self.first_fc(prev))
        e = self.token_embedding(tokens, target)
        decoder, fc = self.recurrent(depth)
        r = decoder(prev, e)
        return r, self.head_norm(fc(torch.cat([r, e], dim=-1)))

    def step(self, prev: torch.Tensor, tokens: torch.Tensor, depth: int, target):
        """One depth of drafting (see :func:`clover.heads.drafter.grow_recurrent_trees`):
        (r_k (n, D), logits (n, V') over the draft vocabulary)."""
        r, g = self.head(prev, tokens, depth, target)
        return r, self.vocab_logits(g, target)

    def frozen_parameters(self) -> list[str]:
        """The Augmenting Block's embedding tables (:func:`~clover.heads.clover.block_embeddings`)."""
        return block_embeddings("augment", self.augment)

    def training_outputs(self, target, ids: torch.Tensor, hidden_pre: torch.Tensor,
                         rows: torch.Tensor, cols: torch.Tensor,
                         features: Callable[[torch.Tensor], torch.Tensor] | None = None):
        """The teacher-forced training forward (CLOVER2.md §2.3) at positions s.

        Z runs over whole sequences (each position fused with its true next token); at
        each s the recurrence runs through the true tokens x_{s+2}, ..., x_{s+K}.

        Args:
            ids: (B, T) long, right-padded conversations.
            hidden_pre: (B, T, D) the target's states before the final norm.
            rows, cols: (M,) long, the positions s.
            features: applied to ``hidden_pre`` first (training-time noise or dropout).
        Returns:
            per head k a pair (logits (M, V'), g_k (M, D)): head k predicts x_{s+k+1},
            its teacher is the target at s+k; g_k regresses onto the target's normed
            hidden state at s+k.
        """
        if features is not None:
            hidden_pre = features(hidden_pre)
        T = ids.shape[1]
        next_tokens = torch.cat([ids[:, 1:], ids[:, -1:]], dim=1)  # x_{t+1}; the last is unused
        # Z at the sampled positions only (the block's last layer runs there alone):
        # context(hidden_pre, next_tokens, None, 0, target)[rows, cols], computed cheaply
        last = int(cols.max()) + 1 if len(cols) else 1  # later positions are never read
        u = self.decoder(hidden_pre[:, :last], self.token_embedding(next_tokens[:, :last], target))
        r = self.augment_norm(block_at(self.augment, u, rows, cols))  # (M, D)
        outs = []
        for k in range(self.config.num_heads):
            c = ids[rows, (cols + k + 1).clamp(max=T - 1)]  # x_{s+k+1}, read by heads k >= 1
            r, g = self.head(r, c, k, target)
            outs.append((self.vocab_logits(g, target), g))
        return outs

    def drafter(self, target, tree: TreeConfig) -> "Clover2Drafter":
        return Clover2Drafter(self, target, tree)


class Clover2Drafter(RecurrentDrafter):
    """Per-run Clover-2 state: the Augmenting Block's KV cache and the verified hidden
    states still waiting for their next token.

    A position enters the block only with the token after it (AttnDec1 fuses the two).
    The last verified position's next token is the root of the next draft, so
    :meth:`draft` runs the block over the waiting positions; the root then comes back as
    the first token of the next :meth:`observe`, and is skipped there. Nothing is rolled
    back: every position entering the block is verified.
    """

    def __init__(self, heads: Clover2Heads, target, tree: TreeConfig):
        from clover.cache import buffered_cache

        super().__init__(heads, target, tree)
        self.cache = buffered_cache(heads.augment.config)  # appends in place, no copy per step
        self.length = 0  # positions in the block's cache
        self.waiting: torch.Tensor | None = None  # (W, D) verified states not yet in the block
        self.next_tokens: list[int] = []  # the W - 1 next tokens known so far
        self.z: torch.Tensor | None = None  # (D,) Z at the last position in the block

    def observe(self, hidden_pre: torch.Tensor, hidden_post: torch.Tensor,
                tokens: Sequence[int]) -> None:
        tokens = list(tokens)
        hidden_pre = hidden_pre[..., : self.heads.config.hidden_size]  # the last layer's (a target may pack more)
        if self.waiting is None:  # tokens[0]: the first prompt token or the consumed root
            self.waiting = hidden_pre
        else:  # tokens[0] follows the last waiting position
            self.next_tokens.append(tokens[0])
            self.waiting = torch.cat([self.waiting, hidden_pre])
        self.next_tokens.extend(tokens[1:])

    @property
    def state(self) -> torch.Tensor | None:
        return self.z

    def _ready(self, root_token: int, max_depth: int) -> bool:
        """Run the block over the waiting positions (their next token known now that the
        root is); whether there is a tree to grow (a state, and depth to draft)."""
        if max_depth <= 0:
            return False
        if self.waiting is not None:
            nxt = torch.tensor([self.next_tokens + [root_token]], device=self.waiting.device)
            z = self.heads.context(self.waiting.unsqueeze(0), nxt, self.cache, self.length, self.target)
            self.length += self.waiting.shape[0]
            self.z, self.waiting, self.next_tokens = z[0, -1], None, []
        return self.z is not None  # None: a one-token prompt, nothing verified yet

    @staticmethod
    def _context_many(drafters: list["Clover2Drafter"], roots: list[int]) -> None:
        """What :meth:`_ready` does for each of several rows with waiting positions, in one
        Attention Decoder call over all their positions and one Augmenting Block forward
        (:func:`clover.heads.clover.run_augmenting_rows`)."""
        heads, target = drafters[0].heads, drafters[0].target
        sizes = [d.waiting.shape[0] for d in drafters]
        nxt = torch.tensor([t for d, root in zip(drafters, roots) for t in d.next_tokens + [root]],
                           device=drafters[0].waiting.device)
        u = heads.decoder(torch.cat([d.waiting for d in drafters]), heads.token_embedding(nxt, target))
        outs = run_augmenting_rows(heads.augment, list(u.split(sizes)), [d.cache for d in drafters],
                                   [d.length for d in drafters])
        for d, n, out in zip(drafters, sizes, outs):
            d.length += n
            d.z, d.waiting, d.next_tokens = heads.augment_norm(out[-1]), None, []

    @classmethod
    def prepare(cls, drafters: list["Clover2Drafter"], roots: list[int], max_depths: list[int]) -> list[int]:
        """The rows' blocks run together over their waiting positions (:meth:`_context_many`),
        then each row is ready when it has a state (:meth:`_ready`)."""
        waiting = [i for i, d in enumerate(drafters) if max_depths[i] > 0 and d.waiting is not None]
        if len(waiting) > 1:  # their blocks run together; _ready then finds nothing waiting
            cls._context_many([drafters[i] for i in waiting], [roots[i] for i in waiting])
        return [i for i, d in enumerate(drafters) if d._ready(roots[i], max_depths[i])]
