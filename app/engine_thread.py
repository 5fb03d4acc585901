"""All of the app's torch work on one thread: model loading, tree sizing, warm-up and
every decode step.

Why: PyTorch's CPU build runs its parallel kernels on GNU OpenMP, which keeps one pool
of worker threads per thread that calls into torch. Gradio runs handlers (and the steps
of a streaming handler) on whichever worker thread is free, and the app once loaded the
model on the main thread and sized the tree on a third: as soon as two pools exist,
their threads outnumber the cores and OpenMP stops spin-waiting between parallel
regions, so every kernel call pays a sleep and a wake-up. Measured on a 2-core machine
(the embedded model, 48 greedy tokens, median step): 32-40 ms with every step on one
thread, 55-84 ms once another thread had decoded too, on either thread; with
``OMP_WAIT_POLICY=PASSIVE`` 54-66 ms even on one thread. On the page the plain step took
55-95 ms against the benchmark's ~31, and every speedup card was inflated
(``scripts/page_check.py``). One thread for all of it keeps the app's steps at the
benchmark's cost.

Functions here run their argument on that thread and wait for it (a call from the
engine thread itself runs at once, so nested calls never deadlock). The thread starts
when this module is imported and lives as long as the process.
"""
from __future__ import annotations

import functools
import threading
from contextlib import closing
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Iterator, TypeVar

T = TypeVar("T")

_EXECUTOR = ThreadPoolExecutor(max_workers=1, thread_name_prefix="clover-engine")
_IDENT = _EXECUTOR.submit(threading.get_ident).result()  # the engine thread's ident


def on_engine_thread() -> bool:
    """Whether the calling thread is the engine thread."""
    return threading.get_ident() == _IDENT


def call(fn: Callable[..., T], *args, **kwargs) -> T:
    """``fn(*args, **kwargs)`` on the engine thread; its result, or its exception raised
    here. Waits for the work queued before it (one job at a time, in order)."""
    if on_engine_thread():
        return fn(*args, **kwargs)
    return _EXECUTOR.submit(fn, *args, **kwargs).result()


def submit(fn: Callable[..., T], *args, **kwargs) -> Future:
    """Queue ``fn`` on the engine thread without waiting (background work: the tree
    sizing at start-up); the calls queued after it wait for it."""
    return _EXECUTOR.submit(fn, *args, **kwargs)


def iterate(items: Iterator[T]) -> Iterator[T]:
    """The items of ``items``, each produced on the engine thread (``next`` runs there),
    while the caller consumes them on its own thread. Closing this generator closes
    ``items`` on the engine thread too."""
    with closing(chunks(items, lambda _: True)) as parts:
        for part in parts:
            yield from part


def chunks(items: Iterator[T], until: Callable[[T], bool]) -> Iterator[list[T]]:
    """The items of ``items`` in lists, each list produced by one call on the engine
    thread: it takes items until one for which ``until(item)`` is true (evaluated there,
    that item ending the list) or the end. Between the lists the engine thread waits for
    the caller; within one it hands nothing over, so the caller's thread (and what it
    wakes: a server, a browser) sleeps while the items are made. Closing this generator
    closes ``items`` on the engine thread too."""
    it = iter(items)

    def part() -> list[T] | None:
        out: list[T] = []
        for item in it:
            out.append(item)
            if until(item):
                return out
        return out or None

    try:
        while True:
            got = call(part)
            if got is None:
                return
            yield got
    finally:
        close = getattr(it, "close", None)
        if close is not None:
            call(close)


def runs_on_engine_thread(fn: Callable[..., T]) -> Callable[..., T]:
    """Decorator: every call of ``fn`` runs on the engine thread (see :func:`call`)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return call(fn, *args, **kwargs)

    return wrapper
