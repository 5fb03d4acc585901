"""The shape of the project: packaging metadata that agrees with the pinned requirements."""
from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]


def _requirements(name: str) -> dict[str, Requirement]:
    """The requirements a requirements file lists itself (``-r`` includes not followed)."""
    out = {}
    for line in (ROOT / name).read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-"):
            req = Requirement(line)
            out[canonicalize_name(req.name)] = req
    return out


def _declared(names) -> dict[str, Requirement]:
    out = {}
    for text in names:
        req = Requirement(text)
        if canonicalize_name(req.name) != "clover-studio":  # an extra naming other extras
            out[canonicalize_name(req.name)] = req
    return out


def test_pyproject_declares_what_the_requirements_files_pin():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extras = project["optional-dependencies"]
    assert set(extras) >= {"app", "train", "test"}
    declared = {**_declared(project["dependencies"]), **_declared(extras["app"]),
                **_declared(extras["train"]), **_declared(extras["test"])}
    pinned = {**_requirements("requirements.txt"), **_requirements("requirements-dev.txt")}
    assert set(pinned) == set(declared), "pyproject.toml and requirements*.txt name other packages"
    for name, pin in pinned.items():
        exact = [s.version for s in pin.specifier if s.operator == "=="]
        if exact:  # an exact pin must lie in the declared range
            assert declared[name].specifier.contains(exact[0], prereleases=True), (name, pin)
        else:  # a range is the same range
            assert declared[name].specifier == pin.specifier, (name, pin, declared[name])
    # the test extra pulls the app and training extras
    assert "clover-studio[app,train]" in extras["test"]
    assert project["scripts"]["clover"] == "clover.cli:main"
