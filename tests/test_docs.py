"""The documentation matches the code it documents."""
from __future__ import annotations

import importlib.util
from pathlib import Path

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
