"""The app's loaded models: each target with its draft heads, loaded once and then only
read, shared by every visitor (the only module-level state of the app).

A model is registered under a key (:func:`register_model`); runs name it by key
(:func:`get_model`, :func:`loaded_model`), so decoding can also run in a ZeroGPU worker.
The "auto" tree budget of each head method is sized here, at the app's edge, never
inside the engine.
"""
from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Sequence

from clover import Engine, TreeConfig, encode_prompt, load_target
from clover.methods import HEAD_KINDS, METHOD_LABELS, split_method

from app import zerogpu
from app.settings import auto_tree

log = logging.getLogger(__name__)

# head kinds every model gets (shipped heads, else untrained ones); the other kinds of
# clover.methods.HEAD_KINDS (Clover-2) join only where trained heads exist for them
CORE_HEAD_KINDS = ("medusa", "clover")
# the methods every model offers to watch (the lookup branch: clover.methods.with_lookup)
CORE_METHODS = ("ar", "lookup", *CORE_HEAD_KINDS)
DEFAULT_MODEL_KEY = "default"
# the "auto" tree where the calibration says no tree pays on this machine: the smallest
# that still shows the method (a visitor who picked a head method came to see a tree)
SHOW_BUDGET = 1


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
        calibrating: set while the start-up calibration measures in the background.

    Measurements (auto trees, the verify cost curve) live in the target's
    ``clover.autotree.Calibrator`` (:attr:`calibrator`), not here.
    """

    key: str
    target: object
    heads: dict
    sources: dict = field(default_factory=dict)
    label: str = ""
    calibrating: threading.Event = field(default_factory=threading.Event, repr=False,
                                         compare=False)

    @property
    def head_kinds(self) -> tuple[str, ...]:
        """The head kinds this model has heads for, in display order."""
        return tuple(k for k in HEAD_KINDS
                     if k in self.heads and (k in CORE_HEAD_KINDS or self.heads[k] is not None))

    @property
    def methods(self) -> tuple[str, ...]:
        """The methods this model can run (without the lookup branch): :data:`CORE_METHODS`,
        plus Clover-2 where Clover-2 heads were loaded."""
        return (*CORE_METHODS, *(k for k in self.head_kinds if k not in CORE_METHODS))

    def check_method(self, method: str) -> None:
        """Raise ``ValueError`` (a message for the visitor) when ``method`` needs heads
        this model has none of (Clover-2 without a Clover-2 heads folder)."""
        kind = split_method(method)[0]
        if kind is not None and kind not in self.head_kinds:
            raise ValueError(f"there are no {METHOD_LABELS[kind]} heads for {self.label}: give a "
                             f"folder with {kind} heads in *Model and heads* (trained with "
                             f"`clover train --method {kind}`), or pick another method")

    @property
    def calibrator(self):
        """The target's ``clover.autotree.Calibrator`` (for the store under
        ``$CLOVER_CACHE_DIR``)."""
        from clover.autotree import calibrator_for

        return calibrator_for(self.target)

    @property
    def calibrations(self) -> dict:
        """Per head kind, the ``clover.autotree.Calibration`` of its auto tree, where the
        calibrator holds one."""
        cals = {k: self.calibrator.known(self.heads.get(k), auto_tree()) for k in self.head_kinds
                if self.heads.get(k) is not None}
        return {k: c for k, c in cals.items() if c is not None}

    @property
    def auto_trees(self) -> dict:
        """Per head kind, the concrete tree "auto" means in the app: the calibration's
        tree, never "off": where no tree pays here, the smallest one
        (:data:`SHOW_BUDGET`), so the method still shows."""
        return {k: (replace(c.tree, kind="dynamic", budget=SHOW_BUDGET) if c.tree.off else c.tree)
                for k, c in self.calibrations.items()}

    def lookup_config(self):
        """Prompt lookup settings for this model: the chain length adapts to this machine's
        verify cost curve (measured once, a few seconds on a CPU, in the start-up
        calibration or else on first use, then kept). While the calibration is still
        running, and on ZeroGPU (which this process cannot time), a fixed chain of at most
        4 tokens."""
        from clover.lookup import LookupConfig

        if zerogpu.active() or (self.calibrating.is_set()
                                  and self.calibrator.known_costs() is None):
            return LookupConfig(max_tokens=4)
        return self.calibrator.lookup()

    def measured_verify_costs(self) -> tuple[float, ...] | None:
        """This machine's verify cost curve (ms of one target forward over 1, 2, ...
        tokens) where it was already measured (for prompt lookup, in the start-up
        calibration or a lookup run), else None. Never measures."""
        return self.calibrator.known_costs()

    def tree_for(self, method: str, tree: TreeConfig) -> TreeConfig:
        """``tree``, or for an ``auto`` tree :attr:`auto_trees`' tree for this head kind
        (the calibrator's, read from the stored calibration, or measured on first use,
        seconds on a CPU, then kept). While :meth:`calibrate_in_background` is still
        measuring, the default budget. On ZeroGPU (:mod:`app.zerogpu`) decoding runs on hardware
        this process cannot time, so the default budget is used there."""
        heads = self.heads.get(method)
        if not tree.auto or heads is None:
            return tree
        if zerogpu.active():
            return replace(tree, auto=False)
        known = self.auto_trees.get(method)
        if known is not None:  # never wait on the lock the background calibration holds
            return known
        if self.calibrating.is_set():
            return replace(tree, auto=False)
        self._calibrate(method, measure=True)
        return self.auto_trees[method]

    def _calibrate(self, kind: str, measure: bool) -> bool:
        """Size ``kind``'s auto tree (the stored choice, else measured when ``measure``);
        False where nothing is stored and ``measure`` is False."""
        return self.calibrator.calibration(self.heads[kind], auto_tree(), measure=measure) is not None

    def plain_step_ms(self) -> float | None:
        """A plain step's time (ms) on this machine when quiet, from the calibration (the
        fastest of its repeats), or None where not measured."""
        return self.calibrator.plain_step_ms()

    def calibrate_in_background(self) -> threading.Thread | None:
        """Size the auto trees without holding up start-up: stored sizes are read at once;
        any left are measured in a daemon thread (runs meanwhile use the default budget),
        which then decodes two tokens per method (warm-up). Returns the thread, or None
        when nothing was left to measure."""
        todo = [m for m in self.head_kinds if self.heads.get(m) is not None
                and m not in self.auto_trees and not self._calibrate(m, measure=False)]
        if not todo or zerogpu.active():
            return None
        self.calibrating.set()

        def work():
            try:
                for m in todo:
                    self._calibrate(m, measure=True)
                self.calibrator.lookup()  # the verify cost curve for prompt lookup, before
                self.calibrating.clear()  # lookup runs stop using the fixed chain
                log.info("auto trees sized: %s", {m: t.budget for m, t in self.auto_trees.items()})
            except Exception:  # the default tree stays in use; the app keeps serving
                log.exception("sizing the auto tree failed; using the default budget")
            finally:
                self.calibrating.clear()
            _warm_up(self)

        thread = threading.Thread(target=work, daemon=True, name="clover-auto-tree")
        thread.start()
        return thread

    def tree_note(self) -> str:
        """One line on the auto trees in use: budgets, and where the measurement says no
        tree pays on this machine (or was taken while it was busy), the figures."""
        names = METHOD_LABELS
        parts, notes = [], []
        for m, t in sorted(self.auto_trees.items()):
            parts.append(f"{names[m]} {t.budget} drafted token{'s' if t.budget != 1 else ''}")
            cal = self.calibrations.get(m)
            if cal is not None and cal.tree.off:
                figures = (f" (best expected {cal.expected:.2f}x plain, at {cal.best_budget} "
                           f"drafted token{'s' if cal.best_budget != 1 else ''})"
                           if cal.expected and cal.best_budget else "")
                notes.append(f"for {names[m]} no tree pays on this machine{figures}, so it "
                             f"drafts the smallest tree to show the method")
            if cal is not None and cal.busy:
                notes.append(f"{names[m]}'s was measured while the machine was busy: "
                             f"it is re-measured at the next start")
        text = " · **auto tree:** " + ", ".join(parts)
        return text + (f" ({'; '.join(notes)})" if notes else "")

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
            text += self.tree_note()
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
    """Per head kind (``clover.methods.HEAD_KINDS``) the folder under ``heads_dir`` that
    holds heads of that kind (``clover.heads.find_heads``), None where there is none.

    Raises:
        ValueError: ``heads_dir`` is missing, or holds heads of no kind.
    """
    from clover.heads import find_heads

    if not heads_dir:
        return dict.fromkeys(HEAD_KINDS)
    try:
        folders = {k: find_heads(heads_dir, k) for k in HEAD_KINDS}
    except FileNotFoundError as e:
        raise ValueError(str(e)) from None
    if not any(folders.values()):
        raise ValueError(f"{heads_dir} holds no Medusa, Clover or Clover-2 heads (expected "
                         f"config.json and model.safetensors, or medusa/, clover/ and clover2/ "
                         f"subfolders)")
    return folders


def default_kinds(heads_dir: str | None, target) -> list[str]:
    """The head kinds a model gets: Medusa and Clover always (:data:`CORE_HEAD_KINDS`),
    the other kinds (Clover-2) only where ``heads_dir`` holds them or trained heads ship
    for this target.

    Raises:
        ValueError: as :func:`head_folders`.
    """
    from clover.heads import shipped_heads_for

    folders = head_folders(heads_dir)
    return [k for k in HEAD_KINDS
            if k in CORE_HEAD_KINDS or folders[k] is not None or shipped_heads_for(k, target) is not None]


def load_heads_for(target, heads_dir: str | None, kinds: Sequence[str] | None = None,
                   num_heads: int = 3) -> tuple[dict, dict]:
    """Heads of each of ``kinds`` for ``target``, and where each came from: ``heads_dir``
    (a heads folder, or one with medusa/, clover/ and clover2/ subfolders), else the heads
    shipped for the embedded model, else freshly initialised (untrained) heads.

    Args:
        kinds: head kinds to load (default :func:`default_kinds`: Medusa and Clover, and
            Clover-2 where ``heads_dir`` holds it or trained Clover-2 heads ship for
            ``target``).
    Raises:
        ValueError: a missing folder, or heads that do not fit the target.
    """
    from clover.heads import heads_for

    heads, sources = {}, {}
    folders = head_folders(heads_dir)
    if kinds is None:
        kinds = default_kinds(heads_dir, target)
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
    missing = [k for k in default_kinds(heads_dir, target) if k not in given]
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
        return load_target(model)  # its cache: clover.assets.cache_root()
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


def loaded_model(key: str) -> LoadedModel:
    """The model registered under ``key`` (see :func:`register_model`).

    Raises:
        KeyError: no model is registered under ``key``.
    """
    with _MODELS_LOCK:
        return _MODELS[key]


def model_keys() -> list[str]:
    """The keys of the models registered now, oldest first."""
    with _MODELS_LOCK:
        return list(_MODELS)


def forget_model(key: str) -> None:
    """Drop the model registered under ``key`` (nothing when there is none); a page
    that still holds it keeps working, later look-ups load it again."""
    with _MODELS_LOCK:
        _MODELS.pop(key, None)


def _warm_up(loaded: LoadedModel) -> None:
    """Size the "auto" tree of each method for this machine (unless being sized in the
    background) and decode two tokens with every method once, so the first visitor's
    timings do not include one-off start-up costs."""
    ids = encode_prompt(loaded.target.tokenizer, "Hello")
    for method in ("ar", *loaded.head_kinds):
        tree = replace(loaded.tree_for(method, auto_tree()), auto=False)  # "ar": no tree to size
        Engine(loaded.target, loaded.heads[method], tree).generate(ids, 2)
