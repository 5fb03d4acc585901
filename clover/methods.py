"""The decoding methods by name, and the engine of each (:func:`engine_for`). Nothing heavy
is imported at module level: the CLI's parser reads this."""
from __future__ import annotations

# every decoding method, in display order; "+lookup" adds a prompt lookup branch to a
# head method's tree (clover.lookup)
ALL_METHODS = ("ar", "lookup", "medusa", "clover", "clover2", "medusa+lookup", "clover+lookup",
               "clover2+lookup")
# the methods that decode with draft heads (clover.heads)
HEAD_METHODS = ("medusa", "clover", "clover2")
METHOD_LABELS = {"ar": "Plain", "lookup": "Lookup", "medusa": "Medusa", "clover": "Clover",
                 "clover2": "Clover-2", "medusa+lookup": "Medusa + lookup",
                 "clover+lookup": "Clover + lookup", "clover2+lookup": "Clover-2 + lookup"}
# Okabe-Ito colours (colour-blind safe), one per method, for every chart
METHOD_COLORS = {"ar": "#999999", "lookup": "#009E73", "medusa": "#E69F00", "clover": "#0072B2",
                 "clover2": "#CC79A7", "medusa+lookup": "#D55E00", "clover+lookup": "#56B4E9",
                 "clover2+lookup": "#000000"}


def with_lookup(method: str, lookup: bool = True) -> str:
    """A head method with the lookup branch when ``lookup`` ("clover" ->
    "clover+lookup"); plain decoding, lookup alone and hybrids stay as they are."""
    return f"{method}+lookup" if lookup and method in HEAD_METHODS else method


def split_method(method: str) -> tuple[str | None, bool]:
    """``"clover+lookup"`` -> ``("clover", True)``; ``"ar"`` -> ``(None, False)``.

    Raises:
        ValueError: for a name not in :data:`ALL_METHODS`.
    """
    if method not in ALL_METHODS:
        raise ValueError(f"unknown method {method!r}; use one of {', '.join(ALL_METHODS)}")
    heads, _, extra = method.partition("+")
    if heads == "lookup":
        return None, True
    return (None if heads == "ar" else heads), extra == "lookup"


def engine_for(method: str, target, tree=None, heads_dir: str | None = None, num_heads: int = 3,
               lookup=None, *, recalibrate: bool = False, batch_size: int = 1):
    """The :class:`~clover.engine.Engine` of a method by name, ready to run: the heads
    :func:`clover.heads.heads_for` picks (``heads_dir``, else the shipped heads for this
    target, else fresh ones) and the tree setting resolved for this machine by
    :func:`clover.autotree.resolve_tree` ("auto": the stored budget, else measured and
    stored, seconds on a CPU).

    Args:
        method: one of :data:`ALL_METHODS`.
        tree: a ``TreeConfig`` for the head methods (default ``TreeConfig()``), "auto" or not.
        lookup: the ``LookupConfig`` when the method uses lookup (default ``LookupConfig()``).
        recalibrate: measure the auto tree again even where one is stored.
        batch_size: size an "auto" tree for batches of this many rows.
    Raises:
        ValueError: unknown method, heads that do not fit.
    """
    from clover.autotree import resolve_tree
    from clover.engine import Engine
    from clover.heads import heads_for
    from clover.lookup import LookupConfig

    kind, uses_lookup = split_method(method)
    heads = heads_for(kind, target, heads_dir, num_heads)[0] if kind else None
    tree, lookup = resolve_tree(target, heads, tree, (lookup or LookupConfig()) if uses_lookup else None,
                                recalibrate=recalibrate, batch_size=batch_size)
    return Engine(target, heads, tree, lookup)
