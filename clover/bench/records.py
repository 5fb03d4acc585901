"""What a benchmark run is set up with and records: :class:`BenchConfig`, :class:`RunRecord`,
the machine it ran on."""
from __future__ import annotations

import os
import platform
from dataclasses import dataclass, field

import torch

from clover.methods import ALL_METHODS


HF_LOOKUP = "hf-lookup"  # the reference: transformers' own prompt lookup decoding

HF_GENERATE = "hf-generate"  # the reference of a batch-size sweep: transformers' batched generate


@dataclass(frozen=True)
class BenchConfig:
    """Benchmark settings.

    Attributes:
        methods: method names in run order (``clover.methods.ALL_METHODS``, or "hf-lookup"
            for transformers' prompt lookup as a reference, or in a batch-size sweep
            "hf-generate" for transformers' batched plain ``generate``); "ar" (plain) is
            the speedup baseline.
        max_new_tokens: per turn.
        temperature: 0 = greedy (then outputs are also checked against plain).
        repeats: passes over the prompts.
        max_prompts: use only N prompts, taken round-robin over the task categories in
            file order, so a short run still covers every category (None = all).
        warmup: warm-up generations per method before timing.
        seed: sampling seed (per prompt and repeat, shared by methods).
        batch_sizes: batch sizes to sweep; (1,) (the default) runs the per-prompt
            protocol above, anything else the batch-size sweep (first turns only).
    """

    methods: tuple[str, ...] = ("ar", "medusa", "clover")
    max_new_tokens: int = 128
    temperature: float = 0.0
    repeats: int = 1
    max_prompts: int | None = None
    warmup: int = 1
    seed: int = 0
    batch_sizes: tuple[int, ...] = (1,)

    @property
    def sweep(self) -> bool:
        """Whether this is a batch-size sweep rather than the per-prompt protocol."""
        return tuple(self.batch_sizes) != (1,)

    def __post_init__(self):
        if not self.methods or len(set(self.methods)) != len(self.methods):
            raise ValueError("methods must be a non-empty list without repeats")
        unknown = set(self.methods) - set(ALL_METHODS) - {HF_LOOKUP, HF_GENERATE}
        if unknown:
            raise ValueError(f"unknown methods {sorted(unknown)}; use {', '.join(ALL_METHODS)} "
                             f"or {HF_LOOKUP} (transformers' prompt lookup, for reference)")
        for ref in (HF_LOOKUP, HF_GENERATE):
            if ref in self.methods and self.temperature > 0:
                raise ValueError(f"{ref} (the transformers reference) runs greedy decoding only")
        if self.max_new_tokens < 1 or self.repeats < 1 or self.warmup < 0:
            raise ValueError("max_new_tokens and repeats must be >= 1, warmup >= 0")
        sizes = tuple(self.batch_sizes)
        if not sizes or len(set(sizes)) != len(sizes) or any(
                not isinstance(b, int) or isinstance(b, bool) or b < 1 for b in sizes):
            raise ValueError(f"batch sizes must be distinct integers >= 1, got {list(sizes)}")
        if self.sweep and HF_LOOKUP in self.methods:
            raise ValueError(f"{HF_LOOKUP} decodes one prompt at a time: leave it out of a batch-size sweep")
        if not self.sweep and HF_GENERATE in self.methods:
            raise ValueError(f"{HF_GENERATE} is the reference of a batch-size sweep: give --batch-size "
                             "with more than batch size 1")


@dataclass
class RunRecord:
    """One method on one prompt in one repeat (all turns together).

    ``acceptance_per_depth[d - 1]`` is the acceptance rate at draft depth d
    (:func:`clover.trace.acceptance_rates`: of the steps that drafted depth d, the share
    that accepted a token there)."""

    question_id: str
    category: str
    method: str
    repeat: int
    new_tokens: int
    wall_s: float
    tokens_per_second: float
    steps: int
    mean_accepted_length: float
    acceptance_per_depth: list[float]
    draft_ms: float
    verify_ms: float
    text: list[str] = field(default_factory=list)
    matches_plain: bool | None = None
    ttft_ms: float = 0.0  # time to the first new token: prefill + the first step, first turn
    lookup_share: float | None = None  # accepted drafts that prompt lookup proposed (methods with lookup)
    batch_size: int = 1  # rows decoded together (sweep: question_id joins theirs with ",")
    speedup: float | None = None  # over the plain run of the same prompt or batch (clover.trace.speedup)
    time_split: dict[str, float] = field(default_factory=dict)  # where a step's time goes (:func:`time_split`)


TIME_PARTS = ("draft", "update", "forward", "accept")  # a step's parts, in the order they run


def time_split(steps) -> dict[str, float]:
    """Where a step's time goes, mean ms per step over ``steps``: "draft" (growing the
    tree; a Clover drafter's Augmenting Block runs here), "update" (the drafter observing
    the verified states), "forward" (the target's forward over the tree) and "accept"
    (acceptance, commit, KV-cache compaction); they sum to ``draft_ms + verify_ms``
    (:class:`clover.trace.StepTrace`). Empty for no steps."""
    if not steps:
        return {}
    n = len(steps)
    update = sum(s.update_ms for s in steps) / n
    return {"draft": sum(s.draft_ms for s in steps) / n - update, "update": update,
            "forward": sum(s.forward_ms for s in steps) / n, "accept": sum(s.accept_ms for s in steps) / n}


def lookup_share(steps) -> float | None:
    """Share of committed drafted tokens that prompt lookup proposed (alone or as well
    as the heads); None when no drafted token was committed."""
    accepted = [step.nodes[i] for step in steps for i in step.accepted[1:]]
    if not accepted:
        return None
    return sum(1 for n in accepted if n.source in ("lookup", "both")) / len(accepted)


def machine_info(target) -> dict:
    """Hardware, dtype, threads and versions, stated with the results."""
    import transformers

    info = {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "device": str(target.device), "dtype": str(target.dtype).replace("torch.", ""),
            "python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "model": target.name,
            "date": __import__("datetime").date.today().isoformat()}
    if target.device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(target.device)
    if getattr(target, "linear_kernels", None):  # the CPU linear kernel per row count
        info["linear_kernels"] = target.linear_kernels_text
    return info
