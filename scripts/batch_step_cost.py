"""Where a plain decoding step's time goes at each batch size (the batched-serving cost breakdown).

One plain step is one target forward over one new token per row on top of a KV cache of
``--prefix`` positions, with the engine's own inputs and cache (``clover.engine``:
``verify_inputs`` with root-only trees, the batched mask and position ids). Per batch
size B it reports wall-clock ms per step (the mean of ``--repeats`` steps, interleaved
across batch sizes, the slowest 10% left out), and where they go, timed by forward hooks
on the target's own modules in the same steps (CPU only: a CPU runs each op to
completion, so a module's wall time is its cost; on a GPU the hooks would time kernel
launches):

* ``projections``: the attention blocks' q/k/v/o linear layers;
* ``attention``: the rest of the attention blocks (applying RoPE, the KV-cache append,
  the attention over the cache);
* ``mlp``: the gated MLPs;
* ``lm_head``: the one matrix product of width V;
* ``rest``: the step minus those (embeddings, the RoPE tables, norms, masks and Python
  around them).

The ratio of B's step to B=1's bounds what batching can give: B rows per step at that
cost is at most B / ratio times B=1's tokens per second, with every row busy. With
``--sweep`` (a committed ``clover bench --batch-size`` results file) it also replays that
sweep's plain rows (their token counts, in order) on the measured step costs, to bound
B's throughput over B=1's as the sweep ran it (static batches of B consecutive prompts,
each as long as its longest row) and with continuous batching (a finished row's slot
refilled at once from the queue, its prefill free): what refilling rows could add.

    python scripts/batch_step_cost.py --out runs/batch-step-cost.json   # about a minute
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from torch import nn

from clover.cache import crop_cache, new_cache
from clover.requests import prefill_inputs, verify_inputs
from clover.models import load_target
from clover.tree import root_only


def step_inputs(target, batch: int, prefix: int):
    """A KV cache of ``batch`` rows holding ``prefix`` positions, and one plain step's
    inputs on top of it (the engine's own, root-only trees)."""
    g = torch.Generator().manual_seed(0)
    rows = [torch.randint(min(100, target.vocab_size - 1), target.vocab_size, (prefix,), generator=g).tolist()
            for _ in range(batch)]
    cache = new_cache(target.config)
    with torch.inference_mode():
        ids, pos, mask = prefill_inputs(rows, target.dtype, target.device)
        target.forward_batch(ids, pos, mask, cache, last_only=True)
    step = verify_inputs([root_only(r[-1]) for r in rows], [prefix] * batch, prefix,
                         target.dtype, target.device)
    return cache, step


def run_step(target, cache, step, prefix: int) -> float:
    """One plain step (ms); the cache is cropped back to ``prefix`` afterwards."""
    t0 = time.perf_counter()
    with torch.inference_mode():
        target.forward_batch(*step, cache)
    ms = (time.perf_counter() - t0) * 1e3
    crop_cache(cache, prefix)
    return ms


class ModuleTimer:
    """Wall ms spent inside chosen modules, accumulated by forward pre/post hooks."""

    def __init__(self, groups: dict[str, list[nn.Module]]):
        self.ms = dict.fromkeys(groups, 0.0)
        self._t0: dict[int, float] = {}
        self.handles = []
        for name, modules in groups.items():
            for m in modules:
                self.handles.append(m.register_forward_pre_hook(self._start))
                self.handles.append(m.register_forward_hook(self._stop(name)))

    def _start(self, module, args):
        self._t0[id(module)] = time.perf_counter()

    def _stop(self, name):
        def hook(module, args, out):
            self.ms[name] += (time.perf_counter() - self._t0.pop(id(module))) * 1e3
        return hook

    def remove(self):
        for h in self.handles:
            h.remove()


def module_groups(target) -> dict[str, list[nn.Module]]:
    """The target's modules by role (Llama-family names: ``self_attn``, ``*_proj``, ``mlp``)."""
    layers = [m for m in target.model.modules() if hasattr(m, "self_attn") and hasattr(m, "mlp")]
    if not layers:
        raise ValueError("no decoder layers with self_attn and mlp: a Llama-family target is needed")
    projs = [p for layer in layers for p in (layer.self_attn.q_proj, layer.self_attn.k_proj,
                                             layer.self_attn.v_proj, layer.self_attn.o_proj)]
    return {"attention_block": [layer.self_attn for layer in layers], "projections": projs,
            "mlp": [layer.mlp for layer in layers], "lm_head": [target.lm_head]}


def parts_of(ms: dict[str, float]) -> dict[str, float]:
    """The reported parts from one hooked step's module-group times (``rest`` added later)."""
    return {"projections": ms["projections"], "attention": ms["attention_block"] - ms["projections"],
            "mlp": ms["mlp"], "lm_head": ms["lm_head"]}


def timed_steps(target, setups: dict, prefix: int, repeats: int) -> dict[int, list[tuple[float, dict]]]:
    """Per batch size, ``repeats`` hooked steps (interleaved across batch sizes, so drift
    hits every size alike): (step ms, its parts)."""
    timer = ModuleTimer(module_groups(target))
    out = {b: [] for b in setups}
    try:
        for rep in range(repeats + 3):  # 3 warm-up rounds
            for b, setup in setups.items():
                before = dict(timer.ms)
                ms = run_step(target, *setup, prefix)
                if rep >= 3:
                    out[b].append((ms, parts_of({k: timer.ms[k] - before[k] for k in timer.ms})))
    finally:
        timer.remove()
    return out


def summarise(steps: list[tuple[float, dict]]) -> tuple[float, dict[str, float]]:
    """Mean step ms and mean parts over the steps, the slowest 10% left out (outliers from
    the OS); ``rest`` is the step minus the parts, so the parts add up to the step."""
    kept = sorted(steps, key=lambda s: s[0])[:max(1, -(-9 * len(steps) // 10))]
    step = sum(ms for ms, _ in kept) / len(kept)
    parts = {k: sum(p[k] for _, p in kept) / len(kept) for k in kept[0][1]}
    parts["rest"] = step - sum(parts.values())
    return step, {k: round(v, 2) for k, v in parts.items()}


def replay(lengths: list[int], b: int, step_ms: dict[int, float]) -> dict[str, float]:
    """Bound on B's tokens/s over B=1's for plain rows of ``lengths`` tokens (one per step),
    ``step_ms[n]``: a step's cost with n rows busy. Static batches of ``b`` consecutive
    rows, and continuous batching (slots refilled at once, prefills free)."""
    single = sum(lengths) * step_ms[1]
    static = 0.0
    for i in range(0, len(lengths) - b + 1, b):  # the sweep leaves a last, smaller batch out
        rows = lengths[i:i + b]
        static += sum(step_ms[sum(1 for n in rows if n > s)] for s in range(max(rows)))
    static_single = sum(sum(lengths[i:i + b]) for i in range(0, len(lengths) - b + 1, b)) * step_ms[1]
    queue, active, cont = list(lengths), [], 0.0
    while queue or active:
        while queue and len(active) < b:
            active.append(queue.pop(0))
        cont += step_ms[len(active)]
        active = [n - 1 for n in active if n > 1]
    return {"static": round(static_single / static, 2), "continuous": round(single / cont, 2)}


def step_costs(measured: dict[int, float], upto: int) -> dict[int, float]:
    """Step ms for 1..upto busy rows, linear between the measured batch sizes."""
    sizes = sorted(measured)
    out = {}
    for n in range(1, upto + 1):
        lo = max([s for s in sizes if s <= n], default=sizes[0])
        hi = min([s for s in sizes if s >= n], default=sizes[-1])
        w = 0.0 if hi == lo else (n - lo) / (hi - lo)
        out[n] = measured[lo] * (1 - w) + measured[hi] * w
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch-sizes", default="1,2,4,8")
    ap.add_argument("--prefix", type=int, default=256, help="cached positions per row")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--sweep", default=None, help="a batch-size sweep's results.json to replay")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    target = load_target(None, device="cpu")  # on a GPU the hooks would time kernel launches
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    setups = {b: step_inputs(target, b, args.prefix) for b in sizes}
    summary = {b: summarise(steps) for b, steps in timed_steps(target, setups, args.prefix, args.repeats).items()}
    base = summary[sizes[0]][0]
    result = {"prefix": args.prefix, "threads": args.threads, "repeats": args.repeats, "batch": {}}
    for b in sizes:
        ms, parts = summary[b]
        result["batch"][str(b)] = {
            "step_ms": round(ms, 2), "step_vs_first": round(ms / base, 3),
            "tokens_per_s_bound_vs_first": round(b / sizes[0] / (ms / base), 2), "ms_by_part": parts,
        }
    if args.sweep:
        sweep = json.loads(open(args.sweep).read())
        lengths = [r["new_tokens"] for r in sweep["runs"] if r["method"] == "ar" and r["batch_size"] == 1]
        costs = step_costs({b: result["batch"][str(b)]["step_ms"] for b in sizes}, max(sizes))
        result["replay"] = {"sweep": args.sweep, "row_tokens": lengths,
                            "bound_vs_batch_1": {str(b): replay(lengths, b, costs) for b in sizes if b > 1}}
    print(json.dumps(result, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
