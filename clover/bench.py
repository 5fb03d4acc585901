"""Benchmark: plain, Medusa and Clover decoding side by side, in one process.

Every method runs on the same prompts, after a warm-up, at batch size 1, through the same
engine, and the methods run in lockstep on each prompt (:func:`clover.engine.lockstep`: one decode step
of each in turn, as the app races them), so a slow spell of the machine lands on every
method alike. Each prompt's speedup is :func:`clover.trace.speedup` (the definition the
app shows live: for the same text, the method's tokens/s over plain's on that prompt in
that repeat); the headline speedup of a category is a ratio of totals (all its prompts'
tokens over all their decode time, over plain's), which one disturbed prompt cannot
dominate, with the per-prompt geometric mean and 10th-90th percentiles as its spread.
``results["load"]`` says whether the machine was busy (plain decoding's step times far
above their quiet floor). Multi-turn prompts are answered turn by turn, each method
continuing its own conversation (Spec-Bench's protocol, arXiv 2401.07851 §4).

A batch-size sweep (``BenchConfig.batch_sizes``, ``clover bench --batch-size 1,2,4,8``;
the Clover paper's Table 1, arXiv 2405.00263) decodes the prompts' first turns in
batches of B consecutive prompts instead (:meth:`clover.engine.Engine.generate_batch`),
methods interleaved per batch. Its throughput is total tokens/s over every row of a
batch, its speedup is over plain decoding of the same batch at the same B (averaged
over batches), and its accepted length is per row and step. :func:`batch_sweep_figure`
draws it; a sweep's results.json committed as ``assets/bench/batch_sweep.json``
(:func:`load_batch_sweep`) is what the app's explainer tab and notebook 04 show.

Output folder: ``results.json`` (machine, settings, the command line when the CLI ran it,
every run, summary), ``results.md`` (a table per task category) and ``charts.html`` (Plotly).
"""
from __future__ import annotations

import json
import logging
import os
import platform
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from clover.acceptance import SamplingConfig
from clover.autotree import BUSY_SPREAD
from clover.engine import Engine, lockstep
from clover.methods import ALL_METHODS, METHOD_COLORS
from clover.training.prompts import interleave_categories, read_prompts
from clover.trace import GenerationResult, acceptance_rates, engine_ms, speedup

log = logging.getLogger(__name__)


HF_LOOKUP = "hf-lookup"  # the reference: transformers' own prompt lookup decoding
HF_GENERATE = "hf-generate"  # the reference of a batch-size sweep: transformers' batched generate


@dataclass(frozen=True)
class BenchConfig:
    """Benchmark settings.

    Attributes:
        methods: method names in run order (``clover.methods.ALL_METHODS``, or "hf-lookup"
            for transformers' prompt lookup as a reference, or in a batch-size sweep
            "hf-generate" for transformers' batched plain ``generate``); "ar" (plain) is
            the speedup baseline.
        max_new_tokens: per turn.
        temperature: 0 = greedy (then outputs are also checked against plain).
        repeats: passes over the prompts.
        max_prompts: use only N prompts, taken round-robin over the task categories in
            file order, so a short run still covers every category (None = all).
        warmup: warm-up generations per method before timing.
        seed: sampling seed (per prompt and repeat, shared by methods).
        batch_sizes: batch sizes to sweep; (1,) (the default) runs the per-prompt
            protocol above, anything else the batch-size sweep (first turns only).
    """

    methods: tuple[str, ...] = ("ar", "medusa", "clover")
    max_new_tokens: int = 128
    temperature: float = 0.0
    repeats: int = 1
    max_prompts: int | None = None
    warmup: int = 1
    seed: int = 0
    batch_sizes: tuple[int, ...] = (1,)

    @property
    def sweep(self) -> bool:
        """Whether this is a batch-size sweep rather than the per-prompt protocol."""
        return tuple(self.batch_sizes) != (1,)

    def __post_init__(self):
        if not self.methods or len(set(self.methods)) != len(self.methods):
            raise ValueError("methods must be a non-empty list without repeats")
        unknown = set(self.methods) - set(ALL_METHODS) - {HF_LOOKUP, HF_GENERATE}
        if unknown:
            raise ValueError(f"unknown methods {sorted(unknown)}; use {', '.join(ALL_METHODS)} "
                             f"or {HF_LOOKUP} (transformers' prompt lookup, for reference)")
        for ref in (HF_LOOKUP, HF_GENERATE):
            if ref in self.methods and self.temperature > 0:
                raise ValueError(f"{ref} (the transformers reference) runs greedy decoding only")
        if self.max_new_tokens < 1 or self.repeats < 1 or self.warmup < 0:
            raise ValueError("max_new_tokens and repeats must be >= 1, warmup >= 0")
        sizes = tuple(self.batch_sizes)
        if not sizes or len(set(sizes)) != len(sizes) or any(
                not isinstance(b, int) or isinstance(b, bool) or b < 1 for b in sizes):
            raise ValueError(f"batch sizes must be distinct integers >= 1, got {list(sizes)}")
        if self.sweep and HF_LOOKUP in self.methods:
            raise ValueError(f"{HF_LOOKUP} decodes one prompt at a time: leave it out of a batch-size sweep")
        if not self.sweep and HF_GENERATE in self.methods:
            raise ValueError(f"{HF_GENERATE} is the reference of a batch-size sweep: give --batch-size "
                             "with more than batch size 1")


@dataclass
class RunRecord:
    """One method on one prompt in one repeat (all turns together).

    ``acceptance_per_depth[d - 1]`` is the acceptance rate at draft depth d
    (:func:`clover.trace.acceptance_rates`: of the steps that drafted depth d, the share
    that accepted a token there)."""

    question_id: str
    category: str
    method: str
    repeat: int
    new_tokens: int
    wall_s: float
    tokens_per_second: float
    steps: int
    mean_accepted_length: float
    acceptance_per_depth: list[float]
    draft_ms: float
    verify_ms: float
    text: list[str] = field(default_factory=list)
    matches_plain: bool | None = None
    ttft_ms: float = 0.0  # time to the first new token: prefill + the first step, first turn
    lookup_share: float | None = None  # accepted drafts that prompt lookup proposed (methods with lookup)
    batch_size: int = 1  # rows decoded together (sweep: question_id joins theirs with ",")
    speedup: float | None = None  # over the plain run of the same prompt or batch (clover.trace.speedup)


def lookup_share(steps) -> float | None:
    """Share of committed drafted tokens that prompt lookup proposed (alone or as well
    as the heads); None when no drafted token was committed."""
    accepted = [step.nodes[i] for step in steps for i in step.accepted[1:]]
    if not accepted:
        return None
    return sum(1 for n in accepted if n.source in ("lookup", "both")) / len(accepted)


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


def machine_info(target) -> dict:
    """Hardware, dtype, threads and versions, stated with the results."""
    import transformers

    info = {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "device": str(target.device), "dtype": str(target.dtype).replace("torch.", ""),
            "python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "model": target.name,
            "date": __import__("datetime").date.today().isoformat()}
    if target.device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(target.device)
    return info


def _conversation(engine: Engine, target, turns: list[str], cfg: BenchConfig, seed: int, encode):
    """One method's conversation over ``turns``, as a generator that yields None after
    every decode step (after every turn for a reference without ``stream``), so that
    several methods can advance in lockstep (:func:`clover.engine.lockstep`), and the
    per-turn results last."""
    messages, results = [], []
    for turn in turns:
        messages.append({"role": "user", "content": turn})
        ids = encode(target.tokenizer, messages)
        sampling = SamplingConfig(temperature=cfg.temperature, seed=seed)
        if hasattr(engine, "stream"):
            run = engine.stream(ids, cfg.max_new_tokens, sampling)
            for _ in run:
                yield None
            res = run.result
        else:  # a transformers reference: one turn at a time
            res = engine.generate(ids, cfg.max_new_tokens, sampling)
            yield None
        results.append(res)
        messages.append({"role": "assistant", "content": res.text})
    yield results


def _run_conversation(engine: Engine, target, turns: list[str], cfg: BenchConfig, seed: int,
                      encode) -> list[GenerationResult]:
    *_, results = _conversation(engine, target, turns, cfg, seed, encode)
    return results


def mark_speedups(group: list[RunRecord], steps: list[list]) -> None:
    """Set each record's ``speedup`` over the plain ("ar") run of the same prompt (or
    batch), whatever order the methods ran in: :func:`clover.trace.speedup` of its steps
    (``steps[i]`` belongs to ``group[i]``: every turn's, or every row's) against plain's;
    nothing without a plain run."""
    base = next((st for x, st in zip(group, steps) if x.method == "ar"), None)
    if base is not None:
        for x, st in zip(group, steps):
            x.speedup = speedup(st, base)


def mark_matches_plain(group: list[RunRecord], temperature: float) -> None:
    """Greedy exactness of one prompt's (or batch's) runs, whatever order the methods
    ran in: set each non-plain record's ``matches_plain`` to whether its text equals the
    plain ("ar") run's; nothing when sampling or without a plain run."""
    plain = next((x for x in group if x.method == "ar"), None)
    if temperature == 0 and plain is not None:
        for x in group:
            if x.method != "ar":
                x.matches_plain = x.text == plain.text


def run_bench(target, engines: dict[str, Engine], prompts_path: str | Path, out_dir: str | Path,
              cfg: BenchConfig, progress: bool = True, extra_meta: dict | None = None,
              batch_engines: dict[int, dict[str, Engine]] | None = None) -> dict:
    """Run the benchmark and write results.json, results.md and charts.html.

    At temperature 0 every speculative run's text is compared with plain decoding's on
    the same prompt and repeat, whatever order the methods run in; greedy mismatches
    are listed in ``results["mismatches"]`` and in results.md (``clover bench`` then
    exits with status 1).

    Args:
        engines: method name -> Engine (the same target for all).
        batch_engines: in a batch-size sweep, batch size -> method -> Engine for the batch
            sizes whose engines differ (e.g. an "auto" tree sized per batch size); the
            others use ``engines``.
    Returns:
        the results dict written to results.json.
    Raises:
        ValueError: bad prompts file, or a method in ``cfg.methods`` without an engine.
    """
    from tqdm.auto import tqdm

    from clover.models import encode_prompt

    missing = [m for m in cfg.methods if m not in engines]
    if missing:
        raise ValueError(f"no engine for {missing}")
    prompts = read_prompts(prompts_path)
    if cfg.max_prompts is not None:
        prompts = interleave_categories(prompts)[: cfg.max_prompts]
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)

    if cfg.sweep:
        return _run_sweep(target, engines, prompts, prompts_path, out_dir, cfg, progress, extra_meta,
                          batch_engines or {})
    warm = prompts[0]["turns"][:1]
    for m in cfg.methods:
        for _ in range(cfg.warmup):
            _run_conversation(engines[m], target, warm, BenchConfig(
                methods=cfg.methods, max_new_tokens=min(16, cfg.max_new_tokens),
                temperature=cfg.temperature), cfg.seed, encode_prompt)

    records: list[RunRecord] = []
    plain_step_ms: list[float] = []
    bar = tqdm(total=len(prompts) * cfg.repeats * len(cfg.methods), desc="bench", unit="run",
               disable=not progress)
    for r in range(cfg.repeats):
        for i, p in enumerate(prompts):
            group: list[RunRecord] = []
            group_steps: list[list] = []
            bar.set_postfix(prompt=str(p["question_id"]))
            seed = cfg.seed * 1_000_003 + r * 10_007 + i
            # the methods in lockstep on this prompt: one step of each in turn
            runs = {m: _conversation(engines[m], target, p["turns"], cfg, seed, encode_prompt)
                    for m in cfg.methods}
            answers = {m: item for m, item in lockstep(runs) if item is not None}
            for m in cfg.methods:
                results = answers[m]
                new = sum(len(x.token_ids) for x in results)
                wall = sum(x.decode_s for x in results)
                steps = sum(len(x.steps) for x in results)
                heads, lookup = engines[m].heads, engines[m].lookup
                depth = max(heads.config.num_heads if heads is not None else 0,
                            lookup.max_tokens if lookup is not None else 0)
                all_steps = [s for x in results for s in x.steps]
                rec = RunRecord(
                    question_id=str(p["question_id"]), category=p["category"] or "all", method=m,
                    repeat=r, new_tokens=new, wall_s=wall,
                    tokens_per_second=new / wall if wall > 0 else 0.0, steps=steps,
                    mean_accepted_length=new / steps if steps else 0.0,
                    acceptance_per_depth=acceptance_rates(all_steps, depth),
                    draft_ms=statistics.fmean(s.draft_ms for s in all_steps) if all_steps else 0.0,
                    verify_ms=statistics.fmean(s.verify_ms for s in all_steps) if all_steps else 0.0,
                    text=[x.text for x in results],
                    lookup_share=lookup_share(all_steps) if lookup is not None else None,
                    ttft_ms=results[0].prefill_ms + (results[0].steps[0].draft_ms
                                                      + results[0].steps[0].verify_ms
                                                      if results[0].steps else 0.0))
                group.append(rec)
                group_steps.append(all_steps)
                records.append(rec)
                if m == "ar":
                    plain_step_ms += [engine_ms(s) for s in all_steps]
                bar.update(1)
            mark_matches_plain(group, cfg.temperature)
            mark_speedups(group, group_steps)
    bar.close()
    mismatches = [f"{x.method} on {x.question_id} (repeat {x.repeat})" for x in records
                  if x.matches_plain is False]

    results = {"meta": _meta(target, prompts, prompts_path, cfg, extra_meta, "prompt"),
               "mismatches": mismatches,
               "load": load_report(plain_step_ms),
               "summary": summarize(records, cfg),
               "runs": [asdict(x) for x in records]}
    (out_dir / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    (out_dir / "results.md").write_text(markdown_tables(results))
    write_charts(results, out_dir / "charts.html")
    return results


def _meta(target, prompts, prompts_path, cfg: BenchConfig, extra_meta, unit: str) -> dict:
    return {**machine_info(target), **(extra_meta or {}),
            "prompts": str(prompts_path), "n_prompts": len(prompts),
            "config": asdict(cfg),
            "method_order": f"interleaved per {unit}: {', '.join(cfg.methods)}",
            "warmup": {"runs_per_method": cfg.warmup,
                       "new_tokens": min(16, cfg.max_new_tokens),
                       "prompt": str(prompts[0]["question_id"])},
            "chat_template": getattr(target.tokenizer, "chat_template", None)}


def batch_record(results: list[GenerationResult], engine, question_ids: list[str], method: str,
                 repeat: int) -> RunRecord:
    """One method on one batch of prompts (the rows' results, in order) in one repeat.

    Throughput is over every row: all new tokens over the batch's decode time (the
    longest row's ``decode_s``, which took part in every step); accepted length is per
    row and step; draft and verify ms are per batch step."""
    new = sum(len(x.token_ids) for x in results)
    longest = max(results, key=lambda x: len(x.steps))  # decoding in every batch step
    wall = longest.decode_s
    row_steps = [s for x in results for s in x.steps]
    heads, lookup = engine.heads, engine.lookup
    depth = max(heads.config.num_heads if heads is not None else 0,
                lookup.max_tokens if lookup is not None else 0)
    first = longest.steps[0] if longest.steps else None
    return RunRecord(
        question_id=",".join(question_ids), category="all", method=method, repeat=repeat,
        new_tokens=new, wall_s=wall, tokens_per_second=new / wall if wall > 0 else 0.0,
        steps=len(row_steps), mean_accepted_length=new / len(row_steps) if row_steps else 0.0,
        acceptance_per_depth=acceptance_rates(row_steps, depth),
        draft_ms=statistics.fmean(s.draft_ms for s in longest.steps) if longest.steps else 0.0,
        verify_ms=statistics.fmean(s.verify_ms for s in longest.steps) if longest.steps else 0.0,
        text=[x.text for x in results],
        lookup_share=lookup_share(row_steps) if lookup is not None else None,
        ttft_ms=longest.prefill_ms + (first.draft_ms + first.verify_ms if first else 0.0),
        batch_size=len(results))


def _run_sweep(target, engines: dict[str, Engine], prompts: list[dict], prompts_path, out_dir: Path,
               cfg: BenchConfig, progress: bool, extra_meta: dict | None,
               batch_engines: dict[int, dict[str, Engine]]) -> dict:
    """The batch-size sweep of :func:`run_bench` (module docstring): per batch size B the
    prompts' first turns in consecutive batches of B (a last, smaller batch is left out),
    every method on each batch in turn (``batch_engines[B]`` where given, else
    ``engines``), after a warm-up at the largest B."""
    from tqdm.auto import tqdm

    from clover.models import encode_prompt

    too_big = [b for b in cfg.batch_sizes if b > len(prompts)]
    if too_big:
        raise ValueError(f"batch sizes {too_big} exceed the {len(prompts)} prompts")
    ids = [encode_prompt(target.tokenizer, [{"role": "user", "content": p["turns"][0]}]) for p in prompts]
    qids = [str(p["question_id"]) for p in prompts]
    sampling = SamplingConfig(temperature=cfg.temperature)
    warm = ids[:max(cfg.batch_sizes)]
    for m in cfg.methods:
        for _ in range(cfg.warmup):
            batch_engines.get(len(warm), engines)[m].generate_batch(
                warm, min(16, cfg.max_new_tokens), sampling, seeds=list(range(len(warm))))
    batches = {b: [list(range(i, i + b)) for i in range(0, len(prompts) - b + 1, b)] for b in cfg.batch_sizes}
    bar = tqdm(total=sum(len(v) for v in batches.values()) * cfg.repeats * len(cfg.methods),
               desc="bench", unit="batch", disable=not progress)
    records: list[RunRecord] = []
    for b, rows_list in batches.items():
        by_method = batch_engines.get(b, engines)
        for r in range(cfg.repeats):
            for rows in rows_list:
                seeds = [cfg.seed * 1_000_003 + r * 10_007 + i for i in rows]  # as per prompt
                group, group_steps = [], []
                for m in cfg.methods:
                    bar.set_postfix(batch_size=b, method=m)
                    results = by_method[m].generate_batch([ids[i] for i in rows], cfg.max_new_tokens,
                                                          sampling, seeds=seeds)
                    group.append(batch_record(results, by_method[m], [qids[i] for i in rows], m, r))
                    group_steps.append([s for x in results for s in x.steps])
                    bar.update(1)
                mark_matches_plain(group, cfg.temperature)
                mark_speedups(group, group_steps)
                records += group
    bar.close()
    mismatches = [f"{x.method} on {x.question_id} (batch size {x.batch_size}, repeat {x.repeat})"
                  for x in records if x.matches_plain is False]
    results = {"meta": _meta(target, prompts, prompts_path, cfg, extra_meta, "batch"),
               "mismatches": mismatches,
               "batch_summary": {str(b): summarize([x for x in records if x.batch_size == b], cfg)["all"]
                                 for b in cfg.batch_sizes},
               "runs": [asdict(x) for x in records]}
    (out_dir / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    (out_dir / "results.md").write_text(markdown_tables(results))
    write_charts(results, out_dir / "charts.html")
    return results


def load_report(plain_step_ms: list[float]) -> dict | None:
    """How loaded the machine was during a run, from plain decoding's step times (ms):
    their median, their quiet floor (the 5th percentile) and ``busy`` when the median is
    over :data:`clover.autotree.BUSY_SPREAD` times the floor. None for fewer than 20 steps."""
    if len(plain_step_ms) < 20:
        return None
    floor = statistics.quantiles(plain_step_ms, n=20)[0]
    median = statistics.median(plain_step_ms)
    return {"plain_step_ms_median": round(median, 3), "plain_step_ms_p05": round(floor, 3),
            "busy": median > BUSY_SPREAD * floor}


def _ratios(rows: list[RunRecord], plain: dict) -> tuple[list[float], list[float]]:
    """Per repeat the ratio of totals (the method's tokens over its decode time, summed
    over the prompts, over plain decoding's on the same prompts), and every prompt's own
    speedup (:func:`clover.trace.speedup`, in ``x.speedup``)."""
    by_repeat: dict[int, list[tuple[RunRecord, RunRecord]]] = {}
    for x in rows:
        base = plain.get((x.question_id, x.repeat))
        if base is not None:
            by_repeat.setdefault(x.repeat, []).append((x, base))
    totals = []
    for pairs in by_repeat.values():
        wall, base_wall = sum(x.wall_s for x, _ in pairs), sum(b.wall_s for _, b in pairs)
        tokens, base_tokens = sum(x.new_tokens for x, _ in pairs), sum(b.new_tokens for _, b in pairs)
        if wall > 0 and base_wall > 0 and tokens and base_tokens:
            totals.append((tokens / wall) / (base_tokens / base_wall))
    return totals, [x.speedup for x in rows if x.speedup is not None and x.speedup > 0]


def summarize(records: list[RunRecord], cfg: BenchConfig) -> dict:
    """Per category (and "all") and method: tokens/s (all tokens over all decode time),
    accepted length, mean draft and verify ms, and the speedup over plain decoding.

    ``speedup`` is a ratio of totals: the method's tokens/s over plain's on the same
    prompts (or batches), all of them summed, so one disturbed prompt cannot dominate it;
    averaged over repeats, with ``speedup_min``/``speedup_max`` over repeats. Beside it
    the per-prompt speedups' geometric mean and 10th-90th percentiles show the spread."""
    cats = sorted({x.category for x in records}) + ["all"]
    out: dict = {}
    for c in cats:
        out[c] = {}
        plain = {(x.question_id, x.repeat): x for x in records
                 if x.method == "ar" and (c == "all" or x.category == c)}
        for m in cfg.methods:
            rows = [x for x in records if x.method == m and (c == "all" or x.category == c)]
            if not rows:
                continue
            wall = sum(x.wall_s for x in rows)
            entry = {"tokens_per_second": sum(x.new_tokens for x in rows) / wall if wall > 0 else 0.0,
                     "mean_accepted_length": sum(x.new_tokens for x in rows) / max(1, sum(x.steps for x in rows)),
                     "draft_ms": statistics.fmean(x.draft_ms for x in rows),
                     "verify_ms": statistics.fmean(x.verify_ms for x in rows),
                     "runs": len(rows)}
            shares = [x.lookup_share for x in rows if x.lookup_share is not None]
            if shares:
                entry["lookup_share"] = statistics.fmean(shares)
            depth = max(len(x.acceptance_per_depth) for x in rows)
            if depth:
                entry["acceptance_per_depth"] = [
                    statistics.fmean(x.acceptance_per_depth[d] for x in rows if len(x.acceptance_per_depth) > d)
                    for d in range(depth)]
            totals, per_prompt = _ratios(rows, plain)
            if totals:
                entry["speedup"] = statistics.fmean(totals)
                entry["speedup_min"], entry["speedup_max"] = min(totals), max(totals)
            if per_prompt:
                entry["speedup_geomean"] = statistics.geometric_mean(per_prompt)
                if len(per_prompt) >= 2:
                    deciles = statistics.quantiles(per_prompt, n=10)
                    entry["speedup_p10"], entry["speedup_p90"] = deciles[0], deciles[-1]
                else:
                    entry["speedup_p10"] = entry["speedup_p90"] = per_prompt[0]
            if cfg.temperature == 0 and m != "ar":
                flags = [x.matches_plain for x in rows if x.matches_plain is not None]
                entry["all_match_plain"] = all(flags) if flags else None
            out[c][m] = entry
    return out


def markdown_tables(results: dict) -> str:
    """One Markdown table per category: tokens/s, accepted length, speedup (min-max)."""
    meta = results["meta"]
    lines = [f"# Benchmark: {meta['model']} on {meta['device']} ({meta['dtype']}, "
             f"{meta['torch_threads']} threads)", "",
             f"{meta['n_prompts']} prompts from `{meta['prompts']}`, "
             f"max_new_tokens={meta['config']['max_new_tokens']}, "
             f"temperature={meta['config']['temperature']}, repeats={meta['config']['repeats']}; "
             f"torch {meta['torch']}, transformers {meta['transformers']}, {meta['processor']}.", ""]
    if meta.get("command"):
        lines += [f"Made with `{meta['command']}`.", ""]
    if results.get("mismatches"):
        lines += ["**⚠ Greedy output differs from plain decoding** (a correctness bug): "
                  + "; ".join(results["mismatches"]), ""]
    if "batch_summary" in results:
        return "\n".join(lines + batch_table(results["batch_summary"]))
    load = results.get("load")
    if load:
        lines += [f"Plain decoding's steps: median {load['plain_step_ms_median']:.1f} ms, quiet floor "
                  f"(5th percentile) {load['plain_step_ms_p05']:.1f} ms"
                  + (" — **the machine was busy during this run: the ratios are less certain**."
                     if load["busy"] else "."), ""]
    lines += ["Speedup: the method's tokens/s over plain decoding's, all prompts summed (min-max "
              "over repeats); per prompt: the geometric mean of each prompt's speedup and its "
              "10th-90th percentiles. The methods ran in lockstep, one step of each in turn.", ""]
    for cat, methods in results["summary"].items():
        lines += [f"## {cat}", "", "| method | tokens/s | tokens/step | draft ms/step | verify ms/step "
                  "| speedup vs plain (min-max) | per prompt: geo-mean (p10-p90) | same text as plain "
                  "| drafts from lookup |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for m, e in methods.items():
            sp = (f"{e['speedup']:.2f}x ({e['speedup_min']:.2f}-{e['speedup_max']:.2f})"
                  if "speedup" in e else "-")
            per = (f"{e['speedup_geomean']:.2f}x ({e['speedup_p10']:.2f}-{e['speedup_p90']:.2f})"
                   if "speedup_geomean" in e else "-")
            same = {True: "yes", False: "NO", None: "-"}[e.get("all_match_plain")]
            lines.append(f"| {m} | {e['tokens_per_second']:.1f} | {e['mean_accepted_length']:.2f} | "
                         f"{e['draft_ms']:.1f} | {e['verify_ms']:.1f} | {sp} | {per} | {same} | "
                         + (f"{e['lookup_share']:.0%} |" if "lookup_share" in e else "- |"))
        lines.append("")
    return "\n".join(lines)


def batch_table(batch_summary: dict) -> list[str]:
    """Markdown lines: per batch size and method, total tokens/s over all rows, tokens
    per row and step, and speedup over plain decoding at the same batch size."""
    lines = ["## Speedup against batch size", "",
             "Total tokens/s over every row of a batch; speedup over plain decoding of the same "
             "batches at the same batch size (min-max over repeats).", "",
             "| batch size | method | tokens/s (all rows) | tokens/step per row | verify ms/step "
             "| speedup vs plain (min-max) | same text as plain |",
             "|---|---|---|---|---|---|---|"]
    for b, methods in batch_summary.items():
        for m, e in methods.items():
            sp = (f"{e['speedup']:.2f}x ({e['speedup_min']:.2f}-{e['speedup_max']:.2f})"
                  if "speedup" in e else "-")
            same = {True: "yes", False: "NO", None: "-"}[e.get("all_match_plain")]
            lines.append(f"| {b} | {m} | {e['tokens_per_second']:.1f} | {e['mean_accepted_length']:.2f} | "
                         f"{e['verify_ms']:.1f} | {sp} | {same} |")
    return lines + [""]


BATCH_SWEEP_FILE = Path("bench") / "batch_sweep.json"  # under clover.assets.assets_dir()


def load_batch_sweep(path: str | Path | None = None) -> dict | None:
    """The committed batch-size sweep: a ``clover bench --batch-size ...`` results.json
    (``meta`` with the config and the ``command`` that made it, and ``batch_summary``),
    read from ``path`` or else ``assets/bench/batch_sweep.json``
    (:func:`clover.assets.assets_dir`). None when the file does not exist (the measurement
    is not committed yet); drawn by :func:`batch_sweep_figure`, never re-run.

    Raises:
        ValueError: when the file is not a batch-size sweep or does not say how it was made.
    """
    if path is None:
        from clover.assets import assets_dir

        path = assets_dir() / BATCH_SWEEP_FILE
    path = Path(path)
    if not path.is_file():
        return None
    results = json.loads(path.read_text(encoding="utf-8"))
    meta = results.get("meta", {})
    if "batch_summary" not in results or "config" not in meta:
        raise ValueError(f"{path} is not a batch-size sweep's results.json (no batch_summary or meta.config)")
    if not meta.get("command"):
        raise ValueError(f"{path} does not record the command that made it (meta.command)")
    return results


def batch_sweep_figure(results: dict):
    """The shape of the Clover paper's Table 1 (arXiv 2405.00263) from a batch-size sweep's
    results (``results.json`` with ``batch_summary``): one line per method, in the order of
    ``meta.config.methods``, over two panels sharing the x axis.

    - x (both panels): batch size B, the prompts decoded together (log scale, one tick per
      size swept);
    - y, top: total decoding speed, tokens/s summed over every row of a batch;
    - y, bottom: speedup, the method's tokens/s over plain decoding's on the same batches
      at the same batch size (plain decoding itself is the line at 1).

    Methods keep their colour (:data:`clover.methods.METHOD_COLORS`); transformers'
    batched ``generate`` (``hf-generate``, the reference for plain decoding) is drawn in
    plain decoding's grey, dashed. Each trace's ``meta`` is its method name.

    Returns:
        a ``plotly.graph_objects.Figure``.
    """
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from clover.methods import METHOD_LABELS

    summary = results["batch_summary"]
    sizes = sorted(int(b) for b in summary)
    meta = results.get("meta", {})
    methods = list(meta.get("config", {}).get("methods")
                   or dict.fromkeys(m for by_method in summary.values() for m in by_method))
    fig = make_subplots(rows=2, cols=1, vertical_spacing=0.15, subplot_titles=(
        "Total decoding speed (all rows of a batch)",
        "Speedup over plain decoding at the same batch size"))
    for m in methods:
        entries = [summary[str(b)].get(m, {}) for b in sizes]
        line = (dict(color=METHOD_COLORS["ar"], dash="dash") if m == HF_GENERATE
                else dict(color=METHOD_COLORS.get(m)))
        name = "transformers generate" if m == HF_GENERATE else METHOD_LABELS.get(m, m)
        style = dict(mode="lines+markers", line=line, legendgroup=m, name=name, meta=m, x=sizes)
        fig.add_trace(go.Scatter(y=[e.get("tokens_per_second") for e in entries], **style), row=1, col=1)
        fig.add_trace(go.Scatter(y=[e.get("speedup") for e in entries], showlegend=False, **style),
                      row=2, col=1)
    for row in (1, 2):
        fig.update_xaxes(title_text="batch size", type="log", tickvals=sizes, ticktext=[str(b) for b in sizes],
                         row=row, col=1)
    fig.update_yaxes(title_text="tokens / s", row=1, col=1)
    fig.update_yaxes(title_text="speedup (x)", row=2, col=1)
    where = f": {meta['model']} on {meta['device']}" if "model" in meta and "device" in meta else ""
    fig.update_layout(height=800, title=f"Speedup against batch size{where}")
    return fig


def write_batch_charts(results: dict, path: Path) -> None:
    """Plotly HTML of a batch-size sweep: :func:`batch_sweep_figure`, self-contained."""
    batch_sweep_figure(results).write_html(str(path), include_plotlyjs=True)


def charts_available() -> bool:
    """Whether Plotly is installed (the ``app`` extra): charts.html needs it; the
    benchmark itself and its results.json and results.md do not."""
    import importlib.util

    return importlib.util.find_spec("plotly") is not None


CHARTS_MISSING = ("charts.html is not written: Plotly is not installed (pip install "
                  "'clover-studio[app]' or pip install plotly); results.json and results.md are")


def write_charts(results: dict, path: Path) -> None:
    """Plotly HTML: tokens/s and speedup per category, acceptance per depth (a batch-size
    sweep: :func:`write_batch_charts`). Without Plotly (the core install), logs
    :data:`CHARTS_MISSING` and writes nothing."""
    if not charts_available():
        log.warning(CHARTS_MISSING)
        return
    if "batch_summary" in results:
        return write_batch_charts(results, path)
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    summary = results["summary"]
    cats = list(summary)
    methods = list(results["meta"]["config"]["methods"])
    fig = make_subplots(rows=3, cols=1, vertical_spacing=0.12, subplot_titles=(
        "Decoding speed per task category", "Speedup over plain decoding (same prompts, same run)",
        "Acceptance rate per draft depth (all prompts)"))
    colors = METHOD_COLORS
    for m in methods:
        fig.add_trace(go.Bar(name=m, x=cats, y=[summary[c].get(m, {}).get("tokens_per_second") for c in cats],
                             marker_color=colors.get(m), legendgroup=m), row=1, col=1)
        sp = [summary[c].get(m, {}) for c in cats]
        fig.add_trace(go.Bar(name=m, x=cats, y=[e.get("speedup") for e in sp], marker_color=colors.get(m),
                             legendgroup=m, showlegend=False,
                             error_y=dict(type="data", symmetric=False,
                                          array=[(e.get("speedup_max", 0) - e.get("speedup", 0)) for e in sp],
                                          arrayminus=[(e.get("speedup", 0) - e.get("speedup_min", 0)) for e in sp])),
                      row=2, col=1)
        acc = summary["all"].get(m, {}).get("acceptance_per_depth")
        if acc:
            fig.add_trace(go.Bar(name=m, x=[f"depth {d + 1}" for d in range(len(acc))], y=acc,
                                 marker_color=colors.get(m), legendgroup=m, showlegend=False), row=3, col=1)
    fig.update_yaxes(title_text="tokens / s", row=1, col=1)
    fig.update_yaxes(title_text="speedup (x)", row=2, col=1)
    fig.update_yaxes(title_text="share of steps", range=[0, 1], row=3, col=1)
    fig.update_layout(barmode="group", height=1000, title=f"clover bench: {results['meta']['model']} "
                      f"on {results['meta']['device']}")
    fig.write_html(str(path), include_plotlyjs=True)  # self-contained: opens offline
