"""Timing target forwards on this machine: the verify cost curve.

How long one target forward over n new tokens takes on top of a KV cache, as
verification runs them (the tree attention mask, the engine's preallocated cache), for
each n (:func:`time_forward`, :func:`verify_costs`), and which widths are cheaper padded
to a larger one (:func:`padded_widths`). Calls are interleaved (:func:`interleaved_ms`)
so a slow spell of the machine touches every width alike. The machine's load and whether
it is busy are :mod:`clover.machine`'s; what is stored of these figures,
:mod:`clover.calibration`'s.
"""
from __future__ import annotations

import statistics
import time
from typing import Sequence

import torch

from clover.cache import buffered_cache, crop_cache
from clover.requests import verify_inputs
from clover.tree import Tree


def interleaved_ms(fns, repeats: int, deadline: float | None = None, progress=None) -> list[list[float]]:
    """Wall times in ms of ``repeats`` calls of each of ``fns``, after one warm-up call of
    each (CUDA synchronised after each call when a GPU is present): one list per function.

    The calls are interleaved (round-robin: f1 f2 ... f1 f2 ...) rather than timed one
    function after another, so that a slow spell of the machine (another process, the
    clock) touches every function alike and their ratios, on which the auto tree decides,
    stay steady from one calibration to the next. Past ``deadline`` (``time.monotonic()``)
    no further round starts (one always runs); ``progress(what, done, total)`` is called
    after each round.
    """
    for fn in fns:
        if deadline is None or time.monotonic() < deadline:
            fn()  # warm-up (skipped once past the deadline: the timed round must fit)
    times: list[list[float]] = [[] for _ in fns]
    for r in range(repeats):
        if r and deadline is not None and time.monotonic() > deadline:
            break
        if r and progress is not None:
            progress("timing the budgets", r, repeats)
        for i, fn in enumerate(fns):
            t = time.perf_counter()
            fn()
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            times[i].append((time.perf_counter() - t) * 1e3)
    return times


def verify_once(target, cache, prefix_len: int, tree: Tree, batch_size: int = 1):
    """A callable that runs one verification forward of ``tree`` on top of the
    ``prefix_len`` cached tokens, then crops the cache back (for timing); with
    ``batch_size`` B, of B rows each verifying ``tree`` (the cache holds B rows)."""
    tokens, pos, mask = verify_inputs([tree] * batch_size, [prefix_len] * batch_size, prefix_len,
                                      target.dtype, target.device)

    def run():
        target.forward_batch(tokens, pos, mask, cache)
        crop_cache(cache, prefix_len)
    return run


def prefilled_rows(target, prefix_len: int, batch_size: int = 1, extra: int = 0):
    """A KV cache of ``batch_size`` rows holding the same ``prefix_len`` random tokens
    (seeded), the timing set-up of :func:`time_forward` and :func:`auto_tree`.

    Call under ``torch.inference_mode()``.

    Returns:
        (ids (1, prefix_len + extra) long: the prefix then ``extra`` more tokens to
        verify, the cache, the prefill's :class:`~clover.models.TargetOutput`: hidden
        states (B, P, D) at every position, logits at the last only).
    """
    ids = torch.randint(0, target.vocab_size, (1, prefix_len + extra),
                        generator=torch.Generator().manual_seed(0)).to(target.device)
    rows = ids[:, :prefix_len].expand(batch_size, -1)  # (B, P): every row the same text
    cache = buffered_cache(target.config)  # as the engine's runs append: no copy of the cache per forward
    out = target.forward_batch(rows, torch.arange(prefix_len, device=target.device)[None].expand_as(rows),
                               None, cache, last_only=True)
    return ids, cache, out


def time_forward(target, sizes, prefix_len: int = 256, repeats: int = 3, batch_size: int = 1,
                 quiet: bool = False) -> list[float]:
    """Median wall time (ms) of one target forward over n new tokens on top of a KV cache
    of ``prefix_len`` tokens, for each n in ``sizes`` (n tokens as a chain, with the tree
    attention mask, as verification runs them). Shows how the cost grows with the
    tokens processed at once: nearly flat on a GPU, rising on a CPU. With ``batch_size``
    B, of one batched forward where each of B rows verifies n tokens (``clover.engine``'s
    batched step). With ``quiet``, the fastest of the ``repeats`` calls instead of the
    median: load only ever adds time, so on a busy machine the fastest call is the
    nearest to the machine's own cost (what :func:`auto_tree` decides on too)."""
    prefix_len = max(1, min(prefix_len, target.max_context - max(sizes)))  # fit any context
    with torch.inference_mode():
        ids, cache, _ = prefilled_rows(target, prefix_len, batch_size, extra=max(sizes))
        chains = [Tree(ids[0, prefix_len: prefix_len + n], list(range(-1, n - 1)), list(range(n)),
                       [1.0] * n) for n in sizes]
        times = interleaved_ms([verify_once(target, cache, prefix_len, c, batch_size) for c in chains], repeats)
    return [min(t) if quiet else statistics.median(t) for t in times]


def padded_widths(costs: Sequence[float], n: int, saving: float = 0.05) -> tuple[int, ...]:
    """The padded verification plan from a measured cost curve: for k = 1..``n`` tokens,
    the width w >= k of the cheapest forward in ``costs`` (``costs[w - 1]``: ms over w
    tokens), taken only when it saves at least ``saving`` (a fraction) over k itself, so
    that timing noise never pads; else k.

    Raises:
        ValueError: when ``costs`` covers fewer than ``n`` sizes.
    """
    if len(costs) < n:
        raise ValueError(f"a plan for {n} tokens needs costs for at least {n} sizes, got {len(costs)}")
    plan = []
    for k in range(1, n + 1):
        w = min(range(k, len(costs) + 1), key=lambda j: (costs[j - 1], j))
        plan.append(w if costs[w - 1] <= (1 - saving) * costs[k - 1] else k)
    return tuple(plan)
