"""The "auto" tree of each head kind, sized for this machine at the app's edge (never
inside the engine), and the one piece of the app that changes after start-up.

A :class:`TreeSizing` belongs to one loaded model (:class:`app.registry.LoadedModel`, which
is otherwise only read). Its measurements live in the target's
``clover.calibration.Calibrator`` (stored under ``$CLOVER_CACHE_DIR``, so a restart reads
them instead of measuring); what lives here is whether a background measurement is
running (an event and its engine-thread job) and how the app reads the measurements: the tree a
run gets, the prompt lookup chain, the quiet plain-step time and the banner's line.
"""
from __future__ import annotations

import logging
import threading
from concurrent.futures import Future
from dataclasses import replace
from typing import Callable

from clover import TreeConfig
from clover.methods import METHOD_LABELS

from app import engine_thread, zerogpu
from app.settings import auto_tree

log = logging.getLogger(__name__)

# the "auto" tree where the calibration says no tree pays on this machine: the smallest
# that still shows the method (a visitor who picked a head method came to see a tree)
SHOW_BUDGET = 1


class TreeSizing:
    """The auto trees of one model's draft heads: read from the stored calibration, or
    measured (seconds per head kind on a CPU) on first use or in the background.

    Args:
        target: the model's ``clover.TargetModel``.
        heads: per head kind its heads (None for a kind without heads, e.g. "ar").

    Attributes:
        calibrating: set while :meth:`start_background` measures.
        job: the background measurement queued on the engine thread, once started.
    """

    def __init__(self, target, heads: dict):
        self.target = target
        self.heads = heads
        self.calibrating = threading.Event()
        self.job: Future | None = None

    @property
    def calibrator(self):
        """The target's ``clover.calibration.Calibrator`` (its store under
        ``$CLOVER_CACHE_DIR``)."""
        from clover.calibration import calibrator_for

        return calibrator_for(self.target)

    def _kinds(self) -> list[str]:
        return [k for k, h in self.heads.items() if h is not None]

    @property
    def calibrations(self) -> dict:
        """Per head kind, the ``clover.calibration.Calibration`` of its auto tree, where the
        calibrator holds one."""
        cals = {k: self.calibrator.known(self.heads[k], auto_tree()) for k in self._kinds()}
        return {k: c for k, c in cals.items() if c is not None}

    @property
    def auto_trees(self) -> dict:
        """Per head kind, the concrete tree "auto" means in the app: the calibration's
        tree, never "off": where no tree pays here, the smallest one
        (:data:`SHOW_BUDGET`), so the method still shows."""
        return {k: (replace(c.tree, kind="dynamic", budget=SHOW_BUDGET) if c.tree.off else c.tree)
                for k, c in self.calibrations.items()}

    def tree_for(self, kind: str | None, tree: TreeConfig) -> TreeConfig:
        """``tree``, or for an ``auto`` tree :attr:`auto_trees`' tree for head kind ``kind``
        (stored, or measured now on first use, then kept). While :meth:`start_background`
        is still measuring, and on ZeroGPU (:mod:`app.zerogpu`: hardware this process
        cannot time), the default budget."""
        heads = self.heads.get(kind) if kind else None
        if not tree.auto or heads is None:
            return tree
        if zerogpu.active():
            return replace(tree, auto=False)
        known = self.auto_trees.get(kind)
        if known is not None:  # never wait on the lock the background calibration holds
            return known
        if self.calibrating.is_set():
            return replace(tree, auto=False)
        self._calibrate(kind, measure=True)
        return self.auto_trees[kind]

    def _calibrate(self, kind: str, measure: bool) -> bool:
        """Size ``kind``'s auto tree (the stored choice, else measured when ``measure``);
        False where nothing is stored and ``measure`` is False."""
        return self.calibrator.calibration(self.heads[kind], auto_tree(), measure=measure) is not None

    def lookup_config(self):
        """Prompt lookup settings: the chain length adapts to this machine's verify cost
        curve (measured once, a few seconds on a CPU, then kept). While the background
        calibration runs, and on ZeroGPU, a fixed chain of at most 4 tokens."""
        from clover.lookup import LookupConfig

        if zerogpu.active() or (self.calibrating.is_set()
                                  and self.calibrator.known_costs() is None):
            return LookupConfig(max_tokens=4)
        return self.calibrator.lookup()

    def measured_verify_costs(self) -> tuple[float, ...] | None:
        """This machine's verify cost curve (ms of one target forward over 1, 2, ...
        tokens) where it was already measured, else None. Never measures."""
        return self.calibrator.known_costs()

    def plain_step_ms(self) -> float | None:
        """A plain step's time (ms) on this machine when quiet, from the calibration (the
        fastest of its repeats), or None where not measured."""
        return self.calibrator.plain_step_ms()

    def start_background(self, then: Callable[[], None] | None = None) -> Future | None:
        """Size the auto trees without holding up start-up: stored sizes are read at once;
        any left are measured as a job queued on the engine thread
        (:mod:`app.engine_thread`: never beside a run, whose steps it would slow; runs
        pressed meanwhile wait for it), which afterwards measures the lookup cost curve
        and calls ``then`` (the app's warm-up). Returns the job, or None when nothing was
        left to measure (``then`` is not called)."""
        todo = [k for k in self._kinds() if k not in self.auto_trees
                and not self._calibrate(k, measure=False)]
        if not todo or zerogpu.active():
            return None
        self.calibrating.set()

        def work():
            try:
                for k in todo:
                    self._calibrate(k, measure=True)
                self.calibrator.lookup()  # the verify cost curve for prompt lookup, before
                self.calibrating.clear()  # lookup runs stop using the fixed chain
                log.info("auto trees sized: %s", {k: t.budget for k, t in self.auto_trees.items()})
            except Exception:  # the default tree stays in use; the app keeps serving
                log.exception("sizing the auto tree failed; using the default budget")
            finally:
                self.calibrating.clear()
            if then is not None:
                then()

        self.job = engine_thread.submit(work)
        return self.job

    def note(self) -> str:
        """The banner's words on the auto trees: being sized (runs pressed meanwhile
        wait for it), or the budgets in use and, where the measurement says no tree pays
        on this machine or was taken while it was busy, one clause naming those methods.
        "" with no trees."""
        if self.calibrating.is_set():
            return (" · **auto tree:** being sized for this machine (a run pressed meanwhile "
                    "starts when it ends, within about a minute)")
        trees = self.auto_trees
        if not trees:
            return ""
        parts, off, busy = [], [], []
        cals = self.calibrations
        for k, t in sorted(trees.items()):
            name = METHOD_LABELS[k]
            parts.append(f"{name} {t.budget} drafted token{'s' if t.budget != 1 else ''}")
            cal = cals.get(k)
            if cal is not None and cal.tree.off:
                off.append(name)
            if cal is not None and (cal.busy or cal.provisional):
                busy.append(name)
        notes = []
        if off:
            notes.append(f"no tree pays on this machine for {_join(off)}, so "
                         f"{'it drafts' if len(off) == 1 else 'they draft'} the smallest tree "
                         f"to show the method")
        if busy:
            notes.append(f"measured while the machine was busy; kept until it is quiet")
        text = " · **auto tree:** " + ", ".join(parts)
        return text + (f" ({'; '.join(notes)})" if notes else "")


def _join(names: list[str]) -> str:
    """"A", "A and B", "A, B and C"."""
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
