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

Every measurement of a target on this machine has one home, its :class:`Calibrator`
(:func:`calibrator_for`): the verify cost curve (kept in memory) and the auto tree of each
heads and batch size (kept in memory and on disk, ``autotree.json``, keyed by
:func:`calibration_key`, so it is measured once per machine, target, heads and library
versions). The edges (CLI, bench, app, notebooks) ask it once, through
:func:`resolve_tree` or :meth:`Calibrator.resolve`, and pass the concrete tree and lookup
settings to the engine, which never measures.
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

from clover.cache import buffered_cache, crop_cache
from clover.assets import read_store, write_record
from clover import machine
from clover.machine import cpu_name, load_snapshot, machine_busy, others_load
from clover.engine import Engine, verify_inputs
from clover.heads.drafter import draft_rows, observe_rows
from clover.models import encode_prompt
from clover.tree import MAX_TREE_NODES, Tree, TreeConfig, best_by_joint, root_only

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


def interleaved_ms(fns, repeats: int, deadline: float | None = None, progress=None) -> list[list[float]]:
    """Wall times in ms of ``repeats`` calls of each of ``fns``, after one warm-up call of
    each (CUDA synchronised after each call when a GPU is present): one list per function.

    The calls are interleaved (round-robin: f1 f2 ... f1 f2 ...) rather than timed one
    function after another, so that a slow spell of the machine (another process, the
    clock) touches every function alike and their ratios, on which the auto tree decides,
    stay steady from one calibration to the next. Past ``deadline`` (``time.monotonic()``)
    no further round starts (one always runs); ``progress(what, done, total)`` is called
    after each round.
    """
    for fn in fns:
        if deadline is None or time.monotonic() < deadline:
            fn()  # warm-up (skipped once past the deadline: the timed round must fit)
    times: list[list[float]] = [[] for _ in fns]
    for r in range(repeats):
        if r and deadline is not None and time.monotonic() > deadline:
            break
        if r and progress is not None:
            progress("timing the budgets", r, repeats)
        for i, fn in enumerate(fns):
            t = time.perf_counter()
            fn()
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            times[i].append((time.perf_counter() - t) * 1e3)
    return times


def pool_size(tree: TreeConfig, depth: int) -> int:
    """Most drafted nodes a dynamic tree can hold: ``branching`` children of the root, then
    ``branching`` children of each of the ``branching`` frontier nodes per further depth."""
    return tree.branching + max(0, depth - 1) * tree.branching ** 2


def verify_once(target, cache, prefix_len: int, tree: Tree, batch_size: int = 1):
    """A callable that runs one verification forward of ``tree`` on top of the
    ``prefix_len`` cached tokens, then crops the cache back (for timing); with
    ``batch_size`` B, of B rows each verifying ``tree`` (the cache holds B rows)."""
    tokens, pos, mask = verify_inputs([tree] * batch_size, [prefix_len] * batch_size, prefix_len,
                                      target.dtype, target.device)

    def run():
        target.forward_batch(tokens, pos, mask, cache)
        crop_cache(cache, prefix_len)
    return run


def prefilled_rows(target, prefix_len: int, batch_size: int = 1, extra: int = 0):
    """A KV cache of ``batch_size`` rows holding the same ``prefix_len`` random tokens
    (seeded), the timing set-up of :func:`time_forward` and :func:`auto_tree`.

    Call under ``torch.inference_mode()``.

    Returns:
        (ids (1, prefix_len + extra) long: the prefix then ``extra`` more tokens to
        verify, the cache, the prefill's :class:`~clover.models.TargetOutput`: hidden
        states (B, P, D) at every position, logits at the last only).
    """
    ids = torch.randint(0, target.vocab_size, (1, prefix_len + extra),
                        generator=torch.Generator().manual_seed(0)).to(target.device)
    rows = ids[:, :prefix_len].expand(batch_size, -1)  # (B, P): every row the same text
    cache = buffered_cache(target.config)  # as the engine's runs append: no copy of the cache per forward
    out = target.forward_batch(rows, torch.arange(prefix_len, device=target.device)[None].expand_as(rows),
                               None, cache, last_only=True)
    return ids, cache, out


def time_forward(target, sizes, prefix_len: int = 256, repeats: int = 3, batch_size: int = 1,
                 quiet: bool = False) -> list[float]:
    """Median wall time (ms) of one target forward over n new tokens on top of a KV cache
    of ``prefix_len`` tokens, for each n in ``sizes`` (n tokens as a chain, with the tree
    attention mask, as verification runs them). Shows how the cost grows with the
    tokens processed at once: nearly flat on a GPU, rising on a CPU. With ``batch_size``
    B, of one batched forward where each of B rows verifies n tokens (``clover.engine``'s
    batched step). With ``quiet``, the fastest of the ``repeats`` calls instead of the
    median: load only ever adds time, so on a busy machine the fastest call is the
    nearest to the machine's own cost (what :func:`auto_tree` decides on too)."""
    prefix_len = max(1, min(prefix_len, target.max_context - max(sizes)))  # fit any context
    with torch.inference_mode():
        ids, cache, _ = prefilled_rows(target, prefix_len, batch_size, extra=max(sizes))
        chains = [Tree(ids[0, prefix_len: prefix_len + n], list(range(-1, n - 1)), list(range(n)),
                       [1.0] * n) for n in sizes]
        times = interleaved_ms([verify_once(target, cache, prefix_len, c, batch_size) for c in chains], repeats)
    return [min(t) if quiet else statistics.median(t) for t in times]


def verify_costs(target, n: int, prefix_len: int = 256, repeats: int = 5, batch_size: int = 1) -> list[float]:
    """This machine's verify cost curve: ms of one target forward over 1, 2, ..., ``n``
    tokens (per row, for ``batch_size`` rows) on top of ``prefix_len`` cached ones, each
    the fastest of ``repeats`` interleaved calls (:func:`time_forward` with ``quiet``, so
    that a busy spell does not steepen the curve and cut lookup chains), made
    non-decreasing (timing noise aside, more tokens never cost less). Measured once per
    target, size and batch size by its :class:`Calibrator`, then kept in memory.

    Returns:
        a list of ``n`` times in ms.
    """
    return calibrator_for(target).verify_costs(n, batch_size, prefix_len=prefix_len, repeats=repeats)


def padded_widths(costs: Sequence[float], n: int, saving: float = 0.05) -> tuple[int, ...]:
    """The padded verification plan from a measured cost curve: for k = 1..``n`` tokens,
    the width w >= k of the cheapest forward in ``costs`` (``costs[w - 1]``: ms over w
    tokens), taken only when it saves at least ``saving`` (a fraction) over k itself, so
    that timing noise never pads; else k.

    Raises:
        ValueError: when ``costs`` covers fewer than ``n`` sizes.
    """
    if len(costs) < n:
        raise ValueError(f"a plan for {n} tokens needs costs for at least {n} sizes, got {len(costs)}")
    plan = []
    for k in range(1, n + 1):
        w = min(range(k, len(costs) + 1), key=lambda j: (costs[j - 1], j))
        plan.append(w if costs[w - 1] <= (1 - saving) * costs[k - 1] else k)
    return tuple(plan)


def verify_widths(target, n: int, saving: float = 0.05) -> tuple[int, ...]:
    """This machine's padded verification plan for one row (``Engine(verify_widths=...)``):
    for each k = 1..``n`` tokens, how many to run the target's forward over. A CPU's matrix
    kernels can make a forward over more tokens cheaper than over fewer (measured on a
    2-core AVX-512 CPU at a 256-token prefix: 11 tokens 96 ms, 13-15 tokens 114-141 ms,
    16 tokens 80-85 ms; Clover at a budget of 10 drafted tokens then decoded 12 Spec-Bench
    questions 7% faster, the same text), so a step pads to the cheapest width up to 2n
    tokens when that saves ``saving`` (5%) or more. Measured once per target (the fastest
    of 7 interleaved forwards per size, about 2n x 7 forwards; seconds on a CPU), then
    held by its :class:`Calibrator`.

    Returns:
        ``n`` widths, the k-th >= k.
    """
    return calibrator_for(target).verify_plan(n, saving)[0]


def sized_lookup(target, lookup=None, batch_size: int = 1):
    """``lookup`` (default ``LookupConfig()``) with this machine's verify cost curve for
    chains up to its ``max_tokens`` (:meth:`Calibrator.lookup`), so prompt lookup drafts
    the length that pays here (``clover.lookup.best_length``). With ``batch_size`` B the
    curve is a batched step's, B rows each verifying as many tokens: on a CPU every extra
    token costs B rows' worth, so a larger batch drafts shorter."""
    return calibrator_for(target).lookup(lookup, batch_size)


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


def calibration_key(target, heads, base: TreeConfig, batch_size: int = 1) -> str:
    """What an auto-tree choice depends on: the target (name, fingerprint, dtype, device),
    a hash of the heads' weights, the base tree, the torch thread count, the processor,
    the versions of torch, transformers and this library, the target's CPU linear kernels
    (``TargetModel.linear_kernels_text``), how budgets are timed (:data:`TIMING`), and the
    batch size (named only above 1)."""
    from importlib.metadata import PackageNotFoundError, version

    cpu = cpu_name()
    device = str(target.device)
    if target.device.type == "cuda":
        device += ":" + torch.cuda.get_device_name(target.device)
    versions = []
    for package in ("torch", "transformers", "clover-studio"):
        try:
            versions.append(f"{package}={version(package)}")
        except PackageNotFoundError:  # a source checkout that was never installed
            versions.append(f"{package}=?")
    fingerprint = ",".join(f"{k}={v}" for k, v in sorted(target.fingerprint.items()))
    return "|".join([target.name, fingerprint, str(target.dtype), device,
                     f"threads={torch.get_num_threads()}", cpu, *versions,
                     f"kernels={getattr(target, 'linear_kernels_text', 'off')}",
                     f"heads={heads_digest(heads)}", repr(replace(base, budget=1, auto=False)),
                     f"timing={TIMING}"]
                    + ([f"batch={batch_size}"] if batch_size > 1 else []))


def heads_digest(heads) -> str:
    """A short hash of the heads' weights (names, shapes and the first 4,096 values of
    each tensor)."""
    import hashlib

    h = hashlib.sha1()
    for name, p in sorted(heads.state_dict().items()):
        h.update(name.encode())
        h.update(str(tuple(p.shape)).encode())
        h.update(p.detach().flatten()[:4096].float().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def calibration_family(target, heads, base: TreeConfig, batch_size: int = 1) -> str:
    """What a stored choice is *for*, whatever the conditions it was measured under (the
    thread count, the versions, the kernels, :data:`TIMING`): the target, the heads'
    weights, the base tree and the batch size. A choice of the same family stands in,
    with a note, where none was measured under this :func:`calibration_key` and the
    machine is busy (:func:`calibrate`)."""
    fingerprint = ",".join(f"{k}={v}" for k, v in sorted(target.fingerprint.items()))
    return "|".join([target.name, fingerprint, str(target.dtype), str(target.device.type),
                     f"heads={heads_digest(heads)}", repr(replace(base, budget=1, auto=False)),
                     f"batch={batch_size}"])


@dataclass
class Calibration:
    """The auto tree of one target, heads and batch size on this machine, with the
    figures behind it (:func:`calibrate`).

    Attributes:
        tree: the concrete tree: dynamic with the chosen budget, or kind "off".
        plain_ms: a plain step's time while calibrating (its fastest repeat), ms; None
            for a choice stored by an older version without figures.
        expected: ``best_budget``'s expected speedup over plain decoding (x), or None.
        best_budget: the budget :func:`pick_budget` took (also when ``tree`` is off).
        busy: the machine was busy while timing (:attr:`AutoTreeReport.busy`): the choice
            is stored as provisional.
        stored: read from the store rather than measured now.
        date: when it was measured (UTC, ISO 8601), or None.
        provisional: measured on a busy machine (stored so, with the load it saw): used
            until a measurement on a quiet machine replaces it.
        others_load: CPUs' worth of other processes' work while it was timed (None: unknown).
        note: one line for the user where the choice stands in for a measurement not
            made now (a provisional one, or one of another thread count or an older
            timing version), else "".
    """

    tree: TreeConfig
    plain_ms: float | None = None
    expected: float | None = None
    best_budget: int | None = None
    busy: bool = False
    stored: bool = False
    date: str | None = None
    provisional: bool = False
    others_load: float | None = None
    note: str = ""

    @classmethod
    def from_record(cls, base: TreeConfig, record) -> "Calibration | None":
        """A stored record (a dict, or an int budget from older versions; 0 = off)."""
        if isinstance(record, int) and not isinstance(record, bool):
            record = {"budget": record}
        if not isinstance(record, dict) or not isinstance(record.get("budget"), int):
            return None
        budget = record["budget"]
        tree = (replace(base, kind="off", auto=False) if budget == 0
                else replace(base, kind="dynamic", budget=budget, auto=False))
        return cls(tree, record.get("plain_ms"), record.get("expected"), record.get("best_budget"),
                   stored=True, date=record.get("date"), provisional=bool(record.get("provisional")),
                   others_load=record.get("others_load"))

    def describe(self) -> str:
        """One line on what was chosen and why: the tree, the expected speedup, how it
        was measured (quiet, busy, stored) and any stand-in note."""
        what = "no tree (none beats plain decoding here)" if self.tree.off else f"{self.tree.budget} drafted tokens"
        gain = f", expected {self.expected:.2f}x plain" if self.expected else ""
        how = ("measured on a busy machine, provisional" if self.provisional or self.busy
               else "measured on a quiet machine")
        when = "stored" if self.stored else "measured now"
        return f"auto tree: {what}{gain} ({how}; {when})" + (f"; {self.note}" if self.note else "")


# seconds the auto tree may spend sizing on a busy machine (auto_tree's budget_s): its
# choice is provisional and is measured again once the machine is quiet
BUSY_BUDGET_S = 15.0
# the budgets a busy machine tries (a tree of a few tokens is what such a machine affords,
# and a smaller big tree drafts the calibration texts faster); a quiet one tries BUDGETS
BUSY_BUDGETS = (1, 2, 3, 4)


def calibrate(target, heads, base: TreeConfig | None = None, path=None, measure: bool = True,
              recalibrate: bool = False, batch_size: int = 1, progress=None) -> Calibration | None:
    """:func:`auto_tree`, remembered in a JSON file across runs of the app or CLI.

    The rule (the CLI, the bench and the app all come here, through
    :class:`Calibrator`):

    * a choice stored under this :func:`calibration_key` and measured on a quiet machine
      is used;
    * a provisional one (measured while the machine was busy), or where none is stored
      under this key, one of the same :func:`calibration_family` (another thread count,
      an older :data:`TIMING`), is used at once, with a note (``Calibration.note``),
      while the machine is busy (:func:`machine_busy`) or ``measure`` is False; on a
      quiet machine it is measured again;
    * otherwise it is measured now (``measure``), else None. On a busy machine the
      measurement is bounded (:data:`BUSY_BUDGET_S`, :func:`auto_tree`'s ``budget_s``)
      and stored as provisional with the load it saw, never over a quiet one; a quiet
      one is stored with its figures (budget, plain step ms, expected speedup, date).

    Args:
        heads: the method's draft heads (must not be None).
        base: the dynamic TreeConfig whose budget is tuned (default TreeConfig()).
        path: the JSON file (default ``$CLOVER_CACHE_DIR/autotree.json``, i.e.
            ``~/.cache/clover-studio/autotree.json``).
        recalibrate: measure again (and store) even where a choice is stored.
        batch_size: the batch size the tree is for (:func:`auto_tree`).
        progress: passed to :func:`auto_tree` (``progress(what, done, total)``).
    """
    import datetime
    import json
    from pathlib import Path

    from clover.assets import cache_root

    base = replace(base or TreeConfig(), auto=False)
    path = Path(path or cache_root() / "autotree.json")
    key = calibration_key(target, heads, base, batch_size)
    family = calibration_family(target, heads, base, batch_size)
    stored = read_store(path)
    found = Calibration.from_record(base, stored.get(key))
    if found is not None and not recalibrate and not found.provisional:
        return found
    stand_in = found
    if stand_in is not None:
        stand_in = replace(stand_in, note="measured while the machine was busy; measured again when it is quiet "
                                          "(or with --recalibrate)")
    else:  # the newest choice of the same family, measured under other conditions
        kin = sorted((r for k, r in stored.items() if isinstance(r, dict) and r.get("family") == family),
                     key=lambda r: str(r.get("date", "")))
        newest = Calibration.from_record(base, kin[-1]) if kin else None
        if newest is not None:
            stand_in = replace(newest,
                               note="stored for these heads under other settings (thread count, versions or "
                                    "timing); measured again when the machine is quiet (or with --recalibrate)")
    busy = None
    if stand_in is not None and not recalibrate:
        if not measure or (busy := machine_busy()):
            return stand_in
    if not measure:
        return None
    if busy is None:
        busy = machine_busy()
    tree, report = auto_tree(target, heads, base, batch_size=batch_size, progress=progress,
                             **(dict(budget_s=BUSY_BUDGET_S, budgets=BUSY_BUDGETS, repeats=3) if busy else {}))
    date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    provisional = busy or report.busy
    cal = Calibration(tree, report.plain_ms or None, report.expected or None, report.best_budget or None,
                      report.busy, date=date, provisional=provisional, others_load=report.others_load,
                      note="measured while the machine was busy; measured again when it is quiet" if provisional
                      else "")
    keep_quiet = found is not None and not found.provisional  # never replace a quiet choice by a busy one
    if report.budgets and not (provisional and keep_quiet):
        write_record(path, key, {"budget": 0 if tree.off else tree.budget,
                                  "plain_ms": round(report.plain_ms, 3),
                                  "expected": round(report.expected, 4),
                                  "best_budget": report.best_budget,
                                  "spread": round(report.spread, 3), "date": date,
                                  "others_load": None if report.others_load is None
                                  else round(report.others_load, 2),
                                  "provisional": provisional, "family": family})
    return cal


def stored_auto_tree(target, heads, base: TreeConfig | None = None, path=None,
                     measure: bool = True, recalibrate: bool = False,
                     batch_size: int = 1) -> TreeConfig | None:
    """The tree of :func:`calibrate` (``base`` itself for no heads), or None where nothing
    is stored and ``measure`` is False."""
    if heads is None:
        return base or TreeConfig()
    cal = calibrate(target, heads, base, path, measure, recalibrate, batch_size)
    return None if cal is None else cal.tree


class Calibrator:
    """Every measurement of one target on this machine, in one place: the verify cost
    curve (ms of a forward over 1, 2, ... tokens, per batch size; kept in memory) and the
    auto tree of each heads, base tree and batch size (:class:`Calibration`: kept in
    memory for this process, and on disk in ``path`` through :func:`calibrate`). Get the
    one of a target with :func:`calibrator_for`. Thread-safe: measurements run under one
    lock, and :meth:`known` / :meth:`known_costs` read without waiting on it.

    Args:
        target: the ``clover.TargetModel``.
        path: the store (``autotree.json``).
    """

    def __init__(self, target, path):
        self._target = weakref.ref(target)  # the registry of calibrators must not keep it alive
        self.path = path
        self.lock = threading.RLock()
        self._costs: dict[tuple[int, int], list[float]] = {}
        self._raw: dict[tuple[int, int], list[float]] = {}
        # (heads, base tree, batch size) -> Calibration, per heads object
        self._calibrations: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()

    @property
    def target(self):
        target = self._target()
        if target is None:
            raise ReferenceError("the calibrator's target model was freed")
        return target

    @staticmethod
    def _base(base: TreeConfig | None) -> TreeConfig:
        return replace(base or TreeConfig(), auto=False)

    def known(self, heads, base: TreeConfig | None = None, batch_size: int = 1) -> Calibration | None:
        """The calibration this process already holds for ``heads`` (measured or read from
        the store by :meth:`calibration`), else None. Never measures, reads no file, never
        waits."""
        return self._calibrations.get(heads, {}).get((self._base(base), batch_size))

    def calibration(self, heads, base: TreeConfig | None = None, batch_size: int = 1,
                    measure: bool = True, recalibrate: bool = False, progress=None) -> Calibration | None:
        """The auto tree of ``heads`` on this machine with its figures: held in memory,
        else as :func:`calibrate` rules (stored, a stand-in while the machine is busy, or
        measured now when ``measure``), else None. ``recalibrate`` measures again;
        ``progress`` follows a measurement (:func:`auto_tree`)."""
        base = self._base(base)
        if not recalibrate and (cal := self.known(heads, base, batch_size)) is not None:
            return cal
        with self.lock:
            if not recalibrate and (cal := self.known(heads, base, batch_size)) is not None:
                return cal  # measured by another thread meanwhile
            cal = calibrate(self.target, heads, base, self.path, measure, recalibrate, batch_size, progress)
            if cal is not None:
                self._calibrations.setdefault(heads, {})[base, batch_size] = cal
            return cal

    def calibrations(self) -> list[Calibration]:
        """Every calibration this process holds for this target."""
        return [c for by_heads in list(self._calibrations.values()) for c in by_heads.values()]

    def plain_step_ms(self) -> float | None:
        """A plain step's time (ms) on this machine when quiet: the fastest of the held
        calibrations' plain steps, or None where none was measured."""
        times = [c.plain_ms for c in self.calibrations() if c.plain_ms]
        return min(times) if times else None

    def raw_costs(self, n: int, batch_size: int = 1, prefix_len: int = 256,
                  repeats: int = 5) -> list[float]:
        """ms of one forward over 1..``n`` tokens as measured (:func:`time_forward` with
        ``quiet``; not made non-decreasing), on the first call for this ``n`` and batch
        size, then held."""
        with self.lock:
            if (n, batch_size) not in self._raw:
                self._raw[n, batch_size] = time_forward(self.target, list(range(1, n + 1)), prefix_len=prefix_len,
                                                        repeats=repeats, batch_size=batch_size, quiet=True)
            return list(self._raw[n, batch_size])

    def verify_costs(self, n: int, batch_size: int = 1, prefix_len: int = 256,
                     repeats: int = 5) -> list[float]:
        """The verify cost curve for 1..``n`` tokens (:func:`verify_costs`), measured on
        the first call for this ``n`` and batch size, then held."""
        with self.lock:
            if (n, batch_size) not in self._costs:
                ms = self.raw_costs(n, batch_size, prefix_len, repeats)
                self._costs[n, batch_size] = [max(ms[: i + 1]) for i in range(n)]
            return list(self._costs[n, batch_size])

    def verify_plan(self, n: int, saving: float = 0.05) -> tuple[tuple[int, ...], list[float]]:
        """The padded verification plan for one row (:func:`verify_widths`) and the cost
        curve it gives: ms of a step that verifies 1..``n`` tokens padded by the plan (the
        width's measured time, made non-decreasing), what prompt lookup sizes its chains
        by when the engine pads."""
        raw = self.raw_costs(min(2 * n, MAX_TREE_NODES + 1), repeats=7)
        plan = padded_widths(raw, n, saving)
        costs = [raw[w - 1] for w in plan]
        return plan, [max(costs[: i + 1]) for i in range(n)]

    def known_costs(self, batch_size: int = 1) -> tuple[float, ...] | None:
        """The longest verify cost curve held for ``batch_size``, else None. Never measures."""
        curves = [c for (n, b), c in list(self._costs.items()) if b == batch_size]
        return tuple(max(curves, key=len)) if curves else None

    def lookup(self, lookup=None, batch_size: int = 1):
        """``lookup`` (default ``LookupConfig()``) with the verify cost curve for chains up
        to its ``max_tokens`` (:func:`sized_lookup`)."""
        from clover.lookup import LookupConfig

        lookup = lookup or LookupConfig()
        return replace(lookup, costs=tuple(self.verify_costs(lookup.max_tokens + 1, batch_size)))

    def resolve(self, heads, tree: TreeConfig | None = None, lookup=None, *, measure: bool = True,
                recalibrate: bool = False, batch_size: int = 1, progress=None):
        """The tree setting made concrete for this machine (:func:`resolve_tree`).

        Returns:
            (tree, lookup).
        """
        tree = tree or TreeConfig()
        if not tree.auto:
            return tree, lookup
        if lookup is not None and not lookup.costs and measure:
            lookup = self.lookup(lookup, batch_size)
        if heads is None:
            return replace(tree, auto=False), lookup
        cal = self.calibration(heads, tree, batch_size, measure=measure, recalibrate=recalibrate,
                               progress=progress)
        return (tree if cal is None else cal.tree), lookup


_CALIBRATORS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_CALIBRATORS_LOCK = threading.Lock()


def calibrator_for(target, path=None) -> Calibrator:
    """The :class:`Calibrator` of ``target`` for the store ``path`` (default
    ``$CLOVER_CACHE_DIR/autotree.json``, i.e. ``~/.cache/clover-studio/autotree.json``,
    read when called): one per target and store for the life of the target."""
    from pathlib import Path

    from clover.assets import cache_root

    path = Path(path or cache_root() / "autotree.json")
    with _CALIBRATORS_LOCK:
        by_path = _CALIBRATORS.setdefault(target, {})
        if path not in by_path:
            by_path[path] = Calibrator(target, path)
        return by_path[path]


def resolve_tree(target, heads, tree: TreeConfig | None = None, lookup=None, *, path=None,
                 measure: bool = True, recalibrate: bool = False, batch_size: int = 1, progress=None):
    """The one place where the tree setting "auto" becomes a concrete tree for this
    machine; the CLI, the bench, the app and the notebooks call it (or the same
    :meth:`Calibrator.resolve`) before building an :class:`~clover.engine.Engine` (which
    takes concrete trees only).

    With ``tree.auto``: heads get the dynamic tree their :class:`Calibration` picks (held
    by the target's :class:`Calibrator`, else read from the store, else measured, seconds
    on a CPU, and stored; it may be "off"); no heads (plain decoding, lookup alone) get
    ``tree`` without the mark; a ``lookup`` config without ``costs`` gets this machine's
    verify cost curve (:func:`sized_lookup`). A tree that is not "auto" and its lookup are
    returned as they are.

    Args:
        heads: the method's draft heads, or None.
        tree: the tree setting (default ``TreeConfig()``).
        lookup: the method's ``clover.lookup.LookupConfig``, or None.
        path: the store (:func:`calibrator_for`).
        recalibrate: measure again (and store) even where a choice is stored.
        measure: False: never time anything; where no budget is stored, ``tree`` comes
            back still marked ``auto`` (the app then decides what to run meanwhile).
        batch_size: the heads' tree and the lookup cost curve are sized for batches of
            this many rows.
        progress: follows a measurement, ``progress(what, done, total)`` (:func:`auto_tree`).
    Returns:
        (tree, lookup).
    """
    return calibrator_for(target, path).resolve(heads, tree, lookup, measure=measure, recalibrate=recalibrate,
                                                batch_size=batch_size, progress=progress)
