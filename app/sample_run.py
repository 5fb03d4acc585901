"""The recorded run a fresh page plays before any press.

The first example prompt, decoded greedily by every method with the shipped heads, as a
visitor's Run would decode it (:func:`app.runner.run_methods`, in lockstep), is stored in
``assets/sample_run.json`` by ``python scripts/record_sample_run.py``. A page whose model
is the one it was recorded with (same target, same heads' weights) opens on it: the tree
plays step by step and the texts race while the visitor reads; Run replaces it with a live
run. Its speed figures are the recording machine's, and the page says so.

Data flows one way: the runner's traces -> this file -> :mod:`app.decode_tab`.
"""
from __future__ import annotations

import datetime
import json
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path

from app import runner
from app.registry import LoadedModel
from app.settings import DEFAULT_MAX_NEW_TOKENS, parse_settings
from clover.assets import assets_dir
from clover.calibration import heads_digest
from clover.machine import cpu_name
from clover.methods import split_method
from clover.trace import (GenerationResult, StepTrace, result_from_dict, result_to_dict,
                          step_from_dict, step_to_dict)

SAMPLE_FILE = "sample_run.json"  # under clover.assets_dir()
FORMAT = 1  # bumped when the file's layout changes; other formats are not shown


@dataclass(frozen=True)
class SampleRun:
    """A recorded run of every method on one prompt.

    Attributes:
        prompt: the prompt, as typed in the page.
        method: the method the page watches.
        runs: per method (``clover.methods.ALL_METHODS`` names), its step traces.
        results: per method, its result (``steps`` are ``runs[method]``).
        trees: per head method, the tree it used (``str`` of its TreeConfig).
        model: the target's name.
        heads: per head kind, :func:`clover.calibration.heads_digest` of the heads recorded.
        recorded: when (UTC date), where (CPU or GPU, threads) and with which commit.
        max_new_tokens: the run's token limit.
    """

    prompt: str
    method: str
    runs: dict[str, list[StepTrace]]
    results: dict[str, GenerationResult]
    trees: dict[str, str]
    model: str
    heads: dict[str, str]
    recorded: dict
    max_new_tokens: int

    def fits(self, loaded: LoadedModel) -> bool:
        """Whether ``loaded`` is the model and heads this run was recorded with (so its
        trees and texts are what a live run would show, timings aside)."""
        if loaded.target.name != self.model:
            return False
        for kind, digest in self.heads.items():
            heads = loaded.heads.get(kind)
            if heads is None or heads_digest(heads) != digest:
                return False
        return all(split_method(m)[0] in (None, *self.heads) for m in self.runs)

    def where(self) -> str:
        """The recording's date and machine, for the page: e.g. "2026-12-07, AMD EPYC
        9B14 (2 threads)"."""
        r = self.recorded
        return f"{r.get('date', '?')}, {r.get('machine', 'another machine')}"


def _machine(loaded: LoadedModel) -> str:
    import torch

    if loaded.target.device.type == "cuda":
        return torch.cuda.get_device_name(loaded.target.device)
    cpu = cpu_name()
    threads = torch.get_num_threads()
    return f"{cpu} ({threads} thread{'s' if threads != 1 else ''})"


def _commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=10, cwd=Path(__file__).parent)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def record(loaded: LoadedModel, prompt: str, method: str = "clover",
           max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS) -> SampleRun:
    """Decode ``prompt`` greedily with every method of ``loaded`` as the page's Run does
    (the auto tree, in lockstep) and keep the traces.

    Raises:
        ValueError: bad settings (:func:`app.settings.parse_settings`).
    """
    settings = parse_settings(prompt, method, 0.0, max_new_tokens, "auto", True, "", "",
                              None, False)
    ids = runner.encode(loaded, settings)
    runs: dict[str, list[StepTrace]] = {}
    results: dict[str, GenerationResult] = {}
    with runner.load_threads(loaded):
        for ev in runner.run_methods(loaded, settings, ids):
            if ev.kind == "start":
                runs[ev.method] = []
            elif ev.kind == "step":
                runs[ev.method].append(ev.step)
            elif ev.kind == "done":
                results[ev.method] = ev.result
    kinds = {split_method(m)[0] for m in runs} - {None}
    return SampleRun(
        prompt=prompt, method=method, runs=runs, results=results,
        trees={k: str(loaded.sizing.tree_for(k, settings.tree)) for k in sorted(kinds)},
        model=loaded.target.name,
        heads={k: heads_digest(loaded.heads[k]) for k in sorted(kinds)},
        recorded={"date": datetime.datetime.now(datetime.timezone.utc).date().isoformat(),
                  "machine": _machine(loaded), "commit": _commit()},
        max_new_tokens=max_new_tokens)


def _rounded(x):
    """Floats to 4 significant decimals (times in ms, probabilities): the file stays small."""
    if isinstance(x, float):
        return round(x, 4)
    if isinstance(x, dict):
        return {k: _rounded(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_rounded(v) for v in x]
    return x


def save(sample: SampleRun, path: Path | None = None) -> Path:
    """Write ``sample`` as JSON (default: ``assets/sample_run.json``); returns the path."""
    path = Path(path) if path else assets_dir() / SAMPLE_FILE
    data = {"format": FORMAT, "prompt": sample.prompt, "method": sample.method,
            "max_new_tokens": sample.max_new_tokens, "model": sample.model,
            "heads": sample.heads, "trees": sample.trees, "recorded": sample.recorded,
            "runs": {m: [_rounded(step_to_dict(s)) for s in steps]
                     for m, steps in sample.runs.items()},
            "results": {m: _rounded({**result_to_dict(r), "steps": []})
                        for m, r in sample.results.items()}}
    path.write_text(json.dumps(data, separators=(",", ":"), ensure_ascii=False) + "\n",
                    encoding="utf-8")
    return path


def load(path: Path | None = None) -> SampleRun | None:
    """The recorded run (default: ``assets/sample_run.json``); None where there is none,
    or where it was written in another format.

    Raises:
        ValueError: the file is there but not a recorded run (a damaged file).
    """
    path = Path(path) if path else assets_dir() / SAMPLE_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from None
    if data.get("format") != FORMAT:
        return None
    try:
        runs = {m: [step_from_dict(s) for s in steps] for m, steps in data["runs"].items()}
        results = {m: replace(result_from_dict(r), steps=runs.get(m, []))
                   for m, r in data["results"].items()}
        return SampleRun(prompt=data["prompt"], method=data["method"], runs=runs,
                         results=results, trees=data["trees"], model=data["model"],
                         heads=data["heads"], recorded=data["recorded"],
                         max_new_tokens=data["max_new_tokens"])
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{path} is not a recorded run: {e}") from None
