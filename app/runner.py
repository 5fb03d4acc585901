"""Runs of the one engine for the app: the methods decoded in lockstep, one step of each
in turn in one loop (never two forwards at once), so a change in the machine's load
touches every method alike and their engine timings compare like with like.

Data flows prompt -> :class:`clover.Engine` -> :class:`~clover.trace.StepTrace` -> app.
The settings come from :mod:`app.settings`, the models from :mod:`app.registry`.
"""
from __future__ import annotations

from contextlib import closing, contextmanager
from dataclasses import dataclass, replace
from typing import Callable, Iterator, Sequence

from clover import Engine, SamplingConfig, TreeConfig, encode_prompt
from clover.methods import lockstep
from clover.requests import validate_request
from clover.methods import split_method, with_lookup
from clover.trace import GenerationResult, StepTrace

from app import engine_thread, zerogpu
from app.registry import CORE_METHODS, LoadedModel, loaded_model
from app.settings import Settings


@zerogpu.gpu(duration=120)
def decode(model_key: str, method: str, prompt_ids: list[int], max_new_tokens: int,
           sampling: SamplingConfig, tree: TreeConfig) -> Iterator[StepTrace | GenerationResult]:
    """One run of the engine: yields each step's trace, then the :class:`GenerationResult`.

    Takes the model by key (not the object) so that it can run in a ZeroGPU worker.
    A plain generator: the engine enters inference mode per step and never holds it (or
    any other thread-local state) across a yield; :func:`run_methods` advances it on the
    engine thread (:mod:`app.engine_thread`).
    """
    loaded = loaded_model(model_key)
    kind, uses_lookup = split_method(method)
    # the tree is resolved here (auto -> the measured budget), never inside the engine
    engine = Engine(loaded.target, loaded.heads.get(kind) if kind else None,
                    loaded.sizing.tree_for(kind, tree) if kind else replace(tree, auto=False),
                    loaded.sizing.lookup_config() if uses_lookup else None)
    run = engine.stream(prompt_ids, max_new_tokens, sampling)
    for step in run:
        yield step
    yield run.result


@dataclass
class RunEvent:
    """What :func:`run_methods` reports.

    Attributes:
        kind: "start" (a method's run begins), "step" (one decode step), "done", or
            "round" (every running method has stepped once and the caller's ``pause``
            asked to see the events so far: the point where the page may be drawn,
            outside every timed step; ``method`` is "").
        method: the run's method (see :data:`clover.methods.ALL_METHODS`).
        live: True for the method the visitor asked to watch.
        step: the step's trace (kind "step").
        result: the run's result (kind "done").
    """

    kind: str
    method: str
    live: bool
    step: StepTrace | None = None
    result: GenerationResult | None = None


def run_order(method: str, compare: bool, lookup: bool = False,
              methods: Sequence[str] = CORE_METHODS) -> list[str]:
    """Methods to run: the watched ``method`` first, then the others of ``methods``
    (baselines; :attr:`LoadedModel.methods` for a model with Clover-2 heads); with
    ``lookup`` the head methods carry the lookup branch."""
    if not compare:
        return [method]
    family = [with_lookup(m, lookup) for m in methods]
    return [method] + [m for m in family if m != method]


def threads_for_load(loaded: LoadedModel) -> int | None:
    """The torch thread count for the next run on a CPU target: where other processes
    keep the CPUs busy, fewer threads than cores (at least one). Two threads on a 2-core
    machine shared with two CPU-bound processes made a plain step 7.9x slower than idle
    (every thread waits for the one the scheduler paused); one thread, about 2x
    (``scripts/load_check.py``). None: leave the count as it is (a GPU target, ZeroGPU,
    no ``/proc/stat``, or nothing else running)."""
    from clover.machine import threads_for_load as for_load

    if zerogpu.active() or loaded.target.device.type != "cpu":
        return None
    import torch

    return for_load(engine_thread.call(torch.get_num_threads))  # the engine thread's count


@contextmanager
def load_threads(loaded: LoadedModel):
    """Run the block with :func:`threads_for_load`'s thread count on the engine thread
    (:mod:`app.engine_thread`; torch's thread count belongs to the thread that sets it),
    restoring the count after; yields ``(threads used, threads before)`` when it lowered
    them, else None."""
    import torch

    wanted = threads_for_load(loaded)
    before = engine_thread.call(torch.get_num_threads)
    if wanted is None:
        yield None
        return
    engine_thread.call(torch.set_num_threads, wanted)
    try:
        yield wanted, before
    finally:
        engine_thread.call(torch.set_num_threads, before)


def encode(loaded: LoadedModel, settings: Settings) -> list[int]:
    """Prompt token ids, checked against the model's context the way the engine checks.

    Raises:
        ValueError: empty prompt, prompt too long for the context.
    """
    ids = encode_prompt(loaded.target.tokenizer, settings.prompt)
    validate_request(loaded.target, ids, settings.max_new_tokens)
    return ids


def in_lockstep() -> bool:
    """Whether :func:`run_methods` steps the methods in lockstep here (everywhere but
    ZeroGPU, whose GPU calls cannot interleave), so speedups compare the same rounds
    (:func:`clover.trace.speedup` with ``lockstep``)."""
    return not zerogpu.active()


def run_methods(loaded: LoadedModel, settings: Settings, prompt_ids: Sequence[int],
                lockstep: bool | None = None,
                pause: Callable[[], bool] | None = None) -> Iterator[RunEvent]:
    """Run the methods of :func:`run_order` and report every step.

    In lockstep (the default): every method starts at once, then one step of each in
    turn, each round starting one method later (the watched method first in the first),
    until all are done. The watched method's first step comes after one step of its own
    (not after every baseline's whole run), and a slow spell of the machine lands on
    every method alike, so each method's summed step times (its trace's engine time)
    compare within one shared window. On ZeroGPU (:mod:`app.zerogpu`), whose GPU calls
    cannot interleave, the methods run one after another, the watched one first.

    The steps are made on the engine thread (:mod:`app.engine_thread`) and handed to the
    caller in batches: after each round ``pause()`` is asked there (None: after every
    round); where it says True the events so far arrive, then a "round" event, and the
    engine thread waits until the caller asks for the next event. Between those points
    the caller's thread sleeps, so what it would wake (a server, a browser drawing the
    page) takes no CPU from the timed steps.

    Closing this generator stops every run after its current step.

    Raises:
        ValueError: the method needs heads the model lacks (:meth:`LoadedModel.check_method`).
    """
    loaded.check_method(settings.method)
    order = run_order(settings.method, settings.compare, settings.lookup, loaded.methods)
    if lockstep is None:
        lockstep = in_lockstep()
    if not lockstep:
        for method in order:
            yield from _events([method], loaded, settings, prompt_ids, pause)
        return
    yield from _events(order, loaded, settings, prompt_ids, pause)


def _events(methods: list[str], loaded: LoadedModel, settings: Settings,
            prompt_ids: Sequence[int],
            pause: Callable[[], bool] | None = None) -> Iterator[RunEvent]:
    """The runs of ``methods`` advanced one step each in turn
    (:func:`clover.methods.lockstep`), as events, in batches ending where ``pause()``
    says (see :func:`run_methods`)."""
    runs = {m: decode(loaded.key, m, list(prompt_ids), settings.max_new_tokens,
                      settings.sampling, settings.tree) for m in methods}
    for m in methods:
        yield RunEvent("start", m, m == settings.method)

    paused = [False]  # what pause() said at the latest round's end

    def until(item) -> bool:  # on the engine thread, between rounds
        if item[0] is not None:
            return False
        paused[0] = pause is None or pause()
        return paused[0]

    # every step on the engine thread (app.engine_thread), never on Gradio's workers;
    # closing this generator closes every engine run there
    with closing(engine_thread.chunks(lockstep(runs, rotate=True, rounds=True), until)) as parts:
        for part in parts:
            for i, (m, item) in enumerate(part):
                if m is None:  # a round's end, a pause where it ends the part
                    if i == len(part) - 1 and paused[0]:
                        yield RunEvent("round", "", False)
                    continue
                live = m == settings.method
                if isinstance(item, GenerationResult):
                    yield RunEvent("done", m, live, result=item)
                else:
                    yield RunEvent("step", m, live, step=item)
