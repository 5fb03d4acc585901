"""The one decoding engine, for every method and every batch size: :class:`Engine` (a
target, the method's draft heads, its candidate tree and prompt lookup) and its runs of
one prompt (:meth:`Engine.stream`, :meth:`Engine.generate`), of a batch
(:meth:`Engine.stream_batch`, :meth:`Engine.generate_batch`) and of a queue of requests
joining as rows free up (:meth:`Engine.serve`). Every run is the same loop,
:class:`clover.loop.StepLoop`: draft -> verify -> accept -> update (its module text has
the steps and the batch layout, and why it is exact).

Plain autoregressive decoding is the same loop with the empty tree (root only), so all
methods run on identical machinery and their timings compare like with like.
"""
from __future__ import annotations

from collections import deque
from itertools import count
from typing import Callable, Hashable, Iterable, Iterator, Sequence


from clover.acceptance import SamplingConfig
from clover.cache import buffered_cache
from clover.heads import DraftHeads, PlainDrafter, check_fits
from clover.lookup import HybridDrafter, LookupConfig, LookupDrafter
from clover.methods import method_name
from clover.loop import StepLoop
from clover.models import TargetModel
from clover.requests import Request, Row, admit_requests, new_row, validate_request
from clover.trace import GenerationResult, StepTrace
from clover.tree import TreeConfig


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
            ValueError: see :func:`clover.requests.validate_request`.
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
                or a request :func:`clover.requests.validate_request` refuses (naming the row).
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
        queued requests join (:func:`clover.requests.admit_requests`): their prompts are prefilled
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
                below 1; while iterating, for a request :func:`clover.requests.validate_request` refuses
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

        def admit(active: list[Row], width: int) -> list[Row]:
            reqs = admit_requests(queue, active, width, max_new_tokens, batch_size, batch_tokens)
            return [self._request_row(next(index), req, max_new_tokens, loop.stop_strings) for req in reqs]

        for traces, finished in loop.run(admit):
            if on_step is not None:
                on_step(len(traces))
            for row in finished:
                yield row.key, loop.result(row)

    def _request_row(self, index: int, req: Request, max_new_tokens: int, stop_strings) -> "Row":
        """A checked :class:`Request`'s row (``trace.row`` = ``index``).

        Raises:
            ValueError: see :func:`clover.requests.validate_request`, naming the request's key.
        """
        prompt = list(req.prompt)
        cap = max_new_tokens if req.max_new_tokens is None else req.max_new_tokens
        try:
            validate_request(self.target, prompt, cap, stop_strings)
        except ValueError as e:
            raise ValueError(f"request {req.key!r}: {e}") from None
        return new_row(self, index, prompt, cap, req.seed, req.key)


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
        rows = [new_row(self.engine, b, p, cap, self._seed(b))
                for b, (p, cap) in enumerate(zip(self.prompts, self.max_new_tokens))]
        waiting = [rows]
        loop = StepLoop(self.engine, self.sampling, self.stop_strings, buffered_cache)
        for traces, _ in loop.run(lambda active, width: waiting.pop() if waiting else []):
            yield traces
        self.results = [loop.result(r) for r in rows]


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


