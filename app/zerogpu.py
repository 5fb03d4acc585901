"""Whether decoding runs on Hugging Face ZeroGPU hardware: an explicit setting.

On ZeroGPU, CUDA work must run inside functions decorated by ``spaces.GPU``, GPU calls
cannot interleave (the methods then run one after another instead of in lockstep), and
this process cannot time the hardware (the "auto" tree takes the default budget).
``app.py`` switches it on from ``$CLOVER_ZEROGPU`` (default: the platform's own
``$SPACES_ZERO_GPU``, "true" on ZeroGPU Spaces) before the app is built; whether the
``spaces`` package happens to be installed changes nothing.
"""
from __future__ import annotations

from typing import Callable

spaces = None  # the ``spaces`` module while ZeroGPU is on (:func:`configure`), else None
_functions: list[tuple[Callable, int, list]] = []  # gpu() functions: (fn, duration, [wrapped])


def active() -> bool:
    """Whether decoding runs on ZeroGPU."""
    return spaces is not None


def configure(setting: str | bool | None) -> None:
    """Switch ZeroGPU on ("1", "true", "yes", True) or off (anything else), wrapping
    every :func:`gpu` function in ``spaces.GPU`` now (before the app launches, as ZeroGPU
    wants).

    Raises:
        ImportError: when switched on without the ``spaces`` package.
    """
    global spaces
    on = setting is True or str(setting or "").strip().lower() in ("1", "t", "true", "yes")
    if not on:
        spaces = None
        return
    try:
        import spaces as module
    except ImportError as e:
        raise ImportError("ZeroGPU is switched on ($CLOVER_ZEROGPU or $SPACES_ZERO_GPU) but the "
                          "`spaces` package is not installed: pip install spaces") from e
    spaces = module
    for fn, duration, wrapped in _functions:
        wrapped[:] = [module.GPU(duration=duration)(fn)]


def gpu(duration: int) -> Callable[[Callable], Callable]:
    """Decorator: the function runs inside ``spaces.GPU(duration=...)`` while ZeroGPU is
    on, as itself otherwise."""
    def decorate(fn: Callable) -> Callable:
        wrapped: list = []
        _functions.append((fn, duration, wrapped))
        if spaces is not None:
            wrapped.append(spaces.GPU(duration=duration)(fn))

        def call(*args, **kwargs):
            return (wrapped[0] if spaces is not None and wrapped else fn)(*args, **kwargs)

        call.__name__, call.__doc__, call.__wrapped__ = fn.__name__, fn.__doc__, fn
        return call
    return decorate
