"""Trace records -> the page's HTML pieces: the generated text with each token coloured by
where it came from (:func:`tokens_html`), the speed cards and the methods' table
(:func:`metrics_html`), and the text race (:func:`text_race_html`). Pure functions, no
Gradio; colours and styles are :mod:`app.figures`'.
"""
from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Mapping, Sequence

from app.figures import DEPTH_BG, FONT, TARGET_BG, TARGET_LINE
from app.metrics import MIN_RATIO_STEPS, RunStats, timeline, token_origins
from clover.methods import ALL_METHODS, METHOD_COLORS, METHOD_LABELS
from clover.trace import StepTrace


def _swatch(label: str, bg: str, underline: bool = False, dark: bool = False) -> str:
    line = f"border-bottom:2px dotted {TARGET_LINE};" if underline else ""
    color = "#ffffff" if dark else "#111111"
    return (f'<span style="background:{bg};color:{color};{line}padding:1px 6px;'
            f'border-radius:4px;margin-right:6px;white-space:nowrap">{label}</span>')


def tokens_legend() -> str:
    """The key to :func:`tokens_html`'s marks."""
    parts = [_swatch("produced by the target", TARGET_BG, underline=True)]
    parts += [_swatch(f"accepted draft, depth {d}{'+' if d == 4 else ''}", DEPTH_BG[d], dark=d == 4)
              for d in (1, 2, 3, 4)]
    return ('<div style="display:flex;flex-wrap:wrap;gap:4px 0;font-size:12.5px;'
            'margin-bottom:6px">' + "".join(parts) + "</div>")


def token_colours(depth: int) -> tuple[str, str]:
    """(background, text colour) of a generated token drafted at ``depth`` (0: produced
    by the target itself): blue for the target, green darker with depth (4 and deeper
    alike, white text)."""
    if depth == 0:
        return TARGET_BG, "#111"
    d = min(depth, 4)
    return DEPTH_BG[d], "#fff" if d == 4 else "#111"


CURRENT_OUTLINE = "#E69F00"  # the outline of the tokens the step on display committed


def tokens_html(steps: Sequence[StepTrace], special: Sequence[str] = ("<|im_end|>",),
                current: int | None = -1) -> str:
    """The generated text, each token marked by how it came: an accepted draft (green,
    darker = drafted deeper) or produced by the target itself (blue, dotted underline).
    The tokens of step ``current`` (an index into ``steps``; -1: the last; None: none)
    are outlined: the step the tree shows. Every token carries its step number
    (``data-step``, 1-based), so a click on it can bring that step (the Decode tab).
    Hover a token for its step and depth."""
    spans = []
    if current is not None and steps:
        current = steps[current].step
    for tok in token_origins(steps):
        if not tok.text:  # the first bytes of a character another token completes
            continue
        bg, fg = token_colours(tok.depth)
        if tok.depth == 0:
            style = f"background:{bg};border-bottom:2px dotted {TARGET_LINE};color:{fg}"
            tip = f"step {tok.step + 1}: produced by the target"
        else:
            style = f"background:{bg};color:{fg}"
            tip = f"step {tok.step + 1}: accepted draft, depth {tok.depth}"
        text = html.escape(tok.text, quote=False)
        if tok.text in special:
            style += ";opacity:0.6;font-size:0.85em"
        text = text.replace("\n", "↵\n").replace("\t", "→\t")
        cls = ""
        if tok.step == current:
            style += f";outline:2px solid {CURRENT_OUTLINE};outline-offset:0"
            cls = ' class="current-step"'
        spans.append(f'<span{cls} data-step="{tok.step + 1}" title="{tip}" '
                     f'style="{style};border-radius:3px;padding:1px 0">{text}</span>')
    body = "".join(spans) or '<span style="color:#888">(the generated text appears here)</span>'
    return (tokens_legend() +
            '<div id="generated-text" style="white-space:pre-wrap;font-size:15px;line-height:1.9;'
            'padding:10px 12px;border:1px solid #E3E3E3;border-radius:8px;background:#fff;'
            f'color:#111;font-family:{FONT}">{body}</div>')


def _fmt_speedup(x: float | None) -> tuple[str, str]:
    if x is None:
        return "—", "#666666"
    arrow = "▲" if x >= 1.0 else "▼"
    return f"{x:.2f}× {arrow}", ("#007A56" if x >= 1.0 else "#B24A00")


# a speed card's state line: how far the figure on it can be trusted
CARD_STATES = {
    "quiet": "measured on a quiet machine",
    "busy": "⚠ machine busy: less certain",
    "few": "shown after {n} steps of both",
    "self": "this is the baseline",
    "none": "turn on Compare to measure",
    "before": "press Run to measure here",
    "recorded": "recorded run: press Run to measure here",
}


@dataclass
class SpeedCard:
    """One speedup card.

    Attributes:
        value: the ratio (> 1: faster than the baseline); None: not shown.
        state: a key of :data:`CARD_STATES`.
        reference: the committed idle Spec-Bench figure for the same ratio
            (``assets/bench/specbench.json``); None where the benchmark has none.
        min_steps: steps both runs need before the ratio is shown (state "few").
    """

    value: float | None
    state: str
    reference: float | None = None
    min_steps: int = MIN_RATIO_STEPS


def _speed_card(label: str, card: SpeedCard) -> str:
    text, color = _fmt_speedup(card.value)
    state = CARD_STATES[card.state].format(n=card.min_steps)
    state_color = "#8A4B00" if card.state == "busy" else "#555"
    ref = (f"<div style='font-size:11px;color:#555'>Spec-Bench, idle: {card.reference:.2f}×</div>"
           if card.reference is not None else "")
    return (f'<div class="metric-card speed-card" data-state="{card.state}" '
            f'style="flex:1 1 140px;background:#F6F7F9;border:1px solid #E2E5EA;'
            f'border-radius:8px;padding:8px 10px;min-width:130px">'
            f'<div style="font-size:12px;color:#555">{label}</div>'
            f'<div style="font-size:21px;font-weight:650;color:{color}">{text}</div>'
            f"<div style='font-size:11px;color:{state_color}'>{html.escape(state)}</div>{ref}</div>")


def warning_html(text: str) -> str:
    """A warning readable in light and dark themes alike: dark text on its own amber
    ground, never grey on the page's background ("" for no text)."""
    return (f"<div class='run-warning' role='alert' style='background:#FFF3CD;color:#5C3B00;"
            f"border:1px solid #E0B33A;border-radius:6px;padding:6px 10px;margin:0 0 8px;"
            f"font-size:13px'>{html.escape(text)}</div>") if text else ""


def metrics_html(method: str, stats: RunStats, vs_plain: SpeedCard, vs_medusa: SpeedCard,
                 table: Sequence[tuple[str, RunStats, str, float | None]] = (), note: str = "",
                 warning: str = "") -> str:
    """Live metric cards of the streamed run, then a table of every measured run.

    Args:
        method: the run on screen (a name from ``clover.methods.ALL_METHODS``).
        stats: its figures so far.
        vs_plain / vs_medusa: the speedup cards (:class:`SpeedCard`: the ratio at the
            same token count and how far it can be trusted).
        table: (method, stats, state, speedup over plain or None) per measured run,
            state e.g. "done" or "running".
        note: a line under the table.
        warning: shown above the cards, readable in both themes (:func:`warning_html`).
    """
    cards = [
        ("tokens / step", f"{stats.tokens_per_step:.2f}", "#111"),
        ("tokens / s", f"{stats.tokens_per_second:.1f}", "#111"),
        ("draft ms / step", f"{stats.draft_ms:.1f}", "#111"),
        ("verify ms / step", f"{stats.verify_ms:.1f}", "#111"),
    ]
    card_html = "".join(
        f'<div class="metric-card" style="flex:1 1 100px;background:#F6F7F9;border:1px solid #E2E5EA;'
        f'border-radius:8px;padding:8px 10px;min-width:95px">'
        f'<div style="font-size:12px;color:#555">{label}</div>'
        f'<div style="font-size:21px;font-weight:650;color:{color}">{value}</div></div>'
        for label, value, color in cards)
    card_html += (_speed_card("speedup vs plain", vs_plain)
                  + _speed_card("speedup vs Medusa", vs_medusa))
    rows = "".join(
        f"<tr><td style='padding:2px 8px'>{METHOD_LABELS.get(m, m)}</td>"
        f"<td style='padding:2px 8px;text-align:right'>{s.tokens}</td>"
        f"<td style='padding:2px 8px;text-align:right'>{s.steps}</td>"
        f"<td style='padding:2px 8px;text-align:right'>{s.tokens_per_step:.2f}</td>"
        f"<td style='padding:2px 8px;text-align:right'>{s.tokens_per_second:.1f}</td>"
        f"<td style='padding:2px 8px;text-align:right'>{s.engine_ms / 1e3:.2f}</td>"
        f"<td style='padding:2px 8px;text-align:right'>{'—' if x is None else f'{x:.2f}×'}</td>"
        f"<td style='padding:2px 8px;opacity:0.75'>{html.escape(state)}</td></tr>"
        for m, s, state, x in table)
    head = "".join(f"<th style='padding:2px 8px;text-align:{a};font-weight:600'>{h}</th>"
                   for h, a in (("method", "left"), ("tokens", "right"), ("steps", "right"),
                                ("tokens/step", "right"), ("tokens/s", "right"),
                                ("engine s", "right"), ("vs plain", "right"), ("", "left")))
    # the table scrolls sideways in its own box on a narrow screen, never cut off
    table_html = (f"<div class='metrics-table' style='overflow-x:auto;max-width:100%'>"
                  f"<table style='border-collapse:collapse;font-size:13px;margin-top:8px'>"
                  f"<tr style='border-bottom:1px solid #ddd'>{head}</tr>{rows}</table></div>"
                  ) if table else ""
    title = (f"<div style='font-size:13px;margin-bottom:6px'>"
             f"<b>{METHOD_LABELS.get(method, method)}</b> · step {stats.steps} · "
             f"{stats.tokens} tokens · {stats.engine_ms / 1e3:.2f} s engine time</div>")
    foot = f"<div style='font-size:12px;opacity:0.8;margin-top:6px'>{note}</div>" if note else ""
    return (f"<div id='metrics' style='font-family:{FONT}'>{warning_html(warning)}{title}"
            f"<div style='display:flex;flex-wrap:wrap;gap:8px'>{card_html}</div>"
            f"{table_html}{foot}</div>")


def text_race_html(runs: Mapping[str, Sequence[StepTrace]]) -> str:
    """The methods' texts side by side, for the race replay: one row per method that
    ran, each token a span marked with the engine time (ms) at which its step committed
    it (``data-ms``) and coloured as in :func:`tokens_html` (accepted drafts green by
    depth, the target's own tokens blue). ``race_replay.js`` reveals the tokens at their
    own engine-time pace, in the browser; without it the whole texts show."""
    rows = []
    for m in ALL_METHODS:
        steps = runs.get(m) or []
        if not steps:
            continue
        ends = [t for t, _ in timeline(steps)[1:]]  # engine ms after each step
        spans = []
        for tok in token_origins(steps):
            if not tok.text:
                continue
            bg, fg = token_colours(tok.depth)
            text = html.escape(tok.text, quote=False).replace("\n", "↵ ")
            spans.append(f'<span data-ms="{ends[tok.step]:.1f}" style="background:{bg};'
                         f'color:{fg};border-radius:3px">{text}</span>')
        rows.append(
            f"<div class='race-row' data-method='{m}' style='display:flex;gap:8px;"
            f"align-items:flex-start;margin:4px 0'>"
            f"<div style='flex:0 0 92px;font-weight:600;color:{METHOD_COLORS[m]};"
            f"font-size:13px'>{METHOD_LABELS[m]}<div class='race-clock' "
            f"style='font-weight:400;font-size:11px;opacity:0.8'>{ends[-1] / 1e3:.2f} s</div></div>"
            f"<div class='race-text' style='flex:1;min-width:0;white-space:pre-wrap;"
            f"font-size:13px;line-height:1.7;padding:4px 8px;border:1px solid #E3E3E3;"
            f"border-radius:6px;background:#fff;color:#111;max-height:7.5em;overflow-y:auto'>"
            f"{''.join(spans)}</div></div>")
    if not rows:
        return ("<div id='text-race' style='color:#888;font-size:13px'>The methods' texts race "
                "here after a run, each at its own speed.</div>")
    return (f"<div id='text-race' style='font-family:{FONT}'><div style='font-size:13px;"
            f"margin-bottom:4px'><b>The texts, as fast as each method wrote them</b> "
            f"(engine time; replayed in your browser)</div>{''.join(rows)}</div>")
