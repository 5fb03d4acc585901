"""Prompt lookup drafting: match finding, the lookup branch in a head tree,
exact greedy output, and lossless sampling with lookup branches."""
from __future__ import annotations

import pytest
import torch

from clover import Engine, SamplingConfig, new_heads, parse_tree_spec
from clover.lookup import (LookupConfig, LookupDrafter, NgramIndex, best_length, find_continuation,
                           PREFER, match_bucket, merge_branch, plan_step, verify_ms)
from clover.tree import ancestor_matrix
from conftest import path_tokens, perturb, tiny_target, tree_from_levels
from test_acceptance import V, draw_pairs, exact_two_token_joint, pooled_pvalue


def test_longest_tail_first():
    # "1 2 3" occurred at the start; "2 3" also later, followed by 8
    seq = [1, 2, 3, 4, 5, 9, 2, 3, 8, 1, 2, 3]
    assert find_continuation(seq, max_ngram=3, length=3) == ([4, 5, 9], 3)
    assert find_continuation(seq, max_ngram=2, length=3) == ([8, 1, 2], 2)  # latest "2 3"
    assert find_continuation(seq, max_ngram=2, length=3, prefer="earliest") == ([4, 5, 9], 2)


def test_longest_prefers_the_occurrence_whose_context_agrees_furthest():
    # the tail "3 4" ended at index 3 (after "1 2", as now: 4 tokens agree) and at index 7
    # (after "7": only 2 agree); "longest" takes the first although it is not the latest
    seq = [1, 2, 3, 4, 9, 7, 3, 4, 8, 1, 2, 3, 4]
    assert find_continuation(seq, max_ngram=2, length=2) == ([8, 1], 2)
    assert find_continuation(seq, max_ngram=2, length=2, prefer="longest") == ([9, 7], 4)
    # ties go to the latest, and the agreement stops at the start of the text
    assert find_continuation([5, 6, 1, 5, 6, 2, 5, 6], max_ngram=2, prefer="longest", length=1) == ([2], 2)
    # match lengths are bucketed for the rate: 1..4 alone, then 5-7, 8-15, 16+
    assert [match_bucket(m) for m in (1, 4, 5, 7, 8, 15, 16, 40)] == [1, 4, 5, 5, 8, 8, 16, 16]
    with pytest.raises(ValueError, match="prefer"):
        LookupConfig(prefer="best")
    with pytest.raises(ValueError, match="max_match"):
        LookupConfig(max_ngram=4, max_match=3)


def test_no_match_and_min_ngram():
    assert find_continuation([1, 2, 3, 4]) == ([], 0)
    assert find_continuation([7, 1, 2, 7], min_ngram=2) == ([], 0)  # only a 1-gram matches
    assert find_continuation([7, 1, 2, 7], min_ngram=1, length=3) == ([1, 2, 7], 1)
    assert find_continuation([7, 1, 2, 7], min_ngram=1, length=5) == ([1, 2, 7, 1, 2], 1)
    assert find_continuation([5]) == ([], 0)


def test_continuation_copies_overlapping_text_like_lz77():
    # the only earlier "4" is the one just before the root: period 1, so 4 4 4 ...
    assert find_continuation([1, 4, 4], length=5) == ([4] * 5, 1)
    # "7 8" ended two tokens before the root "8": the loop 7 8 continues
    assert find_continuation([7, 8, 7, 8], length=5) == ([7, 8, 7, 8, 7], 2)
    assert find_continuation([]) == ([], 0) and find_continuation([3]) == ([], 0)


def test_an_undrafted_guess_still_updates_the_rate():
    """With costs that make a chain not worth drafting at the prior rate, the first
    token of the match is still scored, so the rate can rise and lookup turn back on."""
    costs = (10.0, 16.0, 22.0)  # one extra token costs 60% of a step: needs rate > 0.6
    d = LookupDrafter(LookupConfig(max_ngram=1, max_tokens=2, costs=costs))
    truth = [5, 6] * 20  # a loop the model keeps following
    d.observe(None, None, truth[:7])
    i, drafted = 7, []
    for _ in range(6):  # the engine's greedy loop, against the known continuation
        tree = d.draft(truth[i], 10)
        chain = tree.tokens.tolist()[1:]
        k = 0
        while k < len(chain) and chain[k] == truth[i + 1 + k]:
            k += 1
        d.observe(None, None, truth[i: i + 1 + k])
        drafted.append(len(chain))
        i += k + 1
    assert drafted[0] == 0 and drafted[-1] > 0  # off at the prior, on once the guesses hit


def test_incremental_index_equals_one_shot():
    g = torch.Generator().manual_seed(0)
    seq = torch.randint(0, 6, (200,), generator=g).tolist()
    index = NgramIndex(1, 3)
    for i in range(1, len(seq)):
        index.extend([seq[i - 1]])
        for prefer in PREFER:
            assert index.find(seq[i], 4, prefer) == find_continuation(seq[: i + 1], 3, 1, 4, prefer)


def test_best_length_follows_costs_and_rate():
    cpu = [33.0, 34.0, 37.0, 40.0, 45.0, 61.0]  # ms for 1..6 tokens on a 2-core CPU
    assert best_length(cpu, 0.9, 5) == 4  # reliable matches: long chains, short of the 61 ms jump
    assert best_length(cpu, 0.5, 5) == 2
    assert best_length([33.0, 60.0, 90.0], 0.3, 2) == 0  # nothing pays: draft nothing
    assert best_length([], 0.1, 7) == 7  # no costs: the cap
    flat = [5.0] * 11  # a GPU-like flat curve
    assert best_length(flat, 0.2, 10) == 10


def test_drafter_learns_its_acceptance_rate():
    d = LookupDrafter(LookupConfig(max_tokens=3))
    d.observe(None, None, [1, 2, 3, 4, 1, 2])  # prompt but its last token
    tree = d.draft(3, 10)  # "2 3" occurred: propose 4 1 2
    assert tree.tokens.tolist() == [3, 4, 1, 2] and tree.sources == ["root", "lookup", "lookup", "lookup"]
    assert tree.parents == [-1, 0, 1, 2] and tree.depths == [0, 1, 2, 3]
    before = d.rate(3)  # the tail "1 2 3" matched: n = 3
    d.observe(None, None, [3, 4, 1])  # root + two accepted drafts, the third rejected
    assert d.stats[3] == [1.0 + 2, 2.0 + 3] and d.rate(3) > before
    assert d.draft(9, 10).tokens.tolist() == [9]  # 9 never occurred: nothing drafted
    assert d.draft(4, 0).tokens.tolist() == [4]  # no room left: nothing drafted


def _head_tree():
    # root 7 -> a(5) -> c(6); root -> b(8)
    return tree_from_levels(7, {0: [1, 2], 1: [3]}, {1: 5, 2: 8, 3: 6})


def test_merge_shares_head_nodes_and_adds_the_rest():
    head = _head_tree()
    merged = merge_branch(head, [5, 6, 9, 4], prob=0.9, budget=10)
    paths = {path_tokens(merged, i): merged.sources[i] for i in range(1, len(merged))}
    assert paths == {(5,): "both", (8,): "head", (5, 6): "both", (5, 6, 9): "lookup",
                     (5, 6, 9, 4): "lookup"}
    assert all(merged.parents[i] < i for i in range(1, len(merged)))  # parents first
    assert merged.depths == sorted(merged.depths)  # breadth-first
    assert all(merged.depths[i] == merged.depths[merged.parents[i]] + 1 for i in range(1, len(merged)))
    # a shared node takes the larger draft probability
    i = next(i for i in range(1, len(merged)) if path_tokens(merged, i) == (5,))
    assert merged.draft_probs[i] == max(0.9, head.draft_probs[1])
    ancestor_matrix(merged.parents)  # a valid tree


def test_merge_keeps_the_budget_by_joint_probability():
    head = _head_tree()  # 3 drafted nodes
    merged = merge_branch(head, [8, 1, 2, 3], prob=0.95, budget=3)
    assert len(merged) - 1 == 3
    kept = {path_tokens(merged, i) for i in range(1, len(merged))}
    # every kept node's parent is kept, and the confident lookup chain displaced head nodes
    assert all(p[:-1] in kept or len(p) == 1 for p in kept)
    assert (8, 1) in kept and (8, 1, 2) in kept
    # a disjoint branch: the chain hangs off the root
    merged = merge_branch(head, [4], prob=0.5, budget=10)
    assert (4,) in {path_tokens(merged, i) for i in range(1, len(merged))}
    assert merged.sources[[path_tokens(merged, i) for i in range(len(merged))].index((4,))] == "lookup"


REPETITIVE = [5, 6, 7, 8, 9, 10, 5, 6, 7, 8, 9, 10, 5, 6, 7]


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
def test_lookup_and_hybrids_equal_plain_greedy(arch):
    target = tiny_target(arch)
    plain = Engine(target).generate(REPETITIVE, 40)
    lookup = Engine(target, lookup=LookupConfig(max_tokens=4))
    assert lookup.method == "lookup"
    out = lookup.generate(REPETITIVE, 40)
    assert out.token_ids == plain.token_ids
    drafted = [n for s in out.steps for n in s.nodes if n.source == "lookup"]
    assert drafted  # the lookup really drafted
    for kind in ("medusa", "clover"):
        heads = perturb(new_heads(kind, target), 0.1)
        for spec in ("dynamic:budget=6,branching=3", "small"):
            eng = Engine(target, heads, parse_tree_spec(spec), lookup=LookupConfig(max_tokens=4))
            assert eng.method == f"{kind}+lookup"
            res = eng.generate(REPETITIVE, 40)
            assert res.token_ids == plain.token_ids, (kind, spec)
            budget = 6 if spec.startswith("dynamic") else 7
            assert all(len(s.nodes) - 1 <= budget for s in res.steps)
            assert {n.source for s in res.steps for n in s.nodes} >= {"root", "head"}


CPU_COSTS = (33.0, 34.0, 40.0, 44.0, 50.0, 55.0, 61.0, 65.0, 70.0)  # ms per 1..9 tokens, this CPU


def test_verify_ms_extends_the_curve_linearly():
    assert verify_ms((10.0, 12.0, 14.0), 2) == 12.0
    assert verify_ms((10.0, 12.0, 14.0), 5) == 18.0  # slope 2 ms per token past the end
    assert verify_ms((10.0,), 3) == 30.0  # one point: each token as dear as the first
    assert verify_ms((10.0, 12.0, 14.0), 1.5) == 11.0  # a mean tree size: interpolated


def test_plan_step_picks_the_fastest_tree():
    # no match: the heads' tree
    assert plan_step(CPU_COSTS, 0.0, 0, 0.3, 1, 4.0) == (True, 0)
    # a weak match on a CPU: an extra node costs more than it brings, the heads alone
    assert plan_step(CPU_COSTS, 0.2, 3, 0.4, 1, 4.0) == (True, 0)
    # a sure match: a long chain, and the heads skip drafting
    heads, length = plan_step(CPU_COSTS, 0.95, 8, 0.3, 1, 4.0)
    assert not heads and length >= 4
    # flat costs (a GPU): everything fits, the heads come along when they bring something
    flat = (10.0,) * 12
    assert plan_step(flat, 0.5, 6, 0.8, 2, 0.1) == (True, 6)
    # heads that cost more to draft than they bring: lookup alone
    assert plan_step(flat, 0.5, 6, 0.01, 2, 5.0) == (False, 6)
    # each choice really is the best of all (heads?, L) by the documented formula
    for rate, gain, ms in ((0.6, 0.3, 4.0), (0.8, 0.5, 8.0), (0.3, 0.6, 1.0)):
        def speed(h, n):
            e = sum(rate ** k for k in range(1, n + 1))
            if not h:
                return (1 + e) / verify_ms(CPU_COSTS, 1 + n)
            return (1 + e + (1 - rate) * gain if n else 1 + gain) / (verify_ms(CPU_COSTS, 2 + n) + ms)
        options = [(True, 0)] + [(h, n) for n in range(1, 7) for h in (False, True)]
        best = max(speed(*o) for o in options)
        assert speed(*plan_step(CPU_COSTS, rate, 6, gain, 1, ms)) == pytest.approx(best)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
def test_hybrid_with_costs_drafts_past_the_head_budget_and_stays_exact(arch):
    """With a cost curve, a sure match drafts a chain longer than the heads' one-node
    budget; greedy output is still plain's."""
    target = tiny_target(arch)
    plain = Engine(target).generate(REPETITIVE, 40)
    flat = LookupConfig(max_tokens=4, costs=(10.0,) * 5)  # verifying more costs nothing
    for kind in ("medusa", "clover"):
        heads = perturb(new_heads(kind, target), 0.1)
        eng = Engine(target, heads, parse_tree_spec("dynamic:budget=1,branching=1"), lookup=flat)
        res = eng.generate(REPETITIVE, 40)
        assert res.token_ids == plain.token_ids, kind
        lookup_nodes = [sum(n.source in ("lookup", "both") for n in s.nodes) for s in res.steps]
        assert max(lookup_nodes) > 1  # past the heads' budget of 1
        # (which of heads/lookup/both a step takes depends on measured drafting ms:
        # test_plan_step_picks_the_fastest_tree checks that choice with fixed numbers)
        assert all(len(s.nodes) - 1 <= 1 + 4 for s in res.steps)  # heads' budget + the chain


def test_lookup_accepts_copied_text():
    """A model that repeats its prompt's cycle: lookup drafts it and the target accepts."""
    target = tiny_target("llama")
    out = Engine(target, lookup=LookupConfig(max_tokens=4)).generate(REPETITIVE, 30)
    plain = Engine(target).generate(REPETITIVE, 30)
    assert out.token_ids == plain.token_ids
    # the tiny random model falls into a loop; once it does, lookup predicts it
    assert max(s.accepted_length for s in out.steps) >= 2
    assert len(out.steps) < len(plain.steps)


def test_lookup_cost_curve_is_measured_per_batch_size(monkeypatch):
    """A batched step verifies B rows' chains in one forward: the lookup's cost curve is
    that step's, measured (and cached) per batch size, and a real timing runs B rows."""
    import clover.calibration as at

    target = tiny_target("llama")
    real = at.time_forward
    seen = []

    def fake(t, sizes, batch_size=1, **kw):
        seen.append(batch_size)
        return [10.0 * batch_size + 5.0 * batch_size * (n - 1) for n in sizes]

    monkeypatch.setattr(at, "time_forward", fake)
    _, one = at.resolve_tree(target, None, parse_tree_spec("auto"), LookupConfig(max_tokens=2))
    _, four = at.resolve_tree(target, None, parse_tree_spec("auto"), LookupConfig(max_tokens=2), batch_size=4)
    assert one.costs == (10.0, 15.0, 20.0) and four.costs == (40.0, 60.0, 80.0)
    at.resolve_tree(target, None, parse_tree_spec("auto"), LookupConfig(max_tokens=2), batch_size=4)
    assert seen == [1, 4]  # cached per (size, batch size)
    ms = real(target, [1, 3], prefix_len=8, repeats=1, batch_size=3)
    assert len(ms) == 2 and all(m > 0 for m in ms)


def test_auto_tree_sizes_lookup_with_the_cost_curve(monkeypatch):
    import clover.calibration as at

    target = tiny_target("llama")
    monkeypatch.setattr(at, "time_forward", lambda t, sizes, **kw: [10.0 + 50.0 * (n - 1) for n in sizes])
    tree, lookup = at.resolve_tree(target, None, parse_tree_spec("auto"), LookupConfig(max_tokens=4))
    eng = Engine(target, tree=tree, lookup=lookup)
    assert eng.lookup.costs == (10.0, 60.0, 110.0, 160.0, 210.0)
    # every extra token costs 5x a plain step: lookup never drafts, the output is plain
    out = eng.generate(REPETITIVE, 20)
    assert all(len(s.nodes) == 1 for s in out.steps)
    assert out.token_ids == Engine(target).generate(REPETITIVE, 20).token_ids
    with pytest.raises(ValueError, match="prefer"):
        LookupConfig(prefer="random")
    with pytest.raises(ValueError, match="n-gram"):
        LookupConfig(min_ngram=3, max_ngram=2)


def test_sampling_with_lookup_branches_matches_target_distribution():
    """Lookup nodes are deterministic proposals: with them in the tree, alone or beside
    head nodes, the first two sampled tokens keep the target's exact joint distribution
    (the head-only version of this test also runs top-k / top-p)."""
    cfg = SamplingConfig(temperature=1.0)
    target = tiny_target("llama", vocab_size=V, seed=3)
    with torch.no_grad():
        target.lm_head.weight.mul_(0.25)
    prompt = [3, 1, 4, 1, 5, 1, 4]  # "1 4" occurred: lookup proposes 1 5
    probs = exact_two_token_joint(target, prompt, cfg)
    lookup = Engine(target, lookup=LookupConfig(max_tokens=2))
    hybrid = Engine(target, perturb(new_heads("clover", target), 0.3), parse_tree_spec("dynamic:budget=4,branching=2"),
                    lookup=LookupConfig(max_tokens=2))
    for engine in (lookup, hybrid):
        first = engine.generate(prompt, 2, SamplingConfig(**{**cfg.__dict__, "seed": 0}))
        assert any(n.source in ("lookup", "both") for n in first.steps[0].nodes)
        counts = draw_pairs(engine, prompt, cfg, 2500)
        assert pooled_pvalue(counts, probs) > 1e-3, engine.method


def test_replayed_lookup_equals_the_engine():
    """scripts/lookup_ablation.py replays lookup over plain greedy answers; the replay
    must take exactly the engine's steps."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "lookup_ablation", Path(__file__).resolve().parents[1] / "scripts" / "lookup_ablation.py")
    ablation = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ablation)
    target = tiny_target("llama")
    for prompt in (REPETITIVE, [5, 6, 7, 8, 9]):
        answer = Engine(target).generate(prompt, 30).token_ids
        for cfg in (LookupConfig(max_tokens=4), LookupConfig(max_ngram=2, max_tokens=10, prefer="earliest"),
                    LookupConfig(max_tokens=6, prefer="longest", costs=(10, 11, 12, 14, 16, 18, 20))):
            run = Engine(target, lookup=cfg).generate(prompt, 30)
            steps, tokens, ms = ablation.replay(prompt, answer, cfg)
            assert (steps, tokens) == (len(run.steps), len(run.token_ids))
            drafted = [len(s.nodes) for s in run.steps]
            assert ms == pytest.approx(sum(verify_ms(cfg.costs, n) for n in drafted) if cfg.costs else 0.0)
