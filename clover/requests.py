"""What enters the decoding loop (:mod:`clover.engine`): a request checked before any
model work (:func:`validate_request`), the row it becomes (:class:`Row`), the queued
requests that join a running batch (:func:`admit_requests`), and the inputs of the
target's prefill and verification forwards in the batch layout (:func:`prefill_inputs`,
:func:`verify_inputs`; the layout is :mod:`clover.engine`'s module text), with the check
of what comes back (:func:`check_finite`).

Rows that join (:meth:`clover.Engine.serve`, continuous batching for throughput, as data
generation uses it): between two steps, when the batch is empty or a quarter of its rows
is free, queued requests join (:func:`admit_requests`). Their prompts are prefilled
together in one forward in a KV cache of their own (right padded) and its rows are placed
below the running rows (:func:`clover.cache.append_rows`): the shorter side gets zero
columns, which are padding like any other and never attended to. From then on they are
rows like the others.

Why right padding: rows accept different numbers of tokens every step. With right padding
each row's accepted path is written into its own gap, a copy of m_b columns per row.
Left padding (rows aligned at the end) would have to shift every row that accepted fewer
tokens than the longest, a copy of its whole cache, or leave holes inside rows that grow
with every step. With one row, L_0 = P always: no padding, no mask for a root-only tree,
and the compaction is the single-prompt one (a crop for a chain), as before batching.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Hashable, Sequence

import torch

from clover.heads.drafter import Drafter
from clover.models import TargetModel, TextStream, check_text
from clover.trace import StepTrace
from clover.tree import Tree, batch_position_ids, batch_tree_mask, position_ids, tree_mask

if TYPE_CHECKING:
    from clover.engine import Engine


class NonFiniteLogitsError(RuntimeError):
    """The target model returned NaN or infinite logits (a broken or overflowing model:
    fp16 overflow, corrupt weights). Decoding stops; nothing derived from those logits is
    emitted."""


def check_finite(logits: torch.Tensor, lengths: Sequence[int], where: str) -> None:
    """Raise :class:`NonFiniteLogitsError` when any of row b's first ``lengths[b]``
    positions of ``logits`` (B, T, V) holds NaN or inf (padding beyond them is not
    looked at). One min/max reduction per row (NaN propagates through it, and it cannot
    overflow as a sum could in fp16): for a 49,152-token vocabulary on this CPU about
    16 us at one node and 46 us at eleven, next to a 33-75 ms forward (an ``isfinite``
    mask took 63 and 556 us).

    Raises:
        NonFiniteLogitsError: naming ``where`` ("the prompt's prefill", "decode step N").
    """
    for b, n in enumerate(lengths):
        if n and not bool(torch.isfinite(torch.stack(torch.aminmax(logits[b, :n]))).all()):
            row = f" (batch row {b})" if len(lengths) > 1 else ""
            raise NonFiniteLogitsError(
                f"the target model returned non-finite logits (NaN or inf) at {where}{row}; "
                f"decoding stopped and nothing was produced from them. The model's weights "
                f"or its dtype are the usual cause (fp16 overflows where bf16 or fp32 do not)")


def validate_request(target: TargetModel, prompt: Sequence[int], max_new_tokens: int,
                     stop_strings: Sequence[str] = ()) -> None:
    """Check one generation request before any model work; the engine, CLI and app all
    call this, so a setting is refused the same way everywhere.

    Raises:
        ValueError: empty prompt, token ids outside the vocabulary, prompt (plus
            ``max_new_tokens``) longer than the model's context, ``max_new_tokens`` not a
            positive integer, an empty or non-string stop string, or one that is not
            valid UTF-8 text (a byte that was not UTF-8 on the command line: it could
            never match).
    """
    if not prompt:
        raise ValueError("the prompt is empty")
    if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens <= 0:
        raise ValueError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
    if isinstance(stop_strings, str):
        raise ValueError("stop_strings must be a list of strings, not one string")
    for i, s in enumerate(stop_strings):
        if not isinstance(s, str) or s == "":
            raise ValueError(f"stop strings must be non-empty text, got {s!r}")
        check_text(s, f"the stop string at index {i}" if len(stop_strings) > 1 else "the stop string")
    if min(prompt) < 0 or max(prompt) >= target.vocab_size:
        raise ValueError(f"prompt token ids must lie in the vocabulary [0, {target.vocab_size})")
    context = f"the model's context of {target.max_context}"
    if getattr(target, "sliding_window", None):
        context += (f" (its sliding attention window: decoding here keeps every position, "
                    f"so prompt and answer must fit in {target.sliding_window} tokens)")
    if len(prompt) >= target.max_context:
        raise ValueError(f"the prompt has {len(prompt)} tokens; it must be shorter than {context}")
    if len(prompt) + max_new_tokens > target.max_context:
        raise ValueError(
            f"prompt ({len(prompt)} tokens) + max_new_tokens ({max_new_tokens}) exceeds "
            f"{context}; lower max_new_tokens to at most {target.max_context - len(prompt)}"
        )


def verify_inputs(trees: Sequence[Tree], lengths: Sequence[int], prefix_len: int,
                  dtype: torch.dtype, device,
                  width: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The inputs of one verification forward over B rows' trees (batch layout: module
    docstring), padded to ``width`` nodes per row where that is more than the largest
    tree (a padding node attends only to itself and nothing attends to it, so the trees'
    logits are unchanged; see :meth:`Engine.verify_widths`).

    Args:
        trees: one candidate tree per row, N_b nodes each.
        lengths: L_b, the committed positions of row b in the KV cache (its columns
            ``[0, L_b)``; its columns ``[L_b, prefix_len)`` are padding).
        prefix_len: P, the KV cache's length (>= every L_b).
        dtype: the mask's float dtype (the target's).
    Returns:
        ids: (B, N) long, N = max N_b; padding nodes repeat their row's root token.
        positions: (B, N) long, ``L_b + depth`` (padding nodes: ``L_b``).
        mask: None when every tree is the root alone and every L_b = P (plain causal
            attention is then exact), else a (B, 1, N, P + N) additive float mask: 0 where
            node i may attend (its row's committed columns, its ancestors, itself),
            ``finfo(dtype).min`` elsewhere. A float mask, because transformers passes a 4D
            float mask to attention verbatim, while a 4D bool mask is silently mishandled by
            some attention backends.
    Raises:
        ValueError: when the lists differ in length or a row claims more than P positions.
    """
    if len(trees) != len(lengths):
        raise ValueError(f"{len(trees)} trees but {len(lengths)} row lengths")
    if any(n > prefix_len for n in lengths):
        raise ValueError(f"row lengths {list(lengths)} exceed the cache's {prefix_len} positions")
    n = max(max(len(t) for t in trees), width or 0)
    if len(trees) == 1 and lengths[0] == prefix_len and n == len(trees[0]):  # the single-prompt case
        tree = trees[0]
        mask = tree_mask(tree.parents, prefix_len, dtype, device) if n > 1 else None
        return tree.tokens[None].to(device), position_ids(tree.depths, prefix_len, device), mask
    tokens = [tree.tokens.tolist() for tree in trees]
    ids = torch.tensor([t + t[:1] * (n - len(t)) for t in tokens], device=device)  # (B, N)
    positions = batch_position_ids([tree.depths for tree in trees], lengths, device, width=n)  # (B, N)
    if n == 1 and all(L == prefix_len for L in lengths):
        return ids, positions, None
    return ids, positions, batch_tree_mask([tree.parents for tree in trees], lengths, prefix_len, dtype, device,
                                           width=n)


def prefill_inputs(prompts: Sequence[Sequence[int]], dtype: torch.dtype,
                   device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The inputs of one prefill forward over B rows, right padded (each row's tokens
    start at column 0; see the module docstring).

    Args:
        prompts: the tokens to prefill per row (each prompt but its last token), T_b >= 0
            of them, at least one row non-empty.
    Returns:
        ids: (B, T) long, T = max T_b, padded with token 0.
        positions: (B, T) long, ``0 .. T - 1`` for every row.
        mask: None when every row has T tokens (causal attention is then exact), else a
            (B, 1, T, T) additive float mask: causal within a row's own tokens; a padding
            position attends to its row's tokens and to itself, and none attends to it.
    """
    b, t = len(prompts), max(len(p) for p in prompts)
    ids = torch.zeros((b, t), dtype=torch.long)
    for row, p in enumerate(prompts):
        ids[row, :len(p)] = torch.tensor(p, dtype=torch.long)
    positions = torch.arange(t)[None, :].repeat(b, 1)
    if all(len(p) == t for p in prompts):
        return ids.to(device), positions.to(device), None
    lengths = torch.tensor([len(p) for p in prompts])
    q, k = torch.arange(t)[:, None], torch.arange(t)[None, :]
    allowed = (k <= q) & ((k[None] < lengths[:, None, None]) | (k == q))  # (B, T, T)
    mask = torch.zeros((b, 1, t, t), dtype=dtype)
    mask.masked_fill_(~allowed[:, None], torch.finfo(dtype).min)
    return ids.to(device), positions.to(device), mask.to(device)


@dataclass
class Request:
    """One prompt for :meth:`Engine.serve`.

    Attributes:
        key: names the request in what ``serve`` yields (any hashable value).
        prompt: the prompt's token ids.
        seed: seeds the row's own sampling generator, so a sampled answer does not depend
            on which rows shared its batch.
        max_new_tokens: this request's cap; None takes ``serve``'s.
    """

    key: Hashable
    prompt: list[int]
    seed: int = 0
    max_new_tokens: int | None = None


@dataclass
class Row:
    """One prompt's state in a (batched) run."""

    index: int  # the row's place in the batch as given, or in admission order (trace.row)
    prompt: list[int]
    max_new_tokens: int
    drafter: Drafter
    generator: torch.Generator
    detok: TextStream
    key: Hashable = None  # the request's key (Engine.serve)
    length: int = 0  # L_b: committed positions in the target's KV cache
    root: int = 0  # the last committed token, not yet in the KV cache
    new: list[int] = field(default_factory=list)
    steps: list[StepTrace] = field(default_factory=list)
    stop_reason: str | None = None
    decode_s: float = 0.0
    prefill_ms: float = 0.0

    def commit(self, tokens: list[int], eos_ids, stop_strings: Sequence[str], tokenizer) -> list[int]:
        """Commit a step's tokens (its accepted drafts, then the bonus token) one at a
        time, stopping exactly where plain decoding would: after an EOS (kept), once a stop
        string appears in the new text, or at ``max_new_tokens``; sets ``stop_reason``
        ("eos", "stop_string", "length", or None to go on) and returns the tokens kept."""
        kept: list[int] = []
        for tok in tokens:
            kept.append(tok)
            if tok in eos_ids:
                self.stop_reason = "eos"
                break
            if stop_strings and any(s in tokenizer.decode(self.new + kept) for s in stop_strings):
                self.stop_reason = "stop_string"
                break
            if len(self.new) + len(kept) >= self.max_new_tokens:
                self.stop_reason = "length"
                break
        self.new.extend(kept)
        return kept


def new_row(engine: "Engine", index: int, prompt: list[int], max_new_tokens: int, seed: int | None,
             key: Hashable = None) -> Row:
    """A row with a fresh drafter and its own generator, seeded with ``seed`` (None: a
    random seed)."""
    generator = torch.Generator(device=engine.target.device)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(int(seed))
    return Row(index, prompt, max_new_tokens, engine.drafter(), generator, TextStream(engine.target.tokenizer),
                key=key)


def admit_requests(queue: deque, active: Sequence[Row], width: int, max_new_tokens: int,
                   batch_size: int, batch_tokens: int) -> list[Request]:
    """The queued requests that join a running batch before its next step (continuous
    batching, :meth:`Engine.serve`), taken from the front of ``queue``.

    None join unless the batch is empty or at least a quarter of ``batch_size`` is free;
    then requests join in queue order while a row is free and rows x (cache width +
    the longest ``max_new_tokens`` among them) stays within ``batch_tokens`` (a request
    joining an empty batch always joins).

    Args:
        active: the running rows; width: their KV cache's length P (columns).
        max_new_tokens: the cap of requests that give none.
    """
    free = batch_size - len(active)
    if not queue or (active and 4 * free < batch_size):
        return []
    taken: list[Request] = []
    longest = max((r.max_new_tokens for r in active), default=0)
    cols = width + 1 if active else 0  # the cache's columns once every row holds its root
    while queue and len(taken) < free:
        req = queue[0]
        cap = max(longest, max_new_tokens if req.max_new_tokens is None else req.max_new_tokens)
        cols_with = max(cols, len(req.prompt))
        if (active or taken) and (len(active) + len(taken) + 1) * (cols_with + cap) > batch_tokens:
            break
        taken.append(queue.popleft())
        longest, cols = cap, cols_with
    return taken
