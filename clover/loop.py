"""The one decoding loop (:class:`StepLoop`): draft -> verify -> accept -> update cache,
for every method and every batch size (:class:`clover.engine.Engine` runs it).

Plain autoregressive decoding is the same loop with the empty tree (root only), so all
methods run on identical machinery and their timings compare like with like.

Per step (Medusa arXiv 2401.10774 §2; Clover arXiv 2405.00263 §3):

1. draft: the method's drafter grows a candidate tree rooted at the last committed token
   (not yet in the target's KV cache);
2. verify: the target runs once over the flattened tree on top of its KV cache, with a
   tree attention mask and position ids ``prefix_len + depth``;
3. accept: an acceptance rule keeps a root-to-node path and produces the bonus token;
4. update cache: the target's KV cache is compacted to the accepted path and the drafter
   observes the verified hidden states of those positions.

Generation stops exactly as plain decoding would: at the first EOS (kept in the output),
after ``max_new_tokens`` (never overshot) or once a stop string appears.

Batches (:meth:`~clover.engine.Engine.generate_batch`; Clover's serving regime, arXiv 2405.00263 Table 1).
B prompts decode together. Each row has its own drafter (drafters hold per-run state), its
own random generator, its own tree (same budget for every row), its own acceptance and its
own stopping; one target forward verifies every row's tree. A single prompt
(:meth:`~clover.engine.Engine.stream`, :meth:`~clover.engine.Engine.generate`) runs this same loop with B = 1. The
layout, and why it is exact:

* KV cache: right padded, with a valid length L_b per row. Row b's committed positions
  fill cache columns ``[0, L_b)``; the cache is P = max_b L_b columns long and row b's
  columns ``[L_b, P)`` are padding (stale keys that nothing attends to). Prompts of
  different lengths are prefilled in one forward, right padded.
* Verify: every row's tree is padded to N = max_b N_b nodes (padding nodes repeat the
  root token) and appended at columns ``[P, P + N)``. Row b's node i has position id
  ``L_b + depth_i``, its true position in its own sequence, so RoPE or learned positions
  never see the padding. It attends to columns ``[0, L_b)``, to its ancestors and to
  itself; a padding node attends only to itself and nothing attends to it. The mask
  (:func:`clover.requests.verify_inputs`) is an additive float (B, 1, N, P + N) tensor, which transformers
  hands to attention unchanged: a masked key weighs ``exp(finfo.min) = 0`` exactly, so a
  row's logits are its unbatched logits up to the float rounding of batched products.
* Draft: per row, from its own drafter; rows whose drafters can draft together
  (``draft_many``: Medusa makes one heads call over every row's hidden state, Clover and
  Clover-2 grow the rows' trees in lock step, one head step per depth) do so
  (:func:`clover.heads.drafter.draft_rows`). Likewise each row's drafter observes its
  accepted states, and rows that can observe together (``observe_many``) do so
  (:func:`clover.heads.drafter.observe_rows`). Clover and Clover-2 queue the states and
  run their Augmenting Blocks when they next draft, once over every drafting row's
  waiting positions.
* Accept: per row, on that row's own N_b logits.
* Update cache: row b's accepted nodes move from columns ``P + path`` to ``[L_b, L_b + m_b)``
  (:func:`clover.cache.compact_rows`): every row stays contiguous from column 0, and the
  cache is cropped to the new longest row. Rows that finish (EOS, stop string, their own
  ``max_new_tokens``) leave the batch: their cache rows are dropped, so they cost no more
  drafting or verification.

Rows that join (:meth:`~clover.engine.Engine.serve`): between two steps queued requests may join the
batch (:mod:`clover.requests`, which also builds every forward's inputs in this layout);
:meth:`~clover.engine.Engine.stream_batch` is the case where every row joins before the first step
(:class:`StepLoop` runs both).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterator

import torch

from clover.acceptance import Acceptance, SamplingConfig, accept_rows, logits_to_probs
from clover.cache import append_rows, cache_length, compact_rows, new_cache, select_rows
from clover.heads.drafter import draft_rows, observe_rows
from clover.models import token_texts
from clover.requests import Row, check_finite, prefill_inputs, verify_inputs
from clover.trace import GenerationResult, StepTrace, tree_nodes
from clover.tree import Tree

if TYPE_CHECKING:
    from clover.engine import Engine


@dataclass(frozen=True)
class StepTimes:
    """Wall time of one step's parts, in ms: ``draft`` (growing the trees), ``forward``
    (the target's forward over them), ``accept`` (acceptance, commit, KV-cache
    compaction), ``update`` (the drafters observing the verified states)."""

    draft: float
    forward: float
    accept: float
    update: float


class StepLoop:
    """The decoding loop itself, over a set of rows that changes: rows join between steps
    (their prompts prefilled together in a KV cache of their own, then placed below the
    running rows, :func:`clover.cache.append_rows`) and leave when they finish. Every step
    is draft -> verify -> accept -> update for all rows at once (module docstring).

    Args:
        engine: the engine whose target and drafters decode.
        sampling: shared by every row; each row samples with its own generator.
        stop_strings: shared by every row.
        make_cache: builds an empty KV cache for a model config (``clover.cache.new_cache``,
            or ``clover.cache.buffered_cache``: no copy of the whole cache per step, what
            :class:`BatchRun` and :meth:`Engine.serve` use).
        trace_nodes: record each step's tree nodes (:class:`TreeNode`, the target's top
            tokens at each); when False, ``StepTrace.nodes`` is empty, every other field
            is kept.
    """

    def __init__(self, engine: Engine, sampling: SamplingConfig, stop_strings: tuple[str, ...],
                 make_cache: Callable = new_cache, trace_nodes: bool = True):
        self.engine = engine
        self.sampling = sampling
        self.stop_strings = stop_strings
        self.make_cache = make_cache
        self.trace_nodes = trace_nodes

    def _sync(self):
        if self.engine.target.device.type == "cuda":
            torch.cuda.synchronize()

    def run(self, admit: Callable[[list[Row], int], list[Row]]) -> Iterator[tuple[list[StepTrace], list[Row]]]:
        """Decode until no row is left and none joins.

        Args:
            admit: called before every step with the running rows and the KV cache's
                length P; returns the rows that join now (possibly none).
        Yields:
            per step, (one :class:`StepTrace` per row that took part, in row order; the
            rows that finished at this step).
        Raises:
            NonFiniteLogitsError: the target's logits hold NaN or inf.
        """
        cache, active = None, []
        while True:
            new = admit(active, 0 if cache is None else cache_length(cache))
            if new:
                cache = self._admit(active, new, cache)
                active = active + new
            if not active:
                return
            # inference mode is thread-local, so it is entered per block and never held across
            # a yield: a consumer may resume this generator from another thread
            with torch.inference_mode():
                starts = [r.length for r in active]  # committed positions before this step
                t_draft = time.perf_counter()
                trees = self._draft(active)                                                    # draft
                self._sync()
                t_verify = time.perf_counter()
                prefix = cache_length(cache)  # positions cached before this step's tree nodes
                out = self._verify(trees, cache, starts, prefix, len(active[0].steps) + 1)     # verify
                self._sync()
                t_accept = time.perf_counter()
                accs, commits, keep = self._accept(active, trees, out, cache, starts, prefix)  # accept
                self._sync()
                t_update = time.perf_counter()
                self._update(active, trees, accs, out, keep)                                   # update
                self._sync()
                t_end = time.perf_counter()
                times = StepTimes(draft=(t_verify - t_draft) * 1e3, forward=(t_accept - t_verify) * 1e3,
                                  accept=(t_update - t_accept) * 1e3, update=(t_end - t_update) * 1e3)
                traces = [self._trace(r, tree, out.logits[b, :len(tree)], acc, kept, times, starts[b])
                          for b, (r, tree, acc, kept) in enumerate(zip(active, trees, accs, commits))]
            yield traces, [r for r in active if r.stop_reason is not None]
            active = [active[b] for b in keep]

    def _admit(self, active: list[Row], new: list[Row], cache):
        """Prefill the joining rows in a KV cache of their own and place them below the
        running rows; returns the batch's cache. Each joining row's ``prefill_ms`` is this
        admission's time."""
        t0 = time.perf_counter()
        part = self.make_cache(self.engine.target.config)
        with torch.inference_mode():
            self._prefill(new, part)
            if active:
                append_rows(cache, part, len(active), len(new))
        self._sync()
        prefill_ms = (time.perf_counter() - t0) * 1e3
        for r in new:
            r.root, r.prefill_ms = r.prompt[-1], prefill_ms
        return cache if active else part

    def _prefill(self, rows: list[Row], cache) -> None:
        """Prefill every prompt but its last token (the first root), in one forward."""
        target = self.engine.target
        tokens = [r.prompt[:-1] for r in rows]
        if not any(tokens):
            return
        ids, positions, mask = prefill_inputs(tokens, target.dtype, target.device)
        out = target.forward_batch(ids, positions, mask, cache, last_only=True)
        check_finite(out.logits, [1 if t else 0 for t in tokens], "the prompt's prefill")
        for b, r in enumerate(rows):
            r.length = len(tokens[b])
        seen = [b for b, r in enumerate(rows) if r.length]
        observe_rows([rows[b].drafter for b in seen], [out.hidden_pre[b, :rows[b].length] for b in seen],
                     [out.hidden_post[b, :rows[b].length] for b in seen], [tokens[b] for b in seen])

    def result(self, row: Row) -> GenerationResult:
        """A finished row's :class:`GenerationResult`."""
        return GenerationResult(
            text=self.engine.target.tokenizer.decode(row.new, skip_special_tokens=True),
            token_ids=row.new, steps=row.steps, prompt_tokens=len(row.prompt),
            prefill_ms=row.prefill_ms, decode_s=row.decode_s, stop_reason=row.stop_reason,
            method=self.engine.method, seed=row.generator.initial_seed(),
        )

    def _draft(self, active: list[Row]) -> list[Tree]:
        """Draft: each row's candidate tree, rooted at its last committed token, no deeper
        than its tokens left but one (the bonus token)."""
        return draft_rows([r.drafter for r in active], [r.root for r in active],
                          [r.max_new_tokens - len(r.new) - 1 for r in active])

    def _verify(self, trees: list[Tree], cache, starts: list[int], prefix: int, step: int):
        """Verify: one target forward over every row's tree (tree attention mask, position
        ids = the row's committed length ``starts[b]`` + depth), appended after the
        ``prefix`` cached positions; returns the batched :class:`~clover.models.TargetOutput`.

        Raises:
            NonFiniteLogitsError: the target's logits at a tree node hold NaN or inf.
        """
        target = self.engine.target
        n, plan = max(len(t) for t in trees), self.engine.verify_widths
        width = plan[n - 1] if plan and len(trees) == 1 and n <= len(plan) else None
        ids, positions, mask = verify_inputs(trees, starts, prefix, target.dtype, target.device, width)
        out = target.forward_batch(ids, positions, mask, cache)
        check_finite(out.logits, [len(t) for t in trees], f"decode step {step}")
        return out

    def _accept(self, active: list[Row], trees: list[Tree], out, cache, starts: list[int], prefix: int):
        """Accept: each row's accepted path and bonus token, committed to the row (stopping
        where plain decoding would); the KV cache keeps only the accepted paths, and the
        rows that finished leave it.

        Returns:
            (the rows' :class:`~clover.acceptance.Acceptance`, the tokens each committed,
            the batch places of the rows that go on).
        """
        accs = accept_rows(trees, out.logits, self.sampling, [r.generator for r in active])
        lengths = compact_rows(cache, starts, prefix, [a.path for a in accs])
        target = self.engine.target
        commits = [r.commit(tree.tokens[acc.path[1:]].tolist() + [acc.bonus_token], target.eos_token_ids,
                            self.stop_strings, target.tokenizer) for r, tree, acc in zip(active, trees, accs)]
        keep = [b for b, r in enumerate(active) if r.stop_reason is None]
        if len(keep) < len(active):  # finished rows leave the batch
            select_rows(cache, keep, max((lengths[b] for b in keep), default=0))
        for b in keep:
            active[b].length = lengths[b]
        return accs, commits, keep

    def _update(self, active: list[Row], trees: list[Tree], accs: list[Acceptance], out,
                keep: list[int]) -> None:
        """Update: the drafters of the rows that go on observe their accepted paths' hidden
        states, and each such row's bonus token becomes its next root."""
        self._observe([active[b] for b in keep], [trees[b] for b in keep], [accs[b].path for b in keep],
                      out, keep)
        for b in keep:
            active[b].root = accs[b].bonus_token

    def _observe(self, rows: list[Row], trees: list[Tree], paths: list[list[int]], out,
                 batch_rows: list[int]) -> None:
        """Each row's drafter observes its accepted path: the verified hidden states, (m_b, D)
        per row, gathered from the forward's (B, N, D) in one index (``batch_rows``: the
        rows' places in that batch), and the path's token ids."""
        if not rows:
            return
        device = self.engine.target.device
        at = (torch.tensor([b for b, path in zip(batch_rows, paths) for _ in path], device=device),
              torch.tensor([i for path in paths for i in path], device=device))
        sizes = [len(path) for path in paths]
        tokens = [tree.tokens.tolist() for tree in trees]
        observe_rows([r.drafter for r in rows], out.hidden_pre[at].split(sizes), out.hidden_post[at].split(sizes),
                     [[toks[i] for i in path] for toks, path in zip(tokens, paths)])

    def _trace(self, row: Row, tree: Tree, logits: torch.Tensor, acc: Acceptance,
               kept: list[int], times: "StepTimes", start: int) -> StepTrace:
        """The row's record of this step (appended to its steps); the times are the
        whole batch step's. Built after the step's timed calls: every display field
        (texts, probabilities, the target's top tokens) is made here, never in them.

        Args:
            logits: (N, V) the target's logits at the row's tree nodes.
            start: the row's committed positions in the KV cache before the step.
        """
        n_drafts = min(len(kept), len(acc.path) - 1)  # accepted drafts committed
        texts = [row.detok.push(t) for t in kept]  # the text each committed token adds
        if row.stop_reason is not None:
            texts[-1] += row.detok.flush()
        if self.trace_nodes:
            probs = logits_to_probs(logits, self.sampling)  # (N, V) the target's, after each node
            nodes, last = tree_nodes(tree, probs, self.engine.target.tokenizer), probs[acc.path[-1]]
        else:  # only the last accepted node's distribution: (V,)
            nodes, last = [], logits_to_probs(logits[acc.path[-1]], self.sampling)
        bonus_prob = float(last[acc.bonus_token])
        draft_ms, verify_ms = times.draft + times.update, times.forward + times.accept
        row.decode_s += (draft_ms + verify_ms) / 1e3
        trace = StepTrace(
            step=len(row.steps), nodes=nodes, accepted=acc.path[:1 + n_drafts],
            cut=acc.path[1 + n_drafts:], bonus_token=acc.bonus_token,
            bonus_text=token_texts(self.engine.target.tokenizer, [acc.bonus_token])[0], bonus_prob=bonus_prob,
            bonus_committed=len(kept) == len(acc.path),
            new_tokens=kept, new_text=texts, accepted_length=len(kept),
            draft_ms=draft_ms, verify_ms=verify_ms, total_tokens=len(row.new),
            finished=row.stop_reason is not None, stop_reason=row.stop_reason, row=row.index,
            prefix_length=start, forward_ms=times.forward, accept_ms=times.accept, update_ms=times.update,
        )
        row.steps.append(trace)
        return trace
