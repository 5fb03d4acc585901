"""Where the shipped assets are: trained heads, prompt sets, examples and figures.

The one place that knows: every caller (CLI, heads, app, notebooks) asks
:func:`assets_dir` instead of deriving a folder from its own file's path.
"""
from __future__ import annotations

import os
import sysconfig
from pathlib import Path

ASSETS_ENV = "CLOVER_ASSETS_DIR"
# what the wheel installs under the environment's data prefix (pyproject data-files)
INSTALLED = Path("share") / "clover-studio" / "assets"


def assets_dir() -> Path:
    """The folder of the shipped assets (``heads/``, ``prompts/``, ``examples.json``,
    ``figures/``), looked up in this order:

    1. ``$CLOVER_ASSETS_DIR`` when set (then it must exist);
    2. ``assets/`` beside the ``clover`` package: a source checkout or an editable install;
    3. ``<prefix>/share/clover-studio/assets``: where ``pip install .`` (or a wheel) puts
       them (``sysconfig``'s data path of this environment).

    Raises:
        FileNotFoundError: when none holds the assets, naming every place looked at.
    """
    env = os.environ.get(ASSETS_ENV)
    if env:
        path = Path(env).expanduser()
        if not path.is_dir():
            raise FileNotFoundError(f"${ASSETS_ENV} is {env}, which is not a folder")
        return path
    places = [Path(__file__).resolve().parent.parent / "assets",
              Path(sysconfig.get_path("data")) / INSTALLED]
    for path in places:
        if (path / "prompts").is_dir():
            return path
    raise FileNotFoundError("the Clover Studio assets are not installed: looked in "
                            + ", ".join(str(p) for p in places)
                            + f"; set ${ASSETS_ENV} to the repository's assets/ folder")
