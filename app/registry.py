"""The app's loaded models: each target with its draft heads, loaded once and then only
read, shared by every visitor (the only module-level state of the app; each model's
auto trees, sized after start-up, are :mod:`app.sizing`'s).

A model is registered under a key (:func:`register_model`); runs name it by key
(:func:`get_model`, :func:`loaded_model`), so decoding can also run in a ZeroGPU worker.
"""
from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Sequence

from clover import Engine, encode_prompt, load_target
from clover.methods import HEAD_KINDS, METHOD_LABELS, split_method

from app.engine_thread import runs_on_engine_thread
from app.settings import auto_tree
from app.sizing import TreeSizing

log = logging.getLogger(__name__)

# head kinds every model gets (shipped heads, else untrained ones); the other kinds of
# clover.methods.HEAD_KINDS (Clover-2) join only where trained heads exist for them
CORE_HEAD_KINDS = ("medusa", "clover")
# the methods every model offers to watch (the lookup branch: clover.methods.with_lookup)
CORE_METHODS = ("ar", "lookup", *CORE_HEAD_KINDS)
DEFAULT_MODEL_KEY = "default"


@dataclass(frozen=True)
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
        sizing: the auto tree of each head kind (:class:`app.sizing.TreeSizing`), the one
            part that changes after start-up (sized in the background); its measurements
            live in the target's ``clover.calibration.Calibrator``.
    """

    key: str
    target: object
    heads: dict
    sources: dict = field(default_factory=dict)
    label: str = ""
    sizing: TreeSizing = field(default=None, repr=False, compare=False)

    def __post_init__(self):
        if self.sizing is None:
            object.__setattr__(self, "sizing", TreeSizing(self.target, self.heads))

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
        text += self.sizing.note()
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


@runs_on_engine_thread
def register_model(key: str, target, heads: dict | None = None, sources: dict | None = None,
                   heads_dir: str | None = None, label: str | None = None,
                   warm_up: bool | str = True) -> LoadedModel:
    """Register an already loaded target under ``key``, with ``heads`` (per method, e.g.
    from a test) where given and the rest loaded as :func:`load_heads_for` does. Runs on
    the engine thread (:mod:`app.engine_thread`), as all the app's torch work does.

    ``warm_up``: True sizes the auto trees and decodes two tokens per method now;
    "background" does it in a thread (see :meth:`app.sizing.TreeSizing.start_background`);
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
        if loaded.sizing.start_background(then=lambda: _warm_up(loaded)) is None:
            _warm_up(loaded)
    elif warm_up:
        _warm_up(loaded)
    with _MODELS_LOCK:
        _MODELS[key] = loaded
    return loaded


@runs_on_engine_thread
def open_target(model: str | None):
    """Load a target (None = the embedded model), on the engine thread.

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
        tree = replace(loaded.sizing.tree_for(method, auto_tree()), auto=False)  # "ar": no tree to size
        Engine(loaded.target, loaded.heads[method], tree).generate(ids, 2)
