"""The one decoding loop: draft -> verify -> accept -> update cache, for every method.

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
"""
from __future__ import annotations

import time
from typing import Iterator, Sequence

import torch

from clover.acceptance import SamplingConfig, accept, logits_to_probs
from clover.cache import cache_length, compact_cache, new_cache
from clover.heads import DraftHeads, PlainDrafter
from clover.lookup import HybridDrafter, LookupConfig, LookupDrafter
from clover.models import TargetModel, TextStream
from clover.trace import GenerationResult, StepTrace, TreeNode
from clover.tree import Tree, TreeConfig, position_ids, tree_mask


class Engine:
    """Speculative (or plain) decoding of one prompt at a time with a target model.

    Args:
        target: the target model.
        heads: Medusa or Clover heads; None for plain autoregressive decoding.
        tree: how each step's candidate tree is grown, a concrete tree (ignored for plain
            decoding; a tree of kind "off" drafts nothing, so the heads decode as plain
            decoding). The setting "auto" is resolved before, at the edges, by
            ``clover.autotree.resolve_tree``.
        lookup: prompt lookup drafting (``clover.lookup``): alone (no heads) it is the
            method "lookup"; with heads it adds a lookup branch to their tree
            ("medusa+lookup", "clover+lookup"; sized per step, see
            ``clover.lookup.HybridDrafter``).
    Raises:
        ValueError: when the heads do not fit the target, or ``tree`` is still "auto".
    """

    def __init__(self, target: TargetModel, heads: DraftHeads | None = None,
                 tree: TreeConfig | None = None, lookup: LookupConfig | None = None):
        from clover.heads import check_fits

        if heads is not None:
            check_fits(heads.config, target)
        if tree is not None and tree.auto:
            raise ValueError("the tree setting 'auto' is resolved before building an Engine: "
                             "tree, lookup = clover.autotree.resolve_tree(target, heads, tree, lookup)")
        self.target = target
        self.heads = heads
        self.tree = tree or TreeConfig()
        self.method = method_name(heads, lookup)
        self.lookup = lookup

    def drafter(self):
        """A fresh per-run drafter for this engine's method (see ``clover.heads.base.Drafter``)."""
        heads = (self.heads.drafter(self.target, self.tree)
                 if self.heads is not None and not self.tree.off else None)
        if self.lookup is None:
            return heads or PlainDrafter()
        lookup = LookupDrafter(self.lookup)
        if heads is None:
            return lookup
        budget = len(self.tree.paths) if self.tree.kind == "static" else self.tree.budget
        return HybridDrafter(heads, lookup, budget)

    def stream(self, prompt_ids: Sequence[int], max_new_tokens: int = 128,
               sampling: SamplingConfig | None = None,
               stop_strings: Sequence[str] = ()) -> "DecodeRun":
        """Start a run; iterate it for one :class:`StepTrace` per step.

        After the iteration ends, ``run.result`` holds the :class:`GenerationResult`.

        Raises:
            ValueError: see :func:`validate_request`.
        """
        return DecodeRun(self, list(prompt_ids), max_new_tokens, sampling or SamplingConfig(),
                         tuple(stop_strings))

    def generate(self, prompt_ids: Sequence[int], max_new_tokens: int = 128,
                 sampling: SamplingConfig | None = None,
                 stop_strings: Sequence[str] = ()) -> GenerationResult:
        """Blocking generation; see :meth:`stream` for the arguments and errors."""
        run = self.stream(prompt_ids, max_new_tokens, sampling, stop_strings)
        for _ in run:
            pass
        return run.result


def validate_request(target: TargetModel, prompt: Sequence[int], max_new_tokens: int,
                     stop_strings: Sequence[str] = ()) -> None:
    """Check one generation request before any model work; the engine, CLI and app all
    call this, so a setting is refused the same way everywhere.

    Raises:
        ValueError: empty prompt, token ids outside the vocabulary, prompt (plus
            ``max_new_tokens``) longer than the model's context, ``max_new_tokens`` not a
            positive integer, an empty or non-string stop string.
    """
    if not prompt:
        raise ValueError("the prompt is empty")
    if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens <= 0:
        raise ValueError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
    if isinstance(stop_strings, str):
        raise ValueError("stop_strings must be a list of strings, not one string")
    for s in stop_strings:
        if not isinstance(s, str) or s == "":
            raise ValueError(f"stop strings must be non-empty text, got {s!r}")
    if min(prompt) < 0 or max(prompt) >= target.vocab_size:
        raise ValueError(f"prompt token ids must lie in the vocabulary [0, {target.vocab_size})")
    context = f"the model's context of {target.max_context}"
    if getattr(target, "sliding_window", None):
        context += (f" (its sliding attention window: decoding here keeps every position, "
                    f"so prompt and answer must fit in {target.sliding_window} tokens)")
    if len(prompt) >= target.max_context:
        raise ValueError(f"the prompt has {len(prompt)} tokens; it must be shorter than {context}")
    if len(prompt) + max_new_tokens > target.max_context:
        raise ValueError(
            f"prompt ({len(prompt)} tokens) + max_new_tokens ({max_new_tokens}) exceeds "
            f"{context}; lower max_new_tokens to at most {target.max_context - len(prompt)}"
        )


class DecodeRun:
    """One generation run; iterate it to decode step by step (see :meth:`Engine.stream`)."""

    def __init__(self, engine: Engine, prompt: list[int], max_new_tokens: int,
                 sampling: SamplingConfig, stop_strings: tuple[str, ...]):
        validate_request(engine.target, prompt, max_new_tokens, stop_strings)
        self.engine = engine
        self.prompt = prompt
        self.max_new_tokens = max_new_tokens
        self.sampling = sampling
        self.stop_strings = stop_strings
        self.result: GenerationResult | None = None

    def _sync(self):
        if self.engine.target.device.type == "cuda":
            torch.cuda.synchronize()

    def __iter__(self) -> Iterator[StepTrace]:
        eng, target, sampling = self.engine, self.engine.target, self.sampling
        device = target.device
        generator = torch.Generator(device=device)
        if sampling.seed is not None:
            generator.manual_seed(sampling.seed)
        else:
            generator.seed()
        drafter = eng.drafter()
        cache = new_cache(target.config)
        new: list[int] = []
        detok = TextStream(target.tokenizer)
        steps: list[StepTrace] = []
        stop_reason = "length"

        # inference mode is thread-local, so it is entered per block and never held across
        # a yield: a consumer may resume this generator from another thread
        t0 = time.perf_counter()
        if len(self.prompt) > 1:  # prefill all but the last prompt token, the first root
            with torch.inference_mode():
                ids = torch.tensor([self.prompt[:-1]], device=device)
                pos = torch.arange(ids.shape[1], device=device).unsqueeze(0)
                out = target.forward(ids, pos, None, cache, last_only=True)
                drafter.observe(out.hidden_pre, out.hidden_post, self.prompt[:-1])
            self._sync()
        prefill_ms = (time.perf_counter() - t0) * 1e3
        root = self.prompt[-1]
        decode_s = 0.0  # sum of draft + verify time: neither trace building nor the consumer
        while True:
            with torch.inference_mode():
                t_draft = time.perf_counter()
                tree = drafter.draft(root, max_depth=self.max_new_tokens - len(new) - 1)
                self._sync()
                t_verify = time.perf_counter()
                prefix = cache_length(cache)
                tokens = tree.tokens.to(device)
                mask = tree_mask(tree.parents, prefix, target.dtype, device) if len(tree) > 1 else None
                out = target.forward(tokens.unsqueeze(0), position_ids(tree.depths, prefix, device),
                                     mask, cache)
                acc = accept(tree, out.logits, sampling, generator)
                compact_cache(cache, prefix, acc.path)
                committed = tree.tokens[acc.path[1:]].tolist() + [acc.bonus_token]
                kept, stop_reason = self._cut(new, committed)
                new.extend(kept)
                texts = [detok.push(t) for t in kept]
                finished = stop_reason is not None
                if finished:
                    texts[-1] += detok.flush()
                n_drafts = min(len(kept), len(acc.path) - 1)  # accepted drafts committed
                self._sync()
                t_update = time.perf_counter()
                if not finished:
                    drafter.observe(out.hidden_pre[acc.path], out.hidden_post[acc.path],
                                    tree.tokens[acc.path].tolist())
                    self._sync()
                    root = acc.bonus_token
                t_end = time.perf_counter()
                draft_ms = ((t_verify - t_draft) + (t_end - t_update)) * 1e3
                verify_ms = (t_update - t_verify) * 1e3
                decode_s += (draft_ms + verify_ms) / 1e3
                nodes = self._nodes(tree, out.logits)
                bonus_prob = float(logits_to_probs(out.logits[acc.path[-1]], sampling)[acc.bonus_token])
            trace = StepTrace(
                step=len(steps), nodes=nodes, accepted=acc.path[:1 + n_drafts],
                cut=acc.path[1 + n_drafts:], bonus_token=acc.bonus_token,
                bonus_text=target.tokenizer.decode([acc.bonus_token]), bonus_prob=bonus_prob,
                bonus_committed=len(kept) == len(committed),
                new_tokens=kept, new_text=texts, accepted_length=len(kept),
                draft_ms=draft_ms, verify_ms=verify_ms, total_tokens=len(new), finished=finished,
                stop_reason=stop_reason,
            )
            steps.append(trace)
            yield trace
            if finished:
                break

        self.result = GenerationResult(
            text=target.tokenizer.decode(new, skip_special_tokens=True),
            token_ids=new, steps=steps, prompt_tokens=len(self.prompt),
            prefill_ms=prefill_ms, decode_s=decode_s, stop_reason=stop_reason,
            method=eng.method, seed=generator.initial_seed(),
        )

    def _cut(self, new: list[int], committed: list[int]) -> tuple[list[int], str | None]:
        """Commit tokens one at a time, stopping exactly where plain decoding would."""
        kept: list[int] = []
        eos = self.engine.target.eos_token_ids
        for tok in committed:
            kept.append(tok)
            if tok in eos:
                return kept, "eos"
            if self.stop_strings:
                text = self.engine.target.tokenizer.decode(new + kept)
                if any(s in text for s in self.stop_strings):
                    return kept, "stop_string"
            if len(new) + len(kept) >= self.max_new_tokens:
                return kept, "length"
        return kept, None

    def _nodes(self, tree: Tree, logits: torch.Tensor) -> list[TreeNode]:
        """Trace records of the tree, with the target's probability of each node."""
        tok = self.engine.target.tokenizer
        ids = tree.tokens.tolist()
        target_p = [1.0]
        if len(tree) > 1:
            parents = torch.tensor(tree.parents[1:], device=logits.device)
            probs = logits_to_probs(logits[parents], self.sampling)  # (N-1, V)
            target_p += probs.gather(-1, tree.tokens[1:, None].to(logits.device))[:, 0].tolist()
        texts = tok.batch_decode([[i] for i in ids])
        sources = tree.sources or ["root"] + ["head"] * (len(tree) - 1)
        return [TreeNode(i, ids[i], texts[i], tree.parents[i], tree.depths[i],
                         float(tree.draft_probs[i]), float(target_p[i]), sources[i])
                for i in range(len(tree))]


def method_name(heads: DraftHeads | None, lookup: LookupConfig | None) -> str:
    """"ar", "medusa", "clover", "lookup", "medusa+lookup" or "clover+lookup"."""
    if heads is None:
        return "lookup" if lookup is not None else "ar"
    return heads.config.kind + ("+lookup" if lookup is not None else "")
