"""The machine's load, read once per question: how much CPU other processes use, whether
that makes the machine busy, and how many torch threads work beside them runs best on.
The auto tree (``clover.autotree``), the target's kernel timing at load
(``clover.models``), the CLI and the app all ask here."""
from __future__ import annotations

import time

import torch

# CPUs' worth of other processes' work while timing above which the machine was busy
# (measured directly from /proc/stat where Linux offers it): the spread alone overlaps,
# 1.03-1.51x idle against 1.48-2.34x beside two CPU-bound processes
BUSY_OTHERS = 0.5
# a typical step's time over its quiet time (a calibration's median over its fastest
# repeat, a run's median plain step over the start-up's quiet one, or the 5th percentile
# in clover.bench) above which the machine was busy: idle, the repeats of a calibration
# on this 2-core CPU spread by 1.03-1.51x (a one-token forward after larger ones); with
# two CPU-bound processes beside it, 1.5-2.3x
BUSY_SPREAD = 1.5


def busy(others_load: float | None = None, typical_ms: float | None = None,
         quiet_ms: float | None = None) -> bool:
    """The one test of a busy machine: other processes did over :data:`BUSY_OTHERS`
    CPUs' worth of work (``others_load``, :func:`others_load`), or steps typically took
    over :data:`BUSY_SPREAD` times their quiet time (``typical_ms`` over ``quiet_ms``,
    any unit). A figure that is None (unknown) counts as quiet."""
    if others_load is not None and others_load > BUSY_OTHERS:
        return True
    return bool(typical_ms and quiet_ms) and typical_ms > BUSY_SPREAD * quiet_ms


def cpu_name() -> str:
    """The processor's model name, as Linux's ``/proc/cpuinfo`` gives it ("AMD EPYC
    7B13"), else :func:`platform.processor` or the architecture: what stored timings
    (the auto tree's, the kernel layout's) and recorded runs name the machine by."""
    import platform

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return next((line.split(":", 1)[1].strip() for line in f
                         if line.startswith("model name")), cpu)
    except OSError:
        return cpu


def load_snapshot() -> tuple[float, float, float] | None:
    """(CPU-seconds the whole machine has been busy, CPU-seconds of this process, a
    monotonic clock in s), for :func:`others_load`; None where Linux's ``/proc/stat`` cannot
    be read."""
    import os

    try:
        with open("/proc/stat", encoding="ascii") as f:
            ticks = [int(x) for x in f.readline().split()[1:9]]
        busy = (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")  # all but idle, iowait
    except (OSError, ValueError, IndexError):
        return None
    return busy, time.process_time(), time.monotonic()


def others_load(start, end, min_window_s: float = 0.1) -> float | None:
    """How many CPUs' worth of work other processes did between two
    :func:`load_snapshot` s (the machine's busy time minus this process's own); None when
    either is None or less than ``min_window_s`` passed (the kernel counts in 10 ms
    ticks, too coarse for a shorter window)."""
    if start is None or end is None or end[2] - start[2] < min_window_s:
        return None
    return max(0.0, ((end[0] - start[0]) - (end[1] - start[1])) / (end[2] - start[2]))


def others_cpu_load(window_s: float = 0.15) -> float | None:
    """How many CPUs' worth of work other processes do over the next ``window_s`` seconds
    (:func:`others_load` of two :func:`load_snapshot` s around a sleep); None where that
    cannot be read (not Linux)."""
    start = load_snapshot()
    time.sleep(window_s)
    return others_load(start, load_snapshot())


def machine_busy(window_s: float = 0.15) -> bool:
    """Whether other processes keep the CPUs busy now (:func:`busy` of
    :func:`others_cpu_load` over ``window_s``); False where that cannot be read."""
    return busy(others_cpu_load(window_s))


def threads_for_load(threads: int | None = None) -> int | None:
    """The torch thread count for work starting now on a CPU: where other processes keep
    the CPUs busy, fewer threads than cores (at least one). Two threads on a 2-core
    machine shared with two CPU-bound processes made a plain step 7.9x slower than idle
    (every thread waits for the one the scheduler paused); one thread, about 2x
    (``scripts/load_check.py``). None: leave the count as it is (``threads``, default
    ``torch.get_num_threads()``, is 1 already, nothing else runs, or the load cannot be
    read)."""
    import os

    threads = threads or torch.get_num_threads()
    if threads <= 1:
        return None
    others = others_cpu_load()
    if others is None:
        return None
    free = (os.cpu_count() or threads) - others
    wanted = max(1, min(threads, int(free + 0.5)))
    return wanted if wanted < threads else None
