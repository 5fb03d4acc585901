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
    """``nn.Linear`` whose forward is :func:`few_row_linear` (same parameters)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return few_row_linear(x, self.weight, self.bias)


def use_few_row_linears(module: nn.Module) -> nn.Module:
    """Switch every plain ``nn.Linear`` inside ``module`` to :class:`FewRowLinear`, in
    place (subclasses such as quantised layers are left alone); returns ``module``."""
    for m in module.modules():
        if type(m) is nn.Linear:
            m.__class__ = FewRowLinear
    return module
