"""Trace records -> Plotly figures (the page's HTML pieces are :mod:`app.page_html`'s).
Pure functions, no Gradio.

Colours are Okabe-Ito (colour-blind safe) and every colour comes with a second cue: a
marker shape in the tree, a fill pattern or line dash for methods, an underline for
tokens the target produced itself.
"""
from __future__ import annotations

import html
import textwrap
from dataclasses import dataclass
from typing import Mapping, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from app.metrics import (ACCEPTED, BONUS, CUT, REJECTED, ROOT, acceptance_by_depth,
                         accepted_length_counts, node_statuses, timeline, tokens_at)
from clover.methods import ALL_METHODS, METHOD_COLORS, METHOD_LABELS
from clover.trace import StepTrace

# Okabe-Ito colours, each paired with a marker shape.
STATUS_STYLE = {
    ROOT: dict(label="root (last committed token)", color="#000000", symbol="square", size=15),
    ACCEPTED: dict(label="accepted draft", color="#009E73", symbol="circle", size=19),
    BONUS: dict(label="bonus token (from the target)", color="#0072B2", symbol="star", size=24),
    REJECTED: dict(label="rejected draft", color="#D55E00", symbol="x", size=12),
    CUT: dict(label="accepted after the end (not committed)", color="#B0B0B0",
              symbol="circle-open", size=17),
}
# Nodes proposed by prompt lookup (alone or as well as the heads) get a ring of this colour.
LOOKUP_RING = dict(label="proposed by prompt lookup", color="#CC79A7")
SOURCE_WORDS = {"head": ", drafted by the heads", "lookup": ", proposed by prompt lookup",
                "both": ", drafted by the heads and proposed by prompt lookup"}
STOP_WORDS = {"eos": "end of sequence", "stop_string": "a stop string",
              "length": "the token limit"}
METHOD_STYLE = {  # colour, bar pattern, line dash, marker
    "ar": dict(color=METHOD_COLORS["ar"], pattern="", dash="dot", symbol="circle"),
    "lookup": dict(color=METHOD_COLORS["lookup"], pattern="x", dash="dashdot", symbol="triangle-up"),
    "medusa": dict(color=METHOD_COLORS["medusa"], pattern="/", dash="dash", symbol="diamond"),
    "clover": dict(color=METHOD_COLORS["clover"], pattern="", dash="solid", symbol="star"),
    "medusa+lookup": dict(color=METHOD_COLORS["medusa+lookup"], pattern="\\", dash="longdash",
                          symbol="diamond-open"),
    "clover+lookup": dict(color=METHOD_COLORS["clover+lookup"], pattern=".", dash="longdashdot",
                          symbol="star-open"),
    "clover2": dict(color=METHOD_COLORS["clover2"], pattern="|", dash="8px,3px,2px,3px,2px,3px",
                    symbol="square"),
    "clover2+lookup": dict(color=METHOD_COLORS["clover2+lookup"], pattern="+",
                           dash="2px,6px", symbol="square-open"),
}
# Generated-text marks: accepted drafts in greens (darker = deeper), target tokens blue.
DEPTH_BG = {1: "#CCEDE3", 2: "#8FD6C0", 3: "#45B894", 4: "#00795A"}
TARGET_BG = "#DDEAF6"
TARGET_LINE = "#0072B2"
FONT = "Inter, system-ui, -apple-system, Segoe UI, sans-serif"


# ---------------------------------------------------------------- layout for every width
# Plotly cannot ask for the screen's width, so every figure takes a layout that works on a
# phone (390 px) and a desktop alike: a short title on the left at the top, the legend at
# the bottom (its items wrap onto more rows on a narrow screen), subplots stacked.


def title_layout(text: str, size: int = 15, gap: int = 10) -> dict:
    """A figure's title: on the left, ``gap`` px above the plot area, which Plotly moves
    down to make room for it, however many lines it has (give the figure a small top
    margin: a multi-line title that does not push the margin runs into the plot)."""
    return dict(text=text, x=0.01, xanchor="left", yref="paper", y=1, yanchor="bottom",
                pad=dict(b=gap), automargin=True, font=dict(size=size))


def legend_below(**style) -> dict:
    """A horizontal legend at the bottom of the figure, under the axis titles. Plotly
    reserves room for it there however many rows its items wrap onto, shrinking the plot
    area rather than printing over it, the title or a subplot."""
    return dict(orientation="h", xref="container", x=0, xanchor="left", yref="container",
                y=0, yanchor="bottom", **style)


def wrap_title(text: str, width: int = 40) -> str:
    """``text`` broken into lines of at most ``width`` characters (Plotly never wraps a
    title: a long one runs off a phone's screen). Each line but the last keeps its
    trailing space, so the title's text on the page still reads as one line."""
    return " <br>".join(textwrap.wrap(text, width))


# ---------------------------------------------------------------- token text


def escape_token(text: str) -> str:
    """A token made visible: spaces as '␣', newlines and tabs as '\\n' and '\\t',
    other control characters as '\\xNN', the empty string as '∅'."""
    if text == "":
        return "∅"
    out = []
    for ch in text:
        if ch == " ":
            out.append("␣")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\r":
            out.append("\\r")
        elif ord(ch) < 32 or ord(ch) == 127:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return "".join(out)


def token_label(text: str, max_chars: int = 10) -> str:
    """A short, HTML-safe label of a token for a figure (escaped, clipped with '…')."""
    s = escape_token(text)
    if len(s) > max_chars:
        s = s[: max_chars - 1] + "…"
    return html.escape(s, quote=False)


# ---------------------------------------------------------------- the candidate tree


@dataclass
class PlacedNode:
    """A node of a step's tree with its place in the figure.

    Attributes:
        key: the node id; the bonus token gets ``len(step.nodes)``.
        token_id, text, parent, depth: as in :class:`~clover.trace.TreeNode`.
        status: root, accepted, cut, bonus or rejected.
        draft_prob / target_prob: None for the bonus token (it was not drafted).
        x: the depth. y: the row, 0 at the top.
        source: who proposed it ("root", "head", "lookup", "both"; "target" for the bonus).
    """

    key: int
    token_id: int
    text: str
    parent: int
    depth: int
    status: str
    draft_prob: float | None
    target_prob: float | None
    x: float
    y: float
    source: str = "head"


def tree_layout(step: StepTrace) -> list[PlacedNode]:
    """Place a step's tree: x = depth, siblings top to bottom by falling draft probability,
    leaves on consecutive rows, a parent centred on its children. A committed bonus token
    is an extra node after the last accepted node (its first child, so it sits on top)."""
    nodes, statuses = step.nodes, node_statuses(step)
    bonus = len(nodes)
    children: dict[int, list[int]] = {i: [] for i in range(bonus + 1)}
    for n in nodes[1:]:
        children[n.parent].append(n.id)
    for kids in children.values():
        kids.sort(key=lambda i: (-nodes[i].draft_prob, i))
    last = step.accepted[-1]
    if step.bonus_committed:
        children[last].insert(0, bonus)

    rows: dict[int, float] = {}
    next_row = [0]

    def place(key: int) -> None:
        kids = children[key]
        for k in kids:
            place(k)
        if kids:
            rows[key] = (rows[kids[0]] + rows[kids[-1]]) / 2
        else:
            rows[key] = next_row[0]
            next_row[0] += 1

    place(0)
    placed = [PlacedNode(n.id, n.token_id, n.text, n.parent, n.depth, statuses[n.id],
                         n.draft_prob, n.target_prob, n.depth, rows[n.id], n.source) for n in nodes]
    if step.bonus_committed:
        depth = nodes[last].depth + 1
        placed.append(PlacedNode(bonus, step.bonus_token, step.bonus_text, last, depth, BONUS,
                                 None, None, depth, rows[bonus], "target"))
    return placed


def _hover(p: PlacedNode) -> str:
    head = f"<b>{html.escape(escape_token(p.text), quote=False)}</b>  (token {p.token_id})"
    if p.status == ROOT:
        return f"{head}<br>root: the last committed token, known before this step"
    if p.status == BONUS:
        return (f"{head}<br>bonus token: produced by the target itself<br>"
                f"after the accepted path (position {p.depth})")
    what = {ACCEPTED: "accepted draft", REJECTED: "rejected draft",
            CUT: "accepted, but after the end of generation: not committed"}[p.status]
    by = SOURCE_WORDS.get(p.source, "")
    return (f"{head}<br>{what}, depth {p.depth}{by}<br>"
            f"draft p = {p.draft_prob:.3f}<br>target p = {p.target_prob:.3f}")


def step_title(step: StepTrace, total_steps: int | None = None) -> str:
    """One line saying what a step did, e.g. 'Step 3: 2 of 6 drafted tokens accepted + bonus
    → 3 tokens'; where generation ended inside the block, what ended it. The count after
    the arrow is always the tokens the step committed."""
    n = len(step.accepted) - 1
    of = f" of {total_steps}" if total_steps else ""
    drafted = len(step.nodes) - 1
    k = len(step.new_tokens)
    tokens = f"{k} token{'s' if k != 1 else ''}"
    end = STOP_WORDS.get(step.stop_reason or "", "the end")
    if drafted == 0:
        return f"Step {step.step + 1}{of}: nothing drafted → 1 token from the target"
    if not step.bonus_committed:
        verified = n + len(step.cut)
        return (f"Step {step.step + 1}{of}: {verified} of {drafted} drafted tokens accepted,"
                f" output ends at {end} after {n} → {tokens}")
    return f"Step {step.step + 1}{of}: {n} of {drafted} drafted tokens accepted + bonus → {tokens}"


def tree_figure(step: StepTrace, total_steps: int | None = None) -> go.Figure:
    """The candidate tree of one step: nodes by depth, edges parent -> child, accepted path,
    bonus token and rejected drafts in distinct colours and shapes, hover with draft and
    target probabilities."""
    placed = tree_layout(step)
    by_key = {p.key: p for p in placed}
    on_path = set(step.accepted)

    fig = go.Figure()
    edge_groups = {"path": ([], []), "bonus": ([], []), "other": ([], [])}
    for p in placed:
        if p.parent < 0:
            continue
        q = by_key[p.parent]
        group = "bonus" if p.status == BONUS else "path" if p.key in on_path else "other"
        xs, ys = edge_groups[group]
        xs += [q.x, p.x, None]
        ys += [q.y, p.y, None]
    edge_style = {"other": dict(color="#C4C4C4", width=1.3),
                  "path": dict(color=STATUS_STYLE[ACCEPTED]["color"], width=4),
                  "bonus": dict(color=STATUS_STYLE[BONUS]["color"], width=3, dash="dot")}
    for group, (xs, ys) in edge_groups.items():
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", line=edge_style[group],
                                 hoverinfo="skip", showlegend=False, name=f"edges: {group}"))

    for status in (ROOT, ACCEPTED, BONUS, REJECTED, CUT):
        style = STATUS_STYLE[status]
        pts = [p for p in placed if p.status == status]
        fig.add_trace(go.Scatter(
            x=[p.x for p in pts], y=[p.y for p in pts], mode="markers+text",
            name=style["label"], meta=status,
            marker=dict(symbol=style["symbol"], size=style["size"], color=style["color"],
                        line=dict(width=1.5, color="white")),
            text=[token_label(p.text) for p in pts], textposition="top center",
            textfont=dict(size=13, color="#6B6B6B" if status == REJECTED else "#111111"),
            hovertext=[_hover(p) for p in pts], hovertemplate="%{hovertext}<extra></extra>",
            customdata=[[p.key, p.token_id] for p in pts],
        ))

    # the source layer: a ring around every node prompt lookup proposed (always present, so
    # every step's figure has the same traces)
    ring = [p for p in placed if p.source in ("lookup", "both")]
    fig.add_trace(go.Scatter(
        x=[p.x for p in ring], y=[p.y for p in ring], mode="markers", name=LOOKUP_RING["label"],
        meta="lookup", showlegend=bool(ring), hoverinfo="skip",
        marker=dict(symbol="circle-open", size=29, color=LOOKUP_RING["color"],
                    line=dict(width=3, color=LOOKUP_RING["color"]))))

    rows = max(p.y for p in placed) + 1
    depth = max(p.x for p in placed)
    fig.update_layout(
        title=title_layout(wrap_title(step_title(step, total_steps))),
        height=int(min(860, 250 + 52 * max(rows, 3))),
        margin=dict(l=20, r=20, t=20, b=40),
        plot_bgcolor="white", paper_bgcolor="white", font=dict(family=FONT, size=13),
        legend=legend_below(font=dict(size=12), itemsizing="constant"),
        hoverlabel=dict(bgcolor="white", font=dict(size=13, family=FONT)),
        xaxis=dict(range=[-0.45, depth + 0.55], tickvals=list(range(int(depth) + 1)),
                   ticktext=["root"] + [f"+{d}" for d in range(1, int(depth) + 1)],
                   title=dict(text="tokens ahead of the root (depth)", font=dict(size=12)),
                   showgrid=False, zeroline=False, fixedrange=True),
        yaxis=dict(range=[rows - 0.4, -0.9], visible=False, fixedrange=True),
    )
    return fig


def tree_animation(steps: Sequence[StepTrace], max_frames: int = 60) -> go.Figure:
    """The candidate trees of a run as one animated figure: a frame per step (the first
    ``max_frames`` steps), a play button and a step slider. Works in notebooks and
    exported HTML; every frame has the same nine traces as :func:`tree_figure`.

    Raises:
        ValueError: when ``steps`` is empty.
    """
    if not steps:
        raise ValueError("no steps to animate")
    shown = list(steps[:max_frames])
    figs = [tree_figure(s, len(steps)) for s in shown]
    fig = go.Figure(data=figs[0].data, layout=figs[0].layout,
                    frames=[go.Frame(data=f.data, name=str(s.step),
                                     layout=dict(title=f.layout.title))
                            for f, s in zip(figs, shown)])
    placed = [tree_layout(s) for s in shown]
    rows = max(max(p.y for p in pl) for pl in placed) + 1
    depth = max(max(p.x for p in pl) for pl in placed)
    fig.update_layout(
        height=int(min(860, 310 + 52 * max(rows, 3))), margin=dict(l=20, r=20, t=20, b=110),
        xaxis=dict(range=[-0.45, depth + 0.55], tickvals=list(range(int(depth) + 1)),
                   ticktext=["root"] + [f"+{d}" for d in range(1, int(depth) + 1)]),
        yaxis=dict(range=[rows - 0.4, -0.9]),
        updatemenus=[dict(type="buttons", direction="left", x=0, xanchor="left", y=-0.24,
                          yanchor="top", showactive=False, buttons=[
                              dict(label="Play", method="animate",
                                   args=[None, dict(frame=dict(duration=900, redraw=True),
                                                    transition=dict(duration=0), fromcurrent=True)]),
                              dict(label="Pause", method="animate",
                                   args=[[None], dict(frame=dict(duration=0, redraw=False),
                                                      mode="immediate")])])],
        sliders=[dict(x=0, len=1, y=-0.24, yanchor="top", pad=dict(t=40),  # under the buttons
                      currentvalue=dict(prefix="step "),
                      steps=[dict(label=str(s.step + 1), method="animate",
                                  args=[[str(s.step)], dict(mode="immediate",
                                                            frame=dict(duration=0, redraw=True))])
                             for s in shown])],
    )
    return fig


def empty_figure(message: str, height: int = 320) -> go.Figure:
    """A blank figure that says ``message`` (before the first run)."""
    fig = go.Figure()
    fig.add_annotation(text=message, x=0.5, y=0.5, xref="paper", yref="paper",
                       showarrow=False, font=dict(size=15, color="#666666"))
    fig.update_layout(height=height, margin=dict(l=20, r=20, t=20, b=20),
                      plot_bgcolor="white", paper_bgcolor="white", font=dict(family=FONT),
                      xaxis=dict(visible=False), yaxis=dict(visible=False))
    return fig


# ---------------------------------------------------------------- after a run


def _speculative(runs: Mapping[str, Sequence[StepTrace]]) -> dict[str, Sequence[StepTrace]]:
    return {m: s for m, s in runs.items() if s and any(len(x.nodes) > 1 for x in s)}


def acceptance_figure(runs: Mapping[str, Sequence[StepTrace]]) -> go.Figure:
    """Per-depth acceptance rate of each speculative run: the share of steps whose accepted
    path reached depth d, among the steps that drafted a token at depth d."""
    runs = _speculative(runs)
    if not runs:
        return empty_figure("No drafts in this run (plain decoding only)")
    fig = go.Figure()
    for method, steps in runs.items():
        rows = acceptance_by_depth(steps)
        style = METHOD_STYLE.get(method, METHOD_STYLE["clover"])
        rates = [100.0 * r / n for _, r, n in rows]
        fig.add_trace(go.Bar(
            x=[f"depth {d}" for d, _, _ in rows], y=rates, name=METHOD_LABELS.get(method, method),
            marker=dict(color=style["color"], pattern=dict(shape=style["pattern"])),
            text=[f"{v:.0f}%<br>({r}/{n})" for v, (_, r, n) in zip(rates, rows)],
            textposition="outside", cliponaxis=False,
            hovertemplate="%{x}: %{y:.1f}% of steps<extra>" + METHOD_LABELS.get(method, method)
                          + "</extra>",
        ))
    fig.update_layout(
        title=title_layout("Acceptance rate per draft depth"),
        barmode="group", height=420, margin=dict(l=50, r=20, t=20, b=40),
        plot_bgcolor="white", paper_bgcolor="white", font=dict(family=FONT, size=13),
        legend=legend_below(),
        yaxis=dict(title="steps that reached it (%)", range=[0, 119], gridcolor="#EEEEEE"),
    )
    return fig


def accepted_length_figure(runs: Mapping[str, Sequence[StepTrace]]) -> go.Figure:
    """Histogram of tokens committed per step (accepted drafts + bonus) for each
    speculative run, as a share of its steps."""
    runs = _speculative(runs)
    if not runs:
        return empty_figure("Plain decoding: always 1 token per step")
    longest = max(max(accepted_length_counts(s)) for s in runs.values())
    lengths = list(range(1, longest + 1))
    fig = go.Figure()
    for method, steps in runs.items():
        counts = accepted_length_counts(steps)
        style = METHOD_STYLE.get(method, METHOD_STYLE["clover"])
        share = [100.0 * counts.get(k, 0) / len(steps) for k in lengths]
        fig.add_trace(go.Bar(
            x=lengths, y=share, name=METHOD_LABELS.get(method, method),
            marker=dict(color=style["color"], pattern=dict(shape=style["pattern"])),
            text=[str(counts.get(k, 0)) for k in lengths], textposition="outside",
            cliponaxis=False, customdata=[counts.get(k, 0) for k in lengths],
            hovertemplate="%{x} tokens/step: %{customdata} steps (%{y:.1f}%)<extra>"
                          + METHOD_LABELS.get(method, method) + "</extra>",
        ))
    fig.update_layout(
        title=title_layout("Tokens per step (accepted + bonus)"),
        barmode="group", height=420, margin=dict(l=50, r=20, t=20, b=40),
        plot_bgcolor="white", paper_bgcolor="white", font=dict(family=FONT, size=13),
        legend=legend_below(),
        xaxis=dict(title="tokens committed in one step", tickvals=lengths, dtick=1),
        yaxis=dict(title="share of steps (%)", range=[0, 119], gridcolor="#EEEEEE"),
    )
    return fig


RACE_REPLAY_SECONDS = 8.0  # longest race replay; longer races are replayed faster
RACE_REPLAY_FPS = 10.0  # frames per second of the replay, drawn in the visitor's browser


def race_end_ms(runs: Mapping[str, Sequence[StepTrace]]) -> float:
    """Engine time of the slowest run, ms (where a race replay ends)."""
    return max((timeline(s)[-1][0] for s in runs.values() if s), default=0.0)


def race_figure(runs: Mapping[str, Sequence[StepTrace]], t_ms: float | None = None) -> go.Figure:
    """Plain, Medusa and Clover side by side at engine time ``t_ms`` (default: the end),
    replayed from the per-step timings the runs recorded: tokens so far as bars (above),
    tokens over time as curves (below).

    The figure carries its timelines in ``layout.meta["race"]`` (engine ms and tokens
    after each step, per method, with the indices of its three traces) so that the page
    can replay the race by itself (``app/race_replay.js``) without a server round trip.
    """
    runs = {m: runs[m] for m in ALL_METHODS if runs.get(m)}
    if not runs:
        return empty_figure("Run a prompt to see the race")
    end = race_end_ms(runs)
    t = end if t_ms is None else max(0.0, min(t_ms, end))
    top = max(s[-1].total_tokens for s in runs.values())
    # the two parts stacked (side by side they crush each other on a phone); the gap
    # holds the bars' axis title and the curves' subplot title
    fig = make_subplots(rows=2, cols=1, vertical_spacing=0.24,
                        subplot_titles=("tokens so far", "tokens over engine time"))
    names = [METHOD_LABELS[m] for m in runs]
    replay = []  # the timelines the browser replays from
    for method, steps in runs.items():
        style, name = METHOD_STYLE[method], METHOD_LABELS[method]
        n = tokens_at(steps, t)
        end_ms = timeline(steps)[-1][0]
        label = f"{n} tok"
        if t >= end_ms:
            label += (f" · done in {end_ms / 1e3:.2f} s" if steps[-1].finished
                      else f" · stopped at {end_ms / 1e3:.2f} s")
        fig.add_trace(go.Bar(
            y=[name], x=[n], orientation="h", name=name, showlegend=False,
            marker=dict(color=style["color"], pattern=dict(shape=style["pattern"])),
            text=[label], textfont=dict(size=12),
            textposition="outside", cliponaxis=False,
            hovertemplate=f"{name}: %{{x}} tokens<extra></extra>"), row=1, col=1)
        line = timeline(steps)
        replay.append(dict(name=name, finished=bool(steps[-1].finished),
                           traces=[len(fig.data) - 1, len(fig.data), len(fig.data) + 1],
                           ms=[round(ms, 2) for ms, _ in line], tokens=[k for _, k in line]))
        pts = [(ms / 1e3, k) for ms, k in line if ms <= t]
        fig.add_trace(go.Scatter(
            x=[p[0] for p in pts], y=[p[1] for p in pts], mode="lines", name=name,
            line=dict(color=style["color"], dash=style["dash"], width=3, shape="hv"),
            hovertemplate=f"{name}: %{{y}} tokens after %{{x:.2f}} s<extra></extra>"),
            row=2, col=1)
        fig.add_trace(go.Scatter(
            x=[pts[-1][0]], y=[pts[-1][1]], mode="markers", showlegend=False,
            marker=dict(color=style["color"], symbol=style["symbol"], size=13,
                        line=dict(width=1, color="white")), hoverinfo="skip"), row=2, col=1)
    fig.add_vline(x=t / 1e3, line=dict(color="#555555", width=1, dash="dot"), row=2, col=1)
    fig.update_layout(
        title=title_layout(f"Race replay: {t / 1e3:.2f} s of engine time", gap=34),
        height=660, margin=dict(l=70, r=30, t=20, b=45), barmode="overlay",
        plot_bgcolor="white", paper_bgcolor="white", font=dict(family=FONT, size=13),
        legend=legend_below(),
        meta=dict(race=dict(runs=replay, end_ms=round(end, 2), seconds=RACE_REPLAY_SECONDS,
                            fps=RACE_REPLAY_FPS,
                            key=f"{end:.2f}/" + "/".join(str(r["tokens"][-1]) for r in replay))),
    )
    # room on the right for the bars' labels, also on a phone
    fig.update_xaxes(range=[0, top * 2.6 + 1], title_text="tokens", gridcolor="#EEEEEE",
                     row=1, col=1)
    fig.update_yaxes(categoryorder="array", categoryarray=names[::-1], row=1, col=1)
    fig.update_xaxes(range=[0, end / 1e3 * 1.03 + 1e-3], title_text="engine time (s)",
                     gridcolor="#EEEEEE", row=2, col=1)
    fig.update_yaxes(range=[0, top * 1.08 + 1], title_text="tokens", gridcolor="#EEEEEE",
                     row=2, col=1)
    return fig
