"""``--tree auto``: size the dynamic candidate tree to this hardware and these heads.

Expected speed of a tree budget N (drafted nodes) is

    tokens/s(N) = tau(N) / (draft_s(N) + verify_s(N))

* verify_s(N): one target forward over N + 1 tree nodes on top of a KV cache, timed
  here (the cost curve: nearly flat on a GPU, rising early on a CPU);
* draft_s(N): the heads' time per step for that budget, timed here as the engine spends
  it: refreshing their state over the positions the last step verified, then drafting,
  right after a target forward;
* tau(N): tokens per step the heads achieve with that budget. The dynamic tree keeps the
  N best nodes by joint draft probability from a pool that does not depend on N, so one
  large tree per position gives the tree of every smaller budget. On calibration text
  (the target's own greedy answers to a few short prompts) the accepted length of every
  budget is computed exactly, without a verification forward per budget.

This is EAGLE-2's idea of choosing the total token count from measured cost and
acceptance (arXiv 2406.16858 §5), applied per machine at load time.

The timing is :mod:`clover.timing`'s, the machine's load :mod:`clover.machine`'s; what
is measured is kept, and asked for, through :mod:`clover.calibration` (its
:class:`~clover.calibration.Calibrator`, :func:`~clover.calibration.resolve_tree`).
"""
from __future__ import annotations

import logging
import math
import statistics
import threading
import time
import weakref
from dataclasses import dataclass, replace
from typing import Sequence

import torch

from clover import machine
from clover.assets import read_store, write_record
from clover.engine import Engine
from clover.machine import load_snapshot, others_load
from clover.timing import interleaved_ms, prefilled_rows, verify_once
from clover.heads.drafter import draft_rows, observe_rows
from clover.models import encode_prompt
from clover.tree import Tree, TreeConfig, best_by_joint, root_only

log = logging.getLogger(__name__)

# one short single-turn prompt per task kind of the benchmark, written for calibration
# (not taken from the training or benchmark files), so tau(N) is not tuned to one kind
# of text
CALIBRATION_PROMPTS = (
    "Give three tips for staying focused while studying.",
    "Translate to French: The library opens at nine in the morning and closes at six.",
    "Summarise in two sentences: The town council met on Monday to discuss the new bus "
    "routes. Residents asked for later evening services and a stop near the hospital. "
    "The council agreed to run a six-month trial starting in spring.",
    "Why do leaves change colour in autumn?",
    "A shop sells pens at 3 dollars each. How much do 7 pens cost? Explain step by step.",
    "Using this note, answer the question. Note: The museum is closed on Mondays; tickets "
    "cost 12 euros, 6 for students. Question: How much do two students pay?",
    "Write a Python function that merges two sorted lists into one sorted list.",
)
BUDGETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
# Tokens of the target's own answer per calibration prompt over which tau is measured.
# An answer's first tokens are the hardest to draft, so a short calibration text
# under-rates every budget and a second drafted token most: on a 2-core CPU (2026-12-06,
# v11 heads) 32 tokens gave Clover tau 1.38 / 1.53 at one / two drafted tokens (expected
# 1.286x / 1.288x plain, so one was kept) and 128 gave 1.46 / 1.69 (1.37x / 1.43x, two
# chosen; Medusa likewise); in the engine, on 13 Spec-Bench questions of 128 tokens, two
# drafted tokens decoded faster for every head method (Clover 1.313x -> 1.345x plain,
# Medusa 1.22x -> 1.26x, Clover + lookup 1.387x -> 1.414x, Medusa + lookup 1.363x ->
# 1.381x). 128 is also what the benchmark decodes by default (the app: 64).
CALIBRATION_TOKENS = 128
# The expected speedup a tree must reach to be used at all: below it, timing noise could
# make speculation a loss (two interleaved calibrations on this 2-core CPU differ by up to
# 3% in their expected speedup).
MIN_GAIN = 1.05
# Budgets whose expected speed is within this fraction of the fastest one's count as
# tied, and the smallest of them is picked: the calibration times bare forwards at a
# 256-token prefix, and a real step costs more with the tree (acceptance, the cache's
# compaction, longer prompts). Measured 2026-12-05 on a 2-core CPU, Clover v11: one and
# three drafted tokens expected 0.4% apart, but on twelve Spec-Bench questions one
# drafted token decoded 6% faster; Medusa's choice flipped between one and four drafted
# tokens from run to run (2% apart).
TIE_MARGIN = 0.03
# How auto_tree times a budget, part of every stored choice's key: a choice measured
# another way is measured again (2: drafting timed with the state refresh, after a
# forward; 3: ties within TIE_MARGIN go to the smaller budget; 4: tau over
# CALIBRATION_TOKENS = 128 tokens per prompt instead of 32; 5: heads draft through
# kernels timed for them, the fp16 one among them, and a cheaper block and tree growth;
# forwards timed on the engine's preallocated KV cache, which copies no cache per forward)
TIMING = 5


@dataclass
class AutoTreeReport:
    """What ``auto_tree`` measured, per budget N: tau, draft and verify ms (each call's
    fastest repeat), and the nodes the timed tree really had (at most N; fewer when the
    heads' top-p and ``min_ratio`` cuts leave fewer candidates); ``plain_ms`` is one plain
    step (its fastest repeat).

    Attributes:
        chosen: the budget picked, 0 for "off".
        expected: ``best_budget``'s expected speedup over plain decoding (x).
        best_budget: the budget :func:`pick_budget` takes, even when no tree is used.
        spread: a plain step's median over its fastest repeat while timing (1.0 = steady).
        others_load: CPUs' worth of work other processes did while timing (None: unknown).
        Where :func:`clover.machine.busy` says so of them, the machine was busy, and
        the choice is stored as provisional (:func:`calibrate`).
    """

    budgets: list[int]
    tau: list[float]
    draft_ms: list[float]
    verify_ms: list[float]
    plain_ms: float
    chosen: int
    nodes: list[int] = None
    expected: float = 0.0
    best_budget: int = 0
    spread: float = 1.0
    others_load: float | None = None

    @property
    def busy(self) -> bool:
        """Whether the machine was busy while timing (:func:`clover.machine.busy` of
        ``others_load`` and ``spread``)."""
        return machine.busy(self.others_load, self.spread, 1.0)


def greedy_accepted_length(tree: Tree, keep: set[int], truth: list[int]) -> int:
    """Greedy tokens per step for the subtree ``keep`` (node ids, root included) when
    the target's continuation is ``truth`` (token ids): the drafts matched along one
    root-to-node path (:meth:`clover.tree.Tree.matched_path`), plus the bonus token (so
    at least 1)."""
    return tree.matched_path(truth, keep) + 1


def budget_subtree(tree: Tree, budget: int) -> set[int]:
    """Node ids of the root and the best ``budget`` drafted nodes by joint draft
    probability (ties: shallower, then earlier); a subtree, since a node's joint
    probability never exceeds its parent's."""
    return {0, *best_by_joint(tree.joint_probs(), tree.depths, budget)}


def pool_size(tree: TreeConfig, depth: int) -> int:
    """Most drafted nodes a dynamic tree can hold: ``branching`` children of the root, then
    ``branching`` children of each of the ``branching`` frontier nodes per further depth."""
    return tree.branching + max(0, depth - 1) * tree.branching ** 2


def pick_budget(speed: Sequence[float], margin: float = TIE_MARGIN) -> int:
    """The index of the budget to use given each budget's expected speed (tokens per ms,
    budgets in increasing order): the smallest whose speed is within ``margin`` (a
    fraction) of the fastest one's (:data:`TIE_MARGIN`).

    Raises:
        ValueError: for an empty ``speed`` or a negative ``margin``.
    """
    if not speed or margin < 0:
        raise ValueError(f"need at least one budget's speed and a margin >= 0, got {list(speed)}, {margin}")
    top = max(speed)
    return next(i for i, v in enumerate(speed) if v >= (1 - margin) * top)


@dataclass(frozen=True)
class CalibrationText:
    """One calibration prompt with the target's greedy answer and its hidden states.

    Attributes:
        prompt_len: tokens of the chat-formatted prompt (P).
        token_ids: prompt then answer, P + A token ids.
        hidden_pre / hidden_post: (P + A, D) the target's features at every position
            (``TargetOutput``; D includes the packed feature layers of a target that
            captures them).
    """

    prompt_len: int
    token_ids: list[int]
    hidden_pre: torch.Tensor
    hidden_post: torch.Tensor


# target -> {(prompts, tokens, feature layers): [CalibrationText]}, for the target's life
_TEXTS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_TEXTS_LOCK = threading.Lock()


def calibration_texts(target, prompts=CALIBRATION_PROMPTS, tokens: int = CALIBRATION_TOKENS,
                      path=None, deadline: float | None = None, progress=None) -> list[CalibrationText]:
    """The target's greedy answers to ``prompts`` (up to ``tokens`` each; fewer where the
    model's context is short, none for a prompt that leaves under 2 tokens of room), with
    its hidden states over prompt and answer: the text :func:`auto_tree` measures tau on.

    They depend on the target alone, so they are made once per target, encoded prompts,
    length and captured feature layers and held for the target's life: every heads calibrated
    on the same target (the app's Medusa, Clover and Clover-2, the tests' fixtures) reads
    the same text instead of decoding it again (7 prompts x 128 tokens, about 30 s on a
    2-core CPU). The answers' token ids are also kept on disk (``path``, default
    ``$CLOVER_CACHE_DIR/calibration-texts.json``, keyed by the target's name, fingerprint
    and a sample of its weights, the encoded prompts and ``tokens``), so a later process
    only runs one forward per text for its hidden states.

    Args:
        deadline: a ``time.monotonic()`` time after which answers not yet decoded are
            cut short (at least 2 tokens each; such texts are used, never stored): the
            bounded sizing of a busy machine (:func:`auto_tree`'s ``budget_s``).
        progress: called as ``progress(what, done, total)`` after each text.
    Returns:
        one :class:`CalibrationText` per prompt that fits, in order.
    """
    encoded = tuple(tuple(encode_prompt(target.tokenizer, p)) for p in prompts)  # as templated now
    key = (encoded, int(tokens), tuple(target.feature_layers))
    with _TEXTS_LOCK:
        held = _TEXTS.setdefault(target, {})
        if key in held:
            return list(held[key])
        store = _TextStore(path, target, encoded, tokens)
        answers, complete = store.read(), True
        texts, made = [], {}
        with torch.inference_mode():
            for i, ids in enumerate(map(list, encoded)):
                n = min(tokens, target.max_context - len(ids))
                if n < 2:
                    continue
                answer = answers.get(i) if answers else None
                if answer is None:
                    if deadline is not None and time.monotonic() > deadline:
                        n, complete = 2, False  # out of time: a stub, so every task kind still counts
                    answer, cut = _answer(target, ids, n, deadline)
                    complete = complete and not cut
                made[i] = answer
                seq = ids + answer
                out = target.forward(torch.tensor([seq], device=target.device),
                                     torch.arange(len(seq), device=target.device)[None], None, None)
                texts.append(CalibrationText(len(ids), seq, out.hidden_pre, out.hidden_post))
                if progress is not None:
                    progress("calibration text", i + 1, len(encoded))
        if complete:
            held[key] = texts
            if answers is None:
                store.write(made)
        return list(texts)


def _answer(target, ids: list[int], n: int, deadline: float | None) -> tuple[list[int], bool]:
    """The target's greedy answer to ``ids``, ``n`` tokens (or to its EOS), and whether
    it was cut short: past ``deadline`` (``time.monotonic()``) it stops where it is (at
    least 2 tokens)."""
    tokens: list[int] = []
    for step in Engine(target).stream(ids, n):
        tokens += step.new_tokens
        if deadline is not None and len(tokens) >= 2 and not step.finished and time.monotonic() > deadline:
            return tokens, True
    return tokens, False


class _TextStore:
    """The calibration answers of one target on disk: a JSON file of records keyed by
    the target (name, fingerprint), the encoded prompts and the token count, each
    ``{prompt index: answer token ids}``, read and written as the auto-tree store is
    (:func:`clover.assets.read_store`, :func:`clover.assets.write_record`)."""

    def __init__(self, path, target, encoded, tokens: int):
        import hashlib
        from pathlib import Path

        from clover.assets import cache_root

        self.path = Path(path or cache_root() / "calibration-texts.json")
        h = hashlib.sha1(repr((encoded, int(tokens))).encode())
        for w in (target.lm_head.weight, next(target.model.parameters())):  # these weights, not just this config
            h.update(w.detach().flatten()[:4096].float().cpu().numpy().tobytes())
        fingerprint = ",".join(f"{k}={v}" for k, v in sorted(target.fingerprint.items()))
        self.key = f"{target.name}|{fingerprint}|{h.hexdigest()[:16]}"

    def read(self) -> dict[int, list[int]] | None:
        record = read_store(self.path).get(self.key)
        if not isinstance(record, dict):
            return None
        try:
            return {int(i): [int(t) for t in answer] for i, answer in record.items()}
        except (TypeError, ValueError):
            return None

    def write(self, answers: dict[int, list[int]]) -> None:
        write_record(self.path, self.key, {str(i): a for i, a in answers.items()})


def auto_tree(target, heads, base: TreeConfig | None = None, budgets=BUDGETS,
              prompts=CALIBRATION_PROMPTS, tokens: int = CALIBRATION_TOKENS, repeats: int = 7,
              prefix_len: int = 256, batch_size: int = 1, budget_s: float | None = None,
              progress=None, texts_path=None) -> tuple[TreeConfig, AutoTreeReport]:
    """Pick the dynamic tree budget that maximises expected tokens/s (the smallest within
    :data:`TIE_MARGIN` of the fastest, :func:`pick_budget`), or no tree (kind
    "off", ``report.chosen`` 0) when none is expected to beat plain decoding by at
    least :data:`MIN_GAIN` (EAGLE-2's dynamic tree, arXiv 2406.16858, sized by measured
    cost: the plain step and every budget's drafting and verification are timed
    interleaved, :func:`interleaved_ms`, and each compared at its fastest repeat).

    With ``batch_size`` B the costs are those of a batched step (``clover.engine``): B
    rows drafted together and one forward verifying B trees, whose cost grows with
    B x nodes, so a larger batch affords a smaller tree (tau per row does not depend on B).

    Args:
        heads: Medusa or Clover heads (None returns ``base`` unchanged).
        base: the dynamic TreeConfig whose ``budget`` is tuned (default TreeConfig()).
        budgets: candidate budgets N (drafted nodes, root excluded); those above the
            tree's :func:`pool_size` are dropped (that budget is tried instead), since
            they would all draft the same tree.
        tokens: calibration tokens generated per prompt (fewer where the model's
            context is short; prompts that do not fit are skipped).
        prefix_len: cached prefix length for the timing forwards (capped so that the
            deepest tree still fits the model's context).
        batch_size: rows decoded together (B >= 1).
        budget_s: seconds the whole sizing may take (None: as long as it takes, about
            30-40 s per heads on an idle 2-core CPU the first time, the calibration texts
            then kept): the texts not yet on disk are cut short past 40% of it, tau is
            measured at every k-th position of the texts so that drafting ends by 70% of
            it, and the timing rounds stop at it (at least one). For a busy machine
            (:func:`calibrate`), whose choice is provisional anyway.
        progress: called as ``progress(what, done, total)`` as the sizing advances (a
            progress bar's update; the library prints nothing).
        texts_path: where the calibration texts are kept (:func:`calibration_texts`).
    Returns:
        (the chosen TreeConfig, the AutoTreeReport behind the choice).
    """
    t0 = time.monotonic()
    at = (lambda share: None) if budget_s is None else (lambda share: t0 + share * budget_s)
    base = base or TreeConfig()
    if heads is None:
        return base, AutoTreeReport([], [], [], [], 0.0, base.budget)
    depth = heads.config.num_heads
    pool = pool_size(base, depth)
    budgets = sorted(set(min(b, pool) for b in budgets if b >= 1))
    big = replace(base, kind="dynamic", budget=max(budgets))

    # tau(N) from the calibration text
    lengths = {b: [] for b in budgets}
    texts = calibration_texts(target, prompts, tokens, texts_path, deadline=at(0.4), progress=progress)
    total = sum(len(t.token_ids) - t.prompt_len for t in texts)
    stride, done, t_first = 1, 0, 0.0  # draft at every stride-th position; drafts so far; when they began
    with torch.inference_mode():
        for text in texts:
            seq, start = text.token_ids, text.prompt_len - 1
            drafter = heads.drafter(target, big)
            drafter.observe(text.hidden_pre[:start], text.hidden_post[:start], seq[:start])
            for pos in range(start, len(seq) - 1):  # root = seq[pos]
                if (pos - start) % stride == 0:
                    t_first = t_first or time.monotonic()
                    tree = drafter.draft(seq[pos], depth)
                    truth = seq[pos + 1: pos + 1 + depth]
                    for b in budgets:
                        lengths[b].append(greedy_accepted_length(tree, budget_subtree(tree, b), truth))
                    done += 1
                    if budget_s is not None and done == 4:  # four drafts timed: space the rest to fit
                        per = (time.monotonic() - t_first) / 4
                        room = max(at(0.7) - time.monotonic(), 1e-3)
                        stride = max(1, math.ceil((total - done) * per / room))
                    if progress is not None and done % 16 == 0:
                        progress("drafting over the texts", min(done * stride, total), total)
                drafter.observe(text.hidden_pre[pos: pos + 1], text.hidden_post[pos: pos + 1], seq[pos: pos + 1])
    if not lengths[budgets[0]]:
        log.warning("auto tree: no calibration prompt fits the model's context of %d; "
                    "keeping the default tree", target.max_context)
        return base, AutoTreeReport([], [], [], [], 0.0, base.budget)
    tau = [statistics.fmean(lengths[b]) for b in budgets]

    # cost curve on this hardware
    # every timed drafting call moves the heads' state on by up to depth + 1 positions
    # (tau at most): room for all of them, and the deepest tree, in the model's context
    prefix_len = max(1, min(prefix_len, target.max_context - depth - 2 - (repeats + 2) * (depth + 1)))
    with torch.inference_mode():
        ids, cache, out = prefilled_rows(target, prefix_len, batch_size)

        def drafters_for(tree_cfg: TreeConfig) -> list:  # per row, having seen the prefix
            drafters = [heads.drafter(target, tree_cfg) for _ in range(batch_size)]
            for b, drafter in enumerate(drafters):
                drafter.observe(out.hidden_pre[b], out.hidden_post[b], ids[0].tolist())
            return drafters

        def verify(tree: Tree):
            return verify_once(target, cache, prefix_len, tree, batch_size)

        root = int(ids[0, -1])
        steps, nodes = [], []
        for b, t in zip(budgets, tau):
            # A step's drafting as the engine runs it: the drafters first observe the
            # positions the last step verified (about tau of them: the heads' state
            # refresh, Clover's Augmenting Block over the new positions, Clover-2's
            # context block), then draft. Each call moves the drafters' state on by m
            # positions of the prefix's states; a few dozen positions more do not change
            # the cost.
            m = min(max(1, round(t)), prefix_len)
            seen = ([h[-m:] for h in out.hidden_pre], [h[-m:] for h in out.hidden_post],
                    [ids[0, prefix_len - m: prefix_len].tolist()] * batch_size)  # outside the timing

            def draft(drafters=drafters_for(replace(big, budget=b)), seen=seen):
                observe_rows(drafters, *seen)
                return draft_rows(drafters, [root] * batch_size, [depth] * batch_size)[0]

            tree = draft()
            nodes.append(len(tree) - 1)
            steps += [draft, verify(tree)]
        # the plain step first, then each budget's drafting and its verification, in
        # turn: every drafting call follows a target forward, as in the engine, so the
        # heads' weights are timed as they are read there (out of the caches the target's
        # weights have just swept), not warm from the previous budget's drafting
        before = load_snapshot()
        times = interleaved_ms([verify(root_only(root, target.device))] + steps, repeats, at(1.0), progress)
        others = others_load(before, load_snapshot())
    # each call's quiet floor (its fastest repeat) decides: load only ever adds time, so
    # the floors are the nearest to the idle machine's costs
    floors = [min(t) for t in times]
    plain_ms, draft_ms, verify_ms = floors[0], floors[1::2], floors[2::2]
    spread = statistics.median(times[0]) / plain_ms if plain_ms > 0 else 1.0
    speed = [t / (d + v) for t, d, v in zip(tau, draft_ms, verify_ms)]
    best = pick_budget(speed)
    # whether any tree pays is the fastest budget's call; which tree, pick_budget's (a
    # budget tied with the fastest may sit just under MIN_GAIN)
    chosen = budgets[best] if max(speed) * plain_ms >= MIN_GAIN else 0
    report = AutoTreeReport(budgets, tau, draft_ms, verify_ms, plain_ms, chosen, nodes,
                            expected=speed[best] * plain_ms, best_budget=budgets[best],
                            spread=spread, others_load=others)
    if report.busy:
        log.warning("auto tree: the machine was busy while timing (a plain step's median %.1f ms "
                    "is %.2fx its fastest, %.1f ms; other processes used %s CPUs); the choice is "
                    "stored as provisional until a quiet machine measures it again",
                    statistics.median(times[0]), spread, plain_ms, "?" if others is None else f"{others:.1f}")
    if not chosen:  # no tree clearly pays for itself: do not draft
        log.info("auto tree: off (best expected speedup %.3f at budget %d; plain %.1f ms/token)",
                 report.expected, budgets[best], plain_ms)
        return replace(base, kind="off", auto=False), report
    log.info("auto tree: budget %d (tau %.2f, %.1f + %.1f ms/step; plain %.1f ms/token)",
             budgets[best], tau[best], draft_ms[best], verify_ms[best], plain_ms)
    return replace(base, kind="dynamic", budget=budgets[best]), report
