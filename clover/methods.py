"""The decoding methods by name: the one list of them, their labels and colours
(:func:`clover.engine_for` builds the engine of each), a method's name from its heads and
lookup (:func:`method_name`), and how runs of several methods are compared step for step
(:func:`lockstep`). A leaf module that imports nothing
of the library, so that every other module, the CLI's parser and the app can read it."""
from __future__ import annotations

from typing import Iterator

# every decoding method, in display order; "+lookup" adds a prompt lookup branch to a
# head method's tree (clover.lookup)
ALL_METHODS = ("ar", "lookup", "medusa", "clover", "clover2", "medusa+lookup", "clover+lookup",
               "clover2+lookup")
# the methods that decode with draft heads (clover.heads)
HEAD_KINDS = ("medusa", "clover", "clover2")
METHOD_LABELS = {"ar": "Plain", "lookup": "Lookup", "medusa": "Medusa", "clover": "Clover",
                 "clover2": "Clover-2", "medusa+lookup": "Medusa + lookup",
                 "clover+lookup": "Clover + lookup", "clover2+lookup": "Clover-2 + lookup"}
# Okabe-Ito colours (colour-blind safe), one per method, for every chart
# a head method with the lookup branch: a darker shade of its base method's colour
METHOD_COLORS = {"ar": "#999999", "lookup": "#009E73", "medusa": "#E69F00", "clover": "#0072B2",
                 "clover2": "#CC79A7", "medusa+lookup": "#8F6300", "clover+lookup": "#00406A",
                 "clover2+lookup": "#8A3F6F"}


def with_lookup(method: str, lookup: bool = True) -> str:
    """A head method with the lookup branch when ``lookup`` ("clover" ->
    "clover+lookup"); plain decoding, lookup alone and hybrids stay as they are."""
    return f"{method}+lookup" if lookup and method in HEAD_KINDS else method


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


def method_name(heads, lookup) -> str:
    """The method's name in :data:`clover.methods.ALL_METHODS`: "ar", "lookup", a head
    kind ("medusa", "clover", "clover2") or a head kind with "+lookup"."""
    if heads is None:
        return "lookup" if lookup is not None else "ar"
    return heads.config.kind + ("+lookup" if lookup is not None else "")
