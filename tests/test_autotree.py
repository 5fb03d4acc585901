"""``--tree auto``: exact accepted lengths per budget and a sensible choice."""
from __future__ import annotations

import pytest
import torch

from clover import Engine, TreeConfig, new_heads, parse_tree_spec
import clover.calibration as calib
import clover.timing as timing
from clover.autotree import MIN_GAIN, TIE_MARGIN, auto_tree, budget_subtree, greedy_accepted_length, pool_size
from clover.calibration import resolve_tree
from clover.timing import time_forward
from clover.tree import Tree, grow_dynamic
from conftest import path_tokens, perturb, tiny_target


def test_budget_subtree_equals_growing_with_that_budget():
    """The best-N subtree of a big dynamic tree is the tree grown with budget N (each
    node's children drawn from its own depth and token, as heads compute each row alone,
    whichever nodes share the call)."""
    def expand(depth, ids, parents, tokens):
        rows = [torch.randn(30, generator=torch.Generator().manual_seed(depth * 1000 + t)) for t in tokens]
        return torch.softmax(3 * torch.stack(rows), -1)

    big = grow_dynamic(0, TreeConfig(budget=40, branching=3), expand, 4)
    for b in (1, 3, 7, 15):
        small = grow_dynamic(0, TreeConfig(budget=b, branching=3), expand, 4)
        keep = budget_subtree(big, b)
        paths_big = {path_tokens(big, i) for i in keep}
        paths_small = {path_tokens(small, i) for i in range(len(small))}
        assert paths_big == paths_small


def test_accepted_length_counts_matches_plus_bonus():
    tree = Tree(torch.tensor([9, 1, 2, 3, 4]), [-1, 0, 0, 2, 3], [0, 1, 1, 2, 3], [1, .6, .4, .5, .5])
    assert greedy_accepted_length(tree, {0, 1, 2, 3, 4}, [2, 3, 4]) == 4
    assert greedy_accepted_length(tree, {0, 1, 2, 3}, [2, 3, 4]) == 3
    assert greedy_accepted_length(tree, {0, 1, 2, 3, 4}, [1, 3]) == 2
    assert greedy_accepted_length(tree, {0, 1}, [7]) == 1


def test_auto_tree_on_a_tiny_model(tmp_path, monkeypatch):
    import clover.autotree as at

    target = tiny_target("llama")
    target.tokenizer.chat_template = "{% for m in messages %}t2 {{ m['content'] }} {% endfor %}t3"
    heads = perturb(new_heads("clover", target), 0.1)
    narrow = TreeConfig(branching=3)
    cfg, report = auto_tree(target, heads, narrow, budgets=(1, 4, 16, 64), tokens=8, repeats=1, prefix_len=16)
    # 64 is beyond the tree's pool (3 + 2 * 9 = 21 nodes for branching 3, 3 heads): tried as 21
    assert report.budgets == [1, 4, 16, 21] and pool_size(narrow, 3) == 21
    assert all(n <= b for n, b in zip(report.nodes, report.budgets)) and report.nodes[0] == 1
    assert len(report.tau) == 4 and all(t >= 1.0 for t in report.tau)
    assert report.tau == sorted(report.tau)  # a bigger tree never accepts less
    assert all(v > 0 for v in report.verify_ms) and report.plain_ms > 0
    speed = [t / (d + v) for t, d, v in zip(report.tau, report.draft_ms, report.verify_ms)]
    # measured times decide: random heads on a tiny model may not beat plain decoding by
    # the margin a tree must clear
    if max(speed) * report.plain_ms >= MIN_GAIN:
        assert cfg.kind == "dynamic" and not cfg.auto and cfg.budget == report.chosen in (1, 4, 16, 21)
        i = report.budgets.index(report.chosen)
        assert speed[i] >= (1 - TIE_MARGIN) * max(speed)  # the fastest or tied with it
        assert all(v < (1 - TIE_MARGIN) * max(speed) for v in speed[:i])  # and the smallest such
    else:
        assert cfg.off and report.chosen == 0
    # "auto" is resolved at the edge (measured, stored, then read back), never by the engine
    with pytest.raises(ValueError, match="resolve_tree"):
        Engine(target, heads, parse_tree_spec("auto"))
    store = tmp_path / "autotree.json"
    monkeypatch.setattr("clover.machine.BUSY_SPREAD", float("inf"))  # stored however busy the machine is
    monkeypatch.setattr("clover.machine.BUSY_OTHERS", float("inf"))
    tree, _ = resolve_tree(target, heads, parse_tree_spec("auto"), path=store)
    assert not tree.auto and store.is_file()
    assert resolve_tree(target, heads, parse_tree_spec("auto"), path=store, measure=False)[0] == tree
    engine = Engine(target, heads, tree)
    prompt = [5, 6, 7, 8]
    assert engine.generate(prompt, 12).token_ids == Engine(target).generate(prompt, 12).token_ids


def test_pick_budget_takes_the_smallest_of_the_tied():
    from clover.autotree import pick_budget

    # Medusa v11 on a 2-core CPU: four drafted tokens expected 2% faster than one
    speed = [1.22 / (1.0 + 33.1), 1.34 / (1.2 + 39.9), 1.46 / (1.5 + 38.5)]
    assert max(range(3), key=speed.__getitem__) == 2 and pick_budget(speed) == 0
    speed = [1.38 / (2.6 + 32.3), 1.67 / (2.2 + 33.0)]  # the larger tree clearly faster (19%)
    assert pick_budget(speed) == 1
    assert pick_budget([1.0, 1.02, 1.1]) == 2  # 1.02 is 7% behind 1.1: not tied
    assert pick_budget([1.0, 1.02, 1.1], margin=0.1) == 0
    assert pick_budget([0.5, 1.0], margin=0.0) == 1
    with pytest.raises(ValueError):
        pick_budget([])
    with pytest.raises(ValueError):
        pick_budget([1.0], margin=-0.1)


def test_time_forward_times_each_size():
    target = tiny_target("llama")
    ms = time_forward(target, [1, 4, 9], prefix_len=8, repeats=1)
    assert len(ms) == 3 and all(m > 0 for m in ms)


def test_verify_cost_curve_takes_the_quiet_floor_of_each_size(monkeypatch):
    """A slow spell in the middle of the timing (another tenant of a shared CPU) must not
    steepen the verify cost curve that sizes lookup chains: each size keeps its fastest
    call, while plain ``time_forward`` reports medians."""
    spells = [[30.0, 95.0, 31.0, 90.0, 32.0], [40.0, 210.0, 41.0, 200.0, 42.0]]
    monkeypatch.setattr(timing, "interleaved_ms", lambda fns, repeats, *_: [list(t) for t in spells])
    target = tiny_target("llama")
    assert time_forward(target, [1, 2], prefix_len=8) == [32.0, 42.0]
    assert time_forward(target, [1, 2], prefix_len=8, quiet=True) == [30.0, 40.0]
    assert calib.calibrator_for(target).verify_costs(2) == [30.0, 40.0]


def _scripted_time(plain_ms, other_ms):
    """A stand-in for autotree.interleaved_ms: the first function (the plain step) costs
    ``plain_ms``, every later one (drafting, verification) ``other_ms``."""
    def fake(fns, repeats, *_):
        return [[plain_ms] * repeats] + [[other_ms] * repeats] * (len(fns) - 1)
    return fake


def test_auto_tree_turns_speculation_off_when_nothing_pays(monkeypatch, tmp_path):
    import clover.autotree as at
    from clover import Engine, new_heads
    from conftest import tiny_target

    target = tiny_target("llama", vocab_size=64)
    heads = new_heads("clover", target, num_heads=2)
    monkeypatch.setattr(at, "interleaved_ms", _scripted_time(10.0, 100.0))  # every tree costs 20x plain
    tree, report = at.auto_tree(target, heads, repeats=1)
    assert tree.off and report.chosen == 0 and "speculation off" in tree.describe()
    out = Engine(target, heads, tree).generate([5, 6, 7], 12)
    assert out.token_ids == Engine(target).generate([5, 6, 7], 12).token_ids
    assert all(len(s.nodes) == 1 for s in out.steps)  # nothing drafted
    # stored as "off" and read back as off
    assert calib.stored_auto_tree(target, heads, path=tmp_path / "a.json").off
    monkeypatch.setattr(at, "interleaved_ms", _scripted_time(10.0, 0.01))  # drafting is nearly free
    assert calib.stored_auto_tree(target, heads, path=tmp_path / "a.json").off  # the stored choice
    tree, report = at.auto_tree(target, heads, repeats=1)
    assert tree.kind == "dynamic" and report.chosen == tree.budget >= 1
    assert parse_tree_spec("off").off and parse_tree_spec("off").describe().startswith("speculation off")


def test_auto_tree_times_each_budgets_drafting_with_its_state_refresh(monkeypatch):
    """Each budget's drafting is timed as a step of the engine spends it: the heads first
    observe the positions a step verified (Clover's Augmenting Block runs over them), then
    draft, each drafting call right after a target forward: the calls run as plain,
    draft 1, verify 1, draft 2, verify 2, ... and the report reads them so."""
    import clover.autotree as at
    import clover.heads.clover as ch
    from clover import new_heads
    from conftest import tiny_target

    target = tiny_target("llama", vocab_size=64)
    heads = new_heads("clover", target, num_heads=2)
    observed = []
    block_run = ch.run_augmenting_block
    monkeypatch.setattr(ch, "run_augmenting_block",
                        lambda block, h, cache, start, *rest: observed.append(h.shape[1])
                        or block_run(block, h, cache, start, *rest))
    order = []

    def fake(fns, repeats, *_):  # call i costs i ms; record which budget's calls draft
        for fn in fns[1:]:
            before = len(observed)
            fn()
            order.append(len(observed) > before)
        return [[float(i)] * repeats for i in range(len(fns))]
    monkeypatch.setattr(at, "interleaved_ms", fake)
    tree, report = at.auto_tree(target, heads, budgets=(1, 2, 4), tokens=8, repeats=1, prefix_len=16)
    assert order == [True, False] * 3  # each drafting call refreshes the heads' state; verifying does not
    assert report.plain_ms == 0.0 and report.draft_ms == [1.0, 3.0, 5.0] and report.verify_ms == [2.0, 4.0, 6.0]
    assert all(1 <= m <= 3 for m in observed[-3:])  # about tau positions per step


def test_auto_tree_per_batch_size(tmp_path, monkeypatch):
    """The tree is sized for a batch: a batched step's costs (rows drafted together, one
    forward over B trees), stored under its own key; batch size 1 keeps the old key."""
    import clover.autotree as at

    target = tiny_target("llama")
    target.tokenizer.chat_template = "{% for m in messages %}t2 {{ m['content'] }} {% endfor %}t3"
    heads = perturb(new_heads("medusa", target), 0.1)
    cfg, report = auto_tree(target, heads, budgets=(1, 4, 16), tokens=8, repeats=1, prefix_len=16,
                            batch_size=4)
    assert report.budgets == [1, 4, 16] and all(v > 0 for v in report.verify_ms) and not cfg.auto
    base = TreeConfig()
    assert calib.calibration_key(target, heads, base) == calib.calibration_key(target, heads, base, 1)
    assert calib.calibration_key(target, heads, base, 4).endswith("|batch=4")
    store = tmp_path / "autotree.json"
    monkeypatch.setattr("clover.machine.BUSY_SPREAD", float("inf"))  # stored however busy the machine is
    monkeypatch.setattr("clover.machine.BUSY_OTHERS", float("inf"))
    tree, _ = resolve_tree(target, heads, parse_tree_spec("auto"), path=store, batch_size=4)
    assert not tree.auto
    assert resolve_tree(target, heads, parse_tree_spec("auto"), path=store, measure=False,
                        batch_size=4)[0] == tree
    # batch size 1 was not measured: nothing stored for it
    assert resolve_tree(target, heads, parse_tree_spec("auto"), path=store, measure=False)[0].auto


def test_a_busy_calibration_is_stored_as_provisional_until_a_quiet_one_replaces_it(monkeypatch, tmp_path):
    """Timings whose repeats spread far above their quiet floor (another process took the
    CPU) are stored as provisional, with the load they saw, and stand in (with a note,
    no measuring) while the machine stays busy; once it is quiet they are measured again
    and a steady measurement replaces them with its figures; a busy one never replaces
    a quiet one; a budget stored by older versions (a bare int) still reads."""
    import json

    import clover.autotree as at

    target = tiny_target("llama", vocab_size=64)
    heads = new_heads("clover", target, num_heads=2)
    store = tmp_path / "autotree.json"
    key = calib.calibration_key(target, heads, TreeConfig())

    def busy(fns, repeats, *_):  # the plain step's repeats: 10 ms at best, 30 ms typically
        return [[10.0] + [30.0] * (repeats - 1)] + [[0.01] * repeats] * (len(fns) - 1)
    monkeypatch.setattr(at, "interleaved_ms", busy)
    monkeypatch.setattr(calib, "machine_busy", lambda: False)
    cal = calib.calibrate(target, heads, path=store)
    assert cal.busy and cal.provisional and not cal.stored and cal.tree.kind == "dynamic" and cal.plain_ms == 10.0
    record = json.loads(store.read_text())[key]
    assert record["provisional"] is True and record["spread"] == 3.0
    monkeypatch.setattr(calib, "machine_busy", lambda: True)
    monkeypatch.setattr(at, "interleaved_ms", lambda *a: pytest.fail("a busy machine measured again"))
    held = calib.calibrate(target, heads, path=store)  # busy still: the provisional choice, at once
    assert held.stored and held.provisional and held.tree == cal.tree and "busy" in held.note
    assert "provisional" in held.describe() and held.describe().startswith("auto tree: ")
    assert calib.calibrate(target, heads, path=store, measure=False).provisional
    monkeypatch.setattr(calib, "machine_busy", lambda: False)  # quiet now: measured again
    monkeypatch.setattr(at, "interleaved_ms", _scripted_time(10.0, 0.01))  # steady
    cal = calib.calibrate(target, heads, path=store)
    assert not cal.busy and not cal.provisional and cal.expected > 1 and not cal.note
    again = calib.calibrate(target, heads, path=store, measure=False)
    assert again.stored and not again.provisional and again.tree == cal.tree and again.plain_ms == 10.0
    record = json.loads(store.read_text())[key]
    assert record["budget"] == cal.tree.budget and record["spread"] == 1.0 and record["provisional"] is False
    monkeypatch.setattr(at, "interleaved_ms", busy)  # a busy --recalibrate keeps the quiet choice stored
    assert calib.calibrate(target, heads, path=store, recalibrate=True).provisional
    assert json.loads(store.read_text())[key]["provisional"] is False
    # other processes' CPU time, read from /proc/stat around the timings, also says busy
    report = at.AutoTreeReport([1], [1.0], [1.0], [1.0], 10.0, 1, spread=1.0, others_load=1.8)
    assert report.busy and not at.AutoTreeReport([1], [1.0], [1.0], [1.0], 10.0, 1).busy
    assert at.others_load((10.0, 1.0, 100.0), (12.0, 1.5, 101.0)) == pytest.approx(1.5)
    assert at.others_load((10.0, 1.0, 100.0), (10.1, 1.0, 100.01)) is None  # too short to tell
    assert at.others_load(None, at.load_snapshot()) is None
    store.write_text(json.dumps({key: 0}))  # an older version's bare budget: "off"
    old = calib.calibrate(target, heads, path=store, measure=False)
    assert old.tree.off and old.stored and old.plain_ms is None


def test_one_calibrator_per_target_holds_every_measurement(monkeypatch, tmp_path):
    """Calibration has one home: the target's Calibrator. The verify cost curve is timed
    once however many lookup configs ask for it; an auto tree measured through
    resolve_tree (CLI, bench, notebooks) is the one the app's loaded model then uses,
    without measuring again; a new store (another cache folder) starts empty."""
    import clover.autotree as at
    from app import registry

    monkeypatch.setenv("CLOVER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr("clover.machine.BUSY_SPREAD", float("inf"))  # stored however busy the machine is
    monkeypatch.setattr("clover.machine.BUSY_OTHERS", float("inf"))
    timed = []
    real_time_forward = calib.time_forward

    def counting(target, sizes, **kw):
        timed.append(tuple(sizes))
        return real_time_forward(target, sizes, prefix_len=8, repeats=1, batch_size=kw.get("batch_size", 1))

    monkeypatch.setattr(calib, "time_forward", counting)
    target = tiny_target("llama", vocab_size=64)
    cal = calib.calibrator_for(target)
    assert calib.calibrator_for(target) is cal and cal.path == tmp_path / "cache" / "autotree.json"
    assert cal.known_costs() is None
    from clover.lookup import LookupConfig

    first = calib.sized_lookup(target)
    assert len(first.costs) == LookupConfig().max_tokens + 1 and len(timed) == 1
    assert calib.resolve_tree(target, None, TreeConfig(auto=True), LookupConfig())[1] == first
    assert len(timed) == 1 and cal.known_costs() == first.costs  # timed once, held
    assert list(first.costs) == sorted(first.costs)  # made non-decreasing

    heads = new_heads("clover", target, num_heads=2)
    monkeypatch.setattr(calib, "auto_tree", lambda t, h, base=None, **kw: (
        replace_budget(base, 3), at.AutoTreeReport([1, 3], [1.0, 2.0], [1.0, 1.0], [10.0, 11.0],
                                                   10.0, 3, expected=1.5, best_budget=3)))
    tree, _ = calib.resolve_tree(target, heads, TreeConfig(auto=True))
    assert tree.budget == 3 and not tree.auto and cal.known(heads).tree == tree

    def no_more(*a, **k):
        raise AssertionError("measured again")

    monkeypatch.setattr(calib, "auto_tree", no_more)
    loaded = registry.register_model("test-one-home", target, heads={"clover": heads, "medusa": None},
                                     warm_up=False)
    try:
        assert loaded.sizing.tree_for("clover", TreeConfig(auto=True)) == tree
        assert loaded.sizing.calibrations["clover"] is cal.known(heads)
        assert loaded.sizing.measured_verify_costs() == first.costs
        assert loaded.sizing.plain_step_ms() == 10.0
    finally:
        registry.forget_model("test-one-home")
    other = calib.calibrator_for(target, tmp_path / "other.json")
    assert other is not cal and other.known(heads) is None and other.known_costs() is None


def replace_budget(base, budget):
    from dataclasses import replace

    return replace(base or TreeConfig(), kind="dynamic", budget=budget, auto=False)


def test_padded_widths_pad_only_where_a_wider_forward_is_clearly_cheaper():
    from clover.timing import padded_widths

    # a CPU's shape: 13-15 tokens dearer than 16; 7 a little dearer than 8 (under 5%)
    costs = [33, 34, 41, 42, 48, 56, 65, 62, 76, 88, 96, 94, 114, 116, 137, 80, 99, 96]
    plan = padded_widths(costs, 16)
    assert plan == (1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 16, 16, 16, 16, 16, 16)
    assert padded_widths(costs, 16, saving=0.1)[9] == 10  # 88 -> 80 saves 9%
    assert padded_widths(costs, 16, saving=0.0)[6] == 8  # any saving at all: 7 -> 8
    assert padded_widths(list(range(1, 9)), 8) == tuple(range(1, 9))  # rising costs: no padding
    with pytest.raises(ValueError, match="at least 20"):
        padded_widths(costs, 20)


def test_calibration_text_is_decoded_once_per_target(monkeypatch, tmp_path):
    """Every heads calibrated on one target read the same plain answers: the target decodes
    them once, keeps their token ids on disk for later processes (which then run no
    decode), and the choice is the one a fresh decode gives."""
    import clover.autotree as at

    target = tiny_target("llama", vocab_size=64)
    decoded = []
    real = Engine.stream

    def counting(self, ids, *args, **kwargs):
        decoded.append(list(ids))
        return real(self, ids, *args, **kwargs)

    monkeypatch.setattr(Engine, "stream", counting)
    prompts = at.CALIBRATION_PROMPTS[:3]
    texts = at.calibration_texts(target, prompts, tokens=8, path=tmp_path / "texts.json")
    assert len(decoded) == 3 and [t.prompt_len for t in texts] == [len(ids) for ids in decoded]
    for t, ids in zip(texts, decoded):
        assert t.token_ids[: t.prompt_len] == ids and len(t.token_ids) == len(ids) + 8
        assert t.hidden_pre.shape == t.hidden_post.shape == (len(t.token_ids), target.hidden_size)
    medusa, clover = new_heads("medusa", target, num_heads=2), new_heads("clover", target, num_heads=2)
    kw = dict(budgets=(1, 2), prompts=prompts, tokens=8, repeats=1, prefix_len=16, texts_path=tmp_path / "texts.json")
    one = [auto_tree(target, h, **kw)[1].tau for h in (medusa, clover)]
    assert len(decoded) == 3  # both heads measured on the held text
    at._TEXTS.pop(target)  # this target's text only: as a new process finds it, on disk
    again = [auto_tree(target, h, **kw)[1].tau for h in (medusa, clover)]
    assert len(decoded) == 3 and again == one  # read back, not decoded: the same acceptance
    at._TEXTS.pop(target)
    (tmp_path / "texts.json").unlink()
    assert [auto_tree(target, h, **kw)[1].tau for h in (medusa, clover)] == one  # decoded afresh: the same
    assert len(decoded) == 6
    # another length or prompt set is another text
    at.calibration_texts(target, prompts[:1], tokens=4, path=tmp_path / "texts.json")
    assert len(decoded) == 7


def test_a_choice_stored_under_other_settings_stands_in_while_the_machine_is_busy(monkeypatch, tmp_path):
    """Where nothing is stored under this key but a choice for the same heads is (another
    thread count, an older timing version), a busy machine uses it at once with a note;
    a quiet one measures; other heads' choices never stand in."""
    import json

    import clover.autotree as at

    target = tiny_target("llama", vocab_size=64)
    heads = new_heads("clover", target, num_heads=2)
    store = tmp_path / "autotree.json"
    family = calib.calibration_family(target, heads, TreeConfig())
    key = calib.calibration_key(target, heads, TreeConfig())
    other = key.replace("timing=", "timing=old")
    store.write_text(json.dumps({other: {"budget": 3, "family": family, "date": "2026-12-01T00:00:00+00:00"},
                                 "elsewhere": {"budget": 9, "family": "other heads"}}))
    monkeypatch.setattr(calib, "machine_busy", lambda: True)
    monkeypatch.setattr(at, "interleaved_ms", lambda *a: pytest.fail("measured on a busy machine"))
    cal = calib.calibrate(target, heads, path=store)
    assert cal.tree.budget == 3 and cal.stored and "other settings" in cal.note
    store.write_text(json.dumps({"elsewhere": {"budget": 9, "family": "other heads"}}))
    monkeypatch.setattr(at, "interleaved_ms", _scripted_time(10.0, 0.01))
    cal = calib.calibrate(target, heads, path=store)  # nothing of these heads: measured, bounded, provisional
    assert not cal.stored and cal.provisional and json.loads(store.read_text())[key]["family"] == family


def test_sizing_on_a_busy_machine_is_bounded(monkeypatch, tmp_path):
    """With a time budget the sizing cuts itself short: calibration texts not on disk are
    cut (and not stored), tau is read at every k-th position, the timing rounds stop at
    the budget (one always runs); progress is reported by stage."""
    import time as _time

    import clover.autotree as at

    target = tiny_target("llama", vocab_size=64)
    heads = new_heads("clover", target, num_heads=2)
    slow = heads.drafter

    def slow_drafter(*a, **kw):  # every draft takes 20 ms: a busy machine
        d = slow(*a, **kw)
        real = d.draft
        d.draft = lambda *x: _time.sleep(0.02) or real(*x)
        return d
    monkeypatch.setattr(heads, "drafter", slow_drafter)
    rounds, stages = [], set()
    real_interleaved = at.interleaved_ms

    def counting(fns, repeats, deadline=None, progress=None):
        out = real_interleaved(fns, repeats, deadline, progress)
        rounds.append(len(out[0]))
        return out
    monkeypatch.setattr(at, "interleaved_ms", counting)
    t0 = _time.monotonic()
    tree, report = at.auto_tree(target, heads, budgets=(1, 2), tokens=48, repeats=500, prefix_len=16,
                                budget_s=2.0, progress=lambda what, done, total: stages.add(what),
                                texts_path=tmp_path / "texts.json")
    took = _time.monotonic() - t0
    assert took < 6.0 and report.budgets == [1, 2] and 1 <= rounds[0] < 500
    assert {"calibration text", "timing the budgets"} <= stages
    assert report.tau[0] >= 1.0 and took < 7 * 47 * 0.02  # unbounded: a 20-ms draft at each of 7 x 47 positions


def test_a_busy_machine_has_one_definition():
    """clover.machine.busy, the one test every caller asks (the auto tree's report, the
    bench's load report, the app's busy note, the CLI's warning, the kernel store): other
    processes' load over BUSY_OTHERS CPUs, or a typical step over BUSY_SPREAD times a
    quiet one; unknown figures count as quiet."""
    from clover.machine import BUSY_OTHERS, BUSY_SPREAD, busy
    from dataclasses import replace

    import clover.autotree as at
    from clover.bench.report import load_report

    assert not busy()
    assert busy(others_load=BUSY_OTHERS + 0.1) and not busy(others_load=BUSY_OTHERS - 0.1)
    assert busy(typical_ms=10 * BUSY_SPREAD + 1, quiet_ms=10)
    assert not busy(typical_ms=10 * BUSY_SPREAD - 1, quiet_ms=10)
    assert not busy(typical_ms=100, quiet_ms=None)
    report = at.AutoTreeReport([1], [1.0], [1.0], [10.0], 10.0, 1, spread=BUSY_SPREAD + 0.1)
    assert report.busy and not replace(report, spread=1.0).busy
    assert replace(report, spread=1.0, others_load=BUSY_OTHERS + 0.1).busy
    assert load_report([10.0] * 19 + [10.0] * 20)["busy"] is False
    assert load_report([10.0] * 5 + [10.0 * BUSY_SPREAD + 1] * 35)["busy"] is True
