"""The heads' yardstick: teacher-forced acceptance on the target's own greedy answers.

Under greedy decoding a drafted token is accepted exactly when it is the target's own
next token, so scoring heads teacher-forced on the target's greedy answers measures the
acceptance a one-node tree would see (head 1's top-1) and the expected tokens per step
of a greedy chain of the heads' top-1 drafts (``chain_tau``), averaged over every
answer position instead of the positions where decoding steps happen to start. It costs
the heads' forward only: the target's hidden states of the answers are computed once
and kept (:class:`~clover.training.hidden_cache.HiddenCache`).

Three sets, each scored per category and overall:

* ``spec-bench``: all 480 Spec-Bench questions (Xia et al., arXiv 2401.07851; both
  turns of the 80 MT-bench ones), answered greedily, 128 new tokens per turn. Its
  headline is the **six-task mean**: MT-bench (its eight categories as one task),
  translation, summarisation, QA, math reasoning and RAG, each task weighted alike as
  in the Spec-Bench paper, not by its number of answer tokens.
* ``heldout``: the project's held-out prompts, ``assets/prompts/heldout.jsonl``.
* ``train-heldout``: the first 48 held-out conversations of the training data (the
  split of :func:`clover.training.train.load_split`), the set training selects
  checkpoints by.

The answers are made once with the batched data path (:func:`clover.training.data.build_dataset`)
and kept under ``$CLOVER_CACHE_DIR/yardstick`` (default ``~/.cache/clover-studio``),
never in the work tree: benchmark text is measured here, never trained on or committed.
"""
from __future__ import annotations

from pathlib import Path

# Spec-Bench's MT-bench questions carry MT-bench's own eight categories
MT_BENCH = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
SPEC_BENCH_TASKS = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")
SETS = ("spec-bench", "heldout", "train-heldout")
MAX_NEW_TOKENS = 128
TRAIN_FOLDERS = ("selfdistill-v2", "selfdistill-v2-magpie")  # under clover.assets.data_dir()


def task_of(category: str) -> str:
    """The Spec-Bench task of a question category (MT-bench's eight categories are one)."""
    return "mt_bench" if category in MT_BENCH else category


def cache_dir() -> Path:
    """``$CLOVER_CACHE_DIR/yardstick`` (default ``~/.cache/clover-studio/yardstick``)."""
    from clover.assets import cache_root

    return cache_root() / "yardstick"


def answer_records(target, prompts: str | Path, name: str, max_new_tokens: int = MAX_NEW_TOKENS,
                   progress: bool = True) -> list[dict]:
    """Training-format records (``input_ids``, ``loss_mask`` on every answer token,
    ``key``, ``category``) of the target's greedy answers to a Spec-Bench-format prompt
    file, generated on first use into ``cache_dir()/<name>-<max_new_tokens>`` (the same
    call resumes an interrupted generation) and read from there later.

    Raises:
        FileNotFoundError / ValueError: for a missing or malformed prompt file.
    """
    from clover.training.data import DataConfig, build_dataset, read_records

    out = cache_dir() / f"{name}-{max_new_tokens}"
    build_dataset(target, prompts, out, DataConfig(max_new_tokens=max_new_tokens), progress=progress)
    return [{"key": f"{name}:{r['id']}", "category": r["category"], "input_ids": r["input_ids"],
             "loss_mask": r["loss_mask"]} for r in read_records(out, target.tokenizer)]


def train_heldout_records(target, data: str | None = None, n: int = 48) -> list[dict]:
    """The first ``n`` held-out conversations of the training data (default: the shipped
    heads' folders under :func:`clover.assets.data_dir`), as training selects checkpoints
    on them (default split and ``max_len``)."""
    from clover.assets import data_dir
    from clover.training.config import TrainConfig
    from clover.training.train import load_split

    data = data or ",".join(str(data_dir() / f) for f in TRAIN_FOLDERS)

    _, held = load_split(data, TrainConfig(), target.tokenizer)
    return [{**r, "category": "train-heldout"} for r in held[:n]]


def score(heads, target, records: list[dict], hidden=None, prompt_vocab: bool = False) -> dict:
    """Per category, per Spec-Bench task (where the categories are Spec-Bench's) and
    ``"all"``: :func:`clover.training.train.evaluate`'s figures (per head ``top1``,
    ``top5``, ``chain``; ``chain_tau``). With Spec-Bench tasks present, ``"six_task"``
    holds the unweighted mean over the six tasks of head 1's top-1 and of ``chain_tau``.

    ``hidden``: a :class:`~clover.training.hidden_cache.HiddenCache` holding (or to hold)
    the records' target states. ``prompt_vocab``: each conversation's draft vocabulary
    also holds its prompt's tokens, the heads unchanged (the lever of drafting the
    prompt's rare words, names and numbers; see :func:`clover.training.train.batch_loss`).
    """
    from clover.training.config import TrainConfig
    from clover.training.train import evaluate

    pad = min(target.eos_token_ids) if target.eos_token_ids else 0
    cfg = TrainConfig(method=heads.config.kind, num_heads=heads.config.num_heads, eval_conversations=10**9)
    groups: dict[str, list[dict]] = {"all": records}
    for r in records:
        groups.setdefault(r["category"], []).append(r)
    tasks = {task_of(r["category"]) for r in records}
    if set(SPEC_BENCH_TASKS) <= tasks:
        for r in records:
            if task_of(r["category"]) == "mt_bench":
                groups.setdefault("mt_bench", []).append(r)
    out = {name: evaluate(heads, target, recs, cfg, pad, hidden, prompt_vocab=prompt_vocab)
           for name, recs in groups.items()}
    if set(SPEC_BENCH_TASKS) <= tasks:
        out["six_task"] = {
            "head1_top1": sum(out[t]["head1"]["top1"] for t in SPEC_BENCH_TASKS) / len(SPEC_BENCH_TASKS),
            "chain_tau": sum(out[t]["chain_tau"] for t in SPEC_BENCH_TASKS) / len(SPEC_BENCH_TASKS)}
    return out


def load_sets(target, sets=SETS, spec_bench: str | Path | None = None, progress: bool = True) -> dict[str, list[dict]]:
    """The records of each named set (see the module docstring), generating answers that
    are not cached yet.

    ``spec_bench``: Spec-Bench's ``question.jsonl`` (default ``../shared/data/spec_bench``
    beside the repository).

    Raises:
        ValueError: an unknown set name; FileNotFoundError: Spec-Bench not found.
    """
    from clover.assets import assets_dir

    unknown = [s for s in sets if s not in SETS]
    if unknown:
        raise ValueError(f"unknown set(s) {unknown}; choose from {', '.join(SETS)}")
    out = {}
    for s in sets:
        if s == "spec-bench":
            path = Path(spec_bench) if spec_bench else Path(__file__).resolve().parents[3] / "shared/data/spec_bench/question.jsonl"
            if not path.is_file():
                raise FileNotFoundError(f"Spec-Bench questions not found at {path}; pass their question.jsonl")
            out[s] = answer_records(target, path, "spec-bench", progress=progress)
        elif s == "heldout":
            out[s] = answer_records(target, assets_dir() / "prompts" / "heldout.jsonl", "heldout", progress=progress)
        else:
            out[s] = train_heldout_records(target)
    return out
