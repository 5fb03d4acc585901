"""Draw the heads' compute curve (``assets/heads/curve.json``) as an SVG line chart:
held-out head-1 top-1 against training position-visits: Clover from fresh heads, the
shipped v3 heads as a marker, and the shipped heads' continuations (Clover and Medusa at
equal compute) as dashed lines through the shipped rounds, a round that was not shipped
(``"shipped": false`` on the point, or on one kind's entry when only the other kind
shipped) as an open circle off the line.

    python scripts/curve_figure.py            # writes assets/figures/compute_curve.svg
    python scripts/curve_figure.py --check    # exits 1 when the committed SVG is stale
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CURVE = ROOT / "assets" / "heads" / "curve.json"
OUT = ROOT / "assets" / "figures" / "compute_curve.svg"


def svg(curve: dict) -> str:
    """The chart as SVG text (log-scaled x: million position-visits; y: top-1 in %)."""
    w, h, left, right, top, bottom = 640, 360, 64, 24, 28, 52
    per = curve["position_visits_per_step"]
    pts = [(p["step"] * per / 1e6, 100 * p["heldout_top1"]) for p in curve["points"]]
    ref = curve["reference"]
    rx, ry = ref["position_visits"] / 1e6, 100 * ref["heldout_top1"]
    cont = curve.get("continuation", {}).get("points", [])
    series = {kind: [(c["position_visits"] / 1e6, 100 * c[kind]["heldout_top1"]) for c in cont]
              for kind in ("clover", "medusa")}  # the shipped heads continued, equal compute
    shipped = {kind: [c[kind].get("shipped", c.get("shipped", True)) for c in cont]
               for kind in series}  # a round not shipped: an open circle, off the line
    last = {kind: next((c["heads"] for c, s in zip(reversed(cont), reversed(shipped[kind])) if s), "")
            for kind in series}
    xs, ys = zip(*pts, (rx, ry), *(p for line in series.values() for p in line))
    x0, x1 = math.log10(min(xs) / 1.3), math.log10(max(xs) * 1.3)
    y0, y1 = 25.0, max(60.0, 10 * math.ceil(max(ys) / 10))  # gridlines every 10 points

    def X(x):
        return left + (math.log10(x) - x0) / (x1 - x0) * (w - left - right)

    def Y(y):
        return top + (y1 - y) / (y1 - y0) * (h - top - bottom)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" '
           'font-family="sans-serif" font-size="12">',
           f'<rect width="{w}" height="{h}" fill="white"/>']
    for y in range(30, int(y1) + 1, 10):
        out.append(f'<line x1="{left}" x2="{w - right}" y1="{Y(y):.1f}" y2="{Y(y):.1f}" stroke="#e5e5e5"/>')
        out.append(f'<text x="{left - 8}" y="{Y(y) + 4:.1f}" text-anchor="end">{y}%</text>')
    for x in (1, 2, 5, 10, 20, 50):
        if x0 <= math.log10(x) <= x1:
            out.append(f'<line x1="{X(x):.1f}" x2="{X(x):.1f}" y1="{top}" y2="{h - bottom}" stroke="#e5e5e5"/>')
            out.append(f'<text x="{X(x):.1f}" y="{h - bottom + 16}" text-anchor="middle">{x}M</text>')
    out.append(f'<text x="{(left + w - right) / 2}" y="{h - 12}" text-anchor="middle">training position-visits '
               '(log scale; 1.9M = the shipped v3 heads)</text>')
    out.append(f'<text x="{left}" y="{top - 10}">Head 1, held-out top-1 (greedy acceptance of one '
               'drafted token)</text>')
    legend = [("#2ca02c", False, "Clover from fresh heads: every position, one long cosine")]
    for kind, colour in (("clover", "#1f77b4"), ("medusa", "#ff7f0e")):
        line = series[kind]
        if not line:
            continue
        kept = [p for p, s in zip(line, shipped[kind]) if s]
        d = " ".join(f"{'M' if i == 0 else 'L'}{X(x):.1f},{Y(y):.1f}" for i, (x, y) in enumerate(kept))
        out.append(f'<path d="{d}" fill="none" stroke="{colour}" stroke-width="2" stroke-dasharray="6 3"/>')
        out += [f'<circle cx="{X(x):.1f}" cy="{Y(y):.1f}" r="3" fill="{colour if s else "white"}" '
                f'stroke="{colour}"/>' for (x, y), s in zip(line, shipped[kind])]
        legend.append((colour, True, f"{kind.capitalize()}: the shipped v3 continued to {last[kind]} "
                                     "(equal compute)"))
    path = " ".join(f"{'M' if i == 0 else 'L'}{X(x):.1f},{Y(y):.1f}" for i, (x, y) in enumerate(pts))
    out.append(f'<path d="{path}" fill="none" stroke="#2ca02c" stroke-width="2"/>')
    out += [f'<circle cx="{X(x):.1f}" cy="{Y(y):.1f}" r="3" fill="#2ca02c"/>' for x, y in pts]
    out.append(f'<rect x="{X(rx) - 4:.1f}" y="{Y(ry) - 4:.1f}" width="8" height="8" fill="#d62728"/>')
    out.append(f'<text x="{X(rx) + 8:.1f}" y="{Y(ry) + 16:.1f}" fill="#d62728">shipped v3 (sampled positions)</text>')
    if not all(s for kind in shipped for s in shipped[kind]):
        legend.append(("#555555", None, "open circle: a round not shipped"))
    lx, ly = w - right - 330, Y(37.5)  # the legend, in the empty lower right
    for i, (colour, dashed, label) in enumerate(legend):
        y = ly + 18 * i
        dash = ' stroke-dasharray="6 3"' if dashed else ""
        if dashed is None:  # a marker, not a line
            out.append(f'<circle cx="{lx + 12}" cy="{y - 4:.1f}" r="3" fill="white" stroke="{colour}"/>')
        else:
            out.append(f'<line x1="{lx}" x2="{lx + 24}" y1="{y - 4:.1f}" y2="{y - 4:.1f}" stroke="{colour}" '
                       f'stroke-width="2"{dash}/>')
        out.append(f'<text x="{lx + 30}" y="{y:.1f}" fill="{colour}">{label}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when the committed figure is stale")
    args = ap.parse_args(argv)
    text = svg(json.loads(CURVE.read_text(encoding="utf-8")))
    if args.check:
        return 0 if OUT.is_file() and OUT.read_text(encoding="utf-8") == text else 1
    OUT.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
