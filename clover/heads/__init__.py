"""Draft heads: Medusa (baseline), Clover and Clover-2, behind one ``drafter()`` interface."""
from __future__ import annotations

import logging
from pathlib import Path

from clover.heads.base import DraftHeads
from clover.heads.config import CONFIG_FILE, HeadConfig, check_fits, fingerprint_matches
from clover.heads.drafter import Drafter, HeadsDrafter, PlainDrafter, draft_rows
from clover.heads.clover import CloverHeads
from clover.heads.clover2 import Clover2Heads
from clover.heads.medusa import MedusaHeads
from clover.methods import HEAD_KINDS

log = logging.getLogger(__name__)

def new_heads(kind: str, target, num_heads: int = 3, draft_vocab=None, **config) -> DraftHeads:
    """Freshly initialised heads of ``kind`` sized for ``target`` (they run, guessing badly).

    Args:
        draft_vocab: token ids the heads may draft (None: the whole vocabulary).
        config: further HeadConfig fields (e.g. ``own_lm_head=True`` for Medusa).
    Raises:
        ValueError: for an unknown kind or bad sizes.
    """
    if draft_vocab is not None:
        draft_vocab = sorted(set(int(t) for t in draft_vocab))
        config["draft_vocab_size"] = len(draft_vocab)
    cfg = HeadConfig.for_target(kind, target, num_heads=num_heads, **config)
    heads = DraftHeads.build(cfg, target)
    if draft_vocab is not None:
        heads.set_draft_vocab(draft_vocab)
    return heads.init_from_target(target).to(device=target.device, dtype=target.dtype).eval()


def load_heads(path: str | Path, target) -> DraftHeads:
    """Load heads saved with ``save_pretrained`` for ``target``.

    Raises:
        FileNotFoundError: when ``path`` holds no heads.
        ValueError: when the heads do not fit the target (hidden size or vocabulary).
    """
    return DraftHeads.from_pretrained(path, target)


__all__ = ["DraftHeads", "Drafter", "HeadConfig", "PlainDrafter", "MedusaHeads", "CloverHeads", "Clover2Heads",
           "new_heads", "load_heads", "heads_for", "check_fits", "fingerprint_matches", "HeadsDrafter",
           "shipped_heads_dir", "shipped_heads_for", "find_heads", "draft_rows"]


def shipped_heads_dir(kind: str) -> Path | None:
    """Folder of the ``kind`` heads shipped for the embedded model
    (``clover.assets_dir() / "heads" / kind``), or None when there are none (also when
    the assets are not installed at all)."""
    from clover.assets import assets_dir

    try:
        path = assets_dir() / "heads" / kind
    except FileNotFoundError:
        return None
    return path if (path / "config.json").is_file() else None


def find_heads(heads_dir: str | Path, kind: str) -> Path | None:
    """The folder under ``heads_dir`` that holds ``kind`` heads: ``heads_dir`` itself when
    it holds heads of that kind, or its ``kind`` subfolder (as ``assets/heads/`` holds
    ``medusa/`` and ``clover/``); None when neither does.

    Raises:
        FileNotFoundError: ``heads_dir`` is not a folder.
    """
    root = Path(heads_dir).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(f"the heads folder {heads_dir} does not exist")
    if (root / kind / CONFIG_FILE).is_file():
        return root / kind
    if (root / CONFIG_FILE).is_file() and DraftHeads.read_config(root).kind == kind:
        return root
    return None


def shipped_heads_for(kind: str, target) -> Path | None:
    """The folder of the shipped ``kind`` heads when they were made for ``target`` (the
    embedded model, or the same model from the hub in any dtype: the same
    :func:`clover.models.target_fingerprint`), else None."""
    from clover.models import EMBEDDED_NAME

    shipped = shipped_heads_dir(kind)
    if shipped is None:
        return None
    cfg = DraftHeads.read_config(shipped)
    if fingerprint_matches(cfg, target) or (target.name == EMBEDDED_NAME and not cfg.target_fingerprint):
        return shipped
    return None


SHIPPED = "trained, shipped with the app"
UNTRAINED = "untrained (freshly initialised)"


def heads_for(kind: str | None, target, heads_dir: str | Path | None = None,
              num_heads: int = 3) -> tuple[DraftHeads | None, str]:
    """The draft heads of ``kind`` to decode ``target`` with, and where they came from.

    One decision for the CLI, the app, the bench and the notebooks: heads from
    ``heads_dir`` when given; else the heads shipped in ``assets/heads/`` when they were
    made for this target (the embedded model, or the same model from the hub in any
    dtype: same :func:`clover.models.target_fingerprint`); else freshly initialised heads,
    with a warning.

    Args:
        kind: a head kind (:data:`clover.methods.HEAD_KINDS`: "medusa", "clover",
            "clover2"), or None for plain decoding (returns ``(None, "")``).
        heads_dir: a folder holding heads saved with ``save_pretrained``.
    Returns:
        (heads or None, provenance): "loaded from DIR", "trained, shipped with the app"
        (plus "(trained on the embedded GGUF copy)" when the target was loaded otherwise),
        or "untrained (freshly initialised)".
    Raises:
        ValueError: unknown kind; heads of another kind in ``heads_dir``; heads that were
            made for another model (:func:`check_fits`).
        FileNotFoundError: ``heads_dir`` holds no heads.
    """
    if kind is None:
        return None, ""
    if kind not in HEAD_KINDS:
        raise ValueError(f"unknown head kind {kind!r}; use one of {', '.join(HEAD_KINDS)}")
    if heads_dir is not None:
        heads = load_heads(heads_dir, target)
        if heads.config.kind != kind:
            raise ValueError(f"{heads_dir} holds {heads.config.kind} heads, not {kind}")
        return heads, f"loaded from {heads_dir}"
    shipped = shipped_heads_for(kind, target)
    if shipped is not None:
        cfg = DraftHeads.read_config(shipped)
        source = SHIPPED if target.name == cfg.target else f"{SHIPPED} (trained on the embedded GGUF copy)"
        return load_heads(shipped, target), source
    log.warning("no trained %s heads for %s: using freshly initialised heads "
                "(they guess badly, so expect little speedup)", kind, target.name)
    return new_heads(kind, target, num_heads=num_heads), UNTRAINED
