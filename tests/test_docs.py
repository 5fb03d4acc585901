"""The documentation matches the code it documents."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_cli_reference_is_current(monkeypatch):
    """docs/cli.md is what the parser says today: every subcommand and flag with its help."""
    cli_docs = _script("cli_docs")
    monkeypatch.setenv("COLUMNS", "100")
    want = cli_docs.render()
    have = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    assert have == want, "docs/cli.md is stale: run `python scripts/cli_docs.py --write`"


def test_cli_reference_names_every_flag():
    import argparse

    from clover.cli import build_parser

    text = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for name, parser in sub.choices.items():
        assert f"## clover {name}" in text
        for action in parser._actions:
            for flag in action.option_strings:
                assert flag in text, f"{flag} of clover {name} is missing from docs/cli.md"


def test_readme_results_table_equals_the_committed_bench_run():
    """The README's one results table is the rendering of the results.json it cites."""
    import json
    import re

    table = _script("results_table")
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = table.readme_block(readme)
    source = re.search(r"From \[`([^`]+)`\]", block).group(1)
    want = table.render(json.loads((ROOT / source).read_text()), source)
    assert block == want.strip(), "run `python scripts/results_table.py --write`"
    assert len(readme.splitlines()) <= 300


def _readme_commands() -> list[str]:
    """The `clover ...` command lines of the README's bash blocks."""
    import re

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    cmds = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        cmds += [line.strip() for line in block.splitlines() if line.strip().startswith("clover ")]
    return cmds


def test_readme_cli_table_names_every_subcommand():
    import argparse

    from clover.cli import build_parser

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for name in sub.choices:
        assert f"`clover {name} " in readme, f"the README's CLI table misses clover {name}"
    assert _readme_commands(), "the README shows no clover command"


@pytest.mark.model  # in a subprocess
def test_readme_cli_examples_run_as_written():
    """Each `clover generate` example of the README runs (with a tiny token count) and
    prints text; every other shown command at least parses (--help)."""
    import shlex
    import subprocess
    import sys

    for cmd in _readme_commands():
        args = shlex.split(cmd)[1:]
        if args[0] == "generate":
            args = [a for a in args if a != "..."] + ["--max-new-tokens", "4"]
        else:
            args = [args[0], "--help"]
        out = subprocess.run([sys.executable, "-m", "clover.cli", *args], capture_output=True, text=True,
                             cwd=ROOT, timeout=600)
        assert out.returncode == 0, f"`clover {' '.join(args)}` failed:\n{out.stderr[-2000:]}"
        assert out.stdout.strip()


def test_compute_curve_figure_is_drawn_from_its_data():
    """assets/figures/compute_curve.svg is what scripts/curve_figure.py draws from
    assets/heads/curve.json today, and the curve's points rise with compute overall."""
    import json
    import subprocess
    import sys

    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "curve_figure.py"), "--check"], timeout=60)
    assert out.returncode == 0, "compute_curve.svg is stale: run `python scripts/curve_figure.py`"
    points = json.loads((ROOT / "assets" / "heads" / "curve.json").read_text())["points"]
    assert [p["step"] for p in points] == sorted(p["step"] for p in points) and len(points) >= 4
    assert points[-1]["heldout_top1"] > points[0]["heldout_top1"]


def test_compute_curve_marks_a_round_one_head_kind_did_not_ship():
    """A round shipped for Clover but not for Medusa: Medusa's point is an open circle off
    its dashed line, and each kind's legend names its own last shipped version."""
    import json

    curve = json.loads((ROOT / "assets" / "heads" / "curve.json").read_text())
    curve["continuation"]["points"] = [
        {"heads": "v1", "position_visits": 2e6, "clover": {"heldout_top1": 0.5}, "medusa": {"heldout_top1": 0.4}},
        {"heads": "v2", "position_visits": 4e6, "clover": {"heldout_top1": 0.55},
         "medusa": {"heldout_top1": 0.41, "shipped": False}},
    ]
    svg = _script("curve_figure").svg(curve)
    assert "Clover: the shipped v3 continued to v2" in svg
    assert "Medusa: the shipped v3 continued to v1" in svg
    assert "open circle: a round not shipped" in svg
    medusa = [line for line in svg.splitlines() if 'stroke="#ff7f0e"' in line]
    assert sum('fill="white"' in line for line in medusa if line.startswith("<circle")) == 1
    path = next(line for line in medusa if line.startswith("<path"))
    assert path.count("L") == 0  # the line ends at v1: one point, no segment to v2
    clover = [line for line in svg.splitlines() if 'stroke="#1f77b4"' in line]
    assert next(line for line in clover if line.startswith("<path")).count("L") == 1
