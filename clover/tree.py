"""Candidate trees: static path lists, dynamic top-k growth, tree mask, position ids.

A candidate tree holds N nodes in breadth-first order; node 0 is the root, the last
committed token that the target has not processed yet. Every other node is a token
drafted ``depth`` positions after the root. Verification runs the target once over all
N nodes with a *tree attention mask* (each node sees the cached prefix, its ancestors
and itself) and position ids ``prefix_len + depth`` (Medusa, arXiv 2401.10774 §2.1.2;
Clover, arXiv 2405.00263 §3).

Two ways to grow a tree, both driven by an ``expand`` callback that a drafter supplies:

* static: a list of paths in Medusa's format, e.g. ``[[0], [1], [0, 0]]``: path
  ``(r1, ..., rd)`` is the node reached by taking the r1-th most likely child of the
  root, then the r2-th most likely child of that node, and so on.
* dynamic: expand each frontier node's top-k children, score every node by its joint
  draft probability (product along the path), keep the ``branching`` best nodes per depth as
  the next frontier and the ``budget`` best nodes overall (EAGLE-2, arXiv 2406.16858
  §4; Clover-1's sampler adds a per-head top-p and a floor relative to the best token).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable, Container, Generator, Sequence

import torch

# expand(depth, node_ids, parent_ids, node_tokens) -> draft probabilities of the children
# of those nodes, a float tensor (n, V') over the draft vocabulary (column j is token
# ``vocab[j]``, or token j when the growth is given no ``vocab``). ``depth`` is the depth
# of the expanded nodes (0 = root). Node ids are unique within one growth; the root is 0
# and its parent -1.
ExpandFn = Callable[[int, list[int], list[int], list[int]], torch.Tensor]

# Named static trees, found by exact key.
# Bounds on every tree form (nodes drafted, children per node, depth). A verification
# forward costs ~14% of a plain step per extra node on a 2-core CPU, so trees far below
# these pay; the bounds only stop requests that would stall a shared server.
MAX_TREE_NODES = 256
MAX_BRANCHING = 64
MAX_TREE_DEPTH = 64

# the older spellings of dynamic tree spec keys (results files and commands written before
# the rename), read as the current ones
SPEC_ALIASES = {"topk": "branching", "top_p": "branch_p"}

STATIC_TREES: dict[str, tuple[tuple[int, ...], ...]] = {
    "chain2": ((0,), (0, 0)),
    "chain3": ((0,), (0, 0), (0, 0, 0)),
    "small": ((0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0)),
    "medium": (
        (0,), (1,), (2,), (3,),
        (0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (2, 0),
        (0, 0, 0), (0, 0, 1), (0, 1, 0), (1, 0, 0),
        (0, 0, 0, 0),
    ),
}


@dataclass(frozen=True)
class TreeConfig:
    """How to grow the candidate tree each step.

    Every form is bounded here, before any model work, whoever builds it (CLI, app, API,
    library): at most :data:`MAX_TREE_NODES` drafted nodes, :data:`MAX_BRANCHING` children per
    node and :data:`MAX_TREE_DEPTH` levels; ``ValueError`` otherwise.

    Attributes:
        kind: "static" (use ``paths``), "dynamic" (grow by joint draft probability) or
            "off" (draft nothing: plain decoding, the heads unused; what the auto tree
            chooses when no tree beats plain decoding on this machine).
        paths: static tree, Medusa's format (tuples of child ranks, 0 = most likely).
        budget: dynamic tree: drafted nodes kept, root excluded (N - 1).
        branching: dynamic tree: children proposed per expanded node, and nodes expanded
            per depth, at most the budget (EAGLE-2's top-k, 10 there too; named apart from
            the target's sampling ``SamplingConfig.top_k``, which it has nothing to do
            with). At the default the tree is exactly the budget's most probable nodes
            that pass ``branch_p`` and ``min_ratio``, for budgets up to 10; the narrower
            3 accepted 7-9% fewer tokens per step at a budget of 10 (held-out prompts,
            Medusa and Clover; docs/benchmarks.md).
        branch_p: dynamic tree: the draft side's nucleus; a node's children are cut once
            their cumulative draft probability reaches ``branch_p`` (not the target's
            ``SamplingConfig.top_p``).
        min_ratio: dynamic tree: a child is dropped when its draft probability is below
            ``min_ratio`` times its best sibling's.
        max_depth: deepest drafted level; None means one level per draft head.
        auto: size ``budget`` to the hardware and heads; resolved into a concrete tree
            before an engine is built, by :func:`clover.calibration.resolve_tree` (the CLI,
            bench, app and :func:`clover.engine_for` call it; ``Engine`` refuses an
            unresolved one). The other fields are the starting point.
    """

    kind: str = "dynamic"
    paths: tuple[tuple[int, ...], ...] = ()
    budget: int = 10
    branching: int = 10
    branch_p: float = 0.95
    min_ratio: float = 0.02
    max_depth: int | None = None
    auto: bool = False

    def __post_init__(self):
        if self.kind not in ("static", "dynamic", "off"):
            raise ValueError(f"tree kind must be 'static', 'dynamic' or 'off', got {self.kind!r}")
        if self.auto and self.kind != "dynamic":
            raise ValueError("only a dynamic tree can be sized automatically")
        if self.kind == "static":
            validate_paths(self.paths)
        elif self.kind == "dynamic":
            if not 1 <= self.budget <= MAX_TREE_NODES:
                raise ValueError(f"tree budget must be in [1, {MAX_TREE_NODES}], got {self.budget}")
            if not 1 <= self.branching <= MAX_BRANCHING:
                raise ValueError(f"tree branching must be in [1, {MAX_BRANCHING}], got {self.branching}")
            if not 0.0 < self.branch_p <= 1.0:
                raise ValueError(f"tree branch_p must be in (0, 1], got {self.branch_p}")
            if not 0.0 <= self.min_ratio < 1.0:
                raise ValueError(f"tree min_ratio must be in [0, 1), got {self.min_ratio}")
        if self.max_depth is not None and not 1 <= self.max_depth <= MAX_TREE_DEPTH:
            raise ValueError(f"tree max_depth must be in [1, {MAX_TREE_DEPTH}], got {self.max_depth}")

    @property
    def nodes(self) -> int:
        """The most drafted nodes of one tree, root excluded (0 when off): a static tree's
        paths, a dynamic tree's budget."""
        if self.off:
            return 0
        return len(self.paths) if self.kind == "static" else self.budget

    @property
    def deepest(self) -> int:
        """The most levels this tree can ever draft (0 when off): a static tree's longest
        path, a dynamic tree's budget (all of it one chain), each capped by ``max_depth``.
        Lets drafters that compute every level at once (Medusa) skip the unreachable ones."""
        if self.off:
            return 0
        levels = max(len(p) for p in self.paths) if self.kind == "static" else self.budget
        return levels if self.max_depth is None else min(levels, self.max_depth)

    @property
    def off(self) -> bool:
        """True when nothing is drafted (plain decoding)."""
        return self.kind == "off"

    def describe(self) -> str:
        """A short human-readable name, e.g. "dynamic, 10 drafted tokens"."""
        if self.off:
            return "speculation off (no tree beats plain decoding here)"
        return f"{self.kind}, {self.nodes} drafted tokens"


def validate_paths(paths) -> None:
    """Check a static path list: non-empty, ranks >= 0, every prefix present.

    Raises:
        ValueError: with the offending path.
    """
    if not paths:
        raise ValueError("a static tree needs at least one path, e.g. [[0]]")
    if len(paths) > MAX_TREE_NODES:
        raise ValueError(f"a static tree may have at most {MAX_TREE_NODES} paths, got {len(paths)}")
    seen = set()
    for p in paths:
        if not isinstance(p, (tuple, list)) or not p:
            raise ValueError(f"tree path must be a non-empty list of ranks, got {p!r}")
        if len(p) > MAX_TREE_DEPTH:
            raise ValueError(f"tree paths may be at most {MAX_TREE_DEPTH} deep, got {len(p)}")
        if not all(isinstance(r, int) and not isinstance(r, bool) and 0 <= r < MAX_BRANCHING for r in p):
            raise ValueError(f"tree path ranks must be integers in [0, {MAX_BRANCHING}), got {list(p)}")
        seen.add(tuple(p))
    for p in seen:
        if len(p) > 1 and p[:-1] not in seen:
            raise ValueError(f"tree path {list(p)} needs its parent path {list(p[:-1])}")
    if len(seen) != len(paths):
        raise ValueError("tree paths must not repeat")


def parse_tree_spec(spec: str | None) -> TreeConfig:
    """Parse a tree spec from the CLI or the app.

    Accepted forms: ``"auto"`` (a dynamic tree sized for this machine by
    :func:`clover.calibration.resolve_tree`),
    ``"off"`` (draft nothing),
    ``None`` or ``"dynamic"`` (defaults), ``"dynamic:budget=12,branching=4"``
    (any TreeConfig field of a dynamic tree), a preset name from :data:`STATIC_TREES`
    (exact key), or a JSON path list such as ``"[[0],[1],[0,0]]"``.

    Raises:
        ValueError: for anything else, naming what was expected.
    """
    if spec is None or spec.strip() == "" or spec.strip() == "dynamic":
        return TreeConfig()
    spec = spec.strip()
    if spec == "auto":
        return TreeConfig(auto=True)
    if spec == "off":
        return TreeConfig(kind="off")
    if spec in STATIC_TREES:
        return TreeConfig(kind="static", paths=STATIC_TREES[spec])
    if spec.startswith("["):
        try:
            paths = json.loads(spec)
        except json.JSONDecodeError as e:
            raise ValueError(f"tree spec is not valid JSON: {e}") from None
        if not isinstance(paths, list):
            raise ValueError("a JSON tree spec must be a list of paths, e.g. [[0],[1],[0,0]]")
        validate_paths(paths)
        return TreeConfig(kind="static", paths=tuple(tuple(p) for p in paths))
    if spec.startswith("dynamic:"):
        kwargs = {}
        types = {"budget": int, "branching": int, "branch_p": float, "min_ratio": float, "max_depth": int}
        for item in spec[len("dynamic:"):].split(","):
            key, eq, value = item.partition("=")
            key = SPEC_ALIASES.get(key.strip(), key.strip())
            if not eq or key not in types:
                raise ValueError(
                    f"bad dynamic tree option {item!r}; use key=value with keys {sorted(types)}"
                )
            try:
                kwargs[key] = types[key](value)
            except ValueError:
                raise ValueError(f"tree option {key} must be a {types[key].__name__}, got {value!r}") from None
        return TreeConfig(kind="dynamic", **kwargs)
    raise ValueError(
        f"unknown tree spec {spec!r}: use 'auto', 'dynamic', 'dynamic:budget=N,branching=K', "
        f"a JSON path list like '[[0],[1],[0,0]]', or one of {sorted(STATIC_TREES)}"
    )


@dataclass
class Tree:
    """A candidate tree in breadth-first order (parents before children).

    Attributes:
        tokens: (N,) long, token id per node; node 0 is the root.
        parents: length N, parent node id, -1 for the root.
        depths: length N, 0 for the root.
        draft_probs: length N, conditional draft probability (1.0 for the root).
        sources: length N, who proposed each node: "root", "head" (the draft heads),
            "lookup" (prompt lookup, ``clover.lookup``) or "both"; None = the root and
            head nodes only.
    """

    tokens: torch.Tensor
    parents: list[int]
    depths: list[int]
    draft_probs: list[float]
    sources: list[str] | None = None

    def __len__(self) -> int:
        return len(self.parents)

    def children(self) -> list[list[int]]:
        """Children ids per node, ordered by draft probability (highest first)."""
        kids: list[list[int]] = [[] for _ in self.parents]
        for i, p in enumerate(self.parents):
            if p >= 0:
                kids[p].append(i)
        for k in kids:
            k.sort(key=lambda i: -self.draft_probs[i])
        return kids

    def joint_probs(self) -> list[float]:
        """Joint draft probability per node (:func:`joint_probs`)."""
        return joint_probs(self.parents, self.draft_probs)

    def follow(self, wanted: Callable[[int, int], int | None],
               keep: Container[int] | None = None) -> list[int]:
        """The greedy path walk, the one definition (verification's greedy acceptance and
        the auto tree's calibration): from the root, move to the child whose token is
        ``wanted(node, depth)`` (only through nodes in ``keep``, node ids, when given)
        until no child matches (or ``wanted`` returns None).

        Returns:
            node ids of the path, the root (0) first.
        """
        kids = self.children()
        ids = self.tokens.tolist()
        path = [0]
        while True:
            tok = wanted(path[-1], len(path) - 1)
            nxt = None if tok is None else next(
                (c for c in kids[path[-1]] if ids[c] == tok and (keep is None or c in keep)), None)
            if nxt is None:
                return path
            path.append(nxt)

    def matched_path(self, tokens: Sequence[int], keep: Container[int] | None = None) -> int:
        """How many leading ``tokens`` the tree holds as a path from the root (only
        through nodes in ``keep``, node ids, when given): under greedy decoding with the
        target's continuation ``tokens``, the number of drafts verification accepts."""
        return len(self.follow(lambda node, d: tokens[d] if d < len(tokens) else None, keep)) - 1


def joint_probs(parents: Sequence[int], draft_probs: Sequence[float]) -> list[float]:
    """Joint draft probability per node (the product of the conditional draft
    probabilities on its root path; 1.0 for the root). Parents come before children."""
    joint = [1.0] * len(draft_probs)
    for i in range(1, len(draft_probs)):
        joint[i] = joint[parents[i]] * draft_probs[i]
    return joint


def best_by_joint(joint: Sequence[float], depths: Sequence[int], n: int) -> list[int]:
    """Ids of the ``n`` best drafted nodes (node 0, the root, is never ranked) by joint
    draft probability, best first; ties go to the shallower, then the earlier node.

    A node's joint probability never exceeds its parent's, so the root plus any such
    prefix of the ranking is a subtree: the one rule behind the dynamic tree's budget,
    the auto tree's budget sweep and the lookup branch's merge.
    """
    return sorted(range(1, len(joint)), key=lambda i: (-joint[i], depths[i], i))[:max(n, 0)]


def root_only(root_token: int, device: torch.device | str = "cpu") -> Tree:
    """The empty tree of plain autoregressive decoding: just the root."""
    return Tree(torch.tensor([root_token], device=device), [-1], [0], [1.0])


def ancestor_matrix(parents: list[int]) -> torch.Tensor:
    """(N, N) bool: ``[i, j]`` is True when j is i or an ancestor of i.

    Requires parents to come before children (``parents[i] < i``).
    """
    n = len(parents)
    anc = torch.eye(n, dtype=torch.bool)
    for i, p in enumerate(parents):
        if p >= 0:
            anc[i] |= anc[p]
    return anc


def tree_mask(parents: list[int], prefix_len: int, dtype: torch.dtype, device) -> torch.Tensor:
    """The tree attention mask for verification, as an additive float mask.

    Returns:
        (1, 1, N, prefix_len + N) tensor of ``dtype``: 0 where node i may attend (the
        whole cached prefix, its ancestors and itself), ``finfo(dtype).min`` elsewhere.
        A float mask is used because transformers treats a 4D float mask verbatim,
        while a 4D bool mask is silently mishandled by some attention backends.
    """
    anc = ancestor_matrix(parents).to(device)
    n = len(parents)
    mask = torch.zeros(1, 1, n, prefix_len + n, dtype=dtype, device=device)
    mask[0, 0, :, prefix_len:].masked_fill_(~anc, torch.finfo(dtype).min)
    return mask


def position_ids(depths: list[int], prefix_len: int, device) -> torch.Tensor:
    """(1, N) long position ids for the tree nodes: ``prefix_len + depth``."""
    return (torch.tensor(depths, device=device) + prefix_len).unsqueeze(0)


def batch_tree_mask(parents: Sequence[list[int]], lengths: Sequence[int], prefix_len: int,
                    dtype: torch.dtype, device, width: int | None = None) -> torch.Tensor:
    """:func:`tree_mask` for B rows' trees over a right-padded KV cache (batched
    decoding, ``clover.engine``): row b holds ``lengths[b]`` committed positions, cache
    columns ``[0, L_b)``, of the cache's ``prefix_len`` (P); its trees are padded to
    N = max N_b nodes, or to ``width`` when that is more.

    Returns:
        (B, 1, N, P + N) tensor of ``dtype``: 0 where row b's node i may attend (the
        row's committed columns, its ancestors, itself), ``finfo(dtype).min`` elsewhere; a
        padding node attends only to itself and nothing attends to it.
    Raises:
        ValueError: when the lists differ in length or a row claims more than P positions.
    """
    if len(parents) != len(lengths):
        raise ValueError(f"{len(parents)} trees but {len(lengths)} row lengths")
    if any(n > prefix_len for n in lengths):
        raise ValueError(f"row lengths {list(lengths)} exceed the cache's {prefix_len} positions")
    b, n = len(parents), max(max(len(p) for p in parents), width or 0)
    anc = torch.eye(n, dtype=torch.bool).repeat(b, 1, 1)  # (B, N, N): padding sees itself
    for row, par in enumerate(parents):
        if len(par) > 1:
            anc[row, :len(par), :len(par)] = ancestor_matrix(list(par))
    real = torch.arange(n)[None, :] < torch.tensor([len(p) for p in parents])[:, None]  # (B, N)
    committed = torch.arange(prefix_len)[None, :] < torch.tensor(list(lengths))[:, None]  # (B, P)
    allowed = torch.cat([real[:, :, None] & committed[:, None, :], anc], dim=-1)  # (B, N, P+N)
    mask = torch.zeros((b, 1, n, prefix_len + n), dtype=dtype, device=device)
    mask.masked_fill_(~allowed[:, None].to(device), torch.finfo(dtype).min)
    return mask


def batch_position_ids(depths: Sequence[list[int]], lengths: Sequence[int], device,
                       width: int | None = None) -> torch.Tensor:
    """(B, N) long position ids of B rows' trees padded to N = max N_b nodes (or ``width``
    when more): row b's node at ``depth`` sits at ``lengths[b] + depth`` (padding nodes
    at ``lengths[b]``)."""
    n = max(max(len(d) for d in depths), width or 0)
    return torch.tensor([[L + d for d in ds] + [L] * (n - len(ds)) for L, ds in zip(lengths, depths)],
                        device=device)


def _top(dist: torch.Tensor, k: int, vocab: torch.Tensor | None):
    """Top-k probabilities and token ids per row, as Python lists (one host sync)."""
    top_p, top_i = dist.topk(k, dim=-1)
    if vocab is not None:
        top_i = vocab[top_i]
    return top_p.tolist(), top_i.tolist()


# A growth is a generator: it yields each expand request ``(depth, node_ids, parent_ids,
# node_tokens)`` (the arguments of an ExpandFn), is sent the children's draft probabilities
# (n, V'), and returns the Tree. One driver serves one tree (:func:`grow_tree`), another
# many trees in lock step (:func:`grow_trees`), with the same growth code.
Growth = Generator[tuple[int, list[int], list[int], list[int]], torch.Tensor, Tree]


def _drive(growth: Growth, expand: ExpandFn) -> Tree:
    """Run one growth, answering its requests with ``expand``."""
    try:
        request = next(growth)
        while True:
            request = growth.send(expand(*request))
    except StopIteration as done:
        return done.value


def grow_static(root_token: int, paths, expand: ExpandFn, max_depth: int,
                vocab: torch.Tensor | None = None) -> Tree:
    """Grow a static tree from Medusa-style paths, one ``expand`` call per depth.

    Paths deeper than ``max_depth`` are dropped.

    Raises:
        ValueError: when a rank exceeds the vocabulary size.
    """
    return _drive(static_growth(root_token, paths, max_depth, vocab), expand)


def static_growth(root_token: int, paths, max_depth: int, vocab: torch.Tensor | None = None) -> Growth:
    """:func:`grow_static` as a growth (see :data:`Growth`)."""
    paths = sorted({tuple(p) for p in paths if len(p) <= max_depth}, key=lambda p: (len(p), p))
    node_of = {(): 0}
    tokens, parents, depths, probs = [root_token], [-1], [0], [1.0]
    for d in range(max_depth):
        level = [p for p in paths if len(p) == d + 1]
        if not level:
            break
        parent_paths = sorted({p[:-1] for p in level})
        parent_ids = [node_of[p] for p in parent_paths]
        grand_ids = [parents[i] for i in parent_ids]
        dist = yield d, parent_ids, grand_ids, [tokens[i] for i in parent_ids]  # (n, V)
        k = max(p[-1] for p in level) + 1
        if k > dist.shape[-1]:
            raise ValueError(f"tree rank {k - 1} exceeds the vocabulary size {dist.shape[-1]}")
        top_p, top_t = _top(dist, k, vocab)  # (n, k) each
        row = {p: r for r, p in enumerate(parent_paths)}
        for p in level:
            r = row[p[:-1]]
            node_of[p] = len(tokens)
            tokens.append(top_t[r][p[-1]])
            parents.append(node_of[p[:-1]])
            depths.append(d + 1)
            probs.append(top_p[r][p[-1]])
    return Tree(torch.tensor(tokens), parents, depths, probs)


def grow_dynamic(root_token: int, cfg: TreeConfig, expand: ExpandFn, max_depth: int,
                 vocab: torch.Tensor | None = None) -> Tree:
    """Grow a dynamic tree; see :func:`dynamic_growth`."""
    return _drive(dynamic_growth(root_token, cfg, max_depth, vocab), expand)


def dynamic_growth(root_token: int, cfg: TreeConfig, max_depth: int,
                   vocab: torch.Tensor | None = None) -> Growth:
    """Grow a dynamic tree by joint draft probability (EAGLE-2 style, Clover-1 sampler).

    Per depth: expand the frontier (at most k = min(``cfg.branching``, ``cfg.budget``)
    nodes), propose each node's top k children that survive the top-p cut and the
    ``min_ratio`` floor, score them by joint probability; the k best become the next
    frontier. At the end keep the ``cfg.budget`` best nodes overall. A child's joint
    probability never exceeds its parent's, and ties are broken by depth, so the kept set
    is a tree; for the same reason the growth stops early once ``cfg.budget`` nodes beat
    the whole frontier, and k never needs to exceed the budget (a node outside its
    depth's best ``budget``, or past its parent's ``budget``-th child, has ``budget``
    better nodes already): a small budget costs fewer head calls, with an identical tree.
    With ``branching >= budget`` the tree is the ``budget`` nodes of highest joint draft
    probability among all that pass the filters, as deep as the heads reach. Likewise a
    frontier node with ``cfg.budget`` nodes at least as probable already drafted is not
    expanded (its children could not be kept).
    """
    # candidate pool: (joint, depth, id, token, parent id, prob); the root has id 0
    pool: list[tuple[float, int, int, int, int, float]] = []
    frontier = [(0, -1, root_token, 1.0)]  # (id, parent id, token, joint)
    width = min(cfg.branching, cfg.budget)  # wider can only add nodes the budget drops
    for d in range(max_depth):
        # a child of f ranks behind every node already drafted whose joint probability is
        # at least f's (f included: a child's joint is at most its parent's, and a tie
        # goes to the shallower node), so f is expanded only while fewer than the budget
        # are: the same tree, fewer head calls (a budget of 2 expands one node per depth)
        joints = sorted((c[0] for c in pool), reverse=True)
        frontier = [f for f in frontier if sum(1 for j in joints[:cfg.budget] if j >= f[3]) < cfg.budget]
        if not frontier:
            break
        dist = yield d, [f[0] for f in frontier], [f[1] for f in frontier], [f[2] for f in frontier]  # (n, V)
        top_p, top_t = _top(dist, min(width, dist.shape[-1]), vocab)
        level = []
        for (pid, _, _, joint), ps, ts in zip(frontier, top_p, top_t):
            cum = 0.0
            for j, (p, t) in enumerate(zip(ps, ts)):
                if j > 0 and (cum >= cfg.branch_p or p < cfg.min_ratio * ps[0]):
                    break
                cum += p
                level.append((joint * p, d + 1, len(pool) + 1, t, pid, p))
                pool.append(level[-1])
        level.sort(key=lambda c: -c[0])
        frontier = [(c[2], c[4], c[3], c[0]) for c in level[:width]]
    kept = [pool[i - 1] for i in best_by_joint([1.0] + [c[0] for c in pool], [0] + [c[1] for c in pool],
                                               cfg.budget)]  # pool entry i - 1 has id i
    # re-index breadth first, siblings by draft probability
    kept.sort(key=lambda c: (c[1], -c[0]))
    new_id = {0: 0}
    tokens, parents, depths, probs = [root_token], [-1], [0], [1.0]
    for joint, depth, nid, tok, pid, p in kept:
        if pid not in new_id:  # unreachable by construction; guard against float ties
            continue
        new_id[nid] = len(tokens)
        tokens.append(tok)
        parents.append(new_id[pid])
        depths.append(depth)
        probs.append(p)
    return Tree(torch.tensor(tokens), parents, depths, probs)


def grow_tree(root_token: int, cfg: TreeConfig, expand: ExpandFn, max_depth: int,
              vocab: torch.Tensor | None = None) -> Tree:
    """Grow a tree of either kind; ``max_depth`` caps the drafted depth (>= 0);
    ``vocab`` maps draft-vocabulary columns to token ids (None: the full vocabulary)."""
    return _drive(growth(root_token, cfg, max_depth, vocab), expand)


def growth(root_token: int, cfg: TreeConfig, max_depth: int, vocab: torch.Tensor | None = None) -> Growth:
    """:func:`grow_tree` as a growth (see :data:`Growth`)."""
    if cfg.max_depth is not None:
        max_depth = min(max_depth, cfg.max_depth)
    if max_depth <= 0:
        return root_only(root_token)
    if cfg.kind == "static":
        return (yield from static_growth(root_token, cfg.paths, max_depth, vocab))
    return (yield from dynamic_growth(root_token, cfg, max_depth, vocab))


# expand_many(depth, requests) -> one (n, V') probability tensor per request, in order; a
# request is (row, node_ids, parent_ids, node_tokens) of one tree, all at ``depth``
ExpandManyFn = Callable[[int, list[tuple[int, list[int], list[int], list[int]]]], list[torch.Tensor]]


def grow_trees(roots: Sequence[int], cfg: TreeConfig, expand_many: ExpandManyFn,
               max_depths: Sequence[int], vocab: torch.Tensor | None = None) -> list[Tree]:
    """Grow one tree per row of a batch in lock step, each exactly as :func:`grow_tree`
    grows it alone: every round, the rows still growing expand their nodes of one depth,
    and one ``expand_many`` call serves them all (e.g. one head call over every row's
    nodes). Returns the trees in row order.

    Raises:
        ValueError: when ``roots`` and ``max_depths`` differ in length.
    """
    if len(roots) != len(max_depths):
        raise ValueError(f"{len(roots)} roots but {len(max_depths)} depths")
    growths = [growth(r, cfg, d, vocab) for r, d in zip(roots, max_depths)]
    trees: list[Tree | None] = [None] * len(growths)
    pending: dict[int, tuple] = {}  # row -> its request

    def advance(row: int, dist: torch.Tensor | None) -> None:
        try:
            pending[row] = next(growths[row]) if dist is None else growths[row].send(dist)
        except StopIteration as done:
            trees[row] = done.value
            pending.pop(row, None)

    for row in range(len(growths)):
        advance(row, None)
    while pending:
        depth = min(request[0] for request in pending.values())  # rows grow one depth a round
        rows = [row for row, request in pending.items() if request[0] == depth]
        dists = expand_many(depth, [(row, *pending[row][1:]) for row in rows])
        for row, dist in zip(rows, dists):
            advance(row, dist)
    return trees
