"""The app's side of decoding: settings, loaded models, and runs of the one engine.

Data flows prompt -> :class:`clover.Engine` -> :class:`~clover.trace.StepTrace` -> app.
This module validates what a visitor typed, keeps the loaded models (read-only, shared
by every visitor), and streams runs of plain, Medusa and Clover decoding one after
another, never at once, so their engine timings compare like with like.
"""
from __future__ import annotations

import logging
import math
import os
import queue
import threading
from collections import OrderedDict
from contextlib import closing
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterator, Sequence

from clover import (Engine, SamplingConfig, TreeConfig, encode_prompt, load_target,
                    parse_tree_spec)
from clover.engine import validate_request
from clover.methods import ALL_METHODS, HEAD_METHODS, METHOD_LABELS, split_method, with_lookup
from clover.trace import GenerationResult, StepTrace

log = logging.getLogger(__name__)

try:  # Hugging Face ZeroGPU: CUDA work must run inside a function decorated by spaces.GPU
    import spaces
except ImportError:  # everywhere else the plain function runs
    spaces = None

METHODS = ("ar", "lookup", "medusa", "clover")  # to watch; see clover.methods.with_lookup
# head kinds every model gets (shipped heads, else untrained ones); the other kinds of
# clover.methods.HEAD_METHODS (Clover-2) join only where trained heads exist for them
CORE_HEAD_KINDS = ("medusa", "clover")
MAX_NEW_TOKENS = 512
MAX_PROMPT_CHARS = 20_000
MAX_TEMPERATURE = 5.0
DEFAULT_MODEL_KEY = "default"


# ---------------------------------------------------------------- settings


def auto_tree() -> TreeConfig:
    """The tree setting "auto": the library's default dynamic tree, marked ``auto`` so each
    model and method gets the budget measured for this machine (see
    :meth:`LoadedModel.tree_for`)."""
    return TreeConfig(auto=True)


def tree_config(choice) -> TreeConfig:
    """A tree from the budget setting: "auto", a node budget (e.g. "10"), or any
    ``clover.parse_tree_spec`` spec ("dynamic:budget=12,topk=4", "small", "[[0],[1]]").

    Raises:
        ValueError: with a message for the visitor.
    """
    text = str(choice if choice is not None else "").strip()
    if text in ("", "auto"):
        return auto_tree()
    try:
        budget = float(text)
    except ValueError:
        pass
    else:
        if not budget.is_integer() or not 1 <= budget <= 256:
            raise ValueError(f"the tree budget must be a whole number from 1 to 256, got {text}")
        return TreeConfig(kind="dynamic", budget=int(budget), topk=3)
    try:
        return parse_tree_spec(text)
    except ValueError as e:
        raise ValueError(f"the tree setting {text!r} is not understood ({e}); use auto, a "
                         "number of drafted nodes such as 10, or a spec such as "
                         "dynamic:budget=12,topk=4") from None


def parse_chat(text: str) -> str | list[dict]:
    """A prompt box's text as one user message, or as a chat when it is written as a
    transcript whose lines start with 'User:' / 'Assistant:' (a multi-turn prompt)."""
    lines = text.strip().splitlines()
    if not lines or not lines[0].lower().startswith("user:"):
        return text
    messages: list[dict] = []
    for line in lines:
        low = line.lower()
        if low.startswith("user:") or low.startswith("assistant:"):
            role, _, content = line.partition(":")
            messages.append({"role": role.strip().lower(), "content": content.strip()})
        else:
            messages[-1]["content"] += "\n" + line
    for m in messages:
        m["content"] = m["content"].strip()
    if messages[-1]["role"] != "user":
        raise ValueError("a chat transcript must end with a 'User:' turn")
    return messages


@dataclass(frozen=True)
class Settings:
    """What a visitor asked for, validated.

    Attributes:
        prompt: one user message, or chat messages (multi-turn).
        method: the method streamed step by step: "ar", "lookup", "medusa", "clover",
            "clover2" (where the model has Clover-2 heads, see :meth:`LoadedModel.check_method`),
            or a head method with a lookup branch ("medusa+lookup", "clover+lookup", ...).
        lookup: add a prompt lookup branch to the head methods' trees (the watched run and
            the compared ones).
        sampling: temperature 0 (greedy) or lossless sampling.
        max_new_tokens: 1..MAX_NEW_TOKENS.
        tree: the candidate tree config (ignored by plain decoding).
        compare: also run the other methods, one after another, for the speedups.
        model / heads: a hub id or folder, and a heads folder; None = the app's default.
    """

    prompt: str | list
    method: str
    sampling: SamplingConfig
    max_new_tokens: int
    tree: TreeConfig
    compare: bool = True
    model: str | None = None
    heads: str | None = None
    lookup: bool = False


MAX_SEED = 2**31 - 1


def parse_seed(seed) -> int:
    """The sampling seed of a run: the given whole number (0..MAX_SEED), or a fresh random
    one when empty, so two runs differ unless a seed is repeated to reproduce one.

    Raises:
        ValueError: with a message for the visitor.
    """
    import secrets

    if seed is None or str(seed).strip() == "":
        return secrets.randbelow(MAX_SEED + 1)
    try:
        value = float(seed)
    except (TypeError, ValueError):
        raise ValueError(f"the seed must be a whole number, got {seed!r}") from None
    if not value.is_integer() or not 0 <= value <= MAX_SEED:
        raise ValueError(f"the seed must be a whole number from 0 to {MAX_SEED}, got {seed!r}")
    return int(value)


def parse_settings(prompt, method, temperature, max_new_tokens, tree, compare=True,
                   model=None, heads=None, seed=None, lookup=False) -> Settings:
    """Validate the raw values of the settings widgets (or of an API call). ``seed``:
    see :func:`parse_seed` (empty = a new random seed for this run). ``lookup``: add a
    prompt lookup branch to the head methods (see ``clover.methods.with_lookup``).

    Raises:
        ValueError: with a message for the visitor.
    """
    if prompt is None or not str(prompt).strip():
        raise ValueError("the prompt is empty: type a prompt or pick an example")
    if len(str(prompt)) > MAX_PROMPT_CHARS:
        raise ValueError(f"the prompt is too long ({len(str(prompt))} characters); this app "
                         f"takes up to {MAX_PROMPT_CHARS}")
    if method in ALL_METHODS and method.endswith("+lookup"):  # a full name, e.g. from the API
        method, lookup = split_method(method)[0], True
    known = ("ar", "lookup", *HEAD_METHODS)
    if method not in known:
        raise ValueError(f"unknown method {method!r}; choose one of {', '.join(known)}, or a "
                         f"head method with +lookup (e.g. clover+lookup)")
    try:
        temperature = float(temperature)
    except (TypeError, ValueError):
        raise ValueError(f"the temperature must be a number, got {temperature!r}") from None
    if not math.isfinite(temperature) or not 0.0 <= temperature <= MAX_TEMPERATURE:
        raise ValueError(f"the temperature must be between 0 and {MAX_TEMPERATURE:g} "
                         f"(0 = greedy), got {temperature:g}")
    try:
        n = float(max_new_tokens)
    except (TypeError, ValueError):
        raise ValueError(f"max new tokens must be a whole number, got {max_new_tokens!r}") from None
    if not n.is_integer() or not 1 <= n <= MAX_NEW_TOKENS:
        raise ValueError(f"max new tokens must be a whole number from 1 to {MAX_NEW_TOKENS}, "
                         f"got {max_new_tokens:g}")
    return Settings(
        prompt=parse_chat(str(prompt)), method=with_lookup(method, bool(lookup)),
        lookup=bool(lookup),
        sampling=SamplingConfig(temperature=temperature, seed=parse_seed(seed)),
        max_new_tokens=int(n), tree=tree_config(tree), compare=bool(compare),
        model=(str(model).strip() or None) if model else None,
        heads=(str(heads).strip() or None) if heads else None,
    )


# ---------------------------------------------------------------- loaded models


@dataclass
class LoadedModel:
    """A target and its draft heads, loaded once and then only read.

    Attributes:
        key: registry key (see :func:`get_model`).
        target: the :class:`clover.TargetModel`.
        heads: per head kind the heads ("medusa", "clover", and "clover2" where trained
            Clover-2 heads were loaded; "ar": None).
        sources: per speculative method where its heads came from, e.g.
            "trained, shipped with the app", "loaded from DIR", or "untrained".
        label: how the model is named in the UI.
    """

    key: str
    target: object
    heads: dict
    sources: dict = field(default_factory=dict)
    label: str = ""
    auto_trees: dict = field(default_factory=dict)
    calibrating: threading.Event = field(default_factory=threading.Event, repr=False,
                                         compare=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    _lookup: object = field(default=None, repr=False, compare=False)
    _lookup_lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @property
    def head_kinds(self) -> tuple[str, ...]:
        """The head kinds this model has heads for, in display order."""
        return tuple(k for k in HEAD_METHODS
                     if k in self.heads and (k in CORE_HEAD_KINDS or self.heads[k] is not None))

    @property
    def methods(self) -> tuple[str, ...]:
        """The methods this model can run (without the lookup branch): :data:`METHODS`,
        plus Clover-2 where Clover-2 heads were loaded."""
        return (*METHODS, *(k for k in self.head_kinds if k not in METHODS))

    def check_method(self, method: str) -> None:
        """Raise ``ValueError`` (a message for the visitor) when ``method`` needs heads
        this model has none of (Clover-2 without a Clover-2 heads folder)."""
        kind = split_method(method)[0]
        if kind is not None and kind not in self.head_kinds:
            raise ValueError(f"there are no {METHOD_LABELS[kind]} heads for {self.label}: give a "
                             f"folder with {kind} heads in *Model and heads* (trained with "
                             f"`clover train --method {kind}`), or pick another method")

    def lookup_config(self):
        """Prompt lookup settings for this model: the chain length adapts to this machine's
        verify cost curve (measured once, a few seconds on a CPU, in the start-up
        calibration or else on first use, then kept). While the calibration is still
        running, and on ZeroGPU (which this process cannot time), a fixed chain of at most
        4 tokens."""
        from clover.autotree import sized_lookup
        from clover.lookup import LookupConfig

        if spaces is not None or (self._lookup is None and self.calibrating.is_set()):
            return LookupConfig(max_tokens=4)
        with self._lookup_lock:
            if self._lookup is None:
                self._lookup = sized_lookup(self.target)
            return self._lookup

    def tree_for(self, method: str, tree: TreeConfig) -> TreeConfig:
        """``tree``, or for an ``auto`` tree the dynamic tree whose budget
        ``clover.autotree.auto_tree`` picks for this model, method and machine (read from
        the stored calibration, or measured on first use, seconds on a CPU, then kept).
        While :meth:`calibrate_in_background` is still measuring, the default budget.
        On ZeroGPU (``spaces``) decoding runs on hardware this process cannot time, so
        the default budget is used there."""
        heads = self.heads.get(method)
        if not tree.auto or heads is None:
            return tree
        from clover.autotree import resolve_tree

        if spaces is not None:
            return replace(tree, auto=False)
        if method not in self.auto_trees and self.calibrating.is_set():
            return replace(tree, auto=False)
        with self._lock:
            if method not in self.auto_trees:
                self.auto_trees[method] = resolve_tree(self.target, heads, tree)[0]
            return self.auto_trees[method]

    def calibrate_in_background(self) -> threading.Thread | None:
        """Size the auto trees without holding up start-up: stored sizes are read at once;
        any left are measured in a daemon thread (runs meanwhile use the default budget),
        which then decodes two tokens per method (warm-up). Returns the thread, or None
        when nothing was left to measure."""
        from clover.autotree import resolve_tree

        todo = [m for m in self.head_kinds if self.heads.get(m) is not None
                and m not in self.auto_trees]
        for m in list(todo):
            found = resolve_tree(self.target, self.heads[m], auto_tree(), measure=False)[0]
            if not found.auto:  # stored
                self.auto_trees[m] = found
                todo.remove(m)
        if not todo or spaces is not None:
            return None
        self.calibrating.set()

        def work():
            try:
                for m in todo:
                    with self._lock:
                        self.auto_trees[m] = resolve_tree(self.target, self.heads[m], auto_tree())[0]
                self.calibrating.clear()
                self.lookup_config()  # the verify cost curve for prompt lookup
                log.info("auto trees sized: %s", {m: t.budget for m, t in self.auto_trees.items()})
            except Exception:  # the default tree stays in use; the app keeps serving
                log.exception("sizing the auto tree failed; using the default budget")
            finally:
                self.calibrating.clear()
            _warm_up(self)

        thread = threading.Thread(target=work, daemon=True, name="clover-auto-tree")
        thread.start()
        return thread

    @property
    def untrained(self) -> list[str]:
        """Speculative methods whose heads are freshly initialised."""
        return [m for m, s in self.sources.items() if s.startswith("untrained")]

    def notice(self) -> str:
        """A Markdown line about the model and its heads, with a clear warning when the
        heads are untrained."""
        names = METHOD_LABELS
        heads = " · ".join(f"**{names[m]} heads:** {'⚠ ' if m in self.untrained else ''}"
                           f"{self.sources[m]}" for m in self.head_kinds)
        text = (f"**Model:** {self.label} on {self.target.device.type} · {heads}")
        if self.calibrating.is_set():
            text += (f" · **auto tree:** being sized for this machine in the background "
                     f"(meanwhile {auto_tree().budget} drafted tokens)")
        elif self.auto_trees:
            text += " · **auto tree:** " + ", ".join(
                f"{names[m]} {t.describe() if t.off else f'{t.budget} drafted tokens'}"
                for m, t in sorted(self.auto_trees.items()))
        if self.untrained:
            which = " and ".join(names[m] for m in self.untrained)
            text += (f"\n\n> ⚠ **Untrained draft heads.** There are no trained {which} heads for "
                     f"this model, so they are freshly initialised: they guess badly, the target "
                     f"rejects almost every draft, and speculative decoding is *slower* than "
                     f"plain decoding here. The output is still exact (the same text as plain "
                     f"decoding); only the speed suffers. Give a trained heads folder in "
                     f"*Model and heads* to see real speedups.")
        return text


_MODELS: "OrderedDict[str, LoadedModel]" = OrderedDict()  # read-only models, shared
_MODELS_LOCK = threading.Lock()
_MAX_EXTRA_MODELS = 2  # models loaded from the settings, beyond the app's default


def target_label(target, model: str | None) -> str:
    """The model's name as the banner shows it: the default model says whether it is the
    embedded GGUF copy or the same model from the hub (as on a Space)."""
    if model:
        return target.name
    return f"{target.name} ({'from the hub' if target.loaded_from == 'hub' else 'embedded'})"


def head_folders(heads_dir: str | None) -> dict[str, Path | None]:
    """Per head kind (``clover.methods.HEAD_METHODS``) the folder under ``heads_dir`` that
    holds heads of that kind (``clover.heads.find_heads``), None where there is none.

    Raises:
        ValueError: ``heads_dir`` is missing, or holds heads of no kind.
    """
    from clover.heads import find_heads

    if not heads_dir:
        return dict.fromkeys(HEAD_METHODS)
    try:
        folders = {k: find_heads(heads_dir, k) for k in HEAD_METHODS}
    except FileNotFoundError as e:
        raise ValueError(str(e)) from None
    if not any(folders.values()):
        raise ValueError(f"{heads_dir} holds no Medusa, Clover or Clover-2 heads (expected "
                         f"config.json and model.safetensors, or medusa/, clover/ and clover2/ "
                         f"subfolders)")
    return folders


def default_kinds(heads_dir: str | None) -> list[str]:
    """The head kinds a model gets: Medusa and Clover always (:data:`CORE_HEAD_KINDS`),
    the other kinds (Clover-2) only where ``heads_dir`` holds them or trained heads ship.

    Raises:
        ValueError: as :func:`head_folders`.
    """
    from clover.heads import shipped_heads_dir

    folders = head_folders(heads_dir)
    return [k for k in HEAD_METHODS
            if k in CORE_HEAD_KINDS or folders[k] is not None or shipped_heads_dir(k) is not None]


def load_heads_for(target, heads_dir: str | None, kinds: Sequence[str] | None = None,
                   num_heads: int = 3) -> tuple[dict, dict]:
    """Heads of each of ``kinds`` for ``target``, and where each came from: ``heads_dir``
    (a heads folder, or one with medusa/, clover/ and clover2/ subfolders), else the heads
    shipped for the embedded model, else freshly initialised (untrained) heads.

    Args:
        kinds: head kinds to load (default :func:`default_kinds`: Medusa and Clover, and
            Clover-2 where ``heads_dir`` holds it or trained Clover-2 heads ship).
    Raises:
        ValueError: a missing folder, or heads that do not fit the target.
    """
    from clover.heads import heads_for

    heads, sources = {}, {}
    folders = head_folders(heads_dir)
    if kinds is None:
        kinds = default_kinds(heads_dir)
    for kind in kinds:
        folder = folders[kind]
        heads[kind], sources[kind] = heads_for(kind, target, str(folder) if folder else None, num_heads)
    return heads, sources


def register_model(key: str, target, heads: dict | None = None, sources: dict | None = None,
                   heads_dir: str | None = None, label: str | None = None,
                   warm_up: bool | str = True) -> LoadedModel:
    """Register an already loaded target under ``key``, with ``heads`` (per method, e.g.
    from a test) where given and the rest loaded as :func:`load_heads_for` does.

    ``warm_up``: True sizes the auto trees and decodes two tokens per method now;
    "background" does it in a thread (see :meth:`LoadedModel.calibrate_in_background`);
    False skips it.
    """
    given = dict(heads or {})
    missing = [k for k in default_kinds(heads_dir) if k not in given]
    loaded_heads, loaded_sources = load_heads_for(target, heads_dir, missing)
    all_sources = {k: "given by the caller" for k in given}
    all_sources.update(sources or {})
    all_sources.update(loaded_sources)
    loaded = LoadedModel(key, target, {"ar": None, **given, **loaded_heads}, all_sources,
                         label or target.name)
    if warm_up == "background":
        if loaded.calibrate_in_background() is None:
            _warm_up(loaded)
    elif warm_up:
        _warm_up(loaded)
    with _MODELS_LOCK:
        _MODELS[key] = loaded
    return loaded


def open_target(model: str | None):
    """Load a target (None = the embedded model).

    Raises:
        ValueError: with a message for the visitor when it cannot be loaded.
    """
    if model and model.startswith(("/", ".", "~")) and not Path(model).expanduser().is_dir():
        raise ValueError(f"could not load the model {model!r}: there is no such folder")
    try:
        return load_target(model, cache_dir=os.environ.get("CLOVER_CACHE_DIR"))
    except Exception as e:  # any loader failure becomes a message, never a stack trace
        log.debug("could not load model %r", model, exc_info=True)
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"could not load the model {model!r}: {first}") from None


def get_model(model: str | None, heads_dir: str | None,
              default_key: str = DEFAULT_MODEL_KEY) -> LoadedModel:
    """The model a run asks for: the app's default when ``model`` and ``heads_dir`` are
    empty, else loaded on first use (keeping a few) from a hub id or folder.

    Raises:
        ValueError: with a message for the visitor when the model or heads cannot load.
    """
    if not model and not heads_dir:
        with _MODELS_LOCK:
            if default_key in _MODELS:
                return _MODELS[default_key]
    key = f"{model or default_key}|{heads_dir or ''}"
    with _MODELS_LOCK:
        if key in _MODELS:
            _MODELS.move_to_end(key)
            return _MODELS[key]
        default = _MODELS.get(default_key)
    if not model and default is not None:  # the app's model with other heads
        target, label = default.target, default.label
    else:
        target = open_target(model)
        label = target_label(target, model)
    loaded = register_model(key, target, heads_dir=heads_dir, label=label)
    with _MODELS_LOCK:
        extra = [k for k in _MODELS if "|" in k and k != key]
        for k in extra[: max(0, len(extra) - _MAX_EXTRA_MODELS + 1)]:
            del _MODELS[k]
    return loaded


def _warm_up(loaded: LoadedModel) -> None:
    """Size the "auto" tree of each method for this machine (unless being sized in the
    background) and decode two tokens with every method once, so the first visitor's
    timings do not include one-off start-up costs."""
    ids = encode_prompt(loaded.target.tokenizer, "Hello")
    for method in ("ar", *loaded.head_kinds):
        tree = replace(loaded.tree_for(method, auto_tree()), auto=False)  # "ar": no tree to size
        Engine(loaded.target, loaded.heads[method], tree).generate(ids, 2)


# ---------------------------------------------------------------- decoding


def _gpu(fn):
    return spaces.GPU(duration=120)(fn) if spaces is not None else fn


@_gpu
def decode(model_key: str, method: str, prompt_ids: list[int], max_new_tokens: int,
           sampling: SamplingConfig, tree: TreeConfig) -> Iterator[StepTrace | GenerationResult]:
    """One run of the engine: yields each step's trace, then the :class:`GenerationResult`.

    Takes the model by key (not the object) so that it can run in a ZeroGPU worker.
    """
    loaded = _MODELS[model_key]
    kind, uses_lookup = split_method(method)
    # the tree is resolved here (auto -> the measured budget), never inside the engine
    engine = Engine(loaded.target, loaded.heads.get(kind) if kind else None,
                    loaded.tree_for(kind, tree) if kind else replace(tree, auto=False),
                    loaded.lookup_config() if uses_lookup else None)
    run = engine.stream(prompt_ids, max_new_tokens, sampling)
    for step in run:
        yield step
    yield run.result


class PinnedIterator:
    """Iterate ``make()`` in one dedicated thread, one item per ``next()``, in lock step.

    Gradio advances a generator from whichever worker thread is free, and closes it from
    another; the engine holds thread-local torch state (inference mode) across its
    steps, so its iterator must live in one thread. Nothing runs ahead: the decoding
    thread waits while the caller renders, so rendering never overlaps decoding.
    """

    def __init__(self, make: Callable[[], Iterator]):
        self._requests: queue.SimpleQueue = queue.SimpleQueue()
        self._replies: queue.SimpleQueue = queue.SimpleQueue()
        self._done = False
        self._thread = threading.Thread(target=self._serve, args=(make,), daemon=True,
                                        name="clover-decode")
        self._thread.start()

    def _serve(self, make):
        it = None
        try:
            it = iter(make())
            while self._requests.get() == "next":
                try:
                    self._replies.put(("item", next(it)))
                except StopIteration:
                    self._replies.put(("stop", None))
                    return
        except BaseException as e:  # handed to the caller, which re-raises it
            self._replies.put(("error", e))
        finally:
            if it is not None and hasattr(it, "close"):
                it.close()

    def __iter__(self):
        return self

    def __next__(self):
        if self._done:
            raise StopIteration
        self._requests.put("next")
        kind, value = self._replies.get()
        if kind == "item":
            return value
        self._done = True
        if kind == "stop":
            raise StopIteration
        raise value

    def close(self) -> None:
        """Stop the run (its iterator is closed in its own thread)."""
        if not self._done:
            self._done = True
            self._requests.put("close")
            self._thread.join(timeout=30)


@dataclass
class RunEvent:
    """What :func:`run_methods` reports.

    Attributes:
        kind: "start" (a method's run begins), "step" (one decode step) or "done".
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
              methods: Sequence[str] = METHODS) -> list[str]:
    """Methods to run, one after another: the others of ``methods`` first (baselines;
    :attr:`LoadedModel.methods` for a model with Clover-2 heads), the watched ``method``
    last; with ``lookup`` the head methods carry the lookup branch."""
    if not compare:
        return [method]
    family = [with_lookup(m, lookup) for m in methods]
    return [m for m in family if m != method] + [method]


def encode(loaded: LoadedModel, settings: Settings) -> list[int]:
    """Prompt token ids, checked against the model's context the way the engine checks.

    Raises:
        ValueError: empty prompt, prompt too long for the context.
    """
    ids = encode_prompt(loaded.target.tokenizer, settings.prompt)
    validate_request(loaded.target, ids, settings.max_new_tokens)
    return ids


def run_methods(loaded: LoadedModel, settings: Settings,
                prompt_ids: Sequence[int]) -> Iterator[RunEvent]:
    """Run the methods one after another (never at once) and report every step.

    Closing this generator stops the current run after its current step.

    Raises:
        ValueError: the method needs heads the model lacks (:meth:`LoadedModel.check_method`).
    """
    loaded.check_method(settings.method)
    for method in run_order(settings.method, settings.compare, settings.lookup, loaded.methods):
        live = method == settings.method
        yield RunEvent("start", method, live)

        def make(m=method):
            return decode(loaded.key, m, list(prompt_ids), settings.max_new_tokens,
                          settings.sampling, settings.tree)

        with closing(PinnedIterator(make)) as steps:
            for item in steps:
                if isinstance(item, GenerationResult):
                    yield RunEvent("done", method, live, result=item)
                else:
                    yield RunEvent("step", method, live, step=item)
