"""The transformers references the benchmark runs beside the engine's methods: its own
prompt lookup decoding (``hf-lookup``) and its batched ``generate`` (``hf-generate``, the
reference of a batch-size sweep), each returning the engine's result type."""
from __future__ import annotations

import torch

from clover.acceptance import SamplingConfig
from clover.bench.records import HF_GENERATE, HF_LOOKUP
from clover.trace import GenerationResult


class HFPromptLookup:
    """transformers' prompt lookup decoding (``generate(prompt_lookup_num_tokens=N)``,
    greedy) on the same model object, timed like an engine so that the bench reports it
    beside the ``lookup`` method.

    Every target forward is timed by hooks and becomes one step; the tokens each forward
    committed are read from the KV cache length at the start of the next one (transformers
    crops the cache to the accepted tokens). Its first forward runs the whole prompt plus
    the first drafts; like the engine, which prefills all but the last prompt token
    outside its step times, the time of a forward over the prompt but its last token
    (measured just before, on the same model) is taken off that first step. Only greedy
    decoding is supported.
    """

    heads = None
    lookup = None
    method = HF_LOOKUP

    def __init__(self, target, num_tokens: int = 10, max_ngram: int = 2):
        self.target, self.num_tokens, self.max_ngram = target, num_tokens, max_ngram

    def generate(self, prompt_ids, max_new_tokens: int, sampling: SamplingConfig | None = None,
                 stop_strings=()) -> GenerationResult:
        import time

        from clover.trace import StepTrace, TreeNode

        if sampling is not None and sampling.temperature > 0:
            raise ValueError("the hf-lookup reference runs greedy decoding only")
        model, calls = self.target.model, []

        def pre(module, args, kwargs):
            cache = kwargs.get("cache")
            if cache is None:
                cache = kwargs.get("past_key_values")
            calls.append([time.perf_counter(), None, int(kwargs["input_ids"].shape[1]),
                          cache.get_seq_length() if cache is not None else 0])

        def post(module, args, kwargs, out):
            calls[-1][1] = time.perf_counter()

        ids = torch.tensor([list(prompt_ids)], device=self.target.device)
        p = ids.shape[1]
        with torch.inference_mode():
            t0 = time.perf_counter()
            if p > 1:  # what the engine leaves out of its step times
                model(input_ids=ids[:, :-1], use_cache=True, logits_to_keep=1)
            prefill_ms = (time.perf_counter() - t0) * 1e3
            h1 = model.register_forward_pre_hook(pre, with_kwargs=True)
            h2 = model.register_forward_hook(post, with_kwargs=True)
            try:
                eos = sorted(self.target.eos_token_ids)
                out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                     max_new_tokens=max_new_tokens, prompt_lookup_num_tokens=self.num_tokens,
                                     max_matching_ngram_size=self.max_ngram, eos_token_id=eos or None,
                                     pad_token_id=(eos or [0])[0])
            finally:
                h1.remove()
                h2.remove()
        new = out[0, p:].tolist()
        starts = [p - 1] + [c[3] for c in calls[1:]] + [p + len(new) - 1]  # cache length per call
        steps, total = [], 0
        for i, (t_start, t_end, n_in, _) in enumerate(calls):
            k = starts[i + 1] - starts[i]  # tokens this forward committed
            drafted = n_in - (p if i == 0 else 1)
            total += k
            ms = (t_end - t_start) * 1e3 - (prefill_ms if i == 0 else 0.0)
            steps.append(StepTrace(
                step=i, nodes=[TreeNode(j, 0, "", j - 1, j, 1.0, 1.0, "root" if j == 0 else "lookup")
                               for j in range(drafted + 1)],
                accepted=list(range(k)), bonus_token=0, bonus_text="", new_tokens=new[total - k: total],
                accepted_length=k, draft_ms=0.0, verify_ms=max(ms, 0.0), total_tokens=total))
        return GenerationResult(
            text=self.target.tokenizer.decode(new, skip_special_tokens=True), token_ids=new,
            steps=steps, prompt_tokens=p, prefill_ms=prefill_ms,
            decode_s=sum(s.verify_ms for s in steps) / 1e3, method=HF_LOOKUP)


class HFGenerate:
    """transformers' own batched greedy ``generate`` (left padded) on the same model object,
    timed like an engine: the reference that batched plain decoding is held to in a
    batch-size sweep (the engine's plain decoding should be within 10% of it).

    Every target forward is one step of every row still decoding (finished rows are padded
    by ``generate`` until the longest ends, and their steps stop at their EOS). A step is
    timed, by hooks, from the start of its forward to the start of the next (the last: to
    the return of ``generate``), so, like the engine's step times, it includes choosing
    the token, stopping checks and cache bookkeeping. As for :class:`HFPromptLookup`, the
    time of a forward over the prompts but their last tokens, measured just before on the
    same model, is taken off the first step, so that, like the engine's, the step times
    leave the prefill out.
    """

    heads = None
    lookup = None
    method = HF_GENERATE

    def __init__(self, target):
        self.target = target

    def generate_batch(self, prompts, max_new_tokens: int, sampling: SamplingConfig | None = None,
                       stop_strings=(), seeds=None) -> list[GenerationResult]:
        """One :class:`GenerationResult` per prompt (greedy; ``seeds`` are ignored).

        Raises:
            ValueError: for sampling or stop strings (not supported by this reference).
        """
        import time

        from clover.trace import StepTrace, TreeNode

        if (sampling is not None and sampling.temperature > 0) or stop_strings:
            raise ValueError(f"the {HF_GENERATE} reference runs greedy decoding without stop strings only")
        model, device = self.target.model, self.target.device
        eos = sorted(self.target.eos_token_ids)
        pad = (eos or [0])[0]
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), pad, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for b, p in enumerate(prompts):  # left padded, as generate expects
            ids[b, width - len(p):] = torch.tensor(list(p))
            mask[b, width - len(p):] = 1
        ids, mask = ids.to(device), mask.to(device)
        starts: list[float] = []  # the start of every forward of generate
        with torch.inference_mode():
            t0 = time.perf_counter()
            if width > 1:  # what the engine leaves out of its step times
                model(input_ids=ids[:, :-1], attention_mask=mask[:, :-1], use_cache=True, logits_to_keep=1)
            prefill_ms = (time.perf_counter() - t0) * 1e3
            hook = model.register_forward_pre_hook(lambda *a: starts.append(time.perf_counter()))
            try:
                out = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=max_new_tokens,
                                     eos_token_id=eos or None, pad_token_id=pad)
                if device.type == "cuda":
                    torch.cuda.synchronize()
                starts.append(time.perf_counter())
            finally:
                hook.remove()
        ms = [(end - start) * 1e3 for start, end in zip(starts, starts[1:])]
        ms[0] = max(ms[0] - prefill_ms, 0.0)
        results = []
        for b, (p, row) in enumerate(zip(prompts, out[:, width:].tolist())):
            end = next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
            tokens = row[:end]
            steps = [StepTrace(step=i, nodes=[TreeNode(0, t, "", -1, 0, 1.0, 1.0, "root")], accepted=[0],
                               bonus_token=t, bonus_text="", new_tokens=[t], accepted_length=1,
                               draft_ms=0.0, verify_ms=ms[i], total_tokens=i + 1,
                               finished=i == len(tokens) - 1, row=b) for i, t in enumerate(tokens)]
            results.append(GenerationResult(
                text=self.target.tokenizer.decode(tokens, skip_special_tokens=True), token_ids=tokens,
                steps=steps, prompt_tokens=len(p), prefill_ms=prefill_ms,
                decode_s=sum(ms[:len(tokens)]) / 1e3,
                stop_reason="eos" if tokens and tokens[-1] in eos else "length", method=HF_GENERATE))
        return results
