"""Trees: masks, position ids, static and dynamic growth, spec parsing."""
from __future__ import annotations

import pytest
import torch

from clover.tree import (STATIC_TREES, Tree, TreeConfig, ancestor_matrix, grow_dynamic,
                         grow_static, grow_tree, grow_trees, parse_tree_spec, position_ids, tree_mask)


def fixed_expand(vocab=10):
    """Children distribution depends on depth and parent token, deterministically."""
    calls = []

    def expand(depth, node_ids, parent_ids, tokens):
        calls.append((depth, list(node_ids), list(parent_ids), list(tokens)))
        rows = []
        for t in tokens:
            logits = torch.tensor([float((7 * i + 3 * t + depth) % vocab) for i in range(vocab)])
            rows.append(torch.softmax(logits, -1))
        return torch.stack(rows)

    expand.calls = calls
    return expand


def test_ancestor_matrix_and_mask():
    parents = [-1, 0, 0, 1, 3, 2]
    anc = ancestor_matrix(parents)
    expected = {0: {0}, 1: {0, 1}, 2: {0, 2}, 3: {0, 1, 3}, 4: {0, 1, 3, 4}, 5: {0, 2, 5}}
    for i, js in expected.items():
        assert set(torch.nonzero(anc[i]).flatten().tolist()) == js
    mask = tree_mask(parents, prefix_len=4, dtype=torch.float32, device="cpu")
    assert mask.shape == (1, 1, 6, 10)
    assert (mask[0, 0, :, :4] == 0).all()  # every node sees the whole prefix
    neg = torch.finfo(torch.float32).min
    for i, js in expected.items():
        for j in range(6):
            assert mask[0, 0, i, 4 + j] == (0.0 if j in js else neg)


def test_position_ids():
    assert position_ids([0, 1, 1, 2], 7, "cpu").tolist() == [[7, 8, 8, 9]]


def test_grow_static_follows_ranks():
    expand = fixed_expand()
    paths = [(0,), (1,), (0, 0), (0, 2), (1, 0), (0, 0, 1)]
    tree = grow_static(5, paths, expand, max_depth=3)
    assert len(tree) == 7 and tree.parents[0] == -1 and tree.tokens[0] == 5
    assert tree.depths == [0, 1, 1, 2, 2, 2, 3]
    # node for path (0, 2) is the 3rd most likely child of the node for path (0,)
    probs = expand(0, [0], [-1], [5])[0]
    top = probs.topk(3).indices.tolist()
    assert tree.tokens[1].item() == top[0] and tree.tokens[2].item() == top[1]
    child_probs = expand(1, [1], [0], [top[0]])[0].topk(3).indices.tolist()
    node_02 = [i for i in range(len(tree)) if tree.parents[i] == 1 and tree.depths[i] == 2]
    assert [tree.tokens[i].item() for i in node_02] == [child_probs[0], child_probs[2]]
    # one expand call per depth, with the right parents
    assert [c[0] for c in expand.calls[:3]] == [0, 1, 2]
    assert grow_static(5, paths, fixed_expand(), max_depth=1).depths == [0, 1, 1]


def check_tree(tree: Tree):
    for i, p in enumerate(tree.parents):
        if i == 0:
            assert p == -1 and tree.depths[0] == 0
        else:
            assert 0 <= p < i and tree.depths[i] == tree.depths[p] + 1
    # siblings have distinct tokens
    for kids in tree.children():
        toks = [tree.tokens[k].item() for k in kids]
        assert len(toks) == len(set(toks))


@pytest.mark.parametrize("budget,branching", [(1, 1), (5, 2), (10, 3), (30, 4)])
def test_grow_dynamic_budget_and_shape(budget, branching):
    cfg = TreeConfig(budget=budget, branching=branching, branch_p=1.0, min_ratio=0.0)
    tree = grow_dynamic(3, cfg, fixed_expand(), max_depth=4)
    check_tree(tree)
    assert len(tree) - 1 <= budget
    assert len(tree) - 1 == min(budget, sum(branching * min(branching, branching ** d) for d in range(4)))
    assert max(len(k) for k in tree.children()) <= branching


def test_grow_dynamic_keeps_highest_joint_probability():
    """Every kept node's joint probability is >= every dropped candidate's."""
    cfg = TreeConfig(budget=6, branching=3, branch_p=1.0, min_ratio=0.0)
    tree = grow_dynamic(3, cfg, fixed_expand(), max_depth=3)
    joint = [1.0]
    for i in range(1, len(tree)):
        joint.append(joint[tree.parents[i]] * tree.draft_probs[i])
    full = grow_dynamic(3, TreeConfig(budget=256, branching=3, branch_p=1.0, min_ratio=0.0),
                        fixed_expand(), max_depth=3)
    fj = [1.0]
    for i in range(1, len(full)):
        fj.append(fj[full.parents[i]] * full.draft_probs[i])
    assert min(joint[1:]) >= sorted(fj[1:], reverse=True)[5] - 1e-12


def path_expand(vocab=7, seed=0):
    """Children distributions drawn at random per parent path (no ties), fixed per path;
    ``expand.dist(path)`` reads one without a call."""
    gen = torch.Generator().manual_seed(seed)
    table: dict = {}

    def dist(path):
        if path not in table:
            table[path] = torch.softmax(3 * torch.randn(vocab, generator=gen), -1)
        return table[path]

    paths = {0: ()}  # node id -> token path from the root

    def expand(depth, node_ids, parent_ids, tokens):
        rows = []
        for nid, pid, t in zip(node_ids, parent_ids, tokens):
            paths[nid] = paths.get(pid, ()) + (t,) if pid >= 0 else ()
            rows.append(dist(paths[nid]))
        return torch.stack(rows)

    expand.dist = dist
    return expand


def joint_paths(tree: Tree) -> dict:
    """{token path below the root: joint draft probability} of a tree's drafted nodes."""
    path, joint = {0: ()}, {0: 1.0}
    for i in range(1, len(tree)):
        p = tree.parents[i]
        path[i], joint[i] = path[p] + (int(tree.tokens[i]),), joint[p] * tree.draft_probs[i]
    return {path[i]: joint[i] for i in range(1, len(tree))}


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("budget,branching", [(1, 10), (3, 10), (6, 6), (10, 10), (10, 64)])
def test_grow_dynamic_is_exact_top_budget_when_branching_covers_it(seed, budget, branching):
    """With ``branching >= budget`` (filters off) the dynamic tree is exactly the ``budget``
    paths of highest joint draft probability among every path up to the depth, found by
    brute force; expanding at most ``budget`` nodes per depth loses none of them."""
    depth, vocab = 3, 7
    expand = path_expand(vocab, seed)
    tree = grow_dynamic(0, TreeConfig(budget=budget, branching=branching, branch_p=1.0, min_ratio=0.0),
                        expand, max_depth=depth)
    every = {}

    def walk(path, joint):
        if len(path) == depth:
            return
        probs = expand.dist(path)
        for t in range(vocab):
            every[path + (t,)] = joint * float(probs[t])
            walk(path + (t,), every[path + (t,)])

    walk((), 1.0)
    best = sorted(every, key=lambda p: -every[p])[:budget]
    got = joint_paths(tree)
    assert set(got) == set(best)
    assert all(abs(got[p] - every[p]) < 1e-6 for p in got)
    assert max(len(k) for k in tree.children()) <= budget


def test_grow_dynamic_branching_beyond_budget_costs_no_more_head_calls():
    """Branching above the budget drafts the same tree from the same expanded nodes."""
    trees, calls = [], []
    for branching in (4, 40):
        expand = fixed_expand()
        trees.append(grow_dynamic(3, TreeConfig(budget=4, branching=branching), expand, max_depth=3))
        calls.append(expand.calls)
    assert trees[0].tokens.tolist() == trees[1].tokens.tolist() and trees[0].parents == trees[1].parents
    assert calls[0] == calls[1]


def test_grow_dynamic_branch_p_and_floor():
    def peaked(depth, ids, parents, tokens):
        p = torch.tensor([0.9, 0.05, 0.03, 0.02])
        return p.expand(len(ids), -1)

    t = grow_dynamic(0, TreeConfig(budget=20, branching=4, branch_p=0.85, min_ratio=0.0), peaked, 1)
    assert len(t) == 2  # 0.9 reaches branch_p 0.85: no more siblings
    t = grow_dynamic(0, TreeConfig(budget=20, branching=4, branch_p=1.0, min_ratio=0.04), peaked, 1)
    assert len(t) == 3  # floor 0.036 drops 0.03 and 0.02


def test_grow_tree_depth_cap_and_root_only():
    cfg = TreeConfig(kind="static", paths=STATIC_TREES["chain3"])
    assert len(grow_tree(1, cfg, fixed_expand(), max_depth=0)) == 1
    assert grow_tree(1, cfg, fixed_expand(), max_depth=2).depths == [0, 1, 2]
    cfg = TreeConfig(budget=10, branching=2, max_depth=1)
    assert max(grow_tree(1, cfg, fixed_expand(), max_depth=5).depths) == 1


def test_deepest_bounds_every_grown_tree():
    """``TreeConfig.deepest`` is never below the depth a tree actually reaches."""
    assert TreeConfig(kind="off").deepest == 0
    assert TreeConfig(kind="static", paths=STATIC_TREES["chain3"]).deepest == 3
    assert TreeConfig(kind="static", paths=STATIC_TREES["chain3"], max_depth=2).deepest == 2
    for budget, branching in [(1, 1), (1, 3), (2, 1), (3, 2), (10, 3)]:
        cfg = TreeConfig(budget=budget, branching=branching, branch_p=1.0, min_ratio=0.0)
        assert cfg.deepest == budget

        def sure(depth, ids, parents, tokens):  # a certain chain: the deepest a budget goes
            return torch.tensor([1.0] + [0.0] * 7).expand(len(ids), -1)

        for expand in (fixed_expand(), sure):
            assert max(grow_dynamic(3, cfg, expand, max_depth=16).depths) <= cfg.deepest
        assert max(grow_dynamic(3, cfg, sure, max_depth=16).depths) == budget


def test_parse_tree_spec():
    assert parse_tree_spec(None) == TreeConfig()
    assert parse_tree_spec("dynamic") == TreeConfig()
    assert parse_tree_spec("dynamic:budget=12,branching=4") == TreeConfig(budget=12, branching=4)
    # the keys' older names (draft-side settings once shared the target sampler's names)
    assert parse_tree_spec("dynamic:budget=12,topk=4,top_p=0.5") == TreeConfig(budget=12, branching=4,
                                                                                branch_p=0.5)
    assert parse_tree_spec("small").paths == STATIC_TREES["small"]
    assert parse_tree_spec("[[0],[1],[0,0]]").paths == ((0,), (1,), (0, 0))


@pytest.mark.parametrize("spec,msg", [
    ("[[0],[0,0,1]]", "parent"),
    ("[[0],", "JSON"),
    ("[[-1]]", "integers in \\[0, 64\\)"),
    ("[[]]", "non-empty"),
    ("[]", "at least one"),
    ("[[0],[0]]", "repeat"),
    ('{"a": 1}', "unknown tree spec"),
    ("bushy", "unknown tree spec"),
    ("dynamic:budget=0", "budget"),
    ("dynamic:size=3", "bad dynamic tree option"),
    ("dynamic:budget=x", "must be a int"),
    ("dynamic:branch_p=1.5", "branch_p"),
])
def test_parse_tree_spec_errors(spec, msg):
    with pytest.raises(ValueError, match=msg):
        parse_tree_spec(spec)


def random_expand(seed, vocab=12):
    """Children distributions drawn at random per (depth, token path), reproducibly."""
    calls = []

    def expand(depth, node_ids, parent_ids, tokens):
        calls.append(depth)
        rows = []
        for nid, t in zip(node_ids, tokens):
            g = torch.Generator().manual_seed(seed * 1000 + depth * 100 + int(t))
            rows.append(torch.softmax(3 * torch.randn(vocab, generator=g), -1))
        return torch.stack(rows)

    expand.calls = calls
    return expand


def unpruned(root, cfg, expand, depth):
    """The reference: grow every depth, then keep the ``cfg.budget`` best nodes."""
    full = grow_dynamic(root, TreeConfig(budget=256, branching=cfg.branching, branch_p=cfg.branch_p,
                                         min_ratio=cfg.min_ratio), expand, depth)
    joint = [1.0]
    for i in range(1, len(full)):
        joint.append(joint[full.parents[i]] * full.draft_probs[i])
    best = sorted(range(1, len(full)), key=lambda i: (-joint[i], full.depths[i], i))[: cfg.budget]
    return sorted(token_path(full, i) for i in best)


def token_path(tree, i):
    """The tokens from the root's child down to node i."""
    path = []
    while i > 0:
        path.append(tree.tokens[i].item())
        i = tree.parents[i]
    return tuple(reversed(path))


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("budget", [1, 2, 3, 5, 9, 21])
def test_grow_dynamic_early_stop_gives_the_same_tree(seed, budget):
    """Stopping once the budget beats the frontier drafts exactly the unpruned tree."""
    cfg = TreeConfig(budget=budget, branching=3, branch_p=0.95, min_ratio=0.02)
    expand = random_expand(seed)
    tree = grow_dynamic(4, cfg, expand, max_depth=3)
    check_tree(tree)
    got = sorted(token_path(tree, i) for i in range(1, len(tree)))
    assert got == unpruned(4, cfg, random_expand(seed), 3)
    if budget == 1:
        assert expand.calls == [0]  # the best child of the root beats everything deeper


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("budget", [2, 3, 5])
def test_grow_dynamic_expands_only_nodes_whose_children_could_be_kept(seed, budget):
    """A node with ``budget`` nodes at least as probable already drafted is not expanded
    (its children would rank behind all of them): the tree is the unpruned one, and a
    budget of 2 expands a single node per depth (the best so far)."""
    cfg = TreeConfig(budget=budget, branching=budget, branch_p=1.0, min_ratio=0.0)
    rows = []
    expand = random_expand(seed)
    tree = grow_dynamic(4, cfg, lambda d, ids, *rest: rows.append(len(ids)) or expand(d, ids, *rest), max_depth=3)
    assert sorted(token_path(tree, i) for i in range(1, len(tree))) == unpruned(4, cfg, random_expand(seed), 3)
    if budget == 2:
        assert set(rows) == {1}
    assert sum(rows) < 1 + budget * 2  # unpruned: the root, then ``budget`` nodes at each further depth


@pytest.mark.parametrize("spec", ["dynamic", "dynamic:budget=4,branching=2", "small", "chain3"])
def test_grow_trees_in_lock_step_equals_each_alone(spec):
    """Rows of a batch grow together, one expand_many call per depth, each into the tree it
    grows alone (rows of different depth limits stop early: 0 = the root alone)."""
    cfg = parse_tree_spec(spec)
    roots, depths = [3, 5, 8, 2], [3, 1, 0, 2]
    rounds = []

    def expand_many(depth, requests):
        rounds.append((depth, [r[0] for r in requests]))
        expand = fixed_expand()
        return [expand(depth, node_ids, parent_ids, tokens) for _, node_ids, parent_ids, tokens in requests]

    trees = grow_trees(roots, cfg, expand_many, depths)
    for root, depth, tree in zip(roots, depths, trees):
        alone = grow_tree(root, cfg, fixed_expand(), depth)
        assert tree.tokens.tolist() == alone.tokens.tolist() and tree.parents == alone.parents
        assert tree.draft_probs == alone.draft_probs
    assert [d for d, _ in rounds] == list(range(len(rounds)))  # one call per depth
    assert 2 not in rounds[0][1]  # the depth-0 row never expands
    with pytest.raises(ValueError, match="depths"):
        grow_trees([1], cfg, expand_many, [1, 2])
