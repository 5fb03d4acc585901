"""Benchmark: plain, Medusa and Clover decoding side by side, in one process.

Every method runs on the same prompts, after a warm-up, at batch size 1, through the same
engine, and the methods run in lockstep on each prompt (:func:`clover.methods.lockstep`: one decode step
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

The package: :mod:`~clover.bench.records` (settings and run records),
:mod:`~clover.bench.protocol` (running the methods), :mod:`~clover.bench.references`
(transformers' own decoders as references) and :mod:`~clover.bench.report` (summaries,
tables, charts).
"""
from clover.bench.protocol import batch_record, mark_matches_plain, mark_speedups, run_bench
from clover.bench.records import HF_GENERATE, HF_LOOKUP, BenchConfig, RunRecord, lookup_share, machine_info
from clover.bench.references import HFGenerate, HFPromptLookup
from clover.bench.report import (BATCH_SWEEP_FILE, CHARTS_MISSING, batch_sweep_figure, batch_table, charts_available,
                                 load_batch_sweep, load_report, markdown_tables, summarize, write_batch_charts,
                                 write_charts)

__all__ = ["BenchConfig", "RunRecord", "HF_LOOKUP", "HF_GENERATE", "HFPromptLookup", "HFGenerate", "run_bench",
           "batch_record", "mark_speedups", "mark_matches_plain", "lookup_share", "machine_info", "summarize",
           "markdown_tables", "batch_table", "load_report", "BATCH_SWEEP_FILE", "load_batch_sweep",
           "batch_sweep_figure", "write_batch_charts", "charts_available", "CHARTS_MISSING", "write_charts"]
