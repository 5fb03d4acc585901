"""The shape of the project: packaging metadata that agrees with the pinned requirements,
shipped assets found through one function, and imports inside ``clover/`` that point one
way (no cycle, never into the app)."""
from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

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


def test_assets_dir_finds_the_checkout_and_honours_the_variable(tmp_path, monkeypatch):
    from clover import assets_dir

    monkeypatch.delenv("CLOVER_ASSETS_DIR", raising=False)
    assert assets_dir() == ROOT / "assets"
    monkeypatch.setenv("CLOVER_ASSETS_DIR", str(tmp_path))
    assert assets_dir() == tmp_path
    monkeypatch.setenv("CLOVER_ASSETS_DIR", str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError, match="CLOVER_ASSETS_DIR"):
        assets_dir()


def test_assets_dir_says_where_it_looked(monkeypatch):
    import clover.assets

    monkeypatch.delenv("CLOVER_ASSETS_DIR", raising=False)
    monkeypatch.setattr(clover.assets, "__file__", "/nowhere/clover/assets.py")
    monkeypatch.setattr(clover.assets, "INSTALLED", Path("no-such-share"))
    with pytest.raises(FileNotFoundError, match="/nowhere/assets.*CLOVER_ASSETS_DIR"):
        clover.assets.assets_dir()


def test_every_shipped_asset_goes_into_the_wheel():
    """pyproject's data-files name a folder per line: a new asset folder needs its line."""
    data_files = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))[
        "tool"]["setuptools"]["data-files"]
    covered = set()
    for dest, patterns in data_files.items():
        assert dest.startswith("share/clover-studio/assets")
        for pattern in patterns:
            for path in ROOT.glob(pattern):
                # installed at the same place relative to the assets folder
                assert dest + "/" + path.name == "share/clover-studio/" + path.relative_to(ROOT).as_posix()
                covered.add(path)
    tracked = subprocess.run(["git", "ls-files", "assets"], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout.split()
    assert tracked, "git ls-files found no assets"
    missing = [p for p in tracked if ROOT / p not in covered]
    assert not missing, f"assets not in pyproject's data-files: {missing}"


def _clover_imports() -> dict[str, set[str]]:
    """Per module of ``clover/``, the ``clover`` modules it imports anywhere in its file:
    at module level and inside functions alike (a function-local import still makes an
    arrow, it only hides it until the call), ``if TYPE_CHECKING:`` blocks excepted.
    ``from clover.x import y`` points to ``clover.x.y`` when that is a module, else to
    ``clover.x``; the package a module sits in is not counted as imported by it."""
    pkg = ROOT / "clover"
    names = {}
    for path in pkg.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {}
    for name, path in names.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        skip = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                and "TYPE_CHECKING" in ast.unparse(node.test) for n in ast.walk(node)}
        out = set()
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.Import):
                out |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for a in node.names:
                    full = f"{node.module}.{a.name}"
                    out.add(full if full in names else node.module)
            elif isinstance(node, ast.ImportFrom) and node.level:
                raise AssertionError(f"{path}: relative import; use the absolute name")
        graph[name] = out
    return graph


def test_clover_never_imports_the_app():
    graph = _clover_imports()
    bad = {m: sorted(i for i in imps if i == "app" or i.startswith("app.") or i == "gradio")
           for m, imps in graph.items()}
    assert not {m: i for m, i in bad.items() if i}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per back edge of a depth-first search (none: the graph is acyclic)."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    cycles = []

    def visit(m, path):
        state[m] = 1
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                cycles.append(path[path.index(n):] + [n])
            elif n not in state:
                visit(n, path + [n])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    return cycles


def test_cycle_finder_finds_cycles():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]


def test_the_import_graph_of_clover_has_no_cycle():
    graph = _clover_imports()
    graph = {m: {i for i in imps if i in graph and i != m} for m, imps in graph.items()}
    cycles = _cycles(graph)
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_the_decoding_core_imports_neither_the_outer_layers_nor_the_kernels_directly():
    """Data flows one way, prompt -> engine -> trace -> app / bench / notebook: training,
    the benchmark and the command line read the core, never the other way round; the CPU
    kernels are installed in one place (``clover.models.target``, behind its load-time
    switch, with ``clover.models.kernel_store`` remembering the layout it times)."""
    graph = _clover_imports()
    outer = ("training", "cli", "bench")
    core = [m for m in graph if (m.split(".") + [""])[1] not in outer]
    assert "clover.engine" in core and "clover.heads.clover" in core and "clover.models.target" in core
    back = {m: sorted(i for i in graph[m] if (i.split(".") + [""])[1] in outer) for m in core}
    assert not {m: i for m, i in back.items() if i}
    users = sorted(m for m, imps in graph.items() if (m.split(".") + [""])[1] != "kernels"
                   and any(i.startswith("clover.kernels") for i in imps))
    assert users == ["clover.models.kernel_store", "clover.models.target"]


def test_importing_the_app_and_library_reads_no_assets(tmp_path):
    """Assets are read when used, never at import: with $CLOVER_ASSETS_DIR naming a folder
    that is not there (assets_dir() then raises), every app and library module imports."""
    import os

    code = ("import importlib, pkgutil, app, clover\n"
            "for pkg in (app, clover):\n"
            "    for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + '.'):\n"
            "        importlib.import_module(m.name)\n"
            "from clover import assets_dir\n"
            "try:\n    assets_dir()\nexcept FileNotFoundError:\n    print('ok')\n")
    env = {**os.environ, "CLOVER_ASSETS_DIR": str(tmp_path / "missing"), "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
