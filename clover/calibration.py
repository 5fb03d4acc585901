"""What is measured of a target on this machine, kept: the auto tree of each heads and
batch size, and the verify cost curve.

Every measurement of a target on this machine has one home, its :class:`Calibrator`
(:func:`calibrator_for`): the verify cost curve (:mod:`clover.timing`; kept in memory)
and the auto tree of each heads and batch size (:func:`clover.autotree.auto_tree`; kept
in memory and on disk, ``autotree.json``, keyed by :func:`calibration_key`, so it is
measured once per machine, target, heads and library versions). The edges (CLI, bench,
app, notebooks) ask it once, through :func:`resolve_tree` or :meth:`Calibrator.resolve`,
and pass the concrete tree and lookup settings to the engine, which never measures.
"""
from __future__ import annotations

import logging
import threading
import weakref
from dataclasses import dataclass, replace

import torch

from clover.assets import newest_record, read_store, write_record
from clover.autotree import TIMING, auto_tree
from clover.machine import cpu_name, machine_busy
from clover.timing import padded_widths, time_forward
from clover.tree import MAX_TREE_NODES, TreeConfig

log = logging.getLogger(__name__)


def calibration_key(target, heads, base: TreeConfig, batch_size: int = 1) -> str:
    """What an auto-tree choice depends on: the target (name, fingerprint, dtype, device),
    a hash of the heads' weights, the base tree, the torch thread count, the processor,
    the versions of torch, transformers and this library, the target's CPU linear kernels
    (``TargetModel.linear_kernels_text``), how budgets are timed (:data:`TIMING`), and the
    batch size (named only above 1)."""
    from importlib.metadata import PackageNotFoundError, version

    cpu = cpu_name()
    device = str(target.device)
    if target.device.type == "cuda":
        device += ":" + torch.cuda.get_device_name(target.device)
    versions = []
    for package in ("torch", "transformers", "clover-studio"):
        try:
            versions.append(f"{package}={version(package)}")
        except PackageNotFoundError:  # a source checkout that was never installed
            versions.append(f"{package}=?")
    fingerprint = ",".join(f"{k}={v}" for k, v in sorted(target.fingerprint.items()))
    return "|".join([target.name, fingerprint, str(target.dtype), device,
                     f"threads={torch.get_num_threads()}", cpu, *versions,
                     f"kernels={getattr(target, 'linear_kernels_text', 'off')}",
                     f"heads={heads_digest(heads)}", repr(replace(base, budget=1, auto=False)),
                     f"timing={TIMING}"]
                    + ([f"batch={batch_size}"] if batch_size > 1 else []))


def heads_digest(heads) -> str:
    """A short hash of the heads' weights (names, shapes and the first 4,096 values of
    each tensor)."""
    import hashlib

    h = hashlib.sha1()
    for name, p in sorted(heads.state_dict().items()):
        h.update(name.encode())
        h.update(str(tuple(p.shape)).encode())
        h.update(p.detach().flatten()[:4096].float().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def calibration_family(target, heads, base: TreeConfig, batch_size: int = 1) -> str:
    """What a stored choice is *for*, whatever the conditions it was measured under (the
    thread count, the versions, the kernels, :data:`TIMING`): the target, the heads'
    weights, the base tree and the batch size. A choice of the same family stands in,
    with a note, where none was measured under this :func:`calibration_key` and the
    machine is busy (:func:`calibrate`)."""
    fingerprint = ",".join(f"{k}={v}" for k, v in sorted(target.fingerprint.items()))
    return "|".join([target.name, fingerprint, str(target.dtype), str(target.device.type),
                     f"heads={heads_digest(heads)}", repr(replace(base, budget=1, auto=False)),
                     f"batch={batch_size}"])


@dataclass
class Calibration:
    """The auto tree of one target, heads and batch size on this machine, with the
    figures behind it (:func:`calibrate`).

    Attributes:
        tree: the concrete tree: dynamic with the chosen budget, or kind "off".
        plain_ms: a plain step's time while calibrating (its fastest repeat), ms; None
            for a choice stored by an older version without figures.
        expected: ``best_budget``'s expected speedup over plain decoding (x), or None.
        best_budget: the budget :func:`pick_budget` took (also when ``tree`` is off).
        busy: the machine was busy while timing (:attr:`AutoTreeReport.busy`): the choice
            is stored as provisional.
        stored: read from the store rather than measured now.
        date: when it was measured (UTC, ISO 8601), or None.
        provisional: measured on a busy machine (stored so, with the load it saw): used
            until a measurement on a quiet machine replaces it.
        others_load: CPUs' worth of other processes' work while it was timed (None: unknown).
        note: one line for the user where the choice stands in for a measurement not
            made now (a provisional one, or one of another thread count or an older
            timing version), else "".
    """

    tree: TreeConfig
    plain_ms: float | None = None
    expected: float | None = None
    best_budget: int | None = None
    busy: bool = False
    stored: bool = False
    date: str | None = None
    provisional: bool = False
    others_load: float | None = None
    note: str = ""

    @classmethod
    def from_record(cls, base: TreeConfig, record) -> "Calibration | None":
        """A stored record (a dict, or an int budget from older versions; 0 = off)."""
        if isinstance(record, int) and not isinstance(record, bool):
            record = {"budget": record}
        if not isinstance(record, dict) or not isinstance(record.get("budget"), int):
            return None
        budget = record["budget"]
        tree = (replace(base, kind="off", auto=False) if budget == 0
                else replace(base, kind="dynamic", budget=budget, auto=False))
        return cls(tree, record.get("plain_ms"), record.get("expected"), record.get("best_budget"),
                   stored=True, date=record.get("date"), provisional=bool(record.get("provisional")),
                   others_load=record.get("others_load"))

    def describe(self) -> str:
        """One line on what was chosen and why: the tree, the expected speedup, how it
        was measured (quiet, busy, stored) and any stand-in note."""
        what = "no tree (none beats plain decoding here)" if self.tree.off else f"{self.tree.budget} drafted tokens"
        gain = f", expected {self.expected:.2f}x plain" if self.expected else ""
        how = ("measured on a busy machine, provisional" if self.provisional or self.busy
               else "measured on a quiet machine")
        when = "stored" if self.stored else "measured now"
        return f"auto tree: {what}{gain} ({how}; {when})" + (f"; {self.note}" if self.note else "")


# seconds the auto tree may spend sizing on a busy machine (auto_tree's budget_s): its
# choice is provisional and is measured again once the machine is quiet
BUSY_BUDGET_S = 15.0


# the budgets a busy machine tries (a tree of a few tokens is what such a machine affords,
# and a smaller big tree drafts the calibration texts faster); a quiet one tries BUDGETS
BUSY_BUDGETS = (1, 2, 3, 4)


def calibrate(target, heads, base: TreeConfig | None = None, path=None, measure: bool = True,
              recalibrate: bool = False, batch_size: int = 1, progress=None) -> Calibration | None:
    """:func:`auto_tree`, remembered in a JSON file across runs of the app or CLI.

    The rule (the CLI, the bench and the app all come here, through
    :class:`Calibrator`):

    * a choice stored under this :func:`calibration_key` and measured on a quiet machine
      is used;
    * a provisional one (measured while the machine was busy), or where none is stored
      under this key, one of the same :func:`calibration_family` (another thread count,
      an older :data:`TIMING`), is used at once, with a note (``Calibration.note``),
      while the machine is busy (:func:`machine_busy`) or ``measure`` is False; on a
      quiet machine it is measured again;
    * otherwise it is measured now (``measure``), else None. On a busy machine the
      measurement is bounded (:data:`BUSY_BUDGET_S`, :func:`auto_tree`'s ``budget_s``)
      and stored as provisional with the load it saw, never over a quiet one; a quiet
      one is stored with its figures (budget, plain step ms, expected speedup, date).

    Args:
        heads: the method's draft heads (must not be None).
        base: the dynamic TreeConfig whose budget is tuned (default TreeConfig()).
        path: the JSON file (default ``$CLOVER_CACHE_DIR/autotree.json``, i.e.
            ``~/.cache/clover-studio/autotree.json``).
        recalibrate: measure again (and store) even where a choice is stored.
        batch_size: the batch size the tree is for (:func:`auto_tree`).
        progress: passed to :func:`auto_tree` (``progress(what, done, total)``).
    """
    import datetime
    from pathlib import Path

    from clover.assets import cache_root

    base = replace(base or TreeConfig(), auto=False)
    path = Path(path or cache_root() / "autotree.json")
    key = calibration_key(target, heads, base, batch_size)
    family = calibration_family(target, heads, base, batch_size)
    stored = read_store(path)
    found = Calibration.from_record(base, stored.get(key))
    if found is not None and not recalibrate and not found.provisional:
        return found
    stand_in = found
    if stand_in is not None:
        stand_in = replace(stand_in, note="measured while the machine was busy; measured again when it is quiet "
                                          "(or with --recalibrate)")
    else:  # the newest choice of the same family, measured under other conditions
        newest = Calibration.from_record(base, newest_record(stored, family))
        if newest is not None:
            stand_in = replace(newest,
                               note="stored for these heads under other settings (thread count, versions or "
                                    "timing); measured again when the machine is quiet (or with --recalibrate)")
    busy = None
    if stand_in is not None and not recalibrate:
        if not measure or (busy := machine_busy()):
            return stand_in
    if not measure:
        return None
    if busy is None:
        busy = machine_busy()
    tree, report = auto_tree(target, heads, base, batch_size=batch_size, progress=progress,
                             **(dict(budget_s=BUSY_BUDGET_S, budgets=BUSY_BUDGETS, repeats=3) if busy else {}))
    date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    provisional = busy or report.busy
    cal = Calibration(tree, report.plain_ms or None, report.expected or None, report.best_budget or None,
                      report.busy, date=date, provisional=provisional, others_load=report.others_load,
                      note="measured while the machine was busy; measured again when it is quiet" if provisional
                      else "")
    keep_quiet = found is not None and not found.provisional  # never replace a quiet choice by a busy one
    if report.budgets and not (provisional and keep_quiet):
        write_record(path, key, {"budget": 0 if tree.off else tree.budget,
                                  "plain_ms": round(report.plain_ms, 3),
                                  "expected": round(report.expected, 4),
                                  "best_budget": report.best_budget,
                                  "spread": round(report.spread, 3), "date": date,
                                  "others_load": None if report.others_load is None
                                  else round(report.others_load, 2),
                                  "provisional": provisional, "family": family})
    return cal


def stored_auto_tree(target, heads, base: TreeConfig | None = None, path=None,
                     measure: bool = True, recalibrate: bool = False,
                     batch_size: int = 1) -> TreeConfig | None:
    """The tree of :func:`calibrate` (``base`` itself for no heads), or None where nothing
    is stored and ``measure`` is False."""
    if heads is None:
        return base or TreeConfig()
    cal = calibrate(target, heads, base, path, measure, recalibrate, batch_size)
    return None if cal is None else cal.tree


class Calibrator:
    """Every measurement of one target on this machine, in one place: the verify cost
    curve (ms of a forward over 1, 2, ... tokens, per batch size; kept in memory) and the
    auto tree of each heads, base tree and batch size (:class:`Calibration`: kept in
    memory for this process, and on disk in ``path`` through :func:`calibrate`). Get the
    one of a target with :func:`calibrator_for`. Thread-safe: measurements run under one
    lock, and :meth:`known` / :meth:`known_costs` read without waiting on it.

    Args:
        target: the ``clover.TargetModel``.
        path: the store (``autotree.json``).
    """

    def __init__(self, target, path):
        self._target = weakref.ref(target)  # the registry of calibrators must not keep it alive
        self.path = path
        self.lock = threading.RLock()
        self._costs: dict[tuple[int, int], list[float]] = {}
        self._raw: dict[tuple[int, int], list[float]] = {}
        # (heads, base tree, batch size) -> Calibration, per heads object
        self._calibrations: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()

    @property
    def target(self):
        target = self._target()
        if target is None:
            raise ReferenceError("the calibrator's target model was freed")
        return target

    @staticmethod
    def _base(base: TreeConfig | None) -> TreeConfig:
        return replace(base or TreeConfig(), auto=False)

    def known(self, heads, base: TreeConfig | None = None, batch_size: int = 1) -> Calibration | None:
        """The calibration this process already holds for ``heads`` (measured or read from
        the store by :meth:`calibration`), else None. Never measures, reads no file, never
        waits."""
        return self._calibrations.get(heads, {}).get((self._base(base), batch_size))

    def calibration(self, heads, base: TreeConfig | None = None, batch_size: int = 1,
                    measure: bool = True, recalibrate: bool = False, progress=None) -> Calibration | None:
        """The auto tree of ``heads`` on this machine with its figures: held in memory,
        else as :func:`calibrate` rules (stored, a stand-in while the machine is busy, or
        measured now when ``measure``), else None. ``recalibrate`` measures again;
        ``progress`` follows a measurement (:func:`auto_tree`)."""
        base = self._base(base)
        if not recalibrate and (cal := self.known(heads, base, batch_size)) is not None:
            return cal
        with self.lock:
            if not recalibrate and (cal := self.known(heads, base, batch_size)) is not None:
                return cal  # measured by another thread meanwhile
            cal = calibrate(self.target, heads, base, self.path, measure, recalibrate, batch_size, progress)
            if cal is not None:
                self._calibrations.setdefault(heads, {})[base, batch_size] = cal
            return cal

    def calibrations(self) -> list[Calibration]:
        """Every calibration this process holds for this target."""
        return [c for by_heads in list(self._calibrations.values()) for c in by_heads.values()]

    def plain_step_ms(self) -> float | None:
        """A plain step's time (ms) on this machine when quiet: the fastest of the held
        calibrations' plain steps, or None where none was measured."""
        times = [c.plain_ms for c in self.calibrations() if c.plain_ms]
        return min(times) if times else None

    def raw_costs(self, n: int, batch_size: int = 1, prefix_len: int = 256,
                  repeats: int = 5) -> list[float]:
        """ms of one forward over 1..``n`` tokens as measured (:func:`time_forward` with
        ``quiet``; not made non-decreasing), on the first call for this ``n`` and batch
        size, then held."""
        with self.lock:
            if (n, batch_size) not in self._raw:
                self._raw[n, batch_size] = time_forward(self.target, list(range(1, n + 1)), prefix_len=prefix_len,
                                                        repeats=repeats, batch_size=batch_size, quiet=True)
            return list(self._raw[n, batch_size])

    def verify_costs(self, n: int, batch_size: int = 1, prefix_len: int = 256,
                     repeats: int = 5) -> list[float]:
        """The verify cost curve for 1..``n`` tokens (:func:`verify_costs`), measured on
        the first call for this ``n`` and batch size, then held."""
        with self.lock:
            if (n, batch_size) not in self._costs:
                ms = self.raw_costs(n, batch_size, prefix_len, repeats)
                self._costs[n, batch_size] = [max(ms[: i + 1]) for i in range(n)]
            return list(self._costs[n, batch_size])

    def verify_plan(self, n: int, saving: float = 0.05) -> tuple[tuple[int, ...], list[float]]:
        """The padded verification plan for one row (:func:`verify_widths`) and the cost
        curve it gives: ms of a step that verifies 1..``n`` tokens padded by the plan (the
        width's measured time, made non-decreasing), what prompt lookup sizes its chains
        by when the engine pads."""
        raw = self.raw_costs(min(2 * n, MAX_TREE_NODES + 1), repeats=7)
        plan = padded_widths(raw, n, saving)
        costs = [raw[w - 1] for w in plan]
        return plan, [max(costs[: i + 1]) for i in range(n)]

    def known_costs(self, batch_size: int = 1) -> tuple[float, ...] | None:
        """The longest verify cost curve held for ``batch_size``, else None. Never measures."""
        curves = [c for (n, b), c in list(self._costs.items()) if b == batch_size]
        return tuple(max(curves, key=len)) if curves else None

    def lookup(self, lookup=None, batch_size: int = 1):
        """``lookup`` (default ``LookupConfig()``) with the verify cost curve for chains up
        to its ``max_tokens`` (:func:`sized_lookup`)."""
        from clover.lookup import LookupConfig

        lookup = lookup or LookupConfig()
        return replace(lookup, costs=tuple(self.verify_costs(lookup.max_tokens + 1, batch_size)))

    def resolve(self, heads, tree: TreeConfig | None = None, lookup=None, *, measure: bool = True,
                recalibrate: bool = False, batch_size: int = 1, progress=None):
        """The tree setting made concrete for this machine (:func:`resolve_tree`).

        Returns:
            (tree, lookup).
        """
        tree = tree or TreeConfig()
        if not tree.auto:
            return tree, lookup
        if lookup is not None and not lookup.costs and measure:
            lookup = self.lookup(lookup, batch_size)
        if heads is None:
            return replace(tree, auto=False), lookup
        cal = self.calibration(heads, tree, batch_size, measure=measure, recalibrate=recalibrate,
                               progress=progress)
        return (tree if cal is None else cal.tree), lookup


_CALIBRATORS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


_CALIBRATORS_LOCK = threading.Lock()


def calibrator_for(target, path=None) -> Calibrator:
    """The :class:`Calibrator` of ``target`` for the store ``path`` (default
    ``$CLOVER_CACHE_DIR/autotree.json``, i.e. ``~/.cache/clover-studio/autotree.json``,
    read when called): one per target and store for the life of the target."""
    from pathlib import Path

    from clover.assets import cache_root

    path = Path(path or cache_root() / "autotree.json")
    with _CALIBRATORS_LOCK:
        by_path = _CALIBRATORS.setdefault(target, {})
        if path not in by_path:
            by_path[path] = Calibrator(target, path)
        return by_path[path]


def resolve_tree(target, heads, tree: TreeConfig | None = None, lookup=None, *, path=None,
                 measure: bool = True, recalibrate: bool = False, batch_size: int = 1, progress=None):
    """The one place where the tree setting "auto" becomes a concrete tree for this
    machine; the CLI, the bench, the app and the notebooks call it (or the same
    :meth:`Calibrator.resolve`) before building an :class:`~clover.engine.Engine` (which
    takes concrete trees only).

    With ``tree.auto``: heads get the dynamic tree their :class:`Calibration` picks (held
    by the target's :class:`Calibrator`, else read from the store, else measured, seconds
    on a CPU, and stored; it may be "off"); no heads (plain decoding, lookup alone) get
    ``tree`` without the mark; a ``lookup`` config without ``costs`` gets this machine's
    verify cost curve (:func:`sized_lookup`). A tree that is not "auto" and its lookup are
    returned as they are.

    Args:
        heads: the method's draft heads, or None.
        tree: the tree setting (default ``TreeConfig()``).
        lookup: the method's ``clover.lookup.LookupConfig``, or None.
        path: the store (:func:`calibrator_for`).
        recalibrate: measure again (and store) even where a choice is stored.
        measure: False: never time anything; where no budget is stored, ``tree`` comes
            back still marked ``auto`` (the app then decides what to run meanwhile).
        batch_size: the heads' tree and the lookup cost curve are sized for batches of
            this many rows.
        progress: follows a measurement, ``progress(what, done, total)`` (:func:`auto_tree`).
    Returns:
        (tree, lookup).
    """
    return calibrator_for(target, path).resolve(heads, tree, lookup, measure=measure, recalibrate=recalibrate,
                                                batch_size=batch_size, progress=progress)


def verify_costs(target, n: int, prefix_len: int = 256, repeats: int = 5, batch_size: int = 1) -> list[float]:
    """This machine's verify cost curve: ms of one target forward over 1, 2, ..., ``n``
    tokens (per row, for ``batch_size`` rows) on top of ``prefix_len`` cached ones, each
    the fastest of ``repeats`` interleaved calls (:func:`time_forward` with ``quiet``, so
    that a busy spell does not steepen the curve and cut lookup chains), made
    non-decreasing (timing noise aside, more tokens never cost less). Measured once per
    target, size and batch size by its :class:`Calibrator`, then kept in memory.

    Returns:
        a list of ``n`` times in ms.
    """
    return calibrator_for(target).verify_costs(n, batch_size, prefix_len=prefix_len, repeats=repeats)


def verify_widths(target, n: int, saving: float = 0.05) -> tuple[int, ...]:
    """This machine's padded verification plan for one row (``Engine(verify_widths=...)``):
    for each k = 1..``n`` tokens, how many to run the target's forward over. A CPU's matrix
    kernels can make a forward over more tokens cheaper than over fewer (measured on a
    2-core AVX-512 CPU at a 256-token prefix: 11 tokens 96 ms, 13-15 tokens 114-141 ms,
    16 tokens 80-85 ms; Clover at a budget of 10 drafted tokens then decoded 12 Spec-Bench
    questions 7% faster, the same text), so a step pads to the cheapest width up to 2n
    tokens when that saves ``saving`` (5%) or more. Measured once per target (the fastest
    of 7 interleaved forwards per size, about 2n x 7 forwards; seconds on a CPU), then
    held by its :class:`Calibrator`.

    Returns:
        ``n`` widths, the k-th >= k.
    """
    return calibrator_for(target).verify_plan(n, saving)[0]


def sized_lookup(target, lookup=None, batch_size: int = 1):
    """``lookup`` (default ``LookupConfig()``) with this machine's verify cost curve for
    chains up to its ``max_tokens`` (:meth:`Calibrator.lookup`), so prompt lookup drafts
    the length that pays here (``clover.lookup.best_length``). With ``batch_size`` B the
    curve is a batched step's, B rows each verifying as many tokens: on a CPU every extra
    token costs B rows' worth, so a larger batch drafts shorter."""
    return calibrator_for(target).lookup(lookup, batch_size)
