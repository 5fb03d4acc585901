"""Clover heads (Xiao et al., arXiv 2405.00263 §3): sequential knowledge for the draft.

Three parts on top of Medusa-style heads:

* **Augmenting Block** (§3.3): one extra decoder layer of the target's own architecture,
  run causally over the target's last-layer hidden states (before the final norm),
  initialised from the target's last layer, with its own KV cache. Its output h_0 at the
  last verified position feeds the heads. It is built as a one-layer base model of the
  target's class (embedding of size 1, final norm removed) so that the stock
  transformers code handles rotary embeddings, masks and the cache.
* **Regressive Connection** (§3.1): the token chosen for the previous depth (for head
  1, the root: the target's own token) enters as e = the L2-normalised row of the frozen
  lm_head weight for that token.
* **Attention Decoder** (§3.2): one block shared by all heads,
  ``Q = W_Q norm(h_{i-1}), K = W_K e, V = W_V e, h_i = h_{i-1} + Attn(Q, K, V)``. With a
  single key a softmax is identically 1, so, as in the reference code, each attention
  head's value is gated by the cosine of its query and key. W_Q, W_K start at identity
  plus small noise, W_V at zero, so training starts from Medusa.

Head i then applies its own residual MLP_i, the target's frozen final norm and the
shared frozen lm_head.
"""
from __future__ import annotations

import copy

import torch
from torch import nn

from clover.heads.base import DraftHeads, HeadConfig, ResBlock
from clover.models import decoder_layers, final_norm_name
from clover.tree import Tree, TreeConfig, grow_tree, root_only


def build_augmenting_block(target_config) -> nn.Module:
    """A one-layer base model of the target's architecture, fed with hidden states.

    Call it as ``block(inputs_embeds=h, position_ids=..., cache=..., use_cache=True)``;
    ``last_hidden_state`` is the layer's output (no final norm).
    """
    from transformers import AutoModel

    cfg = copy.deepcopy(target_config)
    cfg.num_hidden_layers = 1
    if getattr(cfg, "layer_types", None):
        cfg.layer_types = list(cfg.layer_types)[-1:]
    cfg.vocab_size = 1  # the block is fed hidden states, never token ids
    cfg.pad_token_id = None
    cfg.tie_word_embeddings = False
    block = AutoModel.from_config(cfg, attn_implementation=target_config._attn_implementation)
    setattr(block, final_norm_name(block), nn.Identity())
    for name in ("wpe", "embed_positions"):  # absolute positions are already in h
        emb = getattr(block, name, None)
        if isinstance(emb, nn.Embedding):
            nn.init.zeros_(emb.weight)
            emb.weight.requires_grad_(False)
    return block


class AttentionDecoder(nn.Module):
    """Clover's Attention Decoder with cosine-gated single-key attention.

    Args:
        d: hidden size D.
        n_heads: attention heads H (D divisible by H).
    """

    def __init__(self, d: int, n_heads: int, eps: float):
        super().__init__()
        self.n_heads = n_heads
        self.norm = nn.RMSNorm(d, eps=eps)
        self.w_q = nn.Linear(d, d, bias=False)
        self.w_k = nn.Linear(d, d, bias=False)
        self.w_v = nn.Linear(d, d, bias=False)
        with torch.no_grad():
            for w in (self.w_q, self.w_k):
                w.weight.copy_(torch.eye(d) + 0.01 * torch.randn(d, d))
            nn.init.zeros_(self.w_v.weight)

    def forward(self, h: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        """h: (n, D) previous state h_{i-1}; e: (n, D) token embedding -> (n, D) h_i."""
        n, d = h.shape
        q = self.w_q(self.norm(h)).view(n, self.n_heads, -1)  # (n, H, D/H)
        k = self.w_k(e).view(n, self.n_heads, -1)
        v = self.w_v(e).view(n, self.n_heads, -1)
        gate = nn.functional.cosine_similarity(q, k, dim=-1).unsqueeze(-1)  # (n, H, 1)
        return h + (gate * v).reshape(n, d)


class CloverHeads(DraftHeads):
    """Augmenting Block + Regressive Connection + Attention Decoder + K head MLPs.

    Args:
        config: HeadConfig with kind "clover".
        target_config: the target's transformers config (to build the Augmenting Block).
    """

    kind = "clover"

    def __init__(self, config: HeadConfig, target_config):
        super().__init__(config)
        d = config.hidden_size
        self.augment = build_augmenting_block(target_config)
        self.decoder = AttentionDecoder(d, config.num_attention_heads, config.norm_eps)
        self.mlps = nn.ModuleList([ResBlock(d) for _ in range(config.num_heads)])

    def init_from_target(self, target) -> "CloverHeads":
        """Copy the target's last decoder layer into the Augmenting Block."""
        src = decoder_layers(target.base)[-1]
        decoder_layers(self.augment)[0].load_state_dict(src.state_dict())
        return self.to(device=target.device, dtype=target.dtype)

    def augment_hidden(self, hidden_pre: torch.Tensor, cache, start: int) -> torch.Tensor:
        """Run the Augmenting Block causally over new target hidden states.

        Args:
            hidden_pre: (B, T, D) target hidden states before the final norm.
            cache: the block's own DynamicCache (``start`` positions cached), or None.
            start: position of the first new state.
        Returns:
            (B, T, D) h_0 per position.
        """
        b, t, _ = hidden_pre.shape
        pos = torch.arange(start, start + t, device=hidden_pre.device).unsqueeze(0).expand(b, -1)
        out = self.augment(inputs_embeds=hidden_pre, position_ids=pos, cache=cache,
                           use_cache=cache is not None)
        return out.last_hidden_state

    def regressive_embedding(self, tokens: torch.Tensor, target) -> torch.Tensor:
        """e: L2-normalised lm_head rows, (...,) long -> (..., D)."""
        return nn.functional.normalize(target.lm_head.weight[tokens], dim=-1)

    def step(self, h_prev: torch.Tensor, tokens: torch.Tensor, head: int, target):
        """One depth of drafting.

        Args:
            h_prev: (n, D) h_{i-1} (h_0 from the Augmenting Block for head 1).
            tokens: (n,) the tokens chosen for the previous depth.
            head: 0-based head index i-1.
        Returns:
            (h_i (n, D), logits (n, V') over the draft vocabulary) for the next depth.
        """
        h = self.decoder(h_prev, self.regressive_embedding(tokens, target))
        logits = self.vocab_logits(target.final_norm(self.mlps[head](h)), target)
        return h, logits

    def drafter(self, target, tree: TreeConfig) -> "CloverDrafter":
        return CloverDrafter(self, target, tree)


class CloverDrafter:
    """Per-run Clover state: the Augmenting Block's KV cache and its last output h_0."""

    def __init__(self, heads: CloverHeads, target, tree: TreeConfig):
        from transformers import DynamicCache

        self.heads, self.target, self.tree = heads, target, tree
        self.cache = DynamicCache(config=heads.augment.config)
        self.length = 0
        self.h0: torch.Tensor | None = None  # (D,)

    def observe(self, hidden_pre: torch.Tensor, hidden_post: torch.Tensor, tokens=()) -> None:
        out = self.heads.augment_hidden(hidden_pre.unsqueeze(0), self.cache, self.length)
        self.length += hidden_pre.shape[0]
        self.h0 = out[0, -1]

    def draft(self, root_token: int, max_depth: int) -> Tree:
        if self.h0 is None:
            return root_only(root_token)
        states: dict[int, torch.Tensor] = {}  # node id -> h_i after that node's token
        device = self.h0.device

        def expand(depth, node_ids, parent_ids, tokens):
            prev = torch.stack([self.h0 if p < 0 else states[p] for p in parent_ids])  # (n, D)
            h, logits = self.heads.step(prev, torch.tensor(tokens, device=device), depth, self.target)
            for i, nid in enumerate(node_ids):
                states[nid] = h[i]
            return torch.softmax(logits.float(), dim=-1)  # (n, V)

        return grow_tree(root_token, self.tree, expand, min(max_depth, self.heads.config.num_heads),
                         self.heads.draft_vocab)
