"""Self-distillation data: the target's own answers to a prompt set.

Draft heads learn to predict what the *target* would say (Medusa-2 / Clover §4.1:
"self-distillation"), so the training set is the target's own answers, produced with its
chat template, greedily and optionally with temperature sampling. Each record holds the
token ids of the whole conversation and a loss mask over the answer tokens.

Prompt files use Spec-Bench's JSONL fields: ``question_id``, ``category``, ``turns`` (a
list of user messages, answered turn by turn).

Output: ``DIR/shard-00000.jsonl.gz``, ... each line
``{"id", "question_id", "category", "temperature", "input_ids", "loss_mask"}``.
Work is cut into fixed batches; a batch's records are written together and flushed, so
an interrupted run resumes where it stopped (finished batches are skipped) and produces
exactly what an uninterrupted run would have.
"""
from __future__ import annotations

import gzip
import json
import logging
import os
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch

log = logging.getLogger(__name__)

CATEGORIES = ("multi_turn", "translation", "summarization", "qa", "math_reasoning", "rag", "code")


@dataclass(frozen=True)
class DataConfig:
    """How to build a self-distillation set.

    Attributes:
        temperatures: one answer per prompt per temperature (0 = greedy).
        max_new_tokens: cap per answer (per turn).
        batch_size: prompts answered together by ``generate`` (left padding).
        seed: base seed; each batch is seeded from it and its index.
        max_prompts: use only the first N prompts, taken round-robin over categories
            (None = all).
        records_per_shard: records per output file.
    """

    temperatures: tuple[float, ...] = (0.0,)
    max_new_tokens: int = 256
    batch_size: int = 16
    seed: int = 0
    max_prompts: int | None = None
    records_per_shard: int = 1000

    def __post_init__(self):
        if not self.temperatures or any(t < 0 for t in self.temperatures):
            raise ValueError("temperatures must be a non-empty list of values >= 0")
        if self.max_new_tokens < 1 or self.batch_size < 1 or self.records_per_shard < 1:
            raise ValueError("max_new_tokens, batch_size and records_per_shard must be >= 1")


def read_prompts(path: str | Path) -> list[dict]:
    """Read a Spec-Bench-format JSONL prompt file.

    Returns:
        records with ``question_id``, ``category`` and ``turns`` (non-empty list of str).
    Raises:
        ValueError: naming the line that lacks a field or has no turns.
    """
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not JSON ({e})") from None
            turns = rec.get("turns")
            if "question_id" not in rec or not isinstance(turns, list) or not turns or \
                    not all(isinstance(t, str) and t.strip() for t in turns):
                raise ValueError(f"{path}:{n}: needs question_id and a non-empty list of turns")
            out.append({"question_id": rec["question_id"], "category": rec.get("category", ""),
                        "turns": turns})
    if not out:
        raise ValueError(f"{path}: no prompts")
    return out


def interleave_categories(prompts: list[dict]) -> list[dict]:
    """Round-robin over categories (first-seen order), so any prefix is balanced."""
    by_cat: dict[str, list[dict]] = {}
    for p in prompts:
        by_cat.setdefault(p["category"], []).append(p)
    out, queues = [], [list(reversed(v)) for v in by_cat.values()]
    while any(queues):
        for q in queues:
            if q:
                out.append(q.pop())
    return out


def _jobs(prompts: list[dict], cfg: DataConfig) -> list[dict]:
    jobs = []
    for temp in cfg.temperatures:
        for p in interleave_categories(prompts)[: cfg.max_prompts]:
            jobs.append({**p, "temperature": temp, "id": f"{p['question_id']}@t{temp:g}"})
    return jobs


def _read_shard(shard: Path) -> tuple[list[dict], bool]:
    """Complete records of one shard, and whether the file ended torn."""
    records = []
    try:
        with gzip.open(shard, "rt", encoding="utf-8") as f:
            for line in f:
                records.append(json.loads(line))
    except (EOFError, gzip.BadGzipFile, json.JSONDecodeError, zlib.error):
        return records, True
    return records, False


def read_records(out_dir: str | Path) -> Iterator[dict]:
    """Yield every complete record of a data folder."""
    for shard in sorted(Path(out_dir).glob("shard-*.jsonl.gz")):
        yield from _read_shard(shard)[0]


def _repair(out_dir: Path) -> None:
    """Rewrite shards torn by an interrupted run with their complete records only."""
    for shard in sorted(out_dir.glob("shard-*.jsonl.gz")):
        records, torn = _read_shard(shard)
        if torn:
            log.warning("%s was cut off mid-write; keeping its %d complete records", shard, len(records))
            tmp = shard.with_suffix(".tmp")
            with gzip.open(tmp, "wt", encoding="utf-8") as f:
                for r in records:
                    f.write(json.dumps(r, separators=(",", ":")) + "\n")
            os.replace(tmp, shard)


def _answer_batch(target, conversations: list[list[dict]], temps: list[float],
                  cfg: DataConfig, seed: int) -> list[tuple[list[int], int]]:
    """One assistant turn for each conversation with HF ``generate`` (left padded).

    Returns:
        per conversation: (ids of the templated conversation + answer, answer start).
    """
    tok = target.tokenizer
    prompts = [tok.apply_chat_template(c, add_generation_prompt=True, tokenize=True) for c in conversations]
    prompts = [p["input_ids"] if not isinstance(p, list) else p for p in prompts]
    pad = tok.pad_token_id if tok.pad_token_id is not None else min(target.eos_token_ids)
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    temp = temps[0]
    torch.manual_seed(seed)
    gen_kw = dict(do_sample=True, temperature=temp, top_k=0, top_p=1.0) if temp > 0 else dict(do_sample=False)
    with torch.inference_mode():
        out = target.model.generate(input_ids=ids.to(target.device), attention_mask=mask.to(target.device),
                                    max_new_tokens=cfg.max_new_tokens, pad_token_id=pad,
                                    eos_token_id=sorted(target.eos_token_ids), **gen_kw)
    results = []
    for i, p in enumerate(prompts):
        answer = out[i, width:].tolist()
        for j, t in enumerate(answer):  # cut after the first EOS; drop padding
            if t in target.eos_token_ids:
                answer = answer[: j + 1]
                break
        results.append((p + answer, len(p)))
    return results


def build_dataset(target, prompts_path: str | Path, out_dir: str | Path, cfg: DataConfig,
                  progress: bool = True) -> int:
    """Generate (or resume) a self-distillation set.

    Multi-turn prompts are answered turn by turn; every assistant turn is in the loss
    mask. Returns the number of records in ``out_dir`` when done.

    Raises:
        ValueError: for a bad prompt file or config.
    """
    from tqdm.auto import tqdm

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    jobs = _jobs(read_prompts(prompts_path), cfg)
    _repair(out_dir)
    done = {r["id"] for r in read_records(out_dir)}
    batches = [jobs[i: i + cfg.batch_size] for i in range(0, len(jobs), cfg.batch_size)]
    todo = [(b, batch) for b, batch in enumerate(batches) if any(j["id"] not in done for j in batch)]
    bar = tqdm(total=len(jobs), initial=len(jobs) - sum(len(b) for _, b in todo),
               desc="self-distillation", unit="answer", disable=not progress)
    for b, batch in todo:
        # same-temperature jobs only share a batch (jobs are grouped by temperature)
        groups: dict[float, list[dict]] = {}
        for j in batch:
            groups.setdefault(j["temperature"], []).append(j)
        records = []
        for temp, group in groups.items():
            convs = [[] for _ in group]
            ids_masks: list[tuple[list[int], list[int]]] = [([], []) for _ in group]
            for turn in range(max(len(j["turns"]) for j in group)):
                live = [i for i, j in enumerate(group) if turn < len(j["turns"])]
                for i in live:
                    convs[i].append({"role": "user", "content": group[i]["turns"][turn]})
                answers = _answer_batch(target, [convs[i] for i in live], [temp] * len(live), cfg,
                                        seed=cfg.seed * 1_000_003 + b * 101 + turn)
                for i, (full, start) in zip(live, answers):
                    text = target.tokenizer.decode(full[start:], skip_special_tokens=True)
                    convs[i].append({"role": "assistant", "content": text})
                    prev_ids, prev_mask = ids_masks[i]
                    # the templated conversation re-tokenises earlier turns identically;
                    # keep the mask of earlier answers where the prefix agrees
                    mask = [0] * start + [1] * (len(full) - start)
                    mask[: len(prev_mask)] = [m if full[k] == prev_ids[k] else 0
                                              for k, m in enumerate(prev_mask[: len(full)])]
                    ids_masks[i] = (full, mask)
            for j, (ids, mask) in zip(group, ids_masks):
                records.append({"id": j["id"], "question_id": j["question_id"],
                                "category": j["category"], "temperature": temp,
                                "input_ids": ids, "loss_mask": mask})
        records = [r for r in records if r["id"] not in done]
        shard = out_dir / f"shard-{b * cfg.batch_size // cfg.records_per_shard:05d}.jsonl.gz"
        with gzip.open(shard, "at", encoding="utf-8") as f:
            for r in records:
                f.write(json.dumps(r, separators=(",", ":")) + "\n")
        done.update(r["id"] for r in records)
        bar.update(len(records))
    bar.close()
    return sum(1 for _ in read_records(out_dir))
