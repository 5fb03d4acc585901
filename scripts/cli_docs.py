"""The CLI reference, docs/cli.md, generated from the parser in :mod:`clover.cli`.

    python scripts/cli_docs.py --write     # regenerate docs/cli.md after changing a flag
    python scripts/cli_docs.py             # print it

``tests/test_docs.py`` fails when docs/cli.md differs from what this prints.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

DOC = Path(__file__).resolve().parent.parent / "docs" / "cli.md"


def render() -> str:
    """docs/cli.md's text: each subcommand's one-line help and its full ``--help``."""
    os.environ["COLUMNS"] = "100"  # argparse wraps to the terminal: fix it for a stable file
    from clover.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {a.dest: a.help for a in sub._choices_actions}
    out = ["# Command line reference", "",
           "Generated from the parser in `clover/cli.py` by `python scripts/cli_docs.py --write`;",
           "`tests/test_docs.py` checks that it is current. The README has the short table.", "",
           "```", parser.format_help().rstrip(), "```", ""]
    for name, p in sub.choices.items():
        out += [f"## clover {name}", "", helps.get(name) or "", "", "```", p.format_help().rstrip(), "```", ""]
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help=f"write {DOC} instead of printing")
    args = ap.parse_args(argv)
    text = render()
    if args.write:
        DOC.parent.mkdir(exist_ok=True)
        DOC.write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
