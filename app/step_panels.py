"""The inside of one decode step, as figures: what verification compared, the tree
attention mask, what the KV-cache update kept, Clover's regressive inputs, and why the
step is as fast as it is on this machine. Pure functions of a step's own
:class:`~clover.trace.StepTrace` (and, for the speed panel, numbers the app already
has); nothing is recomputed with the model, no Gradio.

Node order everywhere is the trace's: node 0 the root, then the drafted nodes in the
order the target verified them. Colours are those of :mod:`app.figures` (Okabe-Ito),
always with a second cue (a word or a marker shape).
"""
from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Mapping, Sequence

import plotly.graph_objects as go

from app.figures import (FONT, STATUS_STYLE, empty_figure, escape_token, legend_below,
                         title_layout, token_label)
from app.metrics import ACCEPTED, CUT, REJECTED, ROOT, node_statuses
from clover.bench.records import time_split
from clover.methods import METHOD_LABELS, split_method, with_lookup
from clover.trace import StepTrace
from clover.tree import ancestor_matrix
from clover.lookup import verify_ms

KEPT_COLOR = STATUS_STYLE[ACCEPTED]["color"]  # green: kept in the KV cache
DROPPED_COLOR = STATUS_STYLE[REJECTED]["color"]  # vermillion: dropped
MASK_SEES = STATUS_STYLE["bonus"]["color"]  # blue: may attend
MASK_HIDDEN = "#F2F2F2"
NOT_TRIED = "not tried"  # sampling: its parent was not accepted, or a sibling was first

CAPTIONS = {
    "verify": "Each drafted token beside what the target itself wanted at that place: a draft "
              "is kept only where the target agrees.",
    "mask": "Who may look at whom in the one verification forward: each token sees the "
            "committed text and its own ancestors, never a sibling branch.",
    "kv": "After verification the KV cache keeps the positions of the accepted path and drops "
          "every other drafted position.",
    "regressive": "Clover's Regressive Connection: the token each draft head was told came "
                  "just before the one it guessed.",
    "speed": "How much one more verified token costs on this machine, and what that means for "
             "the speedup.",
    "time": "Where a step's time goes, for the method on display beside Medusa and plain "
            "decoding: a step must commit more tokens than its break-even to beat plain "
            "decoding here.",
}


def _label(step: StepTrace, i: int) -> str:
    return f"{i} {token_label(step.nodes[i].text, 8)}"


# ---------------------------------------------------------------- verify, per node


@dataclass
class VerifyRow:
    """One drafted node as verification saw it.

    Attributes:
        node / depth / text: the node (its id in the step's node order), depth and token.
        status: accepted, rejected, cut (accepted after the end) or :data:`NOT_TRIED`
            (sampling: its parent was not accepted, or an earlier sibling was, so no
            draw decided it).
        draft_prob: the heads' probability of the token.
        target_prob: the target's probability of it at the parent.
        wanted: the target's own top tokens at the parent, as (text, probability).
        chance: sampling only: the probability it was accepted with (its share of the
            target's distribution left after the siblings rejected before it); None
            for greedy, where the rule is "the target's most likely token".
    """

    node: int
    depth: int
    text: str
    status: str
    draft_prob: float
    target_prob: float
    wanted: list[tuple[str, float]]
    chance: float | None


def verify_rows(step: StepTrace, greedy: bool = True) -> list[VerifyRow]:
    """Per drafted node (node order), what verification compared it with
    (:class:`VerifyRow`); from the trace's ``target_top`` and ``target_prob``.

    Sampling tries a parent's children in node order and accepts child c with
    probability p(c) / (1 - the mass of the siblings rejected before it)
    (``clover.acceptance.accept_sample``); the children after an accepted one are never
    tried, nor are the children of a node that was not accepted.
    """
    statuses = node_statuses(step)
    verified = set(step.accepted + step.cut)
    rows, rejected_mass, done = [], {}, set()
    for n in step.nodes[1:]:
        status = statuses[n.id]
        chance = None
        if not greedy:
            if n.parent in done or n.parent not in verified:
                status = NOT_TRIED
            else:
                left = 1.0 - rejected_mass.get(n.parent, 0.0)
                chance = min(1.0, n.target_prob / left) if left > 0 else 0.0
            if status in (ACCEPTED, CUT):
                done.add(n.parent)
            elif status == REJECTED:
                rejected_mass[n.parent] = rejected_mass.get(n.parent, 0.0) + n.target_prob
        wanted = [(text, p) for _, text, p in step.nodes[n.parent].target_top]
        rows.append(VerifyRow(n.id, n.depth, n.text, status, n.draft_prob, n.target_prob,
                              wanted, chance))
    return rows


def verify_figure(step: StepTrace, greedy: bool = True) -> go.Figure:
    """A table of :func:`verify_rows`: each drafted token, its status (word and colour),
    the draft and target probabilities, and the target's own top tokens at its parent
    (greedy accepts the first of them); for sampling, the chance it was accepted with."""
    rows = verify_rows(step, greedy)
    if not rows:
        return empty_figure("Nothing was drafted this step: the target wrote one token itself",
                            height=160)
    fill = {ACCEPTED: "#DFF3EC", REJECTED: "#FBE5D9", CUT: "#EDEDED", NOT_TRIED: "#FFFFFF"}
    words = {ACCEPTED: "✓ accepted", REJECTED: "✗ rejected", CUT: "✓ accepted, after the end",
             NOT_TRIED: "– not tried"}
    wanted = [" · ".join(f"{html.escape(escape_token(t))} {p:.2f}" for t, p in r.wanted)
              for r in rows]
    cells = [[r.node for r in rows], [r.depth for r in rows],
             [html.escape(escape_token(r.text)) for r in rows], [words[r.status] for r in rows],
             [f"{r.draft_prob:.2f}" for r in rows], [f"{r.target_prob:.2f}" for r in rows],
             wanted]
    header = ["node", "depth", "drafted", "verdict", "draft p", "target p",
              "target's top tokens at the parent" + (" (greedy takes the first)" if greedy else "")]
    if not greedy:
        cells.insert(6, ["" if r.chance is None else f"{r.chance:.2f}" for r in rows])
        header.insert(6, "accepted with prob.")
    colours = [fill[r.status] for r in rows]
    fig = go.Figure(go.Table(
        columnwidth=[38, 40, 80, 130, 55, 60] + ([75] if not greedy else []) + [260],
        header=dict(values=[f"<b>{h}</b>" for h in header], fill_color="#F5F5F5",
                    align="left", font=dict(size=12)),
        cells=dict(values=cells, fill_color=[colours] * len(cells), align="left",
                   font=dict(size=12), height=24)))
    fig.update_layout(height=int(min(560, 70 + 25 * len(rows))), margin=dict(l=4, r=4, t=6, b=4),
                      font=dict(family=FONT), paper_bgcolor="white")
    return fig


# ---------------------------------------------------------------- the tree attention mask


def mask_matrix(step: StepTrace) -> list[list[bool]]:
    """The step's tree attention mask, the committed prefix summarised as one column:
    row i (node i), column 0 the prefix (always visible), column 1 + j node j, True
    where node i may attend (j is i or an ancestor of i: ``clover.tree.ancestor_matrix``
    of the nodes' parents, what verification used)."""
    anc = ancestor_matrix([n.parent for n in step.nodes]).tolist()
    return [[True] + row for row in anc]


def position_ids(step: StepTrace) -> list[int]:
    """The position id each node was verified at: ``prefix_length + depth``."""
    return [step.prefix_length + n.depth for n in step.nodes]


def mask_figure(step: StepTrace) -> go.Figure:
    """:func:`mask_matrix` as a labelled heatmap (blue: may attend), rows labelled with
    the node, its token and its position id."""
    m = mask_matrix(step)
    pos = position_ids(step)
    n = len(step.nodes)
    rows = [f"{_label(step, i)} · pos {pos[i]}" for i in range(n)]
    cols = [f"prefix ({step.prefix_length})"] + [_label(step, j) for j in range(n)]
    hover = [[f"{rows[i]} {'sees' if m[i][j] else 'does not see'} {cols[j]}"
              for j in range(n + 1)] for i in range(n)]
    fig = go.Figure(go.Heatmap(
        z=[[1 if v else 0 for v in row] for row in m], x=cols, y=rows, zmin=0, zmax=1,
        colorscale=[[0, MASK_HIDDEN], [1, MASK_SEES]], showscale=False, xgap=2, ygap=2,
        text=[["●" if v else "" for v in row] for row in m], texttemplate="%{text}",
        textfont=dict(color="white", size=10), hovertext=hover,
        hovertemplate="%{hovertext}<extra></extra>"))
    size = int(min(620, 120 + 24 * n))
    # the title at the top of the figure, above the column labels (Plotly moves the
    # plot down for both)
    fig.update_layout(height=size, margin=dict(l=10, r=10, t=10, b=10), font=dict(family=FONT, size=11),
                      paper_bgcolor="white", plot_bgcolor="white",
                      title=dict(text="rows: the query token · columns: what it may attend to (●)",
                                 x=0.01, xanchor="left", yref="container", y=1, yanchor="top",
                                 pad=dict(t=8), automargin=True, font=dict(size=12)),
                      xaxis=dict(side="top", tickangle=-45, fixedrange=True, type="category"),
                      yaxis=dict(autorange="reversed", fixedrange=True, type="category"))
    return fig


# ---------------------------------------------------------------- the KV-cache update


def kv_update(step: StepTrace) -> list[tuple[int, bool, int | None]]:
    """Per node (node order): (node id, kept, the cache position it holds after the
    update, or None when dropped). The update keeps the verified path (``accepted``,
    then ``cut``) at positions ``prefix_length``, ``prefix_length + 1``, ...; every other
    drafted position goes."""
    path = step.accepted + step.cut
    slot = {i: step.prefix_length + k for k, i in enumerate(path)}
    return [(n.id, n.id in slot, slot.get(n.id)) for n in step.nodes]


def kv_figure(step: StepTrace) -> go.Figure:
    """:func:`kv_update` on the node order: kept positions as green squares with their
    new cache position, dropped ones as vermillion crosses."""
    rows = kv_update(step)
    fig = go.Figure()
    for kept, name, color, symbol in ((True, "kept in the KV cache", KEPT_COLOR, "square"),
                                      (False, "dropped", DROPPED_COLOR, "x")):
        pts = [r for r in rows if r[1] == kept]
        fig.add_trace(go.Scatter(
            x=[r[0] for r in pts], y=[0] * len(pts), mode="markers+text", name=name, meta=name,
            marker=dict(symbol=symbol, size=22, color=color, line=dict(width=1, color="white")),
            text=[f"→ {r[2]}" if kept else "" for r in pts], textposition="bottom center",
            hovertext=[f"{_label(step, r[0])}: " + (f"kept, now cache position {r[2]}" if kept
                                                    else "dropped") for r in pts],
            hovertemplate="%{hovertext}<extra></extra>"))
    n = len(step.nodes)
    fig.update_layout(
        height=220, margin=dict(l=10, r=10, t=10, b=30), font=dict(family=FONT, size=12),
        paper_bgcolor="white", plot_bgcolor="white", showlegend=True,  # also with nothing dropped
        title=title_layout(f"before: {step.prefix_length} + {n} positions · after: "
                           f"{step.prefix_length + len(step.accepted) + len(step.cut)}", size=12),
        legend=legend_below(),
        xaxis=dict(tickvals=list(range(n)), ticktext=[_label(step, i) for i in range(n)],
                   range=[-0.6, n - 0.4], fixedrange=True, showgrid=False),
        yaxis=dict(visible=False, range=[-1, 0.8], fixedrange=True))
    return fig


# ---------------------------------------------------------------- Clover's regressive inputs


def regressive_inputs(step: StepTrace) -> list[tuple[int, int, list[int]]]:
    """Per parent whose children the draft heads drafted: (depth drafted, the parent
    node whose token entered the Attention Decoder, the children drafted from it). At
    depth 1 the parent is the root (the target's own last token); deeper it is the
    previous head's choice. Nodes only prompt lookup proposed are left out."""
    kids: dict[int, list[int]] = {}
    for n in step.nodes[1:]:
        if n.source in ("head", "both"):
            kids.setdefault(n.parent, []).append(n.id)
    return sorted(((step.nodes[p].depth + 1, p, c) for p, c in kids.items()),
                  key=lambda r: (r[0], r[1]))


def regressive_figure(step: StepTrace, method: str) -> go.Figure:
    """:func:`regressive_inputs` as a table for Clover methods; for other methods a
    note on why there is none."""
    kind = split_method(method)[0]
    if kind is None:
        return empty_figure("No draft heads in this method, so no regressive inputs", height=120)
    if not kind.startswith("clover"):
        return empty_figure("Medusa's heads get no regressive input: each guesses from the "
                            "hidden state alone", height=120)
    rows = regressive_inputs(step)
    if not rows:
        return empty_figure("The heads drafted nothing this step", height=120)
    statuses = node_statuses(step)
    mark = {ACCEPTED: "✓", CUT: "✓", REJECTED: "✗", ROOT: ""}

    def tok(i):
        return f"{html.escape(escape_token(step.nodes[i].text))} {mark[statuses[i]]}".strip()

    cells = [[d for d, _, _ in rows],
             [f"head {d}" for d, _, _ in rows],
             [tok(p) for _, p, _ in rows],
             ["the target's token (root)" if p == 0 else f"head {d - 1}'s choice (node {p})"
              for d, p, _ in rows],
             [" · ".join(tok(c) for c in kids) for _, _, kids in rows]]
    fig = go.Figure(go.Table(
        columnwidth=[45, 55, 90, 170, 260],
        header=dict(values=["<b>depth</b>", "<b>head</b>", "<b>input token</b>",
                            "<b>where it came from</b>", "<b>tokens the head drafted from it</b>"],
                    fill_color="#F5F5F5", align="left", font=dict(size=12)),
        cells=dict(values=cells, align="left", font=dict(size=12), height=24)))
    fig.update_layout(height=int(min(420, 70 + 25 * len(rows))), margin=dict(l=4, r=4, t=6, b=4),
                      font=dict(family=FONT), paper_bgcolor="white")
    return fig


# ---------------------------------------------------------------- why this fast, here


@dataclass
class SpeedFacts:
    """What the speed panel reads, all already measured.

    Attributes:
        costs: this machine's verify cost curve, ms of one target forward over 1, 2, ...
            tokens (measured at start-up for prompt lookup, see
            ``clover.calibration.verify_costs``), or None where it was not measured.
        budget: the tree budget the run used (drafted tokens per step), None for no tree.
        auto: whether that budget was sized to this machine ("auto").
        device: "cpu" or "cuda".
        tokens_per_step: the run's measured tokens per step (tau, bonus included).
        verified_per_step: the run's mean tree size, root included (tokens per forward).
        measured: the measured speedup over plain decoding, None without a plain run.
        draft_ms: the run's mean drafting time per step in ms (0 for plain decoding).
    """

    costs: Sequence[float] | None
    budget: int | None
    auto: bool
    device: str
    tokens_per_step: float
    verified_per_step: float
    measured: float | None
    draft_ms: float = 0.0


def expected_speedup(facts: SpeedFacts) -> float | None:
    """What the cost curve predicts: tokens per step times the cost of one plain token
    over a step's cost, the verification of the run's mean tree
    (:func:`clover.lookup.verify_ms`) plus its mean drafting time."""
    if not facts.costs or facts.verified_per_step <= 0:
        return None
    return facts.tokens_per_step * facts.costs[0] / (verify_ms(facts.costs, facts.verified_per_step)
                                                     + facts.draft_ms)


def speed_reading(facts: SpeedFacts) -> str:
    """One paragraph (Markdown) that reads the speed panel's numbers."""
    if not facts.costs:
        text = (f"The verify cost curve of this machine was not measured yet (it is measured at "
                f"start-up, in the background; never on ZeroGPU), so nothing is predicted. The "
                f"run kept {facts.tokens_per_step:.2f} tokens per step")
        if facts.measured is not None:
            return text + f"; measured: **{facts.measured:.2f}×** over plain decoding."
        return text + "."
    c1, n = facts.costs[0], facts.verified_per_step
    cn = verify_ms(facts.costs, n)
    tree = ("no tree of draft heads" if not facts.budget else
            f"a tree of {facts.budget} drafted tokens"
            + (" (auto: sized to this machine)" if facts.auto else ""))
    exp = expected_speedup(facts)
    text = (f"On this {facts.device.upper()} one target forward costs {c1:.1f} ms for one token "
            f"and {cn:.1f} ms for the {n:.1f} tokens this run verified per step on average "
            f"({(cn / c1 - 1) * 100:+.0f}%"
            + (f"; beyond the {len(facts.costs)} measured sizes the curve is extended along its "
               f"mean slope" if n > len(facts.costs) else "")
            + f"). The run used {tree} and kept "
            f"{facts.tokens_per_step:.2f} tokens per step; with its {facts.draft_ms:.1f} ms of "
            f"drafting per step the curve predicts **{exp:.2f}×**")
    if facts.measured is not None:
        text += (f"; measured: **{facts.measured:.2f}×** over plain decoding (the gap is "
                 f"bookkeeping and timing noise).")
    else:
        text += "; turn on the comparison to measure the real speedup."
    if facts.device == "cpu":
        text += (" On a CPU each extra verified token costs real time, so a small tree pays "
                 "best; on a GPU the curve stays flat until much larger trees.")
    else:
        text += " On a GPU the curve stays flat for a while, so larger trees come almost free."
    return text


def speed_figure(facts: SpeedFacts) -> go.Figure:
    """The verify cost curve (ms per forward against tokens verified), with the run's
    mean tree size marked."""
    if not facts.costs:
        return empty_figure("The verify cost curve was not measured on this machine", height=200)
    xs = list(range(1, len(facts.costs) + 1))
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=xs, y=list(facts.costs), mode="lines+markers",
                             name="one target forward", line=dict(color="#0072B2", width=3),
                             marker=dict(symbol="circle", size=8),
                             hovertemplate="%{x} tokens: %{y:.1f} ms<extra></extra>"))
    n = facts.verified_per_step
    if n > len(xs):  # past the measured sizes: the extension verify_ms uses, dashed
        fig.add_trace(go.Scatter(x=[xs[-1], n], y=[facts.costs[-1], verify_ms(facts.costs, n)],
                                 mode="lines", name="extended (not measured)", meta="extended",
                                 line=dict(color="#0072B2", width=2, dash="dash"),
                                 hoverinfo="skip"))
    fig.add_trace(go.Scatter(x=[n], y=[verify_ms(facts.costs, n)], mode="markers",
                             name="this run's mean tree", meta="run",
                             marker=dict(symbol="star", size=18, color="#D55E00"),
                             hovertemplate="%{x:.1f} tokens per step: %{y:.1f} ms<extra></extra>"))
    fig.update_layout(height=300, margin=dict(l=50, r=10, t=16, b=40), font=dict(family=FONT, size=12),
                      paper_bgcolor="white", plot_bgcolor="white",
                      legend=legend_below(),
                      xaxis=dict(title="tokens verified in one forward", gridcolor="#EEEEEE",
                                 range=[0.5, max(len(xs), n) + 0.5], fixedrange=True),
                      yaxis=dict(title="ms", gridcolor="#EEEEEE", rangemode="tozero",
                                 fixedrange=True))
    return fig


# ---------------------------------------------------------------- where a step's time goes

# a step's parts in the order they run (clover.bench.records.TIME_PARTS): label, colour
TIME_PART_STYLE = {
    "draft": ("drafting the tree", "#009E73"),
    "update": ("drafter update (observing the verified states)", "#56B4E9"),
    "forward": ("verify: the target's forward over the tree", "#0072B2"),
    "accept": ("verify: acceptance and the KV-cache update", "#E69F00"),
}


def time_methods(method: str, runs: Mapping[str, Sequence[StepTrace]]) -> list[str]:
    """The methods the time panel compares: ``method``, the Medusa run it is compared
    with (with lookup when ``method`` has it) and plain decoding, those that ran."""
    kind, lookup = split_method(method)
    medusa = with_lookup("medusa", lookup and kind is not None)
    return [m for m in dict.fromkeys((method, medusa, "ar")) if runs.get(m)]


def time_figure(method: str, runs: Mapping[str, Sequence[StepTrace]]) -> go.Figure:
    """Where a step's time goes, mean ms per step over each whole run
    (:func:`clover.bench.records.time_split`): drafting, the drafters' update, the
    target's forward over the tree and acceptance, stacked, for ``method`` beside Medusa
    and plain decoding; each bar ends with the tokens its steps committed and the tokens
    per step a step that long needs to break even with plain decoding on this machine
    (its ms over plain's)."""
    methods = time_methods(method, runs)
    if not methods:
        return empty_figure("Run a prompt to see where a step's time goes", height=160)
    splits = {m: time_split(runs[m]) for m in methods}
    plain_ms = sum(splits["ar"].values()) if "ar" in splits else None
    labels = [METHOD_LABELS[m] for m in methods]
    fig = go.Figure()
    for part, (name, colour) in TIME_PART_STYLE.items():
        xs = [splits[m][part] for m in methods]
        fig.add_trace(go.Bar(y=labels, x=xs, orientation="h", name=name, meta=part,
                             marker=dict(color=colour), text=[f"{x:.1f}" if x >= 3 else ""
                                                              for x in xs],
                             textposition="inside", insidetextanchor="middle",
                             hovertemplate=f"{name}: %{{x:.2f}} ms a step<extra></extra>"))
    notes = []
    for m, label in zip(methods, labels):
        step = sum(splits[m].values())
        tau = sum(s.accepted_length for s in runs[m]) / len(runs[m])
        if m == "ar" or not plain_ms:
            text = f"{step:.1f} ms · 1 token a step"
        else:
            text = (f"{step:.1f} ms · {tau:.2f} tokens a step; breaks even at "
                    f"{step / plain_ms:.2f}")
        notes.append(dict(x=step, y=label, xref="x", yref="y", text=text, showarrow=False,
                          xanchor="left", xshift=6, font=dict(size=12)))
    longest = max(sum(t.values()) for t in splits.values())
    fig.update_layout(barmode="stack", annotations=notes, height=110 + 52 * len(methods),
                      margin=dict(l=10, r=10, t=16, b=10), font=dict(family=FONT, size=12),
                      paper_bgcolor="white", plot_bgcolor="white", legend=legend_below(),
                      bargap=0.35,
                      xaxis=dict(title="ms a step (engine time)", gridcolor="#EEEEEE",
                                 range=[0, longest * 2.1], fixedrange=True),
                      yaxis=dict(autorange="reversed", fixedrange=True, automargin=True))
    return fig
