"""Where things are: the shipped assets (trained heads, prompt sets, examples and
figures), the repository's training data and the project's cache folder, with the
JSON stores kept there (:func:`read_store`, :func:`write_record`,
:func:`newest_record`).

The one place that knows, and the one place that reads the environment variables that
move them: every caller (CLI, heads, app, notebooks, training) asks :func:`assets_dir`,
:func:`data_dir` or :func:`cache_root` instead of deriving a folder itself.
"""
from __future__ import annotations

import os
import sysconfig
from pathlib import Path

ASSETS_ENV = "CLOVER_ASSETS_DIR"
# what the wheel installs under the environment's data prefix (pyproject data-files)
INSTALLED = Path("share") / "clover-studio" / "assets"


def _env_dir(name: str) -> Path | None:
    """The folder the environment variable ``name`` names, None when unset.

    Raises:
        FileNotFoundError: it names something that is not a folder.
    """
    env = os.environ.get(name)
    if not env:
        return None
    path = Path(env).expanduser()
    if not path.is_dir():
        raise FileNotFoundError(f"${name} is {env}, which is not a folder")
    return path


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
    env = _env_dir(ASSETS_ENV)
    if env is not None:
        return env
    places = [Path(__file__).resolve().parent.parent / "assets",
              Path(sysconfig.get_path("data")) / INSTALLED]
    for path in places:
        if (path / "prompts").is_dir():
            return path
    raise FileNotFoundError("the Clover Studio assets are not installed: looked in "
                            + ", ".join(str(p) for p in places)
                            + f"; set ${ASSETS_ENV} to the repository's assets/ folder")


DATA_ENV = "CLOVER_DATA_DIR"


def data_dir() -> Path:
    """The repository's training data folder (``data/``: ``selfdistill-v2/`` and the
    rest), wherever the caller's working directory is: ``$CLOVER_DATA_DIR`` when set,
    else ``data/`` beside :func:`assets_dir` (a source checkout; a wheel does not
    install the data).

    Raises:
        FileNotFoundError: naming the places looked at.
    """
    env = _env_dir(DATA_ENV)
    if env is not None:
        return env
    path = assets_dir().parent / "data"
    if not path.is_dir():
        raise FileNotFoundError(f"the training data is not here: looked for {path} (it is in the "
                                f"repository, not in an installed package); set ${DATA_ENV} to "
                                f"the repository's data/ folder")
    return path


CACHE_ENV = "CLOVER_CACHE_DIR"
DEFAULT_CACHE_DIR = Path.home() / ".cache" / "clover-studio"


def cache_root() -> Path:
    """The project's cache folder: ``$CLOVER_CACHE_DIR`` when set, else
    ``~/.cache/clover-studio``. It holds the embedded model's converted copy, the
    measured auto trees (``autotree.json``), training runs and the heads' yardstick;
    never anything in the work tree. (Unlike the folders above it need not exist yet.)"""
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else DEFAULT_CACHE_DIR


def read_store(path: Path) -> dict:
    """A JSON store's records under the cache folder (the auto trees', the calibration
    texts', the CPU kernel layouts'): key -> record; an unreadable or foreign file counts
    as empty."""
    import json

    try:
        stored = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return stored if isinstance(stored, dict) else {}


def newest_record(stored: dict, family: str) -> dict | None:
    """The newest record of a JSON store (:func:`read_store`) whose "family" is
    ``family``, by its "date" (the last stored among equal dates); None where there is
    none: what a stored choice measured under other settings stands in with."""
    kin = [r for r in stored.values() if isinstance(r, dict) and r.get("family") == family]
    return max(reversed(kin), key=lambda r: str(r.get("date", "")), default=None)


def write_record(path: Path, key: str, record: dict) -> None:
    """Store one record under ``key`` in a JSON store (:func:`read_store`), atomically:
    a temporary file, then a rename; a failure is logged, never raised."""
    import json
    import logging

    try:
        stored = read_store(path)
        stored[key] = record
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(stored, indent=1), encoding="utf-8")
        tmp.replace(path)
    except OSError:
        logging.getLogger(__name__).warning("could not write %s", path, exc_info=True)
