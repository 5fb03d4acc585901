"""The benchmark's protocol: every method on the same prompts, warmed up, in lockstep per
prompt (:func:`run_bench`), or in batches for a batch-size sweep; each run recorded,
checked against plain decoding, and written (see :mod:`clover.bench`)."""
from __future__ import annotations

import json
import statistics
from dataclasses import asdict
from pathlib import Path

from clover.acceptance import SamplingConfig
from clover.bench.records import BenchConfig, RunRecord, lookup_share, machine_info, time_split
from clover.bench.report import load_report, markdown_tables, summarize, write_charts
from clover.engine import Engine
from clover.methods import lockstep
from clover.trace import GenerationResult, acceptance_rates, engine_ms, speedup
from clover.training.prompts import interleave_categories, read_prompts


def _conversation(engine: Engine, target, turns: list[str], cfg: BenchConfig, seed: int, encode):
    """One method's conversation over ``turns``, as a generator that yields None after
    every decode step (after every turn for a reference without ``stream``), so that
    several methods can advance in lockstep (:func:`clover.methods.lockstep`), and the
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
                    text=[x.text for x in results], time_split=time_split(all_steps),
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

    results = {"meta": _meta(target, prompts, prompts_path, cfg, {**draft_kernels(engines), **(extra_meta or {})},
                             "prompt"),
               "mismatches": mismatches,
               "load": load_report(plain_step_ms),
               "summary": summarize(records, cfg),
               "runs": [asdict(x) for x in records]}
    (out_dir / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    (out_dir / "results.md").write_text(markdown_tables(results))
    write_charts(results, out_dir / "charts.html")
    return results


def draft_kernels(engines: dict) -> dict:
    """``{"draft_kernels": {method: the heads' linear kernel per row count, in words}}``
    for the head methods whose heads run the CPU kernels (``TargetModel.adopt``: the
    drafting kernels, fp16 among them, are timed per heads), so a table says what each
    method ran; empty when none does."""
    from clover.models import TargetModel

    kernels = {m: TargetModel.draft_kernels_text(e.heads) for m, e in engines.items()
               if getattr(e, "heads", None) is not None and getattr(e.heads, "linear_kernels", None)}
    return {"draft_kernels": kernels} if kernels else {}


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
        text=[x.text for x in results], time_split=time_split(longest.steps),
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
    results = {"meta": _meta(target, prompts, prompts_path, cfg, {**draft_kernels(engines), **(extra_meta or {})},
                             "batch"),
               "mismatches": mismatches,
               "batch_summary": {str(b): summarize([x for x in records if x.batch_size == b], cfg)["all"]
                                 for b in cfg.batch_sizes},
               "runs": [asdict(x) for x in records]}
    (out_dir / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    (out_dir / "results.md").write_text(markdown_tables(results))
    write_charts(results, out_dir / "charts.html")
    return results
