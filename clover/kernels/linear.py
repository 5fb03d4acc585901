"""Faster linear layers for the few-row products of decoding on a CPU.

Decoding multiplies every weight matrix by 1 to a dozen rows at a time: one token for
plain decoding, the candidate tree's nodes for verification, a few frontier nodes per
drafting depth. With PyTorch's default CPU build (MKL) the layout of ``F.linear``,
``x @ W^T``, picks slow kernels for such shapes: one row goes to a matrix-vector product
that reads the weights at about a third of the speed the machine allows, and 2 to 4 rows
go to a general product that repacks the whole weight matrix on every call. The same
product written the other way round, ``(W @ x^T)^T``, takes MKL's fast path.

Measured on the 2-core development VM (fp32, torch 2.13, SmolLM2-135M, 256 cached tokens),
one target forward over 1 / 2 / 5 / 8 new tokens: 58 / 95 / 76 / 82 ms with ``F.linear``,
32 / 35 / 50 / 63 ms with this layout (a single row is duplicated, since two rows run
faster than one). The arithmetic is the same dot products, so results agree to float
rounding (the tests check closeness and greedy parity across methods).

:func:`use_few_row_linears` switches a module's ``nn.Linear`` layers to
:class:`FewRowLinear` in place (same parameters and state dict); the new path is taken
only for float32 CPU inputs of at most :data:`MAX_ROWS` rows, so training batches, GPUs
and other dtypes run exactly as before.

Which layout is faster depends on the processor and its MKL kernels: on a later host of
the same VM type (a Xeon with AVX-512 and AMX) the plain layout was the faster one (one
forward over 1 / 2 / 4 / 8 tokens: 43 / 44 / 64 / 78 ms with ``F.linear``, 92 ms each
with this one). So :func:`choose_layout` times both on the model's own weights when the
model loads and keeps the faster.
"""
from __future__ import annotations

import torch
from torch import nn

# up to here the whole-model forward was faster this way (8 / 11 / 16 rows: 63 / 99 / 90 ms
# against 82 / 109 / 100 ms with F.linear); prefill and training batches are larger
MAX_ROWS = 16


def few_row_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``, computed as ``(W @ x^T)^T`` for few fp32 CPU rows.

    Args:
        x: (..., D_in).
        weight: (D_out, D_in).
        bias: (D_out,) or None.
    Returns:
        (..., D_out), contiguous.
    """
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    if (x.device.type != "cpu" or x.dtype != torch.float32 or weight.dtype != torch.float32
            or not 0 < rows <= MAX_ROWS):
        return nn.functional.linear(x, weight, bias)
    flat = x.reshape(rows, x.shape[-1])
    if rows == 1:  # two columns take the fast kernel; one goes to a slow matrix-vector path
        flat = torch.cat([flat, flat])
    out = torch.mm(weight, flat.T).T[:rows].contiguous()
    if bias is not None:
        out = out + bias
    return out.reshape(*x.shape[:-1], weight.shape[0])


class FewRowLinear(nn.Linear):
    """``nn.Linear`` whose forward is :func:`few_row_linear` (same parameters), or
    ``F.linear`` where :func:`choose_layout` found that faster (``few_rows`` False)."""

    few_rows = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.few_rows:
            return nn.functional.linear(x, self.weight, self.bias)
        return few_row_linear(x, self.weight, self.bias)


def use_few_row_linears(module: nn.Module) -> nn.Module:
    """Switch every plain ``nn.Linear`` inside ``module`` to :class:`FewRowLinear`, in
    place (subclasses such as quantised layers are left alone); returns ``module``."""
    for m in module.modules():
        if type(m) is nn.Linear:
            m.__class__ = FewRowLinear
    return module


LINEAR_LAYOUTS = ("auto", "few-row", "plain")  # TargetModel(linear_layout=...)


def set_layout(module: nn.Module, layout: str) -> bool | None:
    """Give the module's :class:`FewRowLinear` layers a layout: "few-row"
    (:func:`few_row_linear`), "plain" (``F.linear``) or "auto" (the faster one here,
    timed by :func:`choose_layout`). Tests name the layout, so which code path they run
    does not depend on the machine.

    Returns:
        True for the few-row layout, False for ``F.linear``, None when the module has no
        such layers (or, for "auto", nothing to time).
    Raises:
        ValueError: an unknown layout.
    """
    if layout not in LINEAR_LAYOUTS:
        raise ValueError(f"unknown linear layout {layout!r}; choose one of {', '.join(LINEAR_LAYOUTS)}")
    if layout == "auto":
        return choose_layout(module)
    linears = [m for m in module.modules() if isinstance(m, FewRowLinear)]
    for m in linears:
        m.few_rows = layout == "few-row"
    return (layout == "few-row") if linears else None


def choose_layout(module: nn.Module, rows=(1, 4), repeats: int = 3) -> bool | None:
    """Time the module's :class:`FewRowLinear` layers both ways on their own weights
    (every layer once per pass, so the weights stream from memory as in a forward; the
    best of ``repeats`` passes per row count) and keep the faster layout in all of them.

    Returns:
        True when the few-row layout was kept, False for ``F.linear``, None when there
        was nothing to time (no such layers, or not fp32 on a CPU).
    """
    import time

    linears = [m for m in module.modules() if isinstance(m, FewRowLinear)]
    if not linears or any(m.weight.device.type != "cpu" or m.weight.dtype != torch.float32
                          for m in linears):
        return None
    inputs = {(r, m.in_features): torch.zeros(r, m.in_features) for r in rows for m in linears}

    def cost(fast: bool) -> float:
        total = 0.0
        with torch.inference_mode():
            for r in rows:
                best = float("inf")
                for _ in range(repeats):
                    t0 = time.perf_counter()
                    for m in linears:
                        x = inputs[(r, m.in_features)]
                        if fast:
                            few_row_linear(x, m.weight, m.bias)
                        else:
                            nn.functional.linear(x, m.weight, m.bias)
                    best = min(best, time.perf_counter() - t0)
                total += best
        return total

    cost(True)  # warm both paths
    cost(False)
    fast = cost(True) < cost(False)
    for m in linears:
        m.few_rows = fast
    return fast
