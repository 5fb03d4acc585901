"""Clover heads (Xiao et al., arXiv 2405.00263 §3): sequential knowledge for the draft.

Three parts on top of Medusa-style heads:

* **Augmenting Block** (§3.3): one extra decoder layer of the target's own architecture,
  run causally over the target's last-layer hidden states (before the final norm),
  initialised from the target's last layer, with its own KV cache. Its output h_0 at the
  last verified position feeds the heads. It is built as a one-layer base model of the
  target's class (embedding of size 1, final norm removed) so that the stock
  transformers code handles rotary embeddings, masks and the cache; while drafting,
  Llama/Qwen2 layers run the same arithmetic without the model's wrapper
  (:func:`run_lean_block`).
* **Regressive Connection** (§3.1): the token chosen for the previous depth (for head
  1, the root: the target's own token) enters as e = the L2-normalised row of the frozen
  lm_head weight for that token.
* **Attention Decoder** (§3.2): one block shared by all heads,
  ``Q = W_Q norm(h_{i-1}), K = W_K e, V = W_V e, h_i = h_{i-1} + Attn(Q, K, V)``. With a
  single key a softmax is identically 1, so, as in the reference code, each attention
  head's value is gated by the cosine of its query and key. W_Q, W_K start at identity
  plus small noise, W_V at zero, so training starts from Medusa.

Optionally (``HeadConfig.fuse_layers``, EAGLE-3's multi-layer features) the Augmenting
Block reads the last layer's state plus a learned projection of earlier layers' outputs
(:meth:`CloverHeads.block_input`), zero at the start.

Head i then applies its own residual MLP_i, the target's frozen final norm and the
shared frozen lm_head.
"""
from __future__ import annotations

import copy

import torch
from torch import nn

from clover.heads.base import DraftHeads, ResBlock
from clover.heads.config import HeadConfig
from clover.heads.drafter import RecurrentDrafter
from clover.models import decoder_layers, final_norm_name
from clover.tree import TreeConfig


# decoder layers whose pre-norm attention + MLP structure CloverHeads.augment_at repeats
_PARTIAL_LAYERS = {"LlamaDecoderLayer", "Qwen2DecoderLayer"}


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    """RoPE's rotation of the last dimension's halves: (x1, x2) -> (-x2, x1)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def build_augmenting_block(target_config, num_layers: int = 1, overrides: dict | None = None) -> nn.Module:
    """A base model of the target's architecture with ``num_layers`` decoder layers (each
    of the kind of the target's last one), fed with hidden states.

    ``overrides``: config fields set otherwise than the target's (``HeadConfig.augment_config``).
    Call it through :func:`run_augmenting_block`; ``last_hidden_state`` is the last
    layer's output (no final norm).
    """
    from transformers import AutoModel

    cfg = copy.deepcopy(target_config)
    cfg.num_hidden_layers = num_layers
    if getattr(cfg, "layer_types", None):
        cfg.layer_types = [cfg.layer_types[-1]] * num_layers
    for key, value in (overrides or {}).items():
        setattr(cfg, key, value)
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


def block_embeddings(prefix: str, block: nn.Module) -> list[str]:
    """Names (under ``prefix``) of an Augmenting Block's embedding tables, which training
    leaves frozen: the block is fed hidden states, never token ids, and its position
    table (GPT-2's ``wpe``) is zero, since absolute positions are already in h."""
    return [f"{prefix}.{n}.weight" for n, m in block.named_modules() if isinstance(m, nn.Embedding)]


def run_augmenting_block(block: nn.Module, hidden: torch.Tensor, cache, start: int,
                         last_only: bool = False) -> torch.Tensor:
    """Run an Augmenting Block causally over new positions: the model's forward, or, for
    a block in eval mode with a cache (drafting) whose layers :func:`lean_block` accepts,
    :func:`run_lean_block` (the same outputs, SDPA attention).

    Args:
        hidden: (B, T, D) its input at positions ``start .. start + T - 1``.
        cache: the block's own DynamicCache (``start`` positions cached), or None.
        last_only: only the last position's output is wanted (drafting reads h_0 there);
            every position still enters the cache.
    Returns:
        (B, T, D) the last layer's output ((B, 1, D), the last position's, with ``last_only``).
    """
    if cache is not None and not block.training and lean_block(block):
        return run_lean_block(block, hidden, cache, start, last_only)
    b, t, _ = hidden.shape
    pos = torch.arange(start, start + t, device=hidden.device).unsqueeze(0).expand(b, -1)
    out = block(inputs_embeds=hidden, position_ids=pos, cache=cache, use_cache=cache is not None)
    return out.last_hidden_state[:, -1:] if last_only else out.last_hidden_state


def lean_block(block: nn.Module) -> bool:
    """Whether :func:`run_lean_block` can run this Augmenting Block: every layer a
    Llama/Qwen2 one (pre-norm RoPE attention, then the MLP) attending to every cached
    position (no sliding window)."""
    if getattr(block, "rotary_emb", None) is None:
        return False
    return all(type(layer).__name__ in _PARTIAL_LAYERS
               and getattr(layer.self_attn, "sliding_window", None) is None
               for layer in decoder_layers(block))


def run_lean_block(block: nn.Module, hidden: torch.Tensor, cache, start: int,
                   last_only: bool = False) -> torch.Tensor:
    """:func:`run_augmenting_block` over new positions on top of the block's cache, the
    same layers' arithmetic without the transformers model's wrapper around them (its
    mask and output bookkeeping cost about as much as the layer itself for the one to
    three positions a decoding step adds: 1.9 -> 1.2 ms per call for SmolLM2-135M's
    block timed alone on the development VM; in the engine, Clover's drafting 3.28 ->
    3.13 ms a step and Clover-2's 5.16 -> 4.44; the outputs equal). For a block in eval
    mode (no attention dropout) that passes :func:`lean_block`.

    With ``last_only`` the last layer runs its query, attention, output projection and
    MLP at the last position alone (the others only enter the cache as keys and values,
    which is all that later positions read of them): the same output there, for the
    T - 1 other positions' share of those products saved (a step that accepted two
    drafts runs them over one row instead of three).

    Args:
        hidden: (B, T, D) the block's input at positions ``start .. start + T - 1``.
        cache: the block's DynamicCache, holding ``start`` positions per row.
        last_only: only the last position's output is wanted.
    Returns:
        (B, T, D) the last layer's output ((B, 1, D) with ``last_only``).
    """
    b, t, _ = hidden.shape
    pos = torch.arange(start, start + t, device=hidden.device).unsqueeze(0).expand(b, -1)
    cos, sin = block.rotary_emb(hidden, pos)  # (B, T, hd)
    cos, sin = cos[:, None], sin[:, None]
    mask = None  # one new position attends to everything cached
    if t > 1:  # new position i attends to the cache and new positions 0..i
        keys = torch.arange(start + t, device=hidden.device)
        mask = keys[None, :] <= keys[start:, None]  # (T, start + T) bool, True = attend
    h = hidden
    layers = decoder_layers(block)
    for i, layer in enumerate(layers):
        attn = layer.self_attn
        x = _rms_norm(layer.input_layernorm, h)
        k, v = (proj(x).view(b, t, -1, attn.head_dim).transpose(1, 2)  # (B, KVH, T, hd)
                for proj in (attn.k_proj, attn.v_proj))
        k = k * cos + _rotate_half(k) * sin
        k, v = cache.update(k, v, i)  # (B, KVH, start + T, hd)
        if last_only and i == len(layers) - 1:  # the last position's query alone: it sees every key
            x, h, c, s_, m, tq = x[:, -1:], h[:, -1:], cos[:, :, -1:], sin[:, :, -1:], None, 1
        else:
            c, s_, m, tq = cos, sin, mask, t
        q = attn.q_proj(x).view(b, tq, -1, attn.head_dim).transpose(1, 2)  # (B, H, T_q, hd)
        q = q * c + _rotate_half(q) * s_
        o = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=m, scale=attn.scaling,
                                                       enable_gqa=True)
        h = h + attn.o_proj(o.transpose(1, 2).reshape(b, tq, -1))
        h = h + layer.mlp(_rms_norm(layer.post_attention_layernorm, h))
    return h


def _rms_norm(norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A Llama/Qwen2 RMSNorm (``weight * x / rms(x)``, computed in fp32) applied to x as
    one fused op (its module runs six): (..., D) -> (..., D), equal up to float rounding."""
    if x.dtype != torch.float32:
        return norm(x)
    return nn.functional.rms_norm(x, norm.weight.shape, norm.weight, norm.variance_epsilon)


def run_augmenting_rows(block: nn.Module, hidden: list[torch.Tensor], caches: list,
                        lengths: list[int]) -> list[torch.Tensor]:
    """:func:`run_augmenting_block` for the rows of a batch in one forward, each row with
    its own cache: the caches are stacked right padded (``clover.cache.stack_rows``), every
    row's new positions run together under a mask that keeps the rows apart (the layout
    of ``clover.engine``), and each cache gets back exactly its own positions.

    Args:
        hidden: per row, (T_b, D) its input at positions ``lengths[b] .. lengths[b] + T_b - 1``.
        caches: per row, the block's own single-row DynamicCache (``lengths[b]`` positions).
        lengths: L_b, the positions each row's cache holds.
    Returns:
        per row, (T_b, D) the last layer's output at its new positions.
    """
    from clover.cache import stack_rows, unstack_rows
    from clover.tree import batch_position_ids, batch_tree_mask

    counts = [h.shape[0] for h in hidden]
    width, t = max(lengths), max(counts)
    x = hidden[0].new_zeros((len(hidden), t, hidden[0].shape[-1]))  # (B, T, D), right padded
    for b, h in enumerate(hidden):
        x[b, :counts[b]] = h
    chains = [list(range(-1, m - 1)) for m in counts]  # each row's new positions: a chain
    pos = batch_position_ids([list(range(m)) for m in counts], lengths, x.device)
    mask = batch_tree_mask(chains, lengths, width, x.dtype, x.device)
    stacked = stack_rows(caches, lengths, block.config)
    out = block(inputs_embeds=x, position_ids=pos, attention_mask=mask, cache=stacked, use_cache=True)
    unstack_rows(stacked, caches, lengths, width, counts)
    return [out.last_hidden_state[b, :m] for b, m in enumerate(counts)]


def copy_last_layer(block: nn.Module, target) -> None:
    """Initialise every layer of an Augmenting Block as a copy of the target's last
    decoder layer (Clover §3.3)."""
    src = decoder_layers(target.base)[-1].state_dict()
    for layer in decoder_layers(block):
        layer.load_state_dict(src)


class AttentionDecoder(nn.Module):
    """Clover's Attention Decoder with cosine-gated single-key attention.

    Args:
        d: hidden size D.
        n_heads: attention heads H (D divisible by H).
        eps: epsilon of the query's RMSNorm.
        bias: biases on W_Q, W_K, W_V (Clover-2's ``ResAttentionBlock``; they start at 0).
        gate_eps: epsilon of the cosine gate (Clover-2: the norm's).
    """

    def __init__(self, d: int, n_heads: int, eps: float, bias: bool = False, gate_eps: float = 1e-8):
        super().__init__()
        self.n_heads, self.gate_eps = n_heads, gate_eps
        self.norm = nn.RMSNorm(d, eps=eps)
        self.w_q = nn.Linear(d, d, bias=bias)
        self.w_k = nn.Linear(d, d, bias=bias)
        self.w_v = nn.Linear(d, d, bias=bias)
        with torch.no_grad():
            for w in (self.w_q, self.w_k):
                w.weight.copy_(torch.eye(d) + 0.01 * torch.randn(d, d))
            nn.init.zeros_(self.w_v.weight)
            if bias:
                for w in (self.w_q, self.w_k, self.w_v):
                    nn.init.zeros_(w.bias)

    def forward(self, h: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        """h: (..., D) previous state h_{i-1}; e: (..., D) token embedding -> (..., D) h_i."""
        return self.attend(h, self.w_k(e), self.w_v(e))

    def attend(self, h: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """h_i from h_{i-1} (..., D) and the token's key K = W_K e and value V = W_V e,
        each (..., D) (:meth:`forward`, or :meth:`token_kv`'s table) -> (..., D)."""
        heads = (*h.shape[:-1], self.n_heads, -1)
        q = self.w_q(self.norm(h)).view(heads)  # (..., H, D/H)
        gate = nn.functional.cosine_similarity(q, k.view(heads), dim=-1, eps=self.gate_eps)  # (..., H)
        return h + (gate.unsqueeze(-1) * v.view(heads)).flatten(-2)

    def token_kv(self, tokens: torch.Tensor, embed, vocab: torch.Tensor | None,
                 source: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K = W_K e and V = W_V e of tokens, (n,) long -> two (n, D).

        Both depend on the token alone, so while drafting (eval mode, no gradients
        wanted) they are read from a table over the draft vocabulary ``vocab``, computed
        once (two (V', D) products, about 38 MB for 8,192 tokens of D = 576 in fp32) and
        computed again when ``source``, the weights or the vocabulary change in place;
        a token outside ``vocab`` (a root the target chose) is computed directly. The
        values equal the direct products up to float rounding.

        Args:
            embed: (m,) long -> (m, D), the regressive embedding e of tokens.
            vocab: (V',) long, the draft vocabulary; None: no table (always direct).
            source: the tensor ``embed`` reads (the frozen lm_head weight, (V, D)), which
                keys the table.
        """
        if self.training or vocab is None or (torch.is_grad_enabled() and source.requires_grad):
            e = embed(tokens)
            return self.w_k(e), self.w_v(e)
        table, index = self._kv_table(embed, vocab, source)
        at = index[tokens]  # (n,) row of each token, -1 outside the draft vocabulary
        kv = table[at.clamp(min=0)]  # (n, 2D)
        outside = at < 0
        if bool(outside.any()):
            e = embed(tokens[outside])
            kv[outside] = torch.cat([self.w_k(e), self.w_v(e)], dim=-1)
        return kv.chunk(2, dim=-1)

    def _kv_table(self, embed, vocab: torch.Tensor, source: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(table (V', 2D) of [K, V] per draft token, index (V,) long: each token's row or
        -1), kept while ``source``, W_K, W_V and ``vocab`` are unchanged."""
        parts = [source, vocab, self.w_k.weight, self.w_v.weight] + [b for b in (self.w_k.bias, self.w_v.bias)
                                                                      if b is not None]
        key = tuple((t.data_ptr(), 0 if t.is_inference() else t._version) for t in parts)
        kept = getattr(self, "_kv_kept", None)
        if kept is None or kept[0] != key:
            with torch.no_grad():
                e = embed(vocab)  # (V', D)
                table = torch.cat([nn.functional.linear(e, self.w_k.weight, self.w_k.bias),
                                   nn.functional.linear(e, self.w_v.weight, self.w_v.bias)], dim=-1)
                index = torch.full((source.shape[0],), -1, dtype=torch.long, device=vocab.device)
                index[vocab] = torch.arange(len(vocab), device=vocab.device)
            kept = self._kv_kept = (key, table, index)
        return kept[1], kept[2]


def block_at(block: nn.Module, hidden: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """An Augmenting Block's output at some positions of a batch, run from position 0:
    ``run_augmenting_block(block, hidden, None, 0)[rows, cols]`` with the same values and
    gradients, computed more cheaply (training reads the block at a few sampled positions
    per conversation).

    Where the last layer is a Llama/Qwen2 one (RoPE, no attention dropout), positions
    after the last wanted one are not run (never attended to), the layers before the
    last run over the others, and the last layer only projects keys and values there:
    its query, attention, output projection and MLP run at the M wanted positions (about
    6x fewer multiply-adds in that layer for 64 of ~500 positions per row). Other blocks
    run the full forward.

    Args:
        hidden: (B, T, D) the block's input, from position 0.
        rows, cols: (M,) long, the batch row and position of each wanted output.
    Returns:
        (M, D) the last layer's output at those positions.
    """
    layers = decoder_layers(block)
    rope = getattr(block, "rotary_emb", None)
    layer = layers[-1]
    attn = getattr(layer, "self_attn", None)
    if (len(rows) == 0 or rope is None or type(layer).__name__ not in _PARTIAL_LAYERS
            or getattr(attn, "attention_dropout", 0.0)):
        return run_augmenting_block(block, hidden, None, 0)[rows, cols]
    T = int(cols.max()) + 1  # later positions are never attended to
    h = hidden[:, :T]
    if len(layers) > 1:  # every layer but the last, over every position
        name = next(n for n, m in block.named_children() if m is layers)
        setattr(block, name, layers[:-1])
        try:
            h = run_augmenting_block(block, h, None, 0)
        finally:
            setattr(block, name, layers)
    B = h.shape[0]
    cos, sin = rope(h, torch.arange(T, device=h.device).unsqueeze(0).expand(B, -1))  # (B, T, hd)
    hd = attn.head_dim
    x = layer.input_layernorm(h)
    k = attn.k_proj(x).view(B, T, -1, hd).transpose(1, 2)  # (B, KVH, T, hd)
    v = attn.v_proj(x).view(B, T, -1, hd).transpose(1, 2)
    k = k * cos[:, None] + _rotate_half(k) * sin[:, None]
    k = k.repeat_interleave(attn.num_key_value_groups, dim=1)  # (B, H, T, hd)
    v = v.repeat_interleave(attn.num_key_value_groups, dim=1)
    h_sel = h[rows, cols]  # (M, D)
    q = attn.q_proj(x[rows, cols]).view(len(rows), -1, hd)  # (M, H, hd)
    c, s_ = cos[rows, cols][:, None], sin[rows, cols][:, None]
    q = q * c + _rotate_half(q) * s_
    order = torch.argsort(rows, stable=True)
    out, start = [], 0
    for b, n in zip(*torch.unique_consecutive(rows[order], return_counts=True)):
        idx = order[start: start + n]
        start += int(n)
        qb = q[idx].transpose(0, 1).unsqueeze(0)  # (1, H, n, hd)
        mask = torch.arange(T, device=h.device)[None, :] <= cols[idx][:, None]  # (n, T) causal
        o = nn.functional.scaled_dot_product_attention(qb, k[b: b + 1], v[b: b + 1], attn_mask=mask,
                                                       scale=attn.scaling)
        out.append(o[0].transpose(0, 1))  # (n, H, hd)
    o = torch.cat(out)  # (M, H, hd) in sorted order; its dtype follows autocast
    o = torch.empty_like(o).index_copy_(0, order, o)
    h1 = h_sel + attn.o_proj(o.reshape(len(rows), -1))
    return h1 + layer.mlp(layer.post_attention_layernorm(h1))


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
        self.augment = build_augmenting_block(target_config, config.augment_layers, config.augment_config)
        self.decoder = AttentionDecoder(d, config.num_attention_heads, config.norm_eps)
        self.mlps = nn.ModuleList([ResBlock(d) for _ in range(config.num_heads)])
        self.fuse = None  # multi-layer features: W of x = h_last + W [h_l1; ...], from zero
        if config.fuse_layers:
            self.fuse = nn.Linear(d * len(config.fuse_layers), d, bias=False)
            nn.init.zeros_(self.fuse.weight)

    def block_input(self, hidden_pre: torch.Tensor) -> torch.Tensor:
        """The Augmenting Block's input from the target's features: (..., D) the last
        layer's state before the final norm, or with ``fuse_layers`` the packed
        (..., D x (1 + n)) [h_last; h_l1; ...] (:attr:`clover.models.TargetOutput.hidden_pre`
        of a target capturing those layers) -> (..., D) h_last + W [h_l1; ...]. Features
        packed for other heads are cut to the last layer's.

        Raises:
            ValueError: heads with ``fuse_layers`` given features without those layers.
        """
        d = self.config.hidden_size
        if self.fuse is None:
            return hidden_pre[..., :d]
        if hidden_pre.shape[-1] != self.fuse.in_features + d:
            raise ValueError(f"these Clover heads read the target's layers {self.config.fuse_layers} too "
                             f"({self.fuse.in_features + d} features per position), got {hidden_pre.shape[-1]}: "
                             f"the target must capture them (target.capture_layers, done by "
                             f"load_heads and Engine)")
        return hidden_pre[..., :d] + self.fuse(hidden_pre[..., d:])

    def init_from_target(self, target) -> "CloverHeads":
        """Copy the target's last decoder layer into the Augmenting Block."""
        copy_last_layer(self.augment, target)
        return self.to(device=target.device, dtype=target.dtype)

    def augment_hidden(self, hidden_pre: torch.Tensor, cache, start: int, last_only: bool = False) -> torch.Tensor:
        """Run the Augmenting Block causally over new target hidden states.

        Args:
            hidden_pre: (B, T, D) target hidden states before the final norm (or the
                packed features of :meth:`block_input`).
            cache: the block's own DynamicCache (``start`` positions cached), or None.
            start: position of the first new state.
            last_only: h_0 at the last position alone (drafting); every position enters
                the cache.
        Returns:
            (B, T, D) h_0 per position ((B, 1, D) with ``last_only``).
        """
        return run_augmenting_block(self.augment, self.block_input(hidden_pre), cache, start, last_only)

    def augment_at(self, hidden_pre: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        """h_0 at some positions of a batch: ``augment_hidden(hidden_pre, None, 0)[rows,
        cols]``, computed for those positions only where it can (:func:`block_at`;
        training reads h_0 at a few sampled positions per conversation).

        Args:
            hidden_pre: (B, T, D) target states before the final norm, from position 0
                (or the packed features of :meth:`block_input`).
            rows, cols: (M,) long, the batch row and position of each wanted h_0.
        Returns:
            (M, D) h_0 at those positions.
        """
        return block_at(self.augment, self.block_input(hidden_pre), rows, cols)

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
        k, v = self.decoder.token_kv(tokens, lambda t: self.regressive_embedding(t, target), self.draft_vocab,
                                     target.lm_head.weight)
        h = self.decoder.attend(h_prev, k, v)
        logits = self.vocab_logits(target.final_norm(self.mlps[head](h)), target)
        return h, logits

    regression_space = "pre"  # the head MLPs' output lies before the final norm

    def frozen_parameters(self) -> list[str]:
        """The Augmenting Block's embedding tables (:func:`block_embeddings`)."""
        return block_embeddings("augment", self.augment)

    def training_outputs(self, target, ids, hidden_pre, rows, cols, features=None):
        """The training forward (see :meth:`DraftHeads.training_outputs`), teacher-forced:
        h_0 from the Augmenting Block at s (over the perturbed ``features`` of all
        positions up to s), then at depth k the regressive connection reads the true
        token x_{s+k+1} (the drafted one while a chain holds)."""
        if features is not None:
            hidden_pre = features(hidden_pre)
        h = self.augment_at(hidden_pre, rows, cols)  # (M, D) h_0 at the sampled positions
        T = ids.shape[1]
        outs = []
        for k in range(self.config.num_heads):
            tok = ids[rows, (cols + k + 1).clamp(max=T - 1)]  # x_{s+k+1}
            h = self.decoder(h, self.regressive_embedding(tok, target))
            z = self.mlps[k](h)
            outs.append((self.vocab_logits(target.final_norm(z), target), z))
        return outs

    def drafter(self, target, tree: TreeConfig) -> "CloverDrafter":
        return CloverDrafter(self, target, tree)


class CloverDrafter(RecurrentDrafter):
    """Per-run Clover state: the Augmenting Block's KV cache, the verified hidden states
    still waiting to enter it, and its last output h_0.

    :meth:`observe` only queues the verified states; the block runs over everything
    queued when a tree is next grown (:meth:`prepare`). A step that drafts no head tree
    (a lookup chain alone, ``clover.lookup.HybridDrafter``) then costs no block forward,
    and the drafting time the hybrid measures for the heads includes the block's. The
    block's outputs are the same either way: it is causal, and every queued position is
    verified.
    """

    def __init__(self, heads: CloverHeads, target, tree: TreeConfig):
        from clover.cache import buffered_cache

        super().__init__(heads, target, tree)
        self.cache = buffered_cache(heads.augment.config)  # appends in place, no copy per step
        self.length = 0  # positions in the block's cache
        self.waiting: list[torch.Tensor] = []  # (T, D) verified states not yet in the block
        self.h0: torch.Tensor | None = None  # (D,)

    def observe(self, hidden_pre: torch.Tensor, hidden_post: torch.Tensor, tokens=()) -> None:
        self.waiting.append(hidden_pre)

    def _take_waiting(self) -> torch.Tensor:
        """(T, D) the waiting states, in order, now entering the block (the queue empties
        and ``length`` counts them)."""
        hidden = torch.cat(self.waiting) if len(self.waiting) > 1 else self.waiting[0]
        self.waiting = []
        self.length += hidden.shape[0]
        return hidden

    def _run_block(self) -> None:
        """Run the Augmenting Block over the waiting positions (h_0: the last one's output)."""
        start = self.length
        out = self.heads.augment_hidden(self._take_waiting().unsqueeze(0), self.cache, start, last_only=True)
        self.h0 = out[0, -1]

    @property
    def state(self) -> torch.Tensor | None:
        """h_0 at the last verified position (the block first runs over what waits)."""
        if self.waiting:
            self._run_block()
        return self.h0

    @staticmethod
    def observe_many(drafters: list["CloverDrafter"], hidden_pre: list[torch.Tensor],
                     hidden_post: list[torch.Tensor], tokens: list) -> None:
        """:meth:`observe` for several rows: each queues its own states."""
        for d, h in zip(drafters, hidden_pre):
            d.waiting.append(h)

    @staticmethod
    def _run_blocks(drafters: list["CloverDrafter"]) -> None:
        """:meth:`_run_block` for several rows sharing one set of heads: one Augmenting
        Block forward over every row's waiting positions (:func:`run_augmenting_rows`),
        each row's block cache then holding exactly its own."""
        first = drafters[0]
        starts = [d.length for d in drafters]
        hidden = [first.heads.block_input(d._take_waiting()) for d in drafters]
        outs = run_augmenting_rows(first.heads.augment, hidden, [d.cache for d in drafters], starts)
        for d, out in zip(drafters, outs):
            d.h0 = out[-1]

    @classmethod
    def prepare(cls, drafters: list["CloverDrafter"], roots: list[int], max_depths: list[int]) -> list[int]:
        """The rows that draft run their blocks together over their waiting positions
        (:meth:`_run_blocks`), then each is ready when it has a state."""
        waiting = [d for d, depth in zip(drafters, max_depths) if depth > 0 and d.waiting]
        if len(waiting) > 1:
            cls._run_blocks(waiting)
        return super().prepare(drafters, roots, max_depths)
