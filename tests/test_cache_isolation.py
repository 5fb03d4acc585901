"""The test suite never touches the user's cache (``~/.cache/clover-studio``)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import conftest
from clover.assets import DEFAULT_CACHE_DIR, cache_root


def test_suite_cache_is_not_the_users():
    root = cache_root().resolve()
    assert root == Path(os.environ["CLOVER_CACHE_DIR"]).resolve()
    for user in (DEFAULT_CACHE_DIR, conftest.USER_CACHE_DIR):
        if user:
            user = Path(user).expanduser().resolve()
            assert root != user and user not in root.parents


def test_every_cache_user_resolves_under_the_suite_cache(tmp_path, monkeypatch):
    """The model copy, the auto-tree store and the yardstick all follow $CLOVER_CACHE_DIR,
    also in a subprocess (CLI and app tests run the project that way)."""
    from clover.training.yardstick import cache_dir

    monkeypatch.setenv("CLOVER_CACHE_DIR", str(tmp_path))
    assert cache_root() == tmp_path and cache_dir() == tmp_path / "yardstick"
    code = "from clover.assets import cache_root; print(cache_root())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert Path(out.stdout.strip()) == tmp_path
