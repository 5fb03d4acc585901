"""The one decoding loop: draft -> verify -> accept -> update cache, for every method and
every batch size.

Plain autoregressive decoding is the same loop with the empty tree (root only), so all
methods run on identical machinery and their timings compare like with like.

Per step (Medusa arXiv 2401.10774 §2; Clover arXiv 2405.00263 §3):

1. draft: the method's drafter grows a candidate tree rooted at the last committed token
   (not yet in the target's KV cache);
2. verify: the target runs once over the flattened tree on top of its KV cache, with a
   tree attention mask and position ids ``prefix_len + depth``;
3. accept: an acceptance rule keeps a root-to-node path and produces the bonus token;
4. update cache: the target's KV cache is compacted to the accepted path and the drafter
   observes the verified hidden states of those positions.

Generation stops exactly as plain decoding would: at the first EOS (kept in the output),
after ``max_new_tokens`` (never overshot) or once a stop string appears.

Batches (:meth:`Engine.generate_batch`; Clover's serving regime, arXiv 2405.00263 Table 1).
B prompts decode together. Each row has its own drafter (drafters hold per-run state), its
own random generator, its own tree (same budget for every row), its own acceptance and its
own stopping; one target forward verifies every row's tree. A single prompt
(:meth:`Engine.stream`, :meth:`Engine.generate`) runs this same loop with B = 1. The
layout, and why it is exact:

* KV cache: right padded, with a valid length L_b per row. Row b's committed positions
  fill cache columns ``[0, L_b)``; the cache is P = max_b L_b columns long and row b's
  columns ``[L_b, P)`` are padding (stale keys that nothing attends to). Prompts of
  different lengths are prefilled in one forward, right padded.
* Verify: every row's tree is padded to N = max_b N_b nodes (padding nodes repeat the
  root token) and appended at columns ``[P, P + N)``. Row b's node i has position id
  ``L_b + depth_i``, its true position in its own sequence, so RoPE or learned positions
  never see the padding. It attends to columns ``[0, L_b)``, to its ancestors and to
  itself; a padding node attends only to itself and nothing attends to it. The mask
  (:func:`verify_inputs`) is an additive float (B, 1, N, P + N) tensor, which transformers
  hands to attention unchanged: a masked key weighs ``exp(finfo.min) = 0`` exactly, so a
  row's logits are its unbatched logits up to the float rounding of batched products.
* Draft: per row, from its own drafter; rows whose drafters can draft together
  (``draft_many``: Medusa makes one heads call over every row's hidden state, Clover and
  Clover-2 grow the rows' trees in lock step, one head step per depth) do so
  (:func:`clover.heads.drafter.draft_rows`). Likewise each row's drafter observes its
  accepted states, and rows that can observe together (``observe_many``) do so
  (:func:`clover.heads.drafter.observe_rows`). Clover and Clover-2 queue the states and
  run their Augmenting Blocks when they next draft, once over every drafting row's
  waiting positions.
* Accept: per row, on that row's own N_b logits.
* Update cache: row b's accepted nodes move from columns ``P + path`` to ``[L_b, L_b + m_b)``
  (:func:`clover.cache.compact_rows`): every row stays contiguous from column 0, and the
  cache is cropped to the new longest row. Rows that finish (EOS, stop string, their own
  ``max_new_tokens``) leave the batch: their cache rows are dropped, so they cost no more
  drafting or verification.

Rows that join (:meth:`Engine.serve`, continuous batching for throughput, as data
generation uses it): between two steps, when the batch is empty or a quarter of its rows
is free, queued requests join (:func:`admit_requests`). Their prompts are prefilled
together in one forward in a KV cache of their own (right padded, as above) and its rows
are placed below the running rows (:func:`clover.cache.append_rows`): the shorter side
gets zero columns, which are padding like any other and never attended to. From then on
they are rows like the others; :meth:`Engine.stream_batch` is the case where every row
joins before the first step (:class:`StepLoop` runs both).

Why right padding: rows accept different numbers of tokens every step. With right padding
each row's accepted path is written into its own gap, a copy of m_b columns per row.
Left padding (rows aligned at the end) would have to shift every row that accepted fewer
tokens than the longest, a copy of its whole cache, or leave holes inside rows that grow
with every step. With one row, L_0 = P always: no padding, no mask for a root-only tree,
and the compaction is the single-prompt one (a crop for a chain), as before batching.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from itertools import count
from typing import Callable, Hashable, Iterable, Iterator, Sequence

import torch

from clover.acceptance import Acceptance, SamplingConfig, accept_rows, logits_to_probs
from clover.cache import append_rows, buffered_cache, cache_length, compact_rows, new_cache, select_rows
from clover.heads import DraftHeads, PlainDrafter, check_fits
from clover.heads.drafter import Drafter, draft_rows, observe_rows
from clover.lookup import HybridDrafter, LookupConfig, LookupDrafter
from clover.models import TargetModel, TextStream, check_text, token_texts
from clover.trace import TARGET_TOP, GenerationResult, StepTrace, TreeNode
from clover.tree import (Tree, TreeConfig, batch_position_ids, batch_tree_mask, position_ids,
                         tree_mask)


class Engine:
    """Speculative (or plain) decoding of one prompt, or a batch of prompts, with a target model.

    Args:
        target: the target model.
        heads: Medusa or Clover heads; None for plain autoregressive decoding.
        tree: how each step's candidate tree is grown, a concrete tree (ignored for plain
            decoding; a tree of kind "off" drafts nothing, so the heads decode as plain
            decoding). The setting "auto" is resolved before, at the edges, by
            ``clover.calibration.resolve_tree``.
        lookup: prompt lookup drafting (``clover.lookup``): alone (no heads) it is the
            method "lookup"; with heads it adds a lookup branch to their tree
            ("medusa+lookup", "clover+lookup"; sized per step, see
            ``clover.lookup.HybridDrafter``).
        verify_widths: padded verification (None: off): ``verify_widths[n - 1]`` (>= n)
            is how many tokens a one-row step that verifies n runs the target's forward
            over, the extra ones padding that attends only to itself (the logits, the
            KV cache kept and so the text are unchanged). On a CPU a forward over more
            tokens can cost less (e.g. 16 tokens less than 13); see
            ``clover.calibration.verify_widths``, which measures the plan. Steps of more
            tokens than the plan covers, and batched steps, are not padded.
    Raises:
        ValueError: when the heads do not fit the target, ``tree`` is still "auto", or
            a verify width is below its token count.
    """

    def __init__(self, target: TargetModel, heads: DraftHeads | None = None,
                 tree: TreeConfig | None = None, lookup: LookupConfig | None = None,
                 verify_widths: Sequence[int] | None = None):
        if heads is not None:
            check_fits(heads.config, target)
            target.capture_layers(heads.config.fuse_layers)  # the features they read
        if tree is not None and tree.auto:
            raise ValueError("the tree setting 'auto' is resolved before building an Engine: "
                             "tree, lookup = clover.calibration.resolve_tree(target, heads, tree, lookup)")
        self.target = target
        self.heads = heads
        self.tree = tree or TreeConfig()
        self.method = method_name(heads, lookup)
        self.lookup = lookup
        if verify_widths is not None and any(int(w) < n for n, w in enumerate(verify_widths, 1)):
            raise ValueError(f"verify_widths[n - 1] must be >= n tokens, got {list(verify_widths)}")
        self.verify_widths = tuple(int(w) for w in verify_widths) if verify_widths else None

    @property
    def max_step_tokens(self) -> int:
        """The most tokens one step of one row can verify: the root, the heads' tree
        budget (static: its paths) and the lookup chain (at most ``max_tokens``)."""
        heads = self.tree.nodes if self.heads is not None else 0
        return 1 + heads + (self.lookup.max_tokens if self.lookup is not None else 0)

    def drafter(self):
        """A fresh per-run drafter for this engine's method (see ``clover.heads.drafter.Drafter``)."""
        heads = (self.heads.drafter(self.target, self.tree)
                 if self.heads is not None and not self.tree.off else None)
        if self.lookup is None:
            return heads or PlainDrafter()
        lookup = LookupDrafter(self.lookup)
        if heads is None:
            return lookup
        return HybridDrafter(heads, lookup, self.tree.nodes)

    def stream(self, prompt_ids: Sequence[int], max_new_tokens: int = 128,
               sampling: SamplingConfig | None = None,
               stop_strings: Sequence[str] = ()) -> "DecodeRun":
        """Start a run; iterate it for one :class:`StepTrace` per step.

        After the iteration ends, ``run.result`` holds the :class:`GenerationResult`.

        Raises:
            ValueError: see :func:`validate_request`.
        """
        return DecodeRun(self, list(prompt_ids), max_new_tokens, sampling or SamplingConfig(),
                         tuple(stop_strings))

    def generate(self, prompt_ids: Sequence[int], max_new_tokens: int = 128,
                 sampling: SamplingConfig | None = None,
                 stop_strings: Sequence[str] = ()) -> GenerationResult:
        """Blocking generation; see :meth:`stream` for the arguments and errors."""
        run = self.stream(prompt_ids, max_new_tokens, sampling, stop_strings)
        for _ in run:
            pass
        return run.result

    def stream_batch(self, prompts: Sequence[Sequence[int]],
                     max_new_tokens: int | Sequence[int] = 128,
                     sampling: SamplingConfig | None = None, stop_strings: Sequence[str] = (),
                     seeds: Sequence[int] | None = None) -> "BatchRun":
        """Start a batched run of B prompts; iterate it for each step's traces (one
        :class:`StepTrace` per row still decoding, ``trace.row`` naming it).

        After the iteration ends, ``run.results`` holds one :class:`GenerationResult` per
        prompt, in prompt order.

        Args:
            prompts: B token-id lists (any lengths).
            max_new_tokens: one cap for every row, or one per row.
            sampling: shared by every row; each row samples from its own generator.
            stop_strings: shared by every row.
            seeds: one sampling seed per row; default ``sampling.seed + b`` for row b
                (so row 0 of a batch samples what :meth:`stream` does with that seed),
                or random seeds when ``sampling.seed`` is None.
        Raises:
            ValueError: no prompts, ``max_new_tokens`` or ``seeds`` not one per prompt,
                or a request :func:`validate_request` refuses (naming the row).
        """
        return BatchRun(self, prompts, max_new_tokens, sampling or SamplingConfig(),
                        tuple(stop_strings), seeds)

    def generate_batch(self, prompts: Sequence[Sequence[int]],
                       max_new_tokens: int | Sequence[int] = 128,
                       sampling: SamplingConfig | None = None, stop_strings: Sequence[str] = (),
                       seeds: Sequence[int] | None = None) -> list[GenerationResult]:
        """Blocking batched generation: one :class:`GenerationResult` per prompt, in order.

        Each row's ``decode_s`` is the time of the batch steps it took part in, so the
        batch's total throughput is ``sum(len(r.token_ids)) / max(r.decode_s)``. See
        :meth:`stream_batch` for the arguments and errors.
        """
        run = self.stream_batch(prompts, max_new_tokens, sampling, stop_strings, seeds)
        for _ in run:
            pass
        return run.results

    def serve(self, requests: Iterable[Request], max_new_tokens: int = 128,
              sampling: SamplingConfig | None = None, stop_strings: Sequence[str] = (),
              batch_size: int = 64, batch_tokens: int = 65536,
              on_step: Callable[[int], None] | None = None,
              trace_nodes: bool = True) -> Iterator[tuple[Hashable, GenerationResult]]:
        """Decode a stream of requests with continuous batching; yield each as its row ends.

        The loop of :meth:`stream_batch`, with rows that join while it runs: before a step,
        when the batch is empty or at least a quarter of ``batch_size`` rows is free,
        queued requests join (:func:`admit_requests`): their prompts are prefilled
        together in one forward, in a KV cache of their own, and placed below the running
        rows. Finished rows leave at once. Each row decodes what it decodes alone
        (greedy: token for token, up to the float rounding of batched products; sampled:
        from its own generator, seeded with ``Request.seed``). The KV cache appends into
        preallocated buffers (:class:`clover.cache.BufferedLayer`) instead of copying the
        whole cache at every step. Traces: ``trace.row`` numbers the rows in admission
        order, ``trace.step`` counts each row's own steps; a row's ``prefill_ms`` is its
        admission's prefill, and its ``decode_s`` the time of the steps it took part in.

        Args:
            requests: :class:`Request` s, taken in order. A ``collections.deque`` is read
                as a queue: requests appended to it while iterating (a conversation's next
                turn, once its answer is yielded) join at the next admission.
            max_new_tokens: the cap of every request that gives none.
            sampling: shared by every row (default greedy).
            stop_strings: shared by every row.
            batch_size: most rows decoded together.
            batch_tokens: a request joins only while rows x (KV-cache columns +
                ``max_new_tokens``) stays within this many positions (bounds memory on
                long prompts); one row always runs.
            on_step: called after every step with the number of rows that took part
                (progress bars).
            trace_nodes: record each step's tree nodes; False leaves ``StepTrace.nodes``
                empty (the target's top tokens per node are a softmax and top-k over the
                vocabulary and a detokenisation per row and step), every other field kept.
        Yields:
            (``Request.key``, :class:`GenerationResult`) per request, as its row finishes
            (EOS kept in ``token_ids``, a stop string, or its ``max_new_tokens``).
        Raises:
            ValueError: at once for ``batch_size``, ``batch_tokens`` or ``max_new_tokens``
                below 1; while iterating, for a request :func:`validate_request` refuses
                (naming its key).
            NonFiniteLogitsError: the target's logits hold NaN or inf.
        """
        for name, value in (("max_new_tokens", max_new_tokens), ("batch_size", batch_size),
                            ("batch_tokens", batch_tokens)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        queue = requests if isinstance(requests, deque) else deque(requests)
        loop = StepLoop(self, sampling or SamplingConfig(), tuple(stop_strings), buffered_cache, trace_nodes)
        return self._serve(loop, queue, max_new_tokens, batch_size, batch_tokens, on_step)

    def _serve(self, loop: "StepLoop", queue: deque, max_new_tokens: int, batch_size: int,
               batch_tokens: int, on_step) -> Iterator[tuple[Hashable, GenerationResult]]:
        index = count()

        def admit(active: list[_Row], width: int) -> list[_Row]:
            reqs = admit_requests(queue, active, width, max_new_tokens, batch_size, batch_tokens)
            return [self._request_row(next(index), req, max_new_tokens, loop.stop_strings) for req in reqs]

        for traces, finished in loop.run(admit):
            if on_step is not None:
                on_step(len(traces))
            for row in finished:
                yield row.key, loop.result(row)

    def _request_row(self, index: int, req: Request, max_new_tokens: int, stop_strings) -> "_Row":
        """A checked :class:`Request`'s row (``trace.row`` = ``index``).

        Raises:
            ValueError: see :func:`validate_request`, naming the request's key.
        """
        prompt = list(req.prompt)
        cap = max_new_tokens if req.max_new_tokens is None else req.max_new_tokens
        try:
            validate_request(self.target, prompt, cap, stop_strings)
        except ValueError as e:
            raise ValueError(f"request {req.key!r}: {e}") from None
        return _new_row(self, index, prompt, cap, req.seed, req.key)


def lockstep(runs: dict, rotate: bool = False,
             rounds: bool = False) -> Iterator[tuple[str | None, object]]:
    """Advance the generators ``runs`` (name -> generator) one item each in turn, in their
    order, until all are exhausted, yielding ``(name, item)`` for every item. How the app
    races its methods and the bench runs a prompt's methods: one decode step of each in
    turn, never two at once, so a slow spell of the machine lands on all of them alike.

    Args:
        rotate: start each round one run later (round r begins with the r-th run still
            going), so no run always comes first after whatever happened between rounds.
        rounds: yield ``(None, None)`` after every round that leaves a run going: a point
            where no run is mid-step
            (the app draws its page there, outside every timed step).

    Closing this generator closes every run."""
    active = list(runs)
    try:
        r = 0
        while active:
            start = r % len(active) if rotate else 0
            for name in active[start:] + active[:start]:
                try:
                    item = next(runs[name])
                except StopIteration:
                    active.remove(name)
                    continue
                yield name, item
            r += 1
            if rounds and active:
                yield None, None
    finally:
        for run in runs.values():
            run.close()


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


@dataclass(frozen=True)
class StepTimes:
    """Wall time of one step's parts, in ms: ``draft`` (growing the trees), ``forward``
    (the target's forward over them), ``accept`` (acceptance, commit, KV-cache
    compaction), ``update`` (the drafters observing the verified states)."""

    draft: float
    forward: float
    accept: float
    update: float


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
class _Row:
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


def _new_row(engine: Engine, index: int, prompt: list[int], max_new_tokens: int, seed: int | None,
             key: Hashable = None) -> _Row:
    """A row with a fresh drafter and its own generator, seeded with ``seed`` (None: a
    random seed)."""
    generator = torch.Generator(device=engine.target.device)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(int(seed))
    return _Row(index, prompt, max_new_tokens, engine.drafter(), generator, TextStream(engine.target.tokenizer),
                key=key)


class BatchRun:
    """One generation run of B prompts; iterate it to decode step by step (see
    :meth:`Engine.stream_batch`). Each iteration yields the traces of one step, one per
    row that took part (finished rows take part no more), in row order. It is the
    :class:`StepLoop` with every row admitted before the first step."""

    def __init__(self, engine: Engine, prompts: Sequence[Sequence[int]],
                 max_new_tokens: int | Sequence[int], sampling: SamplingConfig,
                 stop_strings: tuple[str, ...], seeds: Sequence[int] | None = None):
        prompts = [list(p) for p in prompts]
        if not prompts:
            raise ValueError("the batch holds no prompts")
        caps = [max_new_tokens] * len(prompts) if isinstance(max_new_tokens, int) else list(max_new_tokens)
        if len(caps) != len(prompts):
            raise ValueError(f"max_new_tokens gives {len(caps)} caps for {len(prompts)} prompts")
        if seeds is not None and len(seeds) != len(prompts):
            raise ValueError(f"{len(seeds)} seeds for {len(prompts)} prompts")
        for b, (prompt, cap) in enumerate(zip(prompts, caps)):
            try:
                validate_request(engine.target, prompt, cap, stop_strings)
            except ValueError as e:
                raise ValueError(f"prompt {b}: {e}" if len(prompts) > 1 else str(e)) from None
        self.engine = engine
        self.prompts = prompts
        self.max_new_tokens = caps
        self.sampling = sampling
        self.stop_strings = stop_strings
        self.seeds = seeds
        self.results: list[GenerationResult] | None = None

    def _seed(self, b: int) -> int | None:
        """Row b's seed: the given one, else ``sampling.seed + b``, else None (random)."""
        if self.seeds is not None:
            return int(self.seeds[b])
        return None if self.sampling.seed is None else self.sampling.seed + b

    def __iter__(self) -> Iterator[list[StepTrace]]:
        rows = [_new_row(self.engine, b, p, cap, self._seed(b))
                for b, (p, cap) in enumerate(zip(self.prompts, self.max_new_tokens))]
        waiting = [rows]
        loop = StepLoop(self.engine, self.sampling, self.stop_strings, buffered_cache)
        for traces, _ in loop.run(lambda active, width: waiting.pop() if waiting else []):
            yield traces
        self.results = [loop.result(r) for r in rows]


def admit_requests(queue: deque, active: Sequence[_Row], width: int, max_new_tokens: int,
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


class StepLoop:
    """The decoding loop itself, over a set of rows that changes: rows join between steps
    (their prompts prefilled together in a KV cache of their own, then placed below the
    running rows, :func:`clover.cache.append_rows`) and leave when they finish. Every step
    is draft -> verify -> accept -> update for all rows at once (module docstring).

    Args:
        engine: the engine whose target and drafters decode.
        sampling: shared by every row; each row samples with its own generator.
        stop_strings: shared by every row.
        make_cache: builds an empty KV cache for a model config (``clover.cache.new_cache``,
            or ``clover.cache.buffered_cache``: no copy of the whole cache per step, what
            :class:`BatchRun` and :meth:`Engine.serve` use).
        trace_nodes: record each step's tree nodes (:class:`TreeNode`, the target's top
            tokens at each); when False, ``StepTrace.nodes`` is empty, every other field
            is kept.
    """

    def __init__(self, engine: Engine, sampling: SamplingConfig, stop_strings: tuple[str, ...],
                 make_cache: Callable = new_cache, trace_nodes: bool = True):
        self.engine = engine
        self.sampling = sampling
        self.stop_strings = stop_strings
        self.make_cache = make_cache
        self.trace_nodes = trace_nodes

    def _sync(self):
        if self.engine.target.device.type == "cuda":
            torch.cuda.synchronize()

    def run(self, admit: Callable[[list[_Row], int], list[_Row]]) -> Iterator[tuple[list[StepTrace], list[_Row]]]:
        """Decode until no row is left and none joins.

        Args:
            admit: called before every step with the running rows and the KV cache's
                length P; returns the rows that join now (possibly none).
        Yields:
            per step, (one :class:`StepTrace` per row that took part, in row order; the
            rows that finished at this step).
        Raises:
            NonFiniteLogitsError: the target's logits hold NaN or inf.
        """
        cache, active = None, []
        while True:
            new = admit(active, 0 if cache is None else cache_length(cache))
            if new:
                cache = self._admit(active, new, cache)
                active = active + new
            if not active:
                return
            # inference mode is thread-local, so it is entered per block and never held across
            # a yield: a consumer may resume this generator from another thread
            with torch.inference_mode():
                starts = [r.length for r in active]  # committed positions before this step
                t_draft = time.perf_counter()
                trees = self._draft(active)                                                    # draft
                self._sync()
                t_verify = time.perf_counter()
                prefix = cache_length(cache)  # positions cached before this step's tree nodes
                out = self._verify(trees, cache, starts, prefix, len(active[0].steps) + 1)     # verify
                self._sync()
                t_accept = time.perf_counter()
                accs, commits, keep = self._accept(active, trees, out, cache, starts, prefix)  # accept
                self._sync()
                t_update = time.perf_counter()
                self._update(active, trees, accs, out, keep)                                   # update
                self._sync()
                t_end = time.perf_counter()
                times = StepTimes(draft=(t_verify - t_draft) * 1e3, forward=(t_accept - t_verify) * 1e3,
                                  accept=(t_update - t_accept) * 1e3, update=(t_end - t_update) * 1e3)
                traces = [self._trace(r, tree, out.logits[b, :len(tree)], acc, kept, times, starts[b])
                          for b, (r, tree, acc, kept) in enumerate(zip(active, trees, accs, commits))]
            yield traces, [r for r in active if r.stop_reason is not None]
            active = [active[b] for b in keep]

    def _admit(self, active: list[_Row], new: list[_Row], cache):
        """Prefill the joining rows in a KV cache of their own and place them below the
        running rows; returns the batch's cache. Each joining row's ``prefill_ms`` is this
        admission's time."""
        t0 = time.perf_counter()
        part = self.make_cache(self.engine.target.config)
        with torch.inference_mode():
            self._prefill(new, part)
            if active:
                append_rows(cache, part, len(active), len(new))
        self._sync()
        prefill_ms = (time.perf_counter() - t0) * 1e3
        for r in new:
            r.root, r.prefill_ms = r.prompt[-1], prefill_ms
        return cache if active else part

    def _prefill(self, rows: list[_Row], cache) -> None:
        """Prefill every prompt but its last token (the first root), in one forward."""
        target = self.engine.target
        tokens = [r.prompt[:-1] for r in rows]
        if not any(tokens):
            return
        ids, positions, mask = prefill_inputs(tokens, target.dtype, target.device)
        out = target.forward_batch(ids, positions, mask, cache, last_only=True)
        check_finite(out.logits, [1 if t else 0 for t in tokens], "the prompt's prefill")
        for b, r in enumerate(rows):
            r.length = len(tokens[b])
        seen = [b for b, r in enumerate(rows) if r.length]
        observe_rows([rows[b].drafter for b in seen], [out.hidden_pre[b, :rows[b].length] for b in seen],
                     [out.hidden_post[b, :rows[b].length] for b in seen], [tokens[b] for b in seen])

    def result(self, row: _Row) -> GenerationResult:
        """A finished row's :class:`GenerationResult`."""
        return GenerationResult(
            text=self.engine.target.tokenizer.decode(row.new, skip_special_tokens=True),
            token_ids=row.new, steps=row.steps, prompt_tokens=len(row.prompt),
            prefill_ms=row.prefill_ms, decode_s=row.decode_s, stop_reason=row.stop_reason,
            method=self.engine.method, seed=row.generator.initial_seed(),
        )

    def _draft(self, active: list[_Row]) -> list[Tree]:
        """Draft: each row's candidate tree, rooted at its last committed token, no deeper
        than its tokens left but one (the bonus token)."""
        return draft_rows([r.drafter for r in active], [r.root for r in active],
                          [r.max_new_tokens - len(r.new) - 1 for r in active])

    def _verify(self, trees: list[Tree], cache, starts: list[int], prefix: int, step: int):
        """Verify: one target forward over every row's tree (tree attention mask, position
        ids = the row's committed length ``starts[b]`` + depth), appended after the
        ``prefix`` cached positions; returns the batched :class:`~clover.models.TargetOutput`.

        Raises:
            NonFiniteLogitsError: the target's logits at a tree node hold NaN or inf.
        """
        target = self.engine.target
        n, plan = max(len(t) for t in trees), self.engine.verify_widths
        width = plan[n - 1] if plan and len(trees) == 1 and n <= len(plan) else None
        ids, positions, mask = verify_inputs(trees, starts, prefix, target.dtype, target.device, width)
        out = target.forward_batch(ids, positions, mask, cache)
        check_finite(out.logits, [len(t) for t in trees], f"decode step {step}")
        return out

    def _accept(self, active: list[_Row], trees: list[Tree], out, cache, starts: list[int], prefix: int):
        """Accept: each row's accepted path and bonus token, committed to the row (stopping
        where plain decoding would); the KV cache keeps only the accepted paths, and the
        rows that finished leave it.

        Returns:
            (the rows' :class:`~clover.acceptance.Acceptance`, the tokens each committed,
            the batch places of the rows that go on).
        """
        accs = accept_rows(trees, out.logits, self.sampling, [r.generator for r in active])
        lengths = compact_rows(cache, starts, prefix, [a.path for a in accs])
        commits = [self._commit(r, tree, acc) for r, tree, acc in zip(active, trees, accs)]
        keep = [b for b, r in enumerate(active) if r.stop_reason is None]
        if len(keep) < len(active):  # finished rows leave the batch
            select_rows(cache, keep, max((lengths[b] for b in keep), default=0))
        for b in keep:
            active[b].length = lengths[b]
        return accs, commits, keep

    def _update(self, active: list[_Row], trees: list[Tree], accs: list[Acceptance], out,
                keep: list[int]) -> None:
        """Update: the drafters of the rows that go on observe their accepted paths' hidden
        states, and each such row's bonus token becomes its next root."""
        self._observe([active[b] for b in keep], [trees[b] for b in keep], [accs[b].path for b in keep],
                      out, keep)
        for b in keep:
            active[b].root = accs[b].bonus_token

    def _observe(self, rows: list[_Row], trees: list[Tree], paths: list[list[int]], out,
                 batch_rows: list[int]) -> None:
        """Each row's drafter observes its accepted path: the verified hidden states, (m_b, D)
        per row, gathered from the forward's (B, N, D) in one index (``batch_rows``: the
        rows' places in that batch), and the path's token ids."""
        if not rows:
            return
        device = self.engine.target.device
        at = (torch.tensor([b for b, path in zip(batch_rows, paths) for _ in path], device=device),
              torch.tensor([i for path in paths for i in path], device=device))
        sizes = [len(path) for path in paths]
        tokens = [tree.tokens.tolist() for tree in trees]
        observe_rows([r.drafter for r in rows], out.hidden_pre[at].split(sizes), out.hidden_post[at].split(sizes),
                     [[toks[i] for i in path] for toks, path in zip(tokens, paths)])

    def _commit(self, row: _Row, tree: Tree, acc: Acceptance) -> list[int]:
        """Commit the accepted drafts and the bonus token to ``row``, stopping where plain
        decoding would; returns the tokens kept."""
        committed = tree.tokens[acc.path[1:]].tolist() + [acc.bonus_token]
        kept, row.stop_reason = self._cut(row, committed)
        row.new.extend(kept)
        return kept

    def _cut(self, row: _Row, committed: list[int]) -> tuple[list[int], str | None]:
        """Commit tokens one at a time, stopping exactly where plain decoding would."""
        kept: list[int] = []
        eos = self.engine.target.eos_token_ids
        for tok in committed:
            kept.append(tok)
            if tok in eos:
                return kept, "eos"
            if self.stop_strings:
                text = self.engine.target.tokenizer.decode(row.new + kept)
                if any(s in text for s in self.stop_strings):
                    return kept, "stop_string"
            if len(row.new) + len(kept) >= row.max_new_tokens:
                return kept, "length"
        return kept, None

    def _trace(self, row: _Row, tree: Tree, logits: torch.Tensor, acc: Acceptance,
               kept: list[int], times: "StepTimes", start: int) -> StepTrace:
        """The row's record of this step (appended to its steps); the times are the
        whole batch step's. Built after the step's timed calls: every display field
        (texts, probabilities, the target's top tokens) is made here, never in them.

        Args:
            logits: (N, V) the target's logits at the row's tree nodes.
            start: the row's committed positions in the KV cache before the step.
        """
        n_drafts = min(len(kept), len(acc.path) - 1)  # accepted drafts committed
        texts = [row.detok.push(t) for t in kept]  # the text each committed token adds
        if row.stop_reason is not None:
            texts[-1] += row.detok.flush()
        if self.trace_nodes:
            probs = logits_to_probs(logits, self.sampling)  # (N, V) the target's, after each node
            nodes, last = self._nodes(tree, probs), probs[acc.path[-1]]
        else:  # only the last accepted node's distribution: (V,)
            nodes, last = [], logits_to_probs(logits[acc.path[-1]], self.sampling)
        bonus_prob = float(last[acc.bonus_token])
        draft_ms, verify_ms = times.draft + times.update, times.forward + times.accept
        row.decode_s += (draft_ms + verify_ms) / 1e3
        trace = StepTrace(
            step=len(row.steps), nodes=nodes, accepted=acc.path[:1 + n_drafts],
            cut=acc.path[1 + n_drafts:], bonus_token=acc.bonus_token,
            bonus_text=token_texts(self.engine.target.tokenizer, [acc.bonus_token])[0], bonus_prob=bonus_prob,
            bonus_committed=len(kept) == len(acc.path),
            new_tokens=kept, new_text=texts, accepted_length=len(kept),
            draft_ms=draft_ms, verify_ms=verify_ms, total_tokens=len(row.new),
            finished=row.stop_reason is not None, stop_reason=row.stop_reason, row=row.index,
            prefix_length=start, forward_ms=times.forward, accept_ms=times.accept, update_ms=times.update,
        )
        row.steps.append(trace)
        return trace

    def _nodes(self, tree: Tree, probs: torch.Tensor) -> list[TreeNode]:
        """Trace records of the tree: each node's target probability (at its parent) and
        the target's own :data:`~clover.trace.TARGET_TOP` most likely next tokens after it.

        Args:
            probs: (N, V) the target's distribution after each node (``logits_to_probs``).
        """
        tok = self.engine.target.tokenizer
        ids = tree.tokens.tolist()
        parents = torch.tensor([max(p, 0) for p in tree.parents], device=probs.device)
        target_p = probs[parents].gather(-1, tree.tokens[:, None].to(probs.device))[:, 0].tolist()
        target_p[0] = 1.0  # the root: committed already
        top = probs.topk(min(TARGET_TOP, probs.shape[-1]), dim=-1)  # (N, k)
        top_ids, top_p = top.indices.tolist(), top.values.tolist()
        texts = token_texts(tok, ids)
        top_texts = token_texts(tok, [t for row in top_ids for t in row])
        k = len(top_ids[0])
        sources = tree.sources or ["root"] + ["head"] * (len(tree) - 1)
        return [TreeNode(i, ids[i], texts[i], tree.parents[i], tree.depths[i],
                         float(tree.draft_probs[i]), float(target_p[i]), sources[i],
                         target_top=[(top_ids[i][j], top_texts[i * k + j], float(top_p[i][j]))
                                     for j in range(k)])
                for i in range(len(tree))]


class DecodeRun:
    """One generation run of a single prompt (see :meth:`Engine.stream`): the batched
    loop (:class:`BatchRun`) with one row; iterate it for one :class:`StepTrace` per step.
    After the iteration ends, ``result`` holds the :class:`GenerationResult`."""

    def __init__(self, engine: Engine, prompt: list[int], max_new_tokens: int,
                 sampling: SamplingConfig, stop_strings: tuple[str, ...]):
        self.batch = BatchRun(engine, [prompt], max_new_tokens, sampling, stop_strings)
        self.engine, self.prompt, self.max_new_tokens = engine, prompt, max_new_tokens
        self.sampling, self.stop_strings = sampling, stop_strings
        self.result: GenerationResult | None = None

    def __iter__(self) -> Iterator[StepTrace]:
        for (trace,) in self.batch:
            yield trace
        self.result = self.batch.results[0]


def method_name(heads: DraftHeads | None, lookup: LookupConfig | None) -> str:
    """The method's name in :data:`clover.methods.ALL_METHODS`: "ar", "lookup", a head
    kind ("medusa", "clover", "clover2") or a head kind with "+lookup"."""
    if heads is None:
        return "lookup" if lookup is not None else "ar"
    return heads.config.kind + ("+lookup" if lookup is not None else "")
