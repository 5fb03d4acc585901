"""Batched plain decoding for throughput: self-distillation answers and Magpie prompts.

Not speculative: the target alone continues many prompts at once, because on a CPU one
forward over 64 rows costs about seven single-row forwards (measured on the 2-core VM,
SmolLM2-135M), so a batch makes several times more tokens per second than one stream.
This is the engine's own loop (:meth:`clover.engine.Engine.serve` with no heads: plain
decoding, the empty tree) with continuous batching: finished rows leave the batch, new
prompts join when a quarter of the rows are free, and the KV cache appends into
preallocated buffers. A conversation's next turn is queued once its answer is yielded
and prefilled whole (prompt, earlier answers and the new user turn).

Callers pass prompts sorted by length, so that rows decoded together have similar
context lengths. Each row's answer is the target's own greedy (argmax) or sampled
continuation; a sampled row draws from its own seeded generator, so its answer does not
depend on which rows shared its batch. Greedy rows equal single-stream greedy decoding up
to float rounding in batched products (a near-tie may flip).
"""
from __future__ import annotations

from typing import Callable, Hashable, Iterable, Iterator

from clover.acceptance import SamplingConfig
from clover.engine import Engine
from clover.requests import Request, validate_request

__all__ = ["Request", "generate_batch", "generate_many"]


def generate_many(target, requests: Iterable[Request], max_new_tokens: int, temperature: float = 0.0,
                  batch_size: int = 64, batch_tokens: int = 65536,
                  on_step: Callable[[int], None] | None = None) -> Iterator[tuple[Hashable, list[int]]]:
    """Continue many prompts with continuous batching; yield ``(key, answer)`` as rows end.

    Args:
        target: a :class:`clover.models.TargetModel`.
        requests: :class:`~clover.requests.Request` s, taken in order. Pass a
            ``collections.deque`` to add requests while iterating (e.g. a conversation's
            next turn once its answer is yielded); they join the batch at the next
            admission.
        max_new_tokens: cap per answer (a request's own ``max_new_tokens`` overrides it).
        temperature: 0 = greedy (argmax); > 0 samples softmax(logits / temperature);
            temperatures below :data:`clover.acceptance.GREEDY_BELOW` are greedy.
        batch_size: most rows decoded together.
        batch_tokens: a row joins only while rows x (cache length + ``max_new_tokens``)
            stays within this many KV-cache positions (bounds memory on long prompts).
        on_step: called with the number of rows after each decode step (progress bars).
    Yields:
        (request key, answer token ids; the last is an EOS id when the row stopped on one).
    Raises:
        ValueError: for bad settings at once; while iterating, for an empty prompt or a
            prompt that does not fit the context with ``max_new_tokens``.
    """
    results = Engine(target).serve(requests, max_new_tokens, SamplingConfig(temperature=temperature),
                                   batch_size=batch_size, batch_tokens=batch_tokens, on_step=on_step,
                                   trace_nodes=False)
    return ((key, result.token_ids) for key, result in results)


def generate_batch(target, prompts: list[list[int]], max_new_tokens: int, temperature: float = 0.0,
                   seeds: list[int] | None = None, batch_size: int = 64,
                   on_step: Callable[[int], None] | None = None) -> list[list[int]]:
    """Answers to ``prompts`` in their order (see :func:`generate_many`; seeds default to
    the row index)."""
    for i, p in enumerate(prompts):  # every prompt checked before any decoding
        try:
            validate_request(target, p, max_new_tokens)
        except ValueError as e:
            raise ValueError(f"prompt {i}: {e}") from None
    reqs = [Request(i, list(p), seeds[i] if seeds is not None else i) for i, p in enumerate(prompts)]
    out: list[list[int]] = [[] for _ in prompts]
    for key, answer in generate_many(target, reqs, max_new_tokens, temperature, batch_size,
                                     batch_tokens=1 << 62, on_step=on_step):
        out[key] = answer
    return out
