"""The CPU linear kernels (few-row, oneDNN packed) compute the same product as F.linear."""
import pytest
import torch
from torch import nn

from clover.kernels.linear import (DRAFT_KERNELS, KERNELS, MAX_ROWS, SMALL_ROWS, FewRowLinear, cpu_linear,
                                   describe_layout, few_row_linear, forget_packed, half_linear, packed_available,
                                   packed_linear, parse_layout, use_few_row_linears)

LAYOUTS = ["few-row", "plain"] + (["packed", "few-row/packed"] if packed_available() else [])


@pytest.mark.parametrize("rows", [1, 2, 3, 5, MAX_ROWS, MAX_ROWS + 1, 40])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_matches_f_linear(rows, bias, layout):
    g = torch.Generator().manual_seed(rows)
    w = torch.randn(300, 64, generator=g)
    b = torch.randn(300, generator=g) if bias else None
    x = torch.randn(1, rows, 64, generator=g)
    out = cpu_linear(x, w, b, parse_layout(layout))
    assert out.shape == (1, rows, 300)
    torch.testing.assert_close(out, nn.functional.linear(x, w, b), rtol=1e-5, atol=1e-5)
    if layout == "few-row":
        assert few_row_linear(x, w, b).is_contiguous()


def test_layouts_parse_and_pick_a_kernel_per_row_count(monkeypatch):
    assert parse_layout("few-row") == ("few-row",) * MAX_ROWS
    assert parse_layout("plain / few-row") == ("plain",) * SMALL_ROWS + ("few-row",) * (MAX_ROWS - SMALL_ROWS)
    assert describe_layout(parse_layout("plain / few-row")) == f"plain 1-{SMALL_ROWS}, few-row {SMALL_ROWS + 1}-{MAX_ROWS}"
    assert describe_layout(("packed", "plain") + ("packed",) * (MAX_ROWS - 2)) == f"packed 1, plain 2, packed 3-{MAX_ROWS}"
    for bad in ("fast", "few-row/packed/plain", ""):
        with pytest.raises(ValueError, match="unknown linear layout"):
            parse_layout(bad)
    used = []
    import clover.kernels.linear as lin
    monkeypatch.setitem(lin._KERNEL_FNS, "plain", lambda x, w, b=None: used.append(len(x)) or x @ w.T)
    w = torch.randn(4, 8)
    table = ("few-row", "plain", "few-row") + ("plain",) * (MAX_ROWS - 3)
    for rows in (1, 2, 3, 4, MAX_ROWS):
        torch.testing.assert_close(cpu_linear(torch.randn(rows, 8), w, kernels=table).shape, (rows, 4))
    assert used == [2, 4, MAX_ROWS]  # entry r - 1 for r rows


@pytest.mark.skipif(not packed_available(), reason="needs oneDNN")
def test_packed_rows_do_not_depend_on_the_other_rows_and_follow_weight_changes():
    """oneDNN's packed kernel is batch-invariant: row i of a 16-row product is bitwise the
    row of a one-row product (verification and plain decoding then agree exactly on the
    linear layers); a weight changed in place is packed again."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(200, 64, generator=g)
    x = torch.randn(MAX_ROWS, 64, generator=g)
    full = packed_linear(x, w)
    for rows in (1, 2, 3, 7):
        assert torch.equal(packed_linear(x[:rows], w), full[:rows])
    with torch.no_grad():
        w.mul_(2)
    torch.testing.assert_close(packed_linear(x, w), 2 * full, rtol=1e-5, atol=1e-4)
    w.data.mul_(0.5)  # a change autograd does not see: forget_packed makes it count
    forget_packed()
    torch.testing.assert_close(packed_linear(x, w), full, rtol=1e-5, atol=1e-4)
    lin = FewRowLinear(64, 8)
    lin.kernels = parse_layout("packed")
    lin(x)
    import pickle
    assert isinstance(pickle.loads(pickle.dumps(lin)), FewRowLinear)  # the copy is not on the weight


def test_takes_the_transposed_product_only_for_few_fp32_cpu_rows(monkeypatch):
    calls = []
    real_mm = torch.mm
    monkeypatch.setattr(torch, "mm", lambda a, b: calls.append(a.shape) or real_mm(a, b))
    w = torch.randn(16, 8)
    x = torch.randn(8)
    torch.testing.assert_close(few_row_linear(x, w), nn.functional.linear(x, w))
    assert few_row_linear(x, w).shape == (16,) and calls  # one row: the fast path
    calls.clear()
    few_row_linear(torch.randn(MAX_ROWS + 1, 8), w)  # too many rows
    few_row_linear(torch.randn(2, 8, dtype=torch.float64), w.double())  # not fp32
    assert calls == []


@pytest.mark.parametrize("layout", LAYOUTS)
def test_gradients_match_nn_linear(layout):
    torch.manual_seed(0)
    ref = nn.Linear(8, 5)
    fast = FewRowLinear(8, 5)
    fast.kernels = parse_layout(layout)
    fast.load_state_dict(ref.state_dict())
    x1 = torch.randn(3, 8, requires_grad=True)
    x2 = x1.detach().clone().requires_grad_(True)
    ref(x1).square().sum().backward()
    fast(x2).square().sum().backward()
    torch.testing.assert_close(x2.grad, x1.grad)
    torch.testing.assert_close(fast.weight.grad, ref.weight.grad)
    torch.testing.assert_close(fast.bias.grad, ref.bias.grad)


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


def test_layout_is_chosen_by_timing_and_keeps_results():
    import torch
    from torch import nn

    from clover.kernels.linear import FewRowLinear, choose_layout, use_few_row_linears

    torch.manual_seed(0)
    model = use_few_row_linears(nn.Sequential(nn.Linear(64, 256), nn.Linear(256, 64)))
    x = torch.randn(3, 64)
    before = model(x)
    kept = choose_layout(model, repeats=2)
    assert len(kept) == MAX_ROWS and set(kept) <= set(KERNELS)
    assert all(m.kernels == kept for m in model.modules() if isinstance(m, FewRowLinear))
    if "packed" not in kept:  # the copies made for timing are dropped
        from clover.kernels.linear import _PACKED
        assert not any((id(m.weight), "packed") in _PACKED for m in model.modules() if isinstance(m, FewRowLinear))
    assert torch.allclose(model(x), before, atol=1e-5)
    assert choose_layout(nn.Sequential(nn.ReLU())) is None  # nothing to time
    assert choose_layout(use_few_row_linears(nn.Sequential(nn.Linear(8, 8).double()))) is None


@pytest.mark.skipif(not packed_available(), reason="needs oneDNN: the three kernels race")
def test_choose_layout_keeps_the_fastest_kernel_at_each_row_count(monkeypatch):
    """Where one kernel hands over to another is measured, not assumed: a kernel slow
    below four rows and one slow from four rows give a table that switches at four, and
    counts between the timed ones take the kernel of the count below."""
    import time

    import clover.kernels.linear as lin

    def kernel(slow):
        def fn(x, w, b=None):
            if slow(x.shape[0]):
                time.sleep(0.003)
            return nn.functional.linear(x, w, b)
        return fn

    monkeypatch.setattr(lin, "ROW_POINTS", (1, 2, 3, 4, 6, 8, 12, 16))
    monkeypatch.setitem(lin._KERNEL_FNS, "plain", kernel(lambda rows: rows >= 4))
    monkeypatch.setitem(lin._KERNEL_FNS, "packed", kernel(lambda rows: rows < 4 or rows in (6, 7)))
    monkeypatch.setitem(lin._KERNEL_FNS, "few-row", kernel(lambda rows: rows != 6))
    model = use_few_row_linears(nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8)))
    kept = lin.choose_layout(model, repeats=2)
    assert kept == ("plain",) * 3 + ("packed",) * 2 + ("few-row",) * 2 + ("packed",) * (MAX_ROWS - 7)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_one_switch_for_the_cpu_kernels(monkeypatch, layout):
    """TargetModel switches the CPU kernels once, at load time (on by default on a CPU,
    off with CLOVER_CPU_KERNELS=0 or cpu_kernels=False; the linear layout named or timed);
    heads built for a target take its choice and its layout, and both settings compute
    the same logits, in either layout."""
    from conftest import tiny_model, tiny_tokenizer

    from clover import Engine, new_heads, parse_tree_spec
    from clover.models import TargetModel

    def target(**kw):
        return TargetModel(tiny_model("llama"), tiny_tokenizer(96), "tiny-llama", **kw)

    on, off = target(linear_layout=layout), target(cpu_kernels=False)
    assert on.linear_kernels == parse_layout(layout)
    monkeypatch.setenv("CLOVER_CPU_KERNELS", "0")
    assert not target().cpu_kernels
    monkeypatch.setenv("CLOVER_CPU_KERNELS", layout)
    assert target().linear_kernels == parse_layout(layout)
    monkeypatch.setenv("CLOVER_CPU_KERNELS", "auto")
    assert set(target().linear_kernels) <= set(KERNELS)  # timed here
    with pytest.raises(ValueError, match="unknown linear layout 'fast'"):
        target(linear_layout="fast")
    monkeypatch.setenv("CLOVER_CPU_KERNELS", "fast")
    with pytest.raises(ValueError, match="unknown linear layout 'fast'"):
        target()
    assert on.cpu_kernels and not off.cpu_kernels and off.linear_kernels is None
    assert on.linear_kernels_text == describe_layout(parse_layout(layout)) and off.linear_kernels_text == "off"
    assert any(type(m) is FewRowLinear for m in on.model.modules())
    assert not any(isinstance(m, FewRowLinear) for m in off.model.modules())
    assert off.config._attn_implementation != "clover_sdpa"
    ids = torch.tensor([[3, 14, 15, 9, 2, 6]])
    torch.testing.assert_close(on.model(ids).logits, off.model(ids).logits, atol=1e-5, rtol=1e-4)
    outs = []
    for t in (on, off):
        heads = new_heads("medusa", t, num_heads=2, draft_vocab=[2, 7, 11, 30, 64])
        linears = [m for m in heads.modules() if isinstance(m, nn.Linear)]
        if t.cpu_kernels:
            assert all(type(m) is FewRowLinear and m.kernels == t.linear_kernels for m in linears)
            assert heads.vocab_linear.func is cpu_linear and heads.vocab_linear.keywords == {"kernels": t.linear_kernels}
        else:
            assert all(type(m) is nn.Linear for m in linears) and heads.vocab_linear is nn.functional.linear
        outs.append(heads(torch.ones(3, t.hidden_size), t))
        greedy = Engine(t).generate([3, 14, 15], 8).token_ids
        assert Engine(t, heads, parse_tree_spec("dynamic:budget=4")).generate([3, 14, 15], 8).token_ids == greedy
    torch.testing.assert_close(outs[0], outs[1], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("rows", [1, 2, 3, MAX_ROWS])
@pytest.mark.parametrize("bias", [False, True])
def test_half_kernel_is_the_product_to_fp16_precision_and_falls_back_where_fp16_cannot(rows, bias):
    """The drafting-only fp16 kernel: fp32 in and out, the product to fp16's precision;
    where fp16 overflows (values past 65,504) or gradients are wanted, the fp32 product
    itself; a weight changed in place gets a new fp16 copy."""
    g = torch.Generator().manual_seed(rows)
    w = torch.randn(300, 64, generator=g) / 8
    b = torch.randn(300, generator=g) if bias else None
    x = torch.randn(rows, 64, generator=g)
    out = half_linear(x, w, b)
    assert out.dtype == torch.float32 and out.shape == (rows, 300)
    torch.testing.assert_close(out, nn.functional.linear(x, w, b), rtol=2e-2, atol=2e-2)
    assert not torch.equal(out, nn.functional.linear(x, w, b))  # really the fp16 product
    huge = x * 1e5  # rounds to inf in fp16
    assert torch.equal(half_linear(huge, w, b), nn.functional.linear(huge, w, b))
    big, wide = torch.full((rows, 64), 200.0), torch.full((300, 64), 200.0)  # fp16 inputs, an inf product
    assert torch.equal(half_linear(big, wide, b), nn.functional.linear(big, wide, b))
    assert torch.isfinite(half_linear(big, wide, b)).all()
    with torch.no_grad():
        w.mul_(2)
    torch.testing.assert_close(half_linear(x, w, b), nn.functional.linear(x, w, b), rtol=2e-2, atol=4e-2)
    wg = w.clone().requires_grad_(True)
    assert torch.equal(half_linear(x, wg, b), nn.functional.linear(x, wg, b))
    half_linear(x, wg, b).sum().backward()
    assert wg.grad is not None


def test_only_draft_heads_may_take_the_half_kernel(monkeypatch):
    """A target's layout is made of its exact kernels, never "half" (by name or timed);
    heads built for a target timed "auto" are timed among DRAFT_KERNELS on their own
    weights, the vocabulary projection included; with a named layout they take the
    target's. Greedy decoding with heads drafting through the fp16 kernel is still plain
    greedy decoding, token for token."""
    from conftest import tiny_model, tiny_tokenizer

    import clover.kernels.linear as lin
    from clover import Engine, new_heads, parse_tree_spec
    from clover.models import TargetModel

    with pytest.raises(ValueError, match="unknown linear layout 'half'"):
        parse_layout("half")
    timed = []
    real = lin.choose_layout
    monkeypatch.setattr("clover.models.kernel_store.choose_layout",
                        lambda m, **kw: timed.append((m, kw)) or real(m, **{**kw, "repeats": 1}))
    monkeypatch.setenv("CLOVER_CPU_KERNELS", "retime")  # timed here, whatever is stored
    t = TargetModel(tiny_model("llama"), tiny_tokenizer(96), "tiny-llama")
    assert set(t.linear_kernels) <= set(KERNELS)
    heads = new_heads("clover", t, num_heads=2, draft_vocab=[2, 7, 11, 30, 64])
    module, kw = timed[-1]
    assert module is heads and kw["kernels"] == DRAFT_KERNELS
    assert [w.shape for w, _ in kw["extra"]] == [(5, t.hidden_size)]  # the vocabulary projection
    assert set(heads.linear_kernels) <= set(DRAFT_KERNELS)
    assert heads.vocab_linear.keywords == {"kernels": heads.linear_kernels}
    half = ("half",) * MAX_ROWS  # whatever this machine timed, draft through fp16
    for m in heads.modules():
        if isinstance(m, FewRowLinear):
            m.kernels = half
    heads.vocab_linear = lambda x, w, b=None: cpu_linear(x, w, b, half)
    with torch.no_grad():
        for p in heads.parameters():
            p.add_(0.01 * torch.randn_like(p))
    greedy = Engine(t).generate([3, 14, 15], 12).token_ids
    assert Engine(t, heads, parse_tree_spec("dynamic:budget=4")).generate([3, 14, 15], 12).token_ids == greedy
    monkeypatch.setenv("CLOVER_CPU_KERNELS", "few-row")
    named = TargetModel(tiny_model("llama"), tiny_tokenizer(96), "tiny-llama")
    assert new_heads("medusa", named, num_heads=2).linear_kernels == named.linear_kernels


def test_the_kernel_layout_is_timed_on_a_quiet_machine_once_and_remembered(tmp_path, monkeypatch):
    """kernel_store.stored_layout: a quiet machine times once and stores; later loads use
    the stored layout without timing (whatever the load); a busy machine with nothing
    stored under its key takes the layout stored for the same weights at another thread
    count, and with nothing at all times roughly and stores nothing; "retime" times and
    stores again. Beside two CPU hogs three loads of the embedded model timed three
    different layouts, three quiet loads the same one."""
    import clover.models.kernel_store as ks
    from clover.kernels.linear import use_few_row_linears

    store = tmp_path / "kernels.json"
    timed = []

    def fake_choose(module, repeats=3, kernels=KERNELS, extra=()):
        timed.append(repeats)
        layout = (("plain",) if len(timed) % 2 else ("packed",)) * MAX_ROWS
        return ks.apply_layout(module, layout)

    monkeypatch.setattr(ks, "choose_layout", fake_choose)

    def model():
        return use_few_row_linears(nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 8)))

    busy = [False]
    monkeypatch.setattr(ks, "machine_busy", lambda: busy[0])
    first = ks.stored_layout(model(), path=store)
    assert first == ("plain",) * MAX_ROWS and timed == [3]
    again = model()
    assert ks.stored_layout(again, path=store) == first and timed == [3]  # not timed again
    assert all(m.kernels == first for m in again.modules() if isinstance(m, FewRowLinear))
    busy[0] = True
    assert ks.stored_layout(model(), path=store) == first and timed == [3]
    # another thread count on a busy machine: the stored one of the same weights
    threads = torch.get_num_threads()
    torch.set_num_threads(threads + 1)
    try:
        assert ks.stored_layout(model(), path=store) == first and timed == [3]
        busy[0] = False  # quiet: timed for this thread count and stored
        assert ks.stored_layout(model(), path=store) == ("packed",) * MAX_ROWS and timed == [3, 3]
    finally:
        torch.set_num_threads(threads)
    # other weights, busy, nothing stored for them: timed once, roughly, not stored
    busy[0] = True
    other = use_few_row_linears(nn.Sequential(nn.Linear(8, 24)))
    ks.stored_layout(other, path=store)
    assert timed[-1] == 1 and ks.layout_key(other)[0] not in ks.read_store(store)
    # retime: timed again and stored over the old choice
    busy[0] = False
    n = len(timed)
    assert ks.stored_layout(model(), path=store, retime=True) != first and len(timed) == n + 1
    assert ks.stored_layout(model(), path=store) != first
    # a damaged record is timed again
    store.write_text('{"x": 1}')
    ks.stored_layout(model(), path=store)
    assert len(timed) == n + 2
    # modules with nothing to time are left alone
    monkeypatch.undo()
    assert ks.stored_layout(nn.Sequential(nn.ReLU()), path=store) is None
