"""The CPU linear kernel per row count, timed once on a quiet machine and remembered.

:func:`clover.kernels.linear.choose_layout` times every kernel on a module's own weights
(the target's when it loads, draft heads' when they are adopted) and keeps the fastest
per row count. Timed beside other work, that choice is noise: on the 2-core VM beside
two CPU-bound processes, three loads of SmolLM2-135M chose three layouts ("plain 1,
packed 2, few-row 3-5, packed 6-16"; "packed 1, few-row 2-3, packed 4-16"; "plain 1,
few-row 2, packed 3-7, plain 8-11, packed 12-16") where three quiet loads each chose
"few-row 1-2, packed 3-16" (2026-12-07). A layout timed under load runs the tree's
verify forward on a slower kernel, so a benchmark started on a busy machine timed other
kernels than an app loaded while it was quiet, and every stored auto tree (keyed by the
target's kernels, :func:`clover.calibration.calibration_key`) was measured again.

So a layout timed on a quiet machine is stored (``$CLOVER_CACHE_DIR/kernels.json``)
under what it depends on (:func:`layout_key`: the processor, the torch thread count and
version, the candidate kernels, the weights' shapes) and every later load uses it
without timing (about 4 s saved for the target). Where none is stored under that key:
a quiet machine times and stores; a busy one (:func:`clover.machine.machine_busy`) uses
one stored for the same weights at another thread count, else times once, roughly, and
stores nothing.
"""
from __future__ import annotations

import datetime
import hashlib
import logging
from collections import Counter
from pathlib import Path

import torch
from torch import nn

from clover.assets import cache_root, newest_record, read_store, write_record
from clover.machine import cpu_name, machine_busy
from clover.kernels.linear import (KERNELS, MAX_ROWS, FewRowLinear, choose_layout, describe_layout,
                                   packed_available)

log = logging.getLogger(__name__)

STORE_FILE = "kernels.json"  # under clover.assets.cache_root()


def layout_key(module: nn.Module, kernels: tuple[str, ...] = KERNELS,
               extra: tuple = ()) -> tuple[str, str]:
    """(key, family) of a layout choice for ``module``'s :class:`FewRowLinear` layers
    (and the ``extra`` (weight, bias) pairs timed with them): the processor, torch's
    version, the candidate kernels (and whether oneDNN's packed one exists), the
    multiset of weight shapes and dtypes; the key adds the torch thread count, the
    family leaves it out."""
    weights = [m.weight for m in module.modules() if isinstance(m, FewRowLinear)]
    weights += [w for w, _ in extra]
    shapes = sorted(Counter(f"{tuple(w.shape)}:{w.dtype}" for w in weights).items())
    digest = hashlib.sha1(repr(shapes).encode()).hexdigest()[:16]
    family = "|".join([cpu_name(), f"torch={torch.__version__}", f"kernels={','.join(kernels)}",
                       f"packed={packed_available()}", f"weights={digest}"])
    return f"{family}|threads={torch.get_num_threads()}", family


def _layout(record, kernels: tuple[str, ...]) -> tuple[str, ...] | None:
    """A stored record's layout, or None where it is not a valid one for ``kernels``."""
    layout = record.get("layout") if isinstance(record, dict) else None
    if (not isinstance(layout, list) or len(layout) != MAX_ROWS
            or any(k not in kernels for k in layout)):
        return None
    return tuple(layout)


def apply_layout(module: nn.Module, layout: tuple[str, ...]) -> tuple[str, ...]:
    """Give every :class:`FewRowLinear` layer of ``module`` the kernel per row count
    ``layout`` (:data:`MAX_ROWS` names); returns ``layout``."""
    for m in module.modules():
        if isinstance(m, FewRowLinear):
            m.kernels = layout
    return layout


def stored_layout(module: nn.Module, kernels: tuple[str, ...] = KERNELS, extra: tuple = (),
                  path: str | Path | None = None, retime: bool = False) -> tuple[str, ...] | None:
    """The layout of ``module``'s :class:`FewRowLinear` layers, from the store or timed
    (:func:`clover.kernels.linear.choose_layout`, arguments as there), applied to the
    layers and returned; see the module's text for the rule.

    Args:
        path: the JSON store (default ``$CLOVER_CACHE_DIR/kernels.json``).
        retime: time again on a quiet machine and store, whatever is stored.
    Returns:
        the kernel per row count in use, or None where there was nothing to time (no
        such layers, or not fp32 on a CPU).
    """
    weights = [m.weight for m in module.modules() if isinstance(m, FewRowLinear)]
    if not weights or any(w.device.type != "cpu" or w.dtype != torch.float32 for w in weights):
        return choose_layout(module, kernels=kernels, extra=extra)  # None, or nothing to store
    path = Path(path or cache_root() / STORE_FILE)
    key, family = layout_key(module, kernels, extra)
    stored = read_store(path)
    if not retime and (found := _layout(stored.get(key), kernels)) is not None:
        return apply_layout(module, found)
    busy = machine_busy()
    if busy and not retime:
        kin = newest_record(stored, family)
        if (found := _layout(kin, kernels)) is not None:
            log.info("the machine is busy: the CPU linear layout stored at %s threads (%s)",
                     kin.get("threads"), describe_layout(found))
            return apply_layout(module, found)
    chosen = choose_layout(module, repeats=1 if busy else 3, kernels=kernels, extra=extra)
    if chosen is None or busy:
        return chosen
    write_record(path, key, {"layout": list(chosen), "family": family,
                             "threads": torch.get_num_threads(), "text": describe_layout(chosen),
                             "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")})
    return chosen
