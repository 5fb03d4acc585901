"""Self-distillation data: the target's own answers to a prompt set.

Draft heads learn to predict what the *target* would say (Medusa-2 / Clover §4.1:
"self-distillation"), so the training set is the target's own answers, produced with its
chat template, greedily and optionally with temperature sampling. Each record holds the
token ids of the whole conversation and a loss mask over the answer tokens.

Prompt files use Spec-Bench's JSONL fields: ``question_id``, ``category``, ``turns`` (a
list of user messages, answered turn by turn).

Output: ``DIR/shard-00000.jsonl.gz``, ... each line
``{"id", "question_id", "category", "temperature", "answers", "input_ids", "loss_mask"}``
(``answers``: the target's answer ids per turn). Records of ShareGPT prompts leave out
``input_ids`` and ``loss_mask``, which would hold the prompt's text: :func:`read_records`
rebuilds them from the installed package. Finished records are flushed as they come,
so an interrupted run resumes with the records it lacks; each sampled answer is seeded
by its record id, so a resumed run produces what an uninterrupted one would have.
"""
from __future__ import annotations

import gzip
import json
import logging
import os
import zlib
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch

from clover.training.batchgen import Request, generate_many
from clover.training.prompts import interleave_categories, is_reference, read_prompts, referenced_turns

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class DataConfig:
    """How to build a self-distillation set.

    Attributes:
        temperatures: one answer per prompt per temperature (0 = greedy).
        max_new_tokens: cap per answer (per turn).
        batch_size: most prompts answered together (:func:`generate_batch`).
        batch_tokens: and at most this many KV-cache positions per batch (rows x (longest
            prompt + ``max_new_tokens``)), which bounds memory on long prompts.
        seed: base seed; each sampled answer is seeded from it and its record id, so it
            does not depend on batching.
        max_prompts: use only the first N prompts, taken round-robin over categories
            (None = all).
        records_per_shard: records per output file.
    """

    temperatures: tuple[float, ...] = (0.0,)
    max_new_tokens: int = 256
    batch_size: int = 64
    batch_tokens: int = 49152
    seed: int = 0
    max_prompts: int | None = None
    records_per_shard: int = 1000

    def __post_init__(self):
        if not self.temperatures or any(t < 0 for t in self.temperatures):
            raise ValueError("temperatures must be a non-empty list of values >= 0")
        if min(self.max_new_tokens, self.batch_size, self.batch_tokens, self.records_per_shard) < 1:
            raise ValueError("max_new_tokens, batch_size, batch_tokens and records_per_shard "
                             "must be >= 1")


def _conversation(tokenizer, turns: list[str], answers: list[list[int]]) -> tuple[list[int], list[int]]:
    """Token ids and loss mask of a templated conversation: user ``turns`` each followed by
    the target's answer ids (every answer in the mask).

    Each turn is templated with the earlier answers as decoded text, as the target saw
    it when answering; the template re-tokenises earlier turns identically, and an earlier
    answer's mask is kept only where the re-tokenised prefix agrees.
    """
    conv: list[dict] = []
    ids: list[int] = []
    mask: list[int] = []
    for user, answer in zip(turns, answers):
        conv.append({"role": "user", "content": user})
        prompt = _template(tokenizer, conv)
        full = prompt + answer
        new_mask = [0] * len(prompt) + [1] * len(answer)
        new_mask[: len(mask)] = [m if full[k] == ids[k] else 0 for k, m in enumerate(mask[: len(full)])]
        ids, mask = full, new_mask
        conv.append({"role": "assistant", "content": tokenizer.decode(answer, skip_special_tokens=True)})
    return ids, mask


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


def read_records(out_dir: str | Path, tokenizer=None) -> Iterator[dict]:
    """Yield every complete record of a data folder.

    Records of ShareGPT prompts are stored without the prompt text (``answers`` only);
    with ``tokenizer`` they are rebuilt with ``input_ids`` and ``loss_mask`` from the
    installed ShareGPT package (:func:`_conversation`), without it they are yielded as
    stored.

    Raises:
        ValueError / FileNotFoundError: see :func:`read_prompts`, when rebuilding.
    """
    for shard in sorted(Path(out_dir).glob("shard-*.jsonl.gz")):
        for r in _read_shard(shard)[0]:
            if "input_ids" not in r and tokenizer is not None:
                turns = referenced_turns(r["question_id"], str(shard))
                r["input_ids"], r["loss_mask"] = _conversation(tokenizer, turns, r["answers"])
            yield r


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


def _append(out_dir: Path, records: list[dict], written: int, per_shard: int) -> int:
    """Append records to the shards (the last one until it holds ``per_shard``), flushed
    per file; returns the new record count."""
    while records:
        shard_no, room = divmod(written, per_shard)
        part, records = records[: per_shard - room], records[per_shard - room:]
        with gzip.open(out_dir / f"shard-{shard_no:05d}.jsonl.gz", "at", encoding="utf-8") as f:
            for r in part:
                f.write(json.dumps(r, separators=(",", ":")) + "\n")
        written += len(part)
    return written


def _template(tokenizer, conversation: list[dict]) -> list[int]:
    from clover.models import chat_ids  # prompt text stays text, whatever it holds

    return chat_ids(tokenizer, conversation)


def build_dataset(target, prompts_path: str | Path, out_dir: str | Path, cfg: DataConfig,
                  progress: bool = True) -> int:
    """Generate (or resume) a self-distillation set.

    Prompts are answered shortest first with continuous batching
    (:func:`clover.training.batchgen.generate_many`, greedy or sampled per ``cfg.temperatures``);
    multi-turn prompts are answered turn by turn, each turn after the target's own
    previous answer, and every assistant turn is in the loss mask. Finished records are
    appended to the shards and flushed every ``batch_size`` records, so an interrupted
    run resumes with the records it lacks. A prompt whose first turn plus
    ``max_new_tokens`` does not fit the model's context is skipped with a warning; a
    later turn that does not fit ends that conversation.

    Returns:
        the number of records in ``out_dir`` when done.
    Raises:
        ValueError: for a bad prompt file or config.
    """
    from tqdm.auto import tqdm

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok = target.tokenizer
    jobs = _jobs(read_prompts(prompts_path), cfg)
    _repair(out_dir)
    done = [r["id"] for r in read_records(out_dir)]  # one pass over the shards
    written, done = len(done), set(done)
    todo = [j for j in jobs if j["id"] not in done]
    for j in todo:  # answered shortest first, so that rows decoded together match in length
        j["_len"] = len(_template(tok, [{"role": "user", "content": j["turns"][0]}]))
    bar = tqdm(total=len(jobs), initial=len(jobs) - len(todo), desc="self-distillation",
               unit="answer", disable=not progress)
    tokens = [0]

    def count(rows: int):
        tokens[0] += rows
        bar.set_postfix(rows=rows, tokens=tokens[0], refresh=False)

    for temp in cfg.temperatures:
        group = sorted((j for j in todo if j["temperature"] == temp), key=lambda j: j["_len"])
        state = {j["id"]: {"job": j, "conv": [], "answers": []} for j in group}
        queue: deque[Request] = deque()

        def ask(st: dict, turn: int) -> bool:
            """Queue the conversation's next user turn; False when it does not fit."""
            conv = st["conv"] + [{"role": "user", "content": st["job"]["turns"][turn]}]
            ids = _template(tok, conv)
            if len(ids) + cfg.max_new_tokens > target.max_context:
                return False
            st["conv"], st["turn"] = conv, turn
            seed = zlib.crc32(f"{cfg.seed}:{st['job']['id']}:{turn}".encode())
            request = Request(st["job"]["id"], ids, seed)
            if turn:  # follow-up turns go first: their conversation is already under way
                queue.appendleft(request)
            else:
                queue.append(request)
            return True

        for st in state.values():
            if not ask(st, 0):
                log.warning("skipping %s: its prompt + %d new tokens exceeds the model's context",
                            st["job"]["id"], cfg.max_new_tokens)
                bar.update(1)
        finished = []
        for key, answer in generate_many(target, queue, cfg.max_new_tokens, temp, cfg.batch_size,
                                         cfg.batch_tokens, on_step=count):
            st = state[key]
            st["answers"].append(answer)
            st["conv"].append({"role": "assistant", "content": tok.decode(answer, skip_special_tokens=True)})
            turn = st["turn"] + 1
            if turn < len(st["job"]["turns"]) and ask(st, turn):
                continue
            j = st["job"]
            record = {"id": j["id"], "question_id": j["question_id"], "category": j["category"],
                      "temperature": temp, "answers": st["answers"]}
            if not is_reference(j["question_id"]):  # referenced prompts stay out of the files
                record["input_ids"], record["loss_mask"] = _conversation(
                    tok, j["turns"][: len(st["answers"])], st["answers"])
            finished.append(record)
            bar.update(1)
            if len(finished) >= min(cfg.batch_size, cfg.records_per_shard):
                written = _append(out_dir, finished, written, cfg.records_per_shard)
                finished = []
        written = _append(out_dir, finished, written, cfg.records_per_shard)
    bar.close()
    return sum(1 for _ in read_records(out_dir))


def measure_speed(target, prompts_path: str | Path, prompts: int = 128, single: int = 8,
                  max_new_tokens: int = 128, batch_size: int = 64, batch_tokens: int = 49152,
                  seed: int = 0, progress: bool = True) -> dict:
    """Answer tokens per second of ``clover data``'s batched decoding against
    single-stream plain decoding of the same model, measured one after the other in one
    call (so on the same machine under the same load).

    ``prompts`` first turns are drawn (seeded) from the prompt file and answered greedily
    together with :func:`clover.training.batchgen.generate_many` (sorted by length, as
    :func:`build_dataset` does); the first ``single`` of them are answered one at a time
    with the engine's plain decoding. Both times include prefill.

    Returns:
        {"single_tokens_per_s", "batched_tokens_per_s", "ratio", "single_prompts",
        "batched_prompts", "batched_tokens", "single_tokens"}.
    Raises:
        ValueError: for ``prompts`` or ``single`` < 1, or a prompt file without prompts.
    """
    import random
    import time

    from tqdm.auto import tqdm

    from clover.training.batchgen import Request, generate_many
    from clover.engine import Engine

    if prompts < 1 or single < 1:
        raise ValueError("prompts and single must be >= 1")
    tok = target.tokenizer
    pool = read_prompts(prompts_path)
    chosen = random.Random(seed).sample(pool, min(prompts, len(pool)))
    ids = [_template(tok, [{"role": "user", "content": p["turns"][0]}]) for p in chosen]
    ids = [x for x in ids if len(x) + max_new_tokens <= target.max_context]
    t0, single_tokens = time.perf_counter(), 0
    for x in tqdm(ids[:single], desc="single stream", disable=not progress):
        single_tokens += len(Engine(target).generate(x, max_new_tokens).token_ids)
    single_s = time.perf_counter() - t0
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    bar = tqdm(total=len(ids), desc="batched", disable=not progress)
    t0, batched_tokens = time.perf_counter(), 0
    for _, answer in generate_many(target, [Request(i, ids[i]) for i in order], max_new_tokens,
                                   0.0, batch_size, batch_tokens):
        batched_tokens += len(answer)
        bar.update(1)
    batched_s = time.perf_counter() - t0
    bar.close()
    single_tps, batched_tps = single_tokens / single_s, batched_tokens / batched_s
    return {"single_tokens_per_s": round(single_tps, 2), "batched_tokens_per_s": round(batched_tps, 2),
            "ratio": round(batched_tps / single_tps, 2), "single_prompts": min(single, len(ids)),
            "single_tokens": single_tokens, "batched_prompts": len(ids),
            "batched_tokens": batched_tokens}


def build_text_dataset(tokenizer, texts: list[dict], out_dir: str | Path, max_answer_tokens: int = 512,
                       records_per_shard: int = 512) -> int:
    """Records of fixed text, labelled later by the target in one forward pass.

    Each text becomes the assistant's answer to a short user turn ("Explain <name>.")
    in the chat template, so the target reads it in the context it decodes in; the
    answer (cut to ``max_answer_tokens``) is in the loss mask. Training needs no answer
    from the target: its loss is against the target's own distribution at every answer
    position (:func:`clover.training.train.batch_loss`), computed by the forward pass that also
    gives the heads their features, several times cheaper per token than generating.
    Only text whose licence allows training belongs here (e.g.
    :func:`clover.training.prompts.stdlib_docs`); an existing folder is rebuilt.

    Args:
        texts: ``{"question_id", "category", "name", "text"}`` records.
    Returns:
        the number of records written.
    """
    import shutil

    out_dir = Path(out_dir)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    eos = tokenizer.eos_token_id
    records = []
    for t in texts:
        answer = tokenizer.encode(t["text"], add_special_tokens=False)[:max_answer_tokens]
        if eos is not None and len(answer) < max_answer_tokens:
            answer.append(eos)  # the answer ends as a chat answer does
        ids, mask = _conversation(tokenizer, [f"Explain {t['name']}."], [answer])
        records.append({"id": f"{t['question_id']}@text", "question_id": t["question_id"],
                        "category": t.get("category", "text"), "temperature": None,
                        "answers": [answer], "input_ids": ids, "loss_mask": mask})
    return _append(out_dir, records, 0, records_per_shard)


def collate(records: list[dict], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad a batch: (B, T) ids and (B, T) loss mask (0 on padding).

    Right padding needs no attention mask: causal attention never looks forward.
    """
    width = max(len(r["input_ids"]) for r in records)
    ids = torch.full((len(records), width), pad, dtype=torch.long)
    mask = torch.zeros((len(records), width), dtype=torch.bool)
    for i, r in enumerate(records):
        ids[i, : len(r["input_ids"])] = torch.tensor(r["input_ids"])
        mask[i, : len(r["loss_mask"])] = torch.tensor(r["loss_mask"], dtype=torch.bool)
    return ids, mask
