"""Acceptance rules, and the proof that speculative sampling keeps the target's
distribution (chi-square against the exact distribution of the first two tokens)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from clover import Engine, SamplingConfig, new_heads, parse_tree_spec
from clover.acceptance import accept_greedy, accept_sample, accept_typical, logits_to_probs
from clover.tree import Tree
from conftest import ScriptedHeads, perturb, random_tree_fn, tiny_target

V = 8


def small_tree():
    # root -> a(3), b(5); a -> c(1)
    return Tree(torch.tensor([0, 3, 5, 1]), [-1, 0, 0, 1], [0, 1, 1, 2], [1.0, 0.6, 0.3, 0.5])


def test_greedy_walks_matching_children():
    logits = torch.full((4, V), -1.0)
    logits[0, 3] = logits[1, 1] = logits[3, 6] = 5.0
    logits[2, 2] = 5.0
    acc = accept_greedy(small_tree(), logits)
    assert acc.path == [0, 1, 3] and acc.bonus_token == 6
    logits[0] = -1.0
    logits[0, 5] = 5.0  # second child wins
    acc = accept_greedy(small_tree(), logits)
    assert acc.path == [0, 2] and acc.bonus_token == 2
    logits[0] = -1.0
    logits[0, 7] = 5.0  # no child matches
    assert accept_greedy(small_tree(), logits).path == [0]


def test_logits_to_probs_top_k_top_p():
    logits = torch.log(torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05]))
    p = logits_to_probs(logits, SamplingConfig(temperature=1.0, top_k=2))
    assert torch.allclose(p, torch.tensor([5 / 7, 2 / 7, 0, 0, 0]))
    p = logits_to_probs(logits, SamplingConfig(temperature=1.0, top_p=0.8))
    assert torch.allclose(p, torch.tensor([0.5, 0.2, 0.15, 0, 0]) / 0.85)
    p = logits_to_probs(logits, SamplingConfig(temperature=0.5))
    q = torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05]) ** 2
    assert torch.allclose(p, q / q.sum(), atol=1e-6)


def empirical_first_token(rule, n=20000):
    """Distribution of the first committed token for a one-node-deep tree."""
    tree = Tree(torch.tensor([0, 2, 5, 6]), [-1, 0, 0, 0], [0, 1, 1, 1], [1.0, 0.5, 0.3, 0.2])
    logits = torch.log(torch.tensor([[0.05, 0.1, 0.3, 0.05, 0.1, 0.2, 0.15, 0.05]] * 4))
    cfg = SamplingConfig(temperature=1.0, acceptance=rule)
    g = torch.Generator().manual_seed(0)
    counts = np.zeros(V)
    for _ in range(n):
        acc = (accept_sample if rule == "sample" else accept_typical)(tree, logits, cfg, g)
        tok = tree.tokens[acc.path[1]].item() if len(acc.path) > 1 else acc.bonus_token
        counts[tok] += 1
    return counts, torch.softmax(logits[0].double(), -1).numpy()


def test_sample_rule_is_exact_on_one_node():
    counts, p = empirical_first_token("sample")
    assert pooled_pvalue(counts, p) > 1e-3


def test_typical_rule_is_lossy():
    """The same test detects typical acceptance's bias: the test can fail."""
    counts, p = empirical_first_token("typical", n=5000)
    assert pooled_pvalue(counts, p) < 1e-6


def exact_two_token_joint(target, prompt, cfg):
    with torch.inference_mode():
        ids = torch.tensor([prompt])
        p1 = logits_to_probs(target.model(ids).logits[0, -1], cfg)
        ext = torch.cat([ids.expand(V, -1), torch.arange(V)[:, None]], 1)
        p2 = logits_to_probs(target.model(ext).logits[:, -1], cfg)  # (V, V)
    return (p1[:, None].double() * p2.double()).flatten().numpy()


def draw_pairs(engine, prompt, cfg, n):
    counts = np.zeros(V * V)
    for i in range(n):
        ids = engine.generate(prompt, 2, SamplingConfig(**{**cfg.__dict__, "seed": i})).token_ids
        counts[ids[0] * V + ids[1]] += 1
    return counts


def pooled_pvalue(counts, probs):
    """Chi-square goodness of fit, cells with expected count < 5 pooled into one."""
    probs = np.asarray(probs, dtype=np.float64)
    expected = probs / probs.sum() * counts.sum()
    big = expected >= 5
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    return chisquare(obs, exp).pvalue


@pytest.mark.parametrize("cfg", [
    SamplingConfig(temperature=1.0),
    SamplingConfig(temperature=0.7, top_k=5, top_p=0.9),
], ids=["t1", "t0.7-topk-topp"])
def test_speculative_sampling_matches_target_distribution(cfg):
    target = tiny_target("llama", vocab_size=V, seed=3)
    with torch.no_grad():  # flatten the tiny model's logits so many pairs occur
        target.lm_head.weight.mul_(0.25)
    prompt = [3, 1, 4, 1, 5]
    probs = exact_two_token_joint(target, prompt, cfg)
    n = 2500
    scripted = Engine(target, ScriptedHeads(target, random_tree_fn(V, seed=1, depth=2, branching=4)))
    clover = Engine(target, perturb(new_heads("clover", target), 0.3), parse_tree_spec("dynamic:budget=6,branching=3"))
    plain = Engine(target)
    for engine in (plain, scripted, clover):
        counts = draw_pairs(engine, prompt, cfg, n)
        assert pooled_pvalue(counts, probs) > 1e-3, engine.method
    # the drafts were really used: multi-token steps happened
    runs = [scripted.generate(prompt, 2, SamplingConfig(**{**cfg.__dict__, "seed": s})) for s in range(200)]
    assert any(len(r.steps) == 1 for r in runs)


def test_typical_acceptance_is_labelled_lossy():
    assert not SamplingConfig(temperature=1.0, acceptance="typical").lossless
    assert SamplingConfig(temperature=1.0).lossless and SamplingConfig().lossless
    assert SamplingConfig().rule == "greedy" and SamplingConfig(temperature=0.5).rule == "sample"


def test_accept_rows_per_row_of_a_padded_batch():
    """Batched acceptance: row b's tree on its own first N_b logits (padding ignored), its
    own generator; greedy takes all rows' argmax at once."""
    from clover.acceptance import accept_rows

    trees = [small_tree(), Tree(torch.tensor([4, 2]), [-1, 0], [0, 1], [1.0, 0.9])]
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 4, V, generator=g)
    logits[1, 2:] = 100.0  # padding nodes of row 1: must not matter
    got = accept_rows(trees, logits, SamplingConfig(), [None, None])
    want = [accept_greedy(trees[0], logits[0]), accept_greedy(trees[1], logits[1, :2])]
    assert [(a.path, a.bonus_token) for a in got] == [(a.path, a.bonus_token) for a in want]
    cfg = SamplingConfig(temperature=1.0)
    got = accept_rows(trees, logits, cfg, [torch.Generator().manual_seed(s) for s in (1, 2)])
    want = [accept_sample(t, logits[b, :len(t)], cfg, torch.Generator().manual_seed(s))
            for b, (t, s) in enumerate(zip(trees, (1, 2)))]
    assert [(a.path, a.bonus_token) for a in got] == [(a.path, a.bonus_token) for a in want]
    with pytest.raises(ValueError, match="generators"):
        accept_rows(trees, logits, cfg, [None])
