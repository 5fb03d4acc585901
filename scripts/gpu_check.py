"""The prepared device check: correctness and cost curves on one NVIDIA GPU.

Run through ``scripts/gpu_check.sh --out DIR [--dry-run]``. Everything it measures goes to
``DIR/gpu_check.json`` (the README's GPU section is built from it):

1. correctness: the engine, tree, cache and acceptance tests with the tiny models on the
   device (greedy parity in fp32), then bf16 and fp16 decoding end to end;
2. the verify cost curve: one target forward over 1..64 tree nodes on top of 256 cached
   tokens, with a random-weight model of the embedded model's exact config (its 98 MB
   weights are not in the repository copy the device machine gets);
3. drafting time of Medusa and Clover heads (random weights, the shipped heads' shapes)
   per tree budget (bf16 on the GPU, as the app runs there);
3b. the verify forward under ``torch.compile`` (inductor, and CUDA graphs through
   "reduce-overhead"), its logits checked against eager;
4. predicted tokens/s per method and budget: the accepted length per budget measured on
   the CPU with the shipped heads (``assets/heads/tau.json``, written by
   ``--measure-tau`` on a machine with the embedded model) over the measured step time,
   and the budget ``--tree auto`` would pick there (or "off").

``--dry-run`` runs the same steps on the CPU with small sizes (CI runs it so the check
cannot rot). No network is used.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

# SmolLM2-135M-Instruct's config (the embedded target), for timing with random weights
EMBEDDED_CONFIG = dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                       num_attention_heads=9, num_key_value_heads=3, head_dim=64,
                       max_position_embeddings=8192, vocab_size=49152, rms_norm_eps=1e-5,
                       rope_theta=100000.0, tie_word_embeddings=True, bos_token_id=1,
                       eos_token_id=2, pad_token_id=2)
TAU_FILE = ROOT / "assets" / "heads" / "tau.json"
ENGINE_TESTS = ["tests/test_engine.py", "tests/test_tree.py", "tests/test_cache.py",
                "tests/test_acceptance.py"]


def word_tokenizer(vocab_size: int):
    """A word-level tokenizer whose token i is ``t{i}`` (timings need no real text)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(vocab={f"t{i}": i for i in range(vocab_size)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0", eos_token="t2")


def random_target(device: str, dtype, small: bool):
    """A random-weight target with the embedded model's config (a 4-layer cut when small)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from clover.models import TargetModel

    cfg = dict(EMBEDDED_CONFIG)
    if small:
        cfg.update(num_hidden_layers=4, vocab_size=4096)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**cfg)).to(device=device, dtype=dtype).eval()
    return TargetModel(model, word_tokenizer(cfg["vocab_size"]), "random-smollm2-135m-config")


def sync(device: str):
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def timed(fn, device: str, repeats: int) -> float:
    """Median wall time of ``fn()`` in ms (after one warm-up call)."""
    import statistics

    fn()
    sync(device)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def step_correctness(device: str, dry: bool, out: Path) -> dict:
    env = {**os.environ, "CLOVER_TEST_DEVICE": device}
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
            *ENGINE_TESTS]
    if dry:  # a short subset on the CPU
        args += ["-k", "parity and llama"]
    t0 = time.perf_counter()
    proc = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=420)
    (out / "pytest.log").write_text(proc.stdout + proc.stderr)
    last = (proc.stdout.strip().splitlines() or [""])[-1]
    return {"passed": proc.returncode == 0, "summary": last, "seconds": round(time.perf_counter() - t0, 1)}


def step_half_precision(device: str) -> dict:
    """bf16 and fp16 decoding end to end (tiny target, fresh heads): no error, tokens out."""
    import torch

    sys.path.insert(0, str(ROOT / "tests"))
    from conftest import tiny_model, tiny_tokenizer

    from clover import Engine, new_heads
    from clover.models import TargetModel

    out = {}
    for name, dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
        try:
            target = TargetModel(tiny_model("llama").to(device=device, dtype=dtype), tiny_tokenizer(96),
                                 f"tiny-{name}")
            res = Engine(target, new_heads("clover", target, num_heads=3)).generate([5, 6, 7, 8], 16)
            out[name] = {"ok": len(res.token_ids) == 16, "steps": len(res.steps)}
        except Exception as e:  # recorded, not raised: the rest of the check still runs
            out[name] = {"ok": False, "error": f"{type(e).__name__}: {e}"}
    return out


def step_costs(device: str, dry: bool) -> dict:
    """Verify cost curve and drafting time per budget, both head types."""
    import torch

    from clover import new_heads
    from clover.timing import time_forward
    from clover.cache import new_cache
    from clover.tree import TreeConfig

    dtype = torch.float32 if dry else torch.bfloat16  # the app's dtype on each device
    target = random_target(device, dtype, dry)
    sizes = [1, 2, 4, 8] if dry else [1, 2, 4, 8, 16, 32, 48, 64]
    repeats = 2 if dry else 10
    prefix = 64 if dry else 256
    verify = time_forward(target, sizes, prefix_len=prefix, repeats=repeats)
    budgets = [1, 4, 10] if dry else [1, 2, 4, 6, 8, 12, 16, 24, 32, 48, 64]
    drafting = {}
    for kind in ("medusa", "clover"):
        heads = new_heads(kind, target, num_heads=3)
        ids = torch.randint(0, target.vocab_size, (1, prefix), generator=torch.Generator().manual_seed(0))
        with torch.inference_mode():
            out = target.forward(ids.to(device), torch.arange(prefix, device=device)[None], None,
                                 new_cache(target.config), last_only=True)
        per = {}
        for b in budgets:
            drafter = heads.drafter(target, TreeConfig(budget=b, branching=max(3, min(8, b))))
            with torch.inference_mode():
                drafter.observe(out.hidden_pre, out.hidden_post, ids[0].tolist())
                per[b] = timed(lambda: drafter.draft(int(ids[0, -1]), 3), device, repeats)
        drafting[kind] = per
    return {"dtype": str(dtype).replace("torch.", ""),
            "model": "random weights, SmolLM2-135M config" + (" (4 layers, 4k vocab: dry run)" if dry else ""),
            "prefix_tokens": prefix, "nodes": sizes, "verify_ms": [round(x, 3) for x in verify],
            "budgets": budgets, "draft_ms": {k: {str(b): round(v, 3) for b, v in d.items()}
                                             for k, d in drafting.items()}}


def step_compiled(device: str, dry: bool, budget_s: float) -> dict:
    """Verify forwards under ``torch.compile``: inductor, and on CUDA also "reduce-overhead"
    (CUDA graphs). Logits must match the eager forward; times are per tree size. The dry
    run uses the "eager" backend (no code generation), so CI checks the plumbing in
    seconds. A mode that fails or runs past ``budget_s`` is recorded, not raised."""
    import torch

    from clover.timing import time_forward

    dtype = torch.float32 if dry else torch.bfloat16
    target = random_target(device, dtype, dry)
    sizes = [1, 4] if dry else [1, 4, 16]
    prefix = 64 if dry else 256
    modes = {"eager-backend": {"backend": "eager"}} if dry else {
        "inductor": {}, "reduce-overhead (CUDA graphs)": {"mode": "reduce-overhead"}}
    ids = torch.randint(0, target.vocab_size, (1, 8), generator=torch.Generator().manual_seed(1)).to(device)
    with torch.inference_mode():
        ref = target.model(input_ids=ids).logits.float()
    eager = target.model
    out = {"dtype": str(dtype).replace("torch.", ""), "nodes": sizes,
           "eager_verify_ms": [round(x, 3) for x in time_forward(target, sizes, prefix_len=prefix, repeats=3)]}
    t0 = time.perf_counter()
    for name, kw in modes.items():
        if time.perf_counter() - t0 > budget_s:
            out[name] = {"skipped": f"over the {budget_s:.0f} s budget"}
            continue
        try:
            target.model = torch.compile(eager, dynamic=False, **kw)
            with torch.inference_mode():
                diff = (target.model(input_ids=ids).logits.float() - ref).abs().max().item()
            ms = time_forward(target, sizes, prefix_len=prefix, repeats=3)
            out[name] = {"verify_ms": [round(x, 3) for x in ms], "max_abs_logit_diff": round(diff, 4),
                         "seconds": round(time.perf_counter() - t0, 1)}
        except Exception as e:  # recorded: a mode that does not compile is a finding
            out[name] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
        finally:
            target.model = eager
            torch._dynamo.reset()
    return out


def interpolate(xs, ys, x):
    """Piecewise-linear y(x) through the points (xs ascending), clamped at the ends."""
    if x <= xs[0]:
        return ys[0]
    for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return ys[-1]


def step_prediction(costs: dict) -> dict:
    """Predicted tokens/s per method and budget from the device's step time and the
    accepted length measured on the CPU; the budget --tree auto would pick."""
    if not TAU_FILE.is_file():
        return {"error": f"{TAU_FILE.relative_to(ROOT)} missing: run gpu_check.py --measure-tau"}
    tau = json.loads(TAU_FILE.read_text())
    plain_ms = costs["verify_ms"][0]
    out = {"plain_tokens_per_s": round(1e3 / plain_ms, 1), "tau_source": tau.get("source"), "methods": {}}
    for kind in ("medusa", "clover"):
        rows = {}
        for b_str, t in tau.get(kind, {}).items():
            b = int(b_str)
            nearest = min(costs["draft_ms"][kind], key=lambda k: abs(int(k) - b))
            step = costs["draft_ms"][kind][nearest] + interpolate(costs["nodes"], costs["verify_ms"], b + 1)
            rows[b_str] = {"tau": t, "step_ms": round(step, 3), "tokens_per_s": round(t / step * 1e3, 1),
                       "speedup": round(t / step * plain_ms, 3)}
        best = max(rows, key=lambda b: rows[b]["tokens_per_s"]) if rows else None  # a str key
        choice = "off" if best is None or rows[best]["speedup"] <= 1.0 else best
        out["methods"][kind] = {"per_budget": rows, "auto_tree": choice}
    return out


def measure_tau(out_file: Path) -> None:
    """Accepted length per budget of the shipped heads on the embedded model (CPU)."""
    from clover.autotree import auto_tree
    from clover.heads import heads_for
    from clover.models import load_target

    target = load_target(None, device="cpu")
    result = {"source": "clover.autotree calibration prompts, embedded SmolLM2-135M-Instruct on "
                        f"CPU, shipped heads ({platform.processor() or platform.machine()})"}
    for kind in ("medusa", "clover"):
        _, report = auto_tree(target, heads_for(kind, target)[0], repeats=1)
        result[kind] = {str(b): round(t, 4) for b, t in zip(report.budgets, report.tau)}
    out_file.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out_file}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "runs" / "gpu_check"))
    parser.add_argument("--dry-run", action="store_true", help="CPU, small sizes (CI)")
    parser.add_argument("--measure-tau", action="store_true",
                        help=f"write {TAU_FILE.relative_to(ROOT)} (CPU, needs the embedded model)")
    args = parser.parse_args(argv)
    if args.measure_tau:
        measure_tau(TAU_FILE)
        return 0
    import torch

    device = "cpu" if args.dry_run else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: error: no CUDA device; use --dry-run on a machine without one", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = {"dry_run": args.dry_run, "device": device,
               "gpu": torch.cuda.get_device_name(0) if device == "cuda" else None,
               "torch": torch.__version__, "platform": platform.platform(),
               "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    t0 = time.perf_counter()
    for name, fn in (("correctness", lambda: step_correctness(device, args.dry_run, out)),
                     ("half_precision", lambda: step_half_precision(device)),
                     ("costs", lambda: step_costs(device, args.dry_run)),
                     ("compiled", lambda: step_compiled(device, args.dry_run,
                                                        max(0.0, 400 - (time.perf_counter() - t0))))):
        print(f"gpu_check: {name} ...", flush=True)
        try:
            results[name] = fn()
        except Exception as e:  # keep going: one failed step must not hide the others
            results[name] = {"error": f"{type(e).__name__}: {e}"}
        (out / "gpu_check.json").write_text(json.dumps(results, indent=1) + "\n")
    if "verify_ms" in results.get("costs", {}):
        results["prediction"] = step_prediction(results["costs"])
    results["seconds"] = round(time.perf_counter() - t0, 1)
    (out / "gpu_check.json").write_text(json.dumps(results, indent=1) + "\n")
    ok = (results["correctness"].get("passed") is True
          and all(v.get("ok") for v in results["half_precision"].values())
          and "error" not in results["costs"])
    print(f"gpu_check: {'ok' if ok else 'FAILED'}; results in {out / 'gpu_check.json'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
