"""The prepared device check's dry run (CPU, small sizes): it runs end to end and writes
the results file the README's GPU section is built from, so it cannot rot before a GPU
machine is available."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.install
def test_gpu_check_dry_run_writes_its_results(tmp_path):
    proc = subprocess.run(["bash", "scripts/gpu_check.sh", "--dry-run", "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    res = json.loads((tmp_path / "gpu_check.json").read_text())
    assert res["dry_run"] is True and res["device"] == "cpu"
    assert res["correctness"]["passed"] and "passed" in res["correctness"]["summary"]
    assert res["half_precision"]["bf16"]["ok"] and res["half_precision"]["fp16"]["ok"]
    costs = res["costs"]
    assert len(costs["verify_ms"]) == len(costs["nodes"]) and all(t > 0 for t in costs["verify_ms"])
    assert set(costs["draft_ms"]) == {"medusa", "clover"}
    pred = res["prediction"]["methods"]
    for kind in ("medusa", "clover"):
        assert pred[kind]["auto_tree"] == "off" or pred[kind]["auto_tree"] in pred[kind]["per_budget"]
        assert all(r["tokens_per_s"] > 0 for r in pred[kind]["per_budget"].values())
    compiled = res["compiled"]  # torch.compile plumbing (the "eager" backend on the CPU)
    assert "error" not in compiled["eager-backend"], compiled
    assert compiled["eager-backend"]["max_abs_logit_diff"] < 1e-4
    assert len(compiled["eager-backend"]["verify_ms"]) == len(compiled["nodes"])
