"""The few-row CPU linear layout computes the same product as F.linear."""
import pytest
import torch
from torch import nn

from clover.cpu_linear import MAX_ROWS, FewRowLinear, few_row_linear, use_few_row_linears


@pytest.mark.parametrize("rows", [1, 2, 3, 5, MAX_ROWS, MAX_ROWS + 1, 40])
@pytest.mark.parametrize("bias", [False, True])
def test_matches_f_linear(rows, bias):
    g = torch.Generator().manual_seed(rows)
    w = torch.randn(300, 64, generator=g)
    b = torch.randn(300, generator=g) if bias else None
    x = torch.randn(1, rows, 64, generator=g)
    out = few_row_linear(x, w, b)
    assert out.shape == (1, rows, 300) and out.is_contiguous()
    torch.testing.assert_close(out, nn.functional.linear(x, w, b), rtol=1e-5, atol=1e-5)


def test_other_dtypes_and_one_dim_inputs_take_f_linear():
    w = torch.randn(16, 8, dtype=torch.float64)
    x = torch.randn(8, dtype=torch.float64)
    assert torch.equal(few_row_linear(x, w), nn.functional.linear(x, w))
    assert few_row_linear(torch.randn(8), torch.randn(16, 8)).shape == (16,)


def test_use_few_row_linears_swaps_plain_linears_in_place():
    class Sub(nn.Linear):
        pass

    m = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), Sub(8, 4))
    state = {k: v.clone() for k, v in m.state_dict().items()}
    x = torch.randn(3, 8)
    before = m(x)
    assert use_few_row_linears(m) is m
    assert type(m[0]) is FewRowLinear and type(m[2]) is Sub
    assert m.state_dict().keys() == state.keys()
    torch.testing.assert_close(m(x), before)
