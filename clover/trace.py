"""Trace records: what one decoding step did, and what a whole run did.

Data flows one way: the engine (``clover.engine``) yields a :class:`StepTrace` per
decode step and returns a :class:`GenerationResult` at the end; the CLI, the app, the
benchmark and the notebooks only read these records.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Sequence

TARGET_TOP = 3  # the target's most likely next tokens kept per tree node (TreeNode.target_top)


@dataclass
class TreeNode:
    """One node of a step's candidate tree.

    Node 0 is the root: the last committed token (the previous step's bonus token, or
    the last prompt token), which the target has not yet processed. Its ``draft_prob``
    and ``target_prob`` are 1.0 by convention.

    Attributes:
        id: index of the node in the flattened tree (parents come before children).
        token_id: vocabulary id of the drafted token.
        text: the token decoded on its own (may be whitespace or a partial character).
        parent: id of the parent node, -1 for the root.
        depth: 0 for the root, d for a token drafted d positions ahead.
        draft_prob: the draft heads' probability of this token given its parent path
            (conditional, in [0, 1]).
        target_prob: the target's probability of this token given the prefix and the
            parent path (conditional, after temperature / top-k / top-p; greedy uses
            temperature 1).
        source: who proposed it: "root", "head" (the draft heads), "lookup" (prompt
            lookup) or "both".
        target_top: the target's own :data:`TARGET_TOP` most likely next tokens after this
            node, as (token_id, text, probability), most likely first (same distribution
            as ``target_prob``): what the target wanted at this node's children. Greedy
            verification accepts the child whose token is the first of them.
    """

    id: int
    token_id: int
    text: str
    parent: int
    depth: int
    draft_prob: float
    target_prob: float
    source: str = "head"
    target_top: list[tuple[int, str, float]] = field(default_factory=list)


@dataclass
class StepTrace:
    """What one decode step (draft -> verify -> accept -> cache update) did.

    Attributes:
        step: 0-based step index.
        nodes: the candidate tree, node 0 the root.
        accepted: node ids of the accepted path whose tokens were committed, root first
            (the root is always there).
        cut: node ids the target accepted after ``accepted`` but that were never
            committed, because generation ended inside the block (EOS, a stop string or
            ``max_new_tokens``); empty on every step but possibly the last.
        bonus_token / bonus_text: the token the target produced itself after the
            accepted path (verification's own token, committed or not).
        bonus_prob: the target's probability of the bonus token (after temperature /
            top-k / top-p; greedy uses temperature 1).
        bonus_committed: whether the bonus token is part of the output (False when
            generation ended before it).
        new_tokens: token ids committed by this step, in order (the drafts of
            ``accepted`` then, if committed, the bonus token).
        new_text: the text each of ``new_tokens`` adds to the output, same length: a
            character spanning several tokens appears with the token that completes it
            (the others add ""); special tokens appear as their text.
        accepted_length: tokens committed by this step, ``len(new_tokens)`` (tau,
            "tokens per step"): every per-step metric sums to the committed tokens.
        draft_ms / verify_ms: wall time of drafting (incl. head state refresh) and of
            verification (target forward, acceptance, KV-cache compaction, stop
            checks), in ms. Building this record is not included. In a batched run these
            are the whole step's times, every row's drafting and the one shared forward.
        forward_ms / accept_ms / update_ms: the parts of those, in ms (where the time
            goes): ``verify_ms = forward_ms + accept_ms`` (the target's forward over the
            tree, its inputs and the finite-logits check; then acceptance, committing
            the tokens and compacting the KV cache), and ``update_ms``, the drafters
            observing the verified states, is inside ``draft_ms`` (so drafting proper is
            ``draft_ms - update_ms``). 0.0 in records that do not split their time.
        total_tokens: new tokens generated so far, this step included.
        finished: True when generation stopped at this step.
        stop_reason: why it stopped ("eos", "length" or "stop_string") on the finished
            step, else None.
        row: which prompt of a batched run this step belongs to (its index in the
            batch as given; 0 for a single prompt).
        prefix_length: the committed positions in the target's KV cache before this step
            (the prompt but its last token, plus the tokens of earlier steps). Node i is
            verified at position id ``prefix_length + depth``; verification appends the
            tree's N positions after them and the update keeps only the accepted path's.
    """

    step: int
    nodes: list[TreeNode]
    accepted: list[int]
    bonus_token: int
    bonus_text: str
    new_tokens: list[int]
    accepted_length: int
    draft_ms: float
    verify_ms: float
    total_tokens: int
    finished: bool = False
    bonus_prob: float = 1.0
    cut: list[int] = field(default_factory=list)
    bonus_committed: bool = True
    new_text: list[str] = field(default_factory=list)
    stop_reason: str | None = None
    row: int = 0
    prefix_length: int = 0
    forward_ms: float = 0.0
    accept_ms: float = 0.0
    update_ms: float = 0.0


@dataclass
class GenerationResult:
    """The outcome of a whole generation run of one prompt (alone, or one row of a batch).

    Attributes:
        text: the generated text (special tokens removed).
        token_ids: generated token ids, EOS included when generation ended on it.
        steps: one :class:`StepTrace` per decode step.
        prompt_tokens: number of prompt tokens.
        prefill_ms: wall time of the prompt prefill, in ms.
        decode_s: decoding time in seconds: the sum of every step's draft_ms and
            verify_ms (time spent building traces or in the consumer is excluded); for a
            row of a batch, the time of the batch steps it took part in.
        stop_reason: "eos", "length" or "stop_string".
        method: the method's name (``clover.methods.ALL_METHODS``, e.g. "clover+lookup").
        seed: the sampling generator's seed (the given one, or the random one drawn),
            so a sampled run can be reproduced.
    """

    text: str
    token_ids: list[int]
    steps: list[StepTrace] = field(default_factory=list)
    prompt_tokens: int = 0
    prefill_ms: float = 0.0
    decode_s: float = 0.0
    stop_reason: str = "length"
    method: str = "ar"
    seed: int | None = None

    @property
    def mean_accepted_length(self) -> float:
        """Mean tokens committed per step (tau), bonus included; 1.0 for plain decoding."""
        if not self.steps:
            return 0.0
        return len(self.token_ids) / len(self.steps)

    @property
    def tokens_per_second(self) -> float:
        """New tokens per second of decode time (prefill excluded)."""
        return len(self.token_ids) / self.decode_s if self.decode_s > 0 else 0.0

    def summary(self) -> dict:
        """A JSON-ready dict of the run's headline figures."""
        return {
            "method": self.method,
            "text": self.text,
            "token_ids": self.token_ids,
            "new_tokens": len(self.token_ids),
            "steps": len(self.steps),
            "mean_accepted_length": round(self.mean_accepted_length, 4),
            "tokens_per_second": round(self.tokens_per_second, 3),
            "prompt_tokens": self.prompt_tokens,
            "prefill_ms": round(self.prefill_ms, 3),
            "decode_s": round(self.decode_s, 4),
            "stop_reason": self.stop_reason,
            "seed": self.seed,
        }


def step_to_dict(step: StepTrace) -> dict:
    """A JSON-ready dict of one step's trace (its nodes as dicts); read back with
    :func:`step_from_dict`."""
    return asdict(step)


def step_from_dict(d: dict) -> StepTrace:
    """The :class:`StepTrace` of a dict from :func:`step_to_dict` (also after a JSON
    round trip: ``target_top`` entries become tuples again).

    Raises:
        ValueError: when ``d`` lacks a field a step needs, or names one it does not have.
    """
    nodes = [TreeNode(**{**n, "target_top": [tuple(t) for t in n.get("target_top", [])]})
             for n in d.get("nodes", [])]
    names = {f.name for f in fields(StepTrace)}
    extra = set(d) - names
    if extra:
        raise ValueError(f"not a step trace: unknown field(s) {sorted(extra)}")
    try:
        return StepTrace(**{**d, "nodes": nodes})
    except TypeError as e:  # a required field is missing
        raise ValueError(f"not a step trace: {e}") from None


def result_to_dict(result: GenerationResult) -> dict:
    """A JSON-ready dict of a run's result, its steps as :func:`step_to_dict` gives them."""
    return asdict(result)


def result_from_dict(d: dict) -> GenerationResult:
    """The :class:`GenerationResult` of a dict from :func:`result_to_dict`.

    Raises:
        ValueError: when ``d`` or one of its steps is not such a dict.
    """
    names = {f.name for f in fields(GenerationResult)}
    extra = set(d) - names
    if extra or "text" not in d or "token_ids" not in d:
        raise ValueError(f"not a generation result: fields {sorted(d)}")
    return GenerationResult(**{**d, "steps": [step_from_dict(s) for s in d.get("steps", [])]})


def acceptance_by_depth(steps: Sequence[StepTrace]) -> list[tuple[int, int, int]]:
    """Acceptance per depth, the one definition (app, bench, notebooks): per draft depth
    d >= 1, (d, steps whose accepted path reached depth d, steps that drafted a node at
    depth d). Their ratio, :func:`acceptance_rates`, is the acceptance rate at depth d:
    of the steps that drafted depth d, the share that accepted a token there. Steps that
    drafted nothing that deep (a shallower or empty tree) do not count against it.

    Only committed tokens count: where generation ended inside a step's accepted block
    (EOS, stop string, length), the depths past the end are neither reached nor drafted.
    """
    drafted: dict[int, int] = {}
    reached: dict[int, int] = {}
    for s in steps:
        limit = len(s.accepted) - 1 if not s.bonus_committed else None
        for d in {n.depth for n in s.nodes if n.depth > 0 and (limit is None or n.depth <= limit)}:
            drafted[d] = drafted.get(d, 0) + 1
        for d in range(1, len(s.accepted)):
            reached[d] = reached.get(d, 0) + 1
    return [(d, reached.get(d, 0), drafted[d]) for d in sorted(drafted)]


def acceptance_rates(steps: Sequence[StepTrace], depth: int) -> list[float]:
    """The acceptance rate at depths 1..``depth`` (:func:`acceptance_by_depth`: reached
    over drafted), 0.0 at a depth no step drafted."""
    rows = {d: reached / drafted for d, reached, drafted in acceptance_by_depth(steps)}
    return [rows.get(d, 0.0) for d in range(1, depth + 1)]


def engine_ms(step: StepTrace) -> float:
    """Engine time of one step in ms: drafting plus verification (``decode_s`` is their
    sum over a run's steps)."""
    return step.draft_ms + step.verify_ms


def timeline(steps: Sequence[StepTrace]) -> list[tuple[float, int]]:
    """Cumulative (engine ms, tokens committed) after each step, starting at (0, 0).

    Tokens are counted from each step's ``accepted_length``, so the steps of several
    turns of one conversation may be given one after another. Steps of more than one
    ``row`` are a batched run (one turn): the rows of a batch step share its time, so
    each step index counts its time once and every row's tokens.
    """
    points, t, n = [(0.0, 0)], 0.0, 0
    if len({s.row for s in steps}) > 1:
        by_step: dict[int, list[StepTrace]] = {}
        for s in steps:
            by_step.setdefault(s.step, []).append(s)
        groups = [by_step[k] for k in sorted(by_step)]
    else:
        groups = [[s] for s in steps]
    for group in groups:
        t += engine_ms(group[0])
        n += sum(s.accepted_length for s in group)
        points.append((t, n))
    return points


def tokens_at(steps: Sequence[StepTrace], t_ms: float) -> int:
    """Tokens committed once ``t_ms`` of engine time has passed (a step's tokens land at
    its end)."""
    tokens = 0
    for t, n in timeline(steps):
        if t > t_ms:
            break
        tokens = n
    return tokens


def time_to_tokens(steps: Sequence[StepTrace], n: int) -> float | None:
    """Engine ms until at least ``n`` tokens were committed; None if the run never got there."""
    for t, tokens in timeline(steps):
        if tokens >= n:
            return t
    return None


def speedup(steps: Sequence[StepTrace], baseline: Sequence[StepTrace],
            lockstep: bool = False) -> float | None:
    """Speedup, the one definition (app, bench, notebooks): how many times faster
    ``steps`` committed its tokens than ``baseline`` did, in engine time (:func:`engine_ms`).

    Compared at the same token count: the baseline's time to reach the n tokens that
    ``steps`` has, over the time ``steps`` took for them. For two whole runs of the same
    text (greedy decoding is exact) that is the ratio of their tokens per second; for a
    live run it compares the same stretch of text. Where the baseline never reached n
    tokens (it stopped earlier, e.g. EOS when sampling), the ratio of the two runs'
    tokens per second. The bench averages this per prompt (or batch) over prompts.

    With ``lockstep`` the two runs stepped in lockstep, step k of each in round k, side
    by side in time (:func:`clover.methods.lockstep`, as the app runs its methods): they
    are compared over the rounds both took, their tokens per second over their first
    k = min(len(steps), len(baseline)) steps. Each stretch of the machine's load then
    falls on both runs' compared steps alike; at the same token count instead, the
    baseline's steps to n tokens come from later rounds than the faster run's (measured
    on a page recorded beside other work: 2.14x plain over 8 steps at the same token
    count, 1.6x over the same rounds, 1.26x over the whole run).

    Returns:
        The ratio (> 1: faster than the baseline), or None when either run has no
        tokens or no time.
    """
    if not steps or not baseline:
        return None
    if lockstep:
        k = min(len(steps), len(baseline))
        (t, n), (t_base, n_base) = timeline(steps[:k])[-1], timeline(baseline[:k])[-1]
        if min(n, n_base) == 0 or min(t, t_base) <= 0:
            return None
        return (n / t) / (n_base / t_base)
    (t, n), base = timeline(steps)[-1], timeline(baseline)
    if n == 0 or t <= 0:
        return None
    t_base = next((tb for tb, nb in base if nb >= n), None)  # as time_to_tokens(baseline, n)
    if t_base is not None:
        return t_base / t
    t_all, n_all = base[-1]
    if n_all == 0 or t_all <= 0:
        return None
    return (n / t) / (n_all / t_all)


def tree_nodes(tree, probs, tokenizer) -> list[TreeNode]:
    """Trace records of the tree: each node's target probability (at its parent) and
    the target's own :data:`~clover.trace.TARGET_TOP` most likely next tokens after it.

    Args:
        tree: the step's :class:`clover.tree.Tree` of N nodes.
        probs: (N, V) torch tensor, the target's distribution after each node
            (``clover.acceptance.logits_to_probs``).
        tokenizer: the target's, for the tokens' texts.
    """
    import torch

    from clover.models import token_texts

    tok = tokenizer
    ids = tree.tokens.tolist()
    parents = torch.tensor([max(p, 0) for p in tree.parents], device=probs.device)
    target_p = probs[parents].gather(-1, tree.tokens[:, None].to(probs.device))[:, 0].tolist()
    target_p[0] = 1.0  # the root: committed already
    top = probs.topk(min(TARGET_TOP, probs.shape[-1]), dim=-1)  # (N, k)
    top_ids, top_p = top.indices.tolist(), top.values.tolist()
    texts = token_texts(tok, ids)
    top_texts = token_texts(tok, [t for row in top_ids for t in row])
    k = len(top_ids[0])
    sources = tree.sources or ["root"] + ["head"] * (len(tree) - 1)
    return [TreeNode(i, ids[i], texts[i], tree.parents[i], tree.depths[i],
                     float(tree.draft_probs[i]), float(target_p[i]), sources[i],
                     target_top=[(top_ids[i][j], top_texts[i * k + j], float(top_p[i][j]))
                                 for j in range(k)])
            for i in range(len(tree))]
