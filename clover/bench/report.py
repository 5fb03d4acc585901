"""The benchmark's report: summaries (ratios of totals, per-prompt spread, load), Markdown
tables, and the Plotly charts (optional: the core install writes no charts)."""
from __future__ import annotations

import json
import logging
import statistics
from pathlib import Path

from clover.machine import busy
from clover.bench.records import HF_GENERATE, TIME_PARTS, BenchConfig, RunRecord
from clover.methods import METHOD_COLORS

log = logging.getLogger(__name__)


def load_report(plain_step_ms: list[float]) -> dict | None:
    """How loaded the machine was during a run, from plain decoding's step times (ms):
    their median, their quiet floor (the 5th percentile) and ``busy``, as
    :func:`clover.machine.busy` says of the two. None for fewer than 20 steps."""
    if len(plain_step_ms) < 20:
        return None
    floor = statistics.quantiles(plain_step_ms, n=20)[0]
    median = statistics.median(plain_step_ms)
    return {"plain_step_ms_median": round(median, 3), "plain_step_ms_p05": round(floor, 3),
            "busy": busy(typical_ms=median, quiet_ms=floor)}


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
            split = [x.time_split for x in rows if x.time_split]
            if split:
                entry["time_split"] = {k: statistics.fmean(t[k] for t in split) for k in TIME_PARTS}
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
    lines += time_table(results["summary"].get("all", {}))
    return "\n".join(lines)


def time_table(methods: dict) -> list[str]:
    """Markdown lines: where a step's time goes per method (mean ms per step: drafting,
    the drafters' state update, the target's forward, acceptance with the KV-cache
    compaction) and the tokens per step at which the method breaks even with plain
    decoding here (its step's time over plain decoding's: below it, it is slower). Empty
    when no method's records split their time."""
    rows = {m: e for m, e in methods.items() if "time_split" in e}
    if not rows:
        return []
    plain = rows.get("ar")
    plain_ms = sum(plain["time_split"].values()) if plain else None
    lines = ["## Where the time goes", "",
             "Mean ms per step, all prompts: drafting (a Clover drafter's Augmenting Block "
             "included), the drafters' state update, the target's forward over the tree, and "
             "acceptance with the KV-cache compaction. Break-even: the tokens per step at which "
             "a step this long decodes as fast as plain decoding here.", "",
             "| method | draft | update | forward | accept | step | tokens/step | break-even tokens/step |",
             "|---|---|---|---|---|---|---|---|"]
    for m, e in rows.items():
        t = e["time_split"]
        step = sum(t.values())
        even = f"{step / plain_ms:.2f}" if plain_ms else "-"
        lines.append(f"| {m} | {t['draft']:.2f} | {t['update']:.2f} | {t['forward']:.1f} | {t['accept']:.2f} "
                     f"| {step:.1f} | {e['mean_accepted_length']:.2f} | {even} |")
    return lines + [""]


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
