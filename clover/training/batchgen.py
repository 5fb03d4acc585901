"""Batched plain decoding for throughput: self-distillation answers and Magpie prompts.

Not speculative: the target alone continues many prompts at once, because on a CPU one
forward over 64 rows costs about seven single-row forwards (measured on the 2-core VM,
SmolLM2-135M), so a batch makes several times more tokens per second than one stream.
Three things keep the batch busy (continuous batching, as in serving engines):

* rows leave the batch as soon as they end (EOS or ``max_new_tokens``), and their KV
  cache rows are dropped, so finished answers cost nothing;
* new prompts join whenever a quarter of the rows are free: they are prefilled on
  their own, then their KV cache is appended below the running rows, right-aligned,
  with the gap masked (left padding, per-row position ids);
* a conversation's next turn, queued as soon as its previous answer is yielded, starts
  from that row's KV cache: only the new tokens are prefilled;
* the KV cache appends into preallocated buffers (:class:`clover.cache.BufferedLayer`)
  rather than concatenating at every step, and cache columns that are padding for every
  row are cropped off.

Callers pass prompts sorted by length, so that rows decoded together have similar
context lengths. Each row's answer is the target's own greedy (argmax) or sampled
continuation; a sampled row draws from its own seeded generator, so its answer does not
depend on which rows shared its batch. Greedy rows equal single-stream greedy decoding up
to float rounding in batched products (a near-tie may flip).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Callable, Hashable, Iterable, Iterator

import torch

from clover.acceptance import GREEDY_BELOW
from clover.cache import buffered_cache


@dataclass
class Request:
    """One prompt to continue: ``key`` names it in the results, ``seed`` seeds its sampling."""

    key: Hashable
    prompt: list[int]
    seed: int = 0


def _check(target, req: Request, max_new_tokens: int) -> None:
    if not req.prompt:
        raise ValueError(f"request {req.key!r} has an empty prompt")
    if len(req.prompt) + max_new_tokens > target.max_context:
        raise ValueError(f"request {req.key!r}: its prompt ({len(req.prompt)} tokens) plus "
                         f"{max_new_tokens} new tokens exceeds the model's context of {target.max_context}")


def generate_many(target, requests: Iterable[Request], max_new_tokens: int, temperature: float = 0.0,
                  batch_size: int = 64, batch_tokens: int = 65536,
                  on_step: Callable[[int], None] | None = None) -> Iterator[tuple[Hashable, list[int]]]:
    """Continue many prompts with continuous batching; yield ``(key, answer)`` as rows end.

    Args:
        target: a :class:`clover.models.TargetModel` (full-attention layers).
        requests: :class:`Request` s, taken in order. Pass a ``collections.deque`` to add
            requests while iterating (e.g. a conversation's next turn once its answer is
            yielded); they join the batch at the next admission. A request queued at
            once with the *same key* as the row just yielded, whose prompt starts with
            that row's prompt and answer (all but the answer's last token), reuses the
            row's KV cache.
        max_new_tokens: cap per answer.
        temperature: 0 = greedy (argmax); > 0 samples softmax(logits / temperature).
        batch_size: most rows decoded together.
        batch_tokens: a row joins only while rows x (cache length + ``max_new_tokens``)
            stays within this many KV-cache positions (bounds memory on long prompts).
        on_step: called with the number of rows after each decode step (progress bars).
    Yields:
        (request key, answer token ids; the last is an EOS id when the row stopped on one).
    Raises:
        ValueError: for an empty prompt, a prompt that does not fit the context with
            ``max_new_tokens``, or bad settings.
    """
    if max_new_tokens < 1 or batch_size < 1 or batch_tokens < 1:
        raise ValueError("max_new_tokens, batch_size and batch_tokens must be >= 1")
    if not 0 <= temperature < float("inf"):
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")
    if temperature < GREEDY_BELOW:  # as in SamplingConfig: such temperatures are greedy
        temperature = 0.0
    queue = requests if isinstance(requests, deque) else deque(requests)
    device, model = target.device, target.model
    eos = torch.tensor(sorted(target.eos_token_ids) or [-1], device=device)
    pad_id = max(int(eos[0]), 0)
    cache = buffered_cache(target.config)
    attn = torch.zeros((0, 0), dtype=torch.long, device=device)  # (rows, cache length + 1)
    last_pos = torch.zeros((0,), dtype=torch.long, device=device)
    logits = None  # (rows, V) next-token logits of every row
    rows: list[Request] = []
    answers: list[list[int]] = []
    gens: list[torch.Generator] = []
    retained: dict = {}  # key -> (token ids, per-layer (keys, values)) of rows just finished

    while True:
        # admit new rows when at least a quarter of the batch is free (or it is empty)
        free = batch_size - len(rows)
        if queue and (not rows or free * 4 >= batch_size):
            new: list[Request] = []
            length = cache.get_seq_length()
            while queue and len(new) < free:
                _check(target, queue[0], max_new_tokens)
                width = max([length + 1, len(queue[0].prompt)] + [len(r.prompt) for r in new])
                if (rows or new) and (len(rows) + len(new) + 1) * (width + max_new_tokens) > batch_tokens:
                    break
                new.append(queue.popleft())
            if new:
                # a follow-up that extends a conversation just finished reuses its KV cache
                reuse = [_extends(r, retained.get(r.key)) for r in new]
                fresh = [r for r, x in zip(new, reuse) if not x]
                parts = [_prefill(target, fresh, pad_id)] if fresh else []
                parts += [_extend(target, r, retained[r.key]) for r, x in zip(new, reuse) if x]
                new = fresh + [r for r, x in zip(new, reuse) if x]
                part = parts[0]
                for other in parts[1:]:
                    part = _merge(part, other)
                if rows:  # the running rows' mask, without its column for their pending token
                    part = _merge((logits, attn[:, :-1], last_pos, cache), part)
                logits, attn, last_pos, cache = part
                rows += new
                answers += [[] for _ in new]
                for r in new:
                    g = torch.Generator(device=device)
                    g.manual_seed(int(r.seed))
                    gens.append(g)
                attn = torch.cat([attn, attn.new_ones((len(rows), 1))], dim=1)
            retained = {}
        if not rows:
            return
        with torch.inference_mode():
            if temperature > 0:
                probs = torch.softmax(logits.float() / temperature, dim=-1)
                nxt = torch.cat([torch.multinomial(probs[j], 1, generator=gens[j]) for j in range(len(rows))])
            else:
                nxt = logits.argmax(-1)
            done = torch.isin(nxt, eos).tolist()
        finished = []
        for j, tok in enumerate(nxt.tolist()):
            answers[j].append(tok)
            if done[j] or len(answers[j]) >= max_new_tokens:
                done[j] = True
                finished.append((rows[j].key, answers[j]))
        if on_step is not None:
            on_step(len(rows))
        if finished:
            for j in range(len(rows)):  # keep their caches until the next admission
                if done[j]:
                    retained[rows[j].key] = _row_cache(cache, attn, j, rows[j].prompt + answers[j][:-1])
            keep = [j for j in range(len(rows)) if not done[j]]
            idx = torch.tensor(keep, dtype=torch.long, device=device)
            attn, last_pos, nxt = attn[idx], last_pos[idx], nxt[idx]
            # drop the finished rows and the columns that are padding in every other row
            first = int(torch.nonzero(attn.any(0)).flatten()[0]) if keep else attn.shape[1] - 1
            for layer in cache.layers:
                layer.select(idx, first)
            attn = attn[:, first:]
            rows = [rows[j] for j in keep]
            answers = [answers[j] for j in keep]
            gens = [gens[j] for j in keep]
            for item in finished:  # the caller may queue follow-up requests here
                yield item
        if rows:
            last_pos = last_pos + 1
            with torch.inference_mode():
                logits = model(input_ids=nxt[:, None], attention_mask=attn, position_ids=last_pos[:, None],
                               cache=cache, use_cache=True).logits[:, -1]
            attn = torch.cat([attn, attn.new_ones((len(rows), 1))], dim=1)


def _pad_left(mask: torch.Tensor, n: int) -> torch.Tensor:
    """(B, T) -> (B, n + T) with n zero columns in front."""
    if n <= 0:
        return mask
    return torch.cat([mask.new_zeros((mask.shape[0], n)), mask], dim=1)


# A batch part: (next-token logits (n, V), attention mask over its cache (n, W), last
# position id per row (n,), its buffered KV cache of W positions).


def _prefill(target, new: list[Request], pad_id: int):
    """Left-padded prefill of new rows: a batch part."""
    device = target.device
    width = max(len(r.prompt) for r in new)
    ids = torch.full((len(new), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(new), width), dtype=torch.long)
    for i, r in enumerate(new):
        ids[i, width - len(r.prompt):] = torch.tensor(r.prompt)
        attn[i, width - len(r.prompt):] = 1
    ids, attn = ids.to(device), attn.to(device)
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    cache = buffered_cache(target.config)
    with torch.inference_mode():
        logits = target.model(input_ids=ids, attention_mask=attn, position_ids=pos, cache=cache,
                              use_cache=True, logits_to_keep=1).logits[:, -1]
    return logits, attn, pos[:, -1], cache


def _row_cache(cache, attn: torch.Tensor, j: int, tokens: list[int]):
    """Row ``j``'s own cached positions (its padding left out): (tokens, [(k, v) per layer])."""
    cols = torch.nonzero(attn[j, :-1]).flatten()
    return tokens, [(layer.keys[j: j + 1].index_select(-2, cols), layer.values[j: j + 1].index_select(-2, cols))
                    for layer in cache.layers]


def _extends(req: Request, kept) -> bool:
    return kept is not None and len(req.prompt) > len(kept[0]) and req.prompt[: len(kept[0])] == kept[0]


def _extend(target, req: Request, kept):
    """Prefill only the new tail of a request whose prompt starts with a finished row's
    tokens, on top of that row's KV cache: a batch part of one row."""
    tokens, kv = kept
    cache = buffered_cache(target.config)
    for layer, (k, v) in zip(cache.layers, kv):
        layer.update(k, v)
    n, device = len(tokens), target.device
    tail = torch.tensor([req.prompt[n:]], device=device)
    pos = torch.arange(n, len(req.prompt), device=device)[None]
    attn = torch.ones((1, len(req.prompt)), dtype=torch.long, device=device)
    with torch.inference_mode():
        logits = target.model(input_ids=tail, attention_mask=attn, position_ids=pos, cache=cache,
                              use_cache=True, logits_to_keep=1).logits[:, -1]
    return logits, attn, pos[:, -1], cache


def _merge(a, b):
    """Rows of part ``a`` then of part ``b``, right-aligned in ``a``'s cache (changed in place)."""
    logits_a, attn_a, pos_a, cache_a = a
    logits_b, attn_b, pos_b, cache_b = b
    shift = 0
    for layer, other in zip(cache_a.layers, cache_b.layers):
        shift = layer.add_rows(other)
    width = cache_a.get_seq_length()
    attn = torch.cat([_pad_left(attn_a, shift), _pad_left(attn_b, width - attn_b.shape[1])])
    return torch.cat([logits_a, logits_b]), attn, torch.cat([pos_a, pos_b]), cache_a


def generate_batch(target, prompts: list[list[int]], max_new_tokens: int, temperature: float = 0.0,
                   seeds: list[int] | None = None, batch_size: int = 64,
                   on_step: Callable[[int], None] | None = None) -> list[list[int]]:
    """Answers to ``prompts`` in their order (see :func:`generate_many`; seeds default to
    the row index)."""
    reqs = [Request(i, p, seeds[i] if seeds is not None else i) for i, p in enumerate(prompts)]
    for r in reqs:
        _check(target, r, max_new_tokens)
    out: list[list[int]] = [[] for _ in prompts]
    for key, answer in generate_many(target, reqs, max_new_tokens, temperature, batch_size,
                                     batch_tokens=1 << 62, on_step=on_step):
        out[key] = answer
    return out
