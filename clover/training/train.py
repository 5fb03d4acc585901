"""Train draft heads with the target frozen (Clover arXiv 2405.00263 §4.1; Medusa-1).

Data: a self-distillation folder from :mod:`clover.training.data`. Per step, a batch of
conversations goes through the frozen target once (hidden states before and after the
final norm); at a random sample of answer positions s, head k (1..K) is trained to
predict token s+k+1 against the target's own distribution at position s+k (soft
cross-entropy), weighted by ``decay**(k-1)``. Optionally (Clover-2) the head's hidden
state is also regressed onto the target's hidden state at s+k.

Each head class owns its teacher-forced training forward
(:meth:`~clover.heads.base.DraftHeads.training_outputs`); this module knows none of
their insides:

* Medusa head k reads the normed hidden state at s.
* Clover runs the Augmenting Block over the whole sequence, then at s chains the
  Attention Decoder through the true tokens x_{s+1}, ..., x_{s+k} (teacher forcing: the
  Regressive Connection sees what the target said).
* Clover-2 fuses each position with its true next token, then runs its recurrence
  through the true tokens; its preset adds the regression term (CLOVER2.md §2.3).

The frozen target's hidden states come from :mod:`clover.training.hidden_cache`.

Runs under ``accelerate`` (several GPUs, mixed precision on GPU) with a tqdm bar,
periodic held-out evaluation (per-head top-1 / top-5 accuracy against the target's own
next token), checkpoints and resume.
"""
from __future__ import annotations

import heapq
import json
import logging
import math
import random
import time
import zlib
from dataclasses import asdict
from functools import partial
from pathlib import Path

import torch
from torch import nn

from clover.training.data import collate, read_records
from clover.training.hidden_cache import HiddenCache, target_hidden
from clover.heads import DraftHeads, load_heads, new_heads
from clover.training.config import TrainConfig, parse_category_weights, parse_layers

log = logging.getLogger(__name__)


def is_heldout(question_id, percent: int) -> bool:
    """Deterministic split by question id: the same prompt never lands in both."""
    return zlib.crc32(str(question_id).encode()) % 100 < percent


def data_dirs(data_dir) -> list[Path]:
    """One data folder, a comma-separated list of folders, or a list of folders (``~``
    expanded: a shell expands it only at the start of a word, not after a comma).

    Raises:
        FileNotFoundError: a named folder does not exist (rather than training silently
            without it).
    """
    names = data_dir if isinstance(data_dir, (list, tuple)) else str(data_dir).split(",")
    dirs = [Path(str(d).strip()).expanduser() for d in names if str(d).strip()]
    for d in dirs:
        if not d.is_dir():
            raise FileNotFoundError(f"no data folder {d} (make one with `clover data --out {d}`)")
    return dirs


def load_split(data_dir, cfg: TrainConfig, tokenizer=None) -> tuple[list[dict], list[dict]]:
    """(train, held-out) records of one or more data folders (see :func:`data_dirs`), cut
    to ``max_len``. The split is by question id, so the greedy and sampled answers to
    one prompt land on the same side.

    ``tokenizer`` (the target's) rebuilds records stored without their prompt text
    (ShareGPT prompts, see :func:`clover.training.data.read_records`); without it they are skipped.

    Raises:
        ValueError: when the folder holds no usable records.
    """
    import itertools

    train, held = [], []
    records = itertools.chain.from_iterable(read_records(d, tokenizer) for d in data_dirs(data_dir))
    for n, r in enumerate(records):
        if cfg.max_conversations and n >= cfg.max_conversations:
            break
        if "input_ids" not in r:
            continue
        ids, mask = r["input_ids"][: cfg.max_len], r["loss_mask"][: cfg.max_len]
        if sum(mask) < 2:
            continue
        key = f"{r.get('id', r['question_id'])}:{zlib.crc32(bytes(str(ids), 'ascii')):08x}"
        (held if is_heldout(r["question_id"], cfg.heldout_percent) else train).append(
            {"input_ids": ids, "loss_mask": mask, "key": key, "category": r.get("category")})
    if not train:
        raise ValueError(f"no training records in {data_dir}; run `clover data` first")
    return train, held


def frequent_tokens(records: list[dict], n: int, vocab_size: int, always=()) -> list[int]:
    """Sorted ids of ``always`` (e.g. EOS) plus the most frequent answer tokens (ties by
    id), filled up with the lowest unused ids when the data has fewer than ``n``."""
    from collections import Counter

    counts = Counter(t for r in records for t, m in zip(r["input_ids"], r["loss_mask"]) if m)
    ranked = [t for t, _ in sorted(counts.items(), key=lambda x: (-x[1], x[0]))]
    chosen = list(dict.fromkeys(list(always) + ranked + list(range(vocab_size))))
    return sorted(chosen[: min(n, vocab_size)])


def mix_weights(records: list[dict], category_weights: str) -> list[float] | None:
    """Each record's sampling weight under ``TrainConfig.category_weights`` (None when the
    mix is uniform).

    Raises:
        ValueError: a named category that no record has (a typo would otherwise train the
            uniform mix silently).
    """
    weights = parse_category_weights(category_weights)
    if not weights:
        return None
    present = {r.get("category") for r in records}
    missing = sorted(set(weights) - present)
    if missing:
        raise ValueError(f"category_weights names {', '.join(missing)}, which the training data does "
                         f"not have; its categories: {', '.join(sorted(map(str, present)))}")
    return [weights.get(r.get("category"), 1.0) for r in records]


def draw_batch(records: list[dict], k: int, rng: random.Random, weights: list[float] | None = None) -> list[dict]:
    """k distinct records: uniformly (``rng.sample``), or with ``weights`` in proportion to
    them, without replacement (Efraimidis and Spirakis' keys u ** (1 / w), the k largest)."""
    k = min(k, len(records))
    if weights is None:
        return rng.sample(records, k)
    keys = [rng.random() ** (1.0 / w) for w in weights]
    return [records[i] for i in heapq.nlargest(k, range(len(records)), key=keys.__getitem__)]


def sample_positions(mask: torch.Tensor, n: int, gen: torch.Generator):
    """Positions s whose token s+2 is an answer token (head 1 has a target); at most n
    per row (n = 0: all). Returns (rows, cols) long tensors of equal length M."""
    valid = torch.zeros_like(mask)
    valid[:, :-2] = mask[:, 2:]
    rows, cols = [], []
    for b in range(mask.shape[0]):
        idx = torch.nonzero(valid[b]).flatten()
        if n and len(idx) > n:
            idx = idx[torch.randperm(len(idx), generator=gen)[:n]]
        rows.append(torch.full_like(idx, b))
        cols.append(idx)
    return torch.cat(rows), torch.cat(cols)


def perturb_features(x: torch.Tensor, dropout: float, noise: float, gen: torch.Generator | None,
                     width: int | None = None):
    """Training-time regularisation of the target features the heads read: Gaussian
    noise with std ``noise`` x each vector's RMS, then dropout. ``x``: (..., D), or
    features packed from several layers, (..., n x ``width``): each layer's own RMS."""
    if noise > 0:
        groups = x.unflatten(-1, (-1, width or x.shape[-1]))  # (..., n, width)
        rms = groups.float().pow(2).mean(-1, keepdim=True).sqrt().to(x.dtype).expand_as(groups).flatten(-2)
        eps = torch.randn(x.shape, generator=gen, dtype=x.dtype) if gen is not None else torch.randn_like(x)
        x = x + noise * rms * eps.to(x.device)
    if dropout > 0:
        x = nn.functional.dropout(x, dropout, training=True)
    return x


def head_outputs(heads: DraftHeads, target, ids, pre, rows, cols, cfg: TrainConfig | None = None,
                 gen: torch.Generator | None = None):
    """Per head k: draft logits (M, V') and pre-lm_head hidden (M, D) at positions s
    (each head class's own :meth:`~clover.heads.base.DraftHeads.training_outputs`).

    With ``cfg`` (training), its ``feature_noise`` and ``dropout`` perturb the features
    the heads read."""
    features = None
    if cfg is not None and (cfg.feature_noise > 0 or cfg.dropout > 0):
        features = partial(perturb_features, dropout=cfg.dropout, noise=cfg.feature_noise, gen=gen,
                           width=heads.config.hidden_size)
    return heads.training_outputs(target, ids, pre, rows, cols, features)


def batch_loss(heads, target, ids, mask, cfg: TrainConfig, gen, n_positions: int, hidden=None,
               exact_metrics: bool = False, prompt_vocab: bool = False):
    """Weighted soft cross-entropy over heads, plus per-head top-1/top-5 counts.

    The teacher is the target's distribution over the heads' draft vocabulary (the
    whole vocabulary when they have none). Accuracy counts a hit when the head's top-1
    (top-5) draft token is the target's own greedy next token; with ``exact_metrics``
    that token is taken over the whole vocabulary (a target token outside the draft
    vocabulary is a miss), else over the draft vocabulary (cheaper, for progress bars).

    ``hidden``: the batch's (pre, post) target states when already known.

    ``prompt_vocab`` (with ``exact_metrics``, heads with a draft vocabulary): score the
    drafts as if each row's draft vocabulary also held the tokens of its prompt (every
    token outside the answer, ``mask == 0``), the heads unchanged: their output goes
    through the lm_head rows of those tokens too. The loss and KL figures are then over
    the whole vocabulary.

    Returns:
        (loss scalar, per head k a list [positions, top1 hits, top5 hits, cross-entropy
        sum, KL(target || head) sum, chain hits, chain positions]); chain hits count
        the positions where heads 1..k are all right, among the chain positions (those
        where every head has a target).
    """
    pre, post = hidden if hidden is not None else target_hidden(target, ids, heads.config.fuse_layers)
    rows, cols = sample_positions(mask, n_positions, gen)
    training = heads.training and not exact_metrics
    allowed = None
    if prompt_vocab and exact_metrics and heads.draft_vocab is not None:
        if getattr(heads, "lm_heads", None) is not None:
            raise ValueError("prompt_vocab needs heads that project through the target's lm_head")
        allowed = torch.zeros(ids.shape[0], target.vocab_size, dtype=torch.bool, device=ids.device)
        allowed[:, heads.draft_vocab] = True
        allowed.scatter_(1, torch.where(mask.bool(), heads.draft_vocab[0], ids), True)  # (B, V)
        with heads.whole_vocabulary():
            outs = head_outputs(heads, target, ids, pre, rows, cols, None, gen)
        outs = [(logits.masked_fill(~allowed[rows], float("-inf")), z) for logits, z in outs]
    else:
        outs = head_outputs(heads, target, ids, pre, rows, cols, cfg if training else None, gen)
    T = ids.shape[1]
    K = len(outs)
    full = (cols + K + 1 < T) & mask[rows, (cols + K + 1).clamp(max=T - 1)]  # all heads have targets
    chain = torch.ones_like(full)
    loss = torch.zeros((), device=ids.device)
    stats = []
    for k, (logits, z) in enumerate(outs):
        tgt = cols + k + 1  # teacher position s+k (1-based head k); predicts x_{s+k+2}
        ok = (cols + k + 2 < T) & mask[rows, (cols + k + 2).clamp(max=T - 1)]
        if not ok.any():
            stats.append([0, 0, 0, 0.0, 0.0, 0, int(full.sum())])
            chain = torch.zeros_like(chain)
            continue
        tgt = tgt[ok]
        with torch.no_grad():
            teacher = torch.softmax((target.head_logits(post[rows[ok], tgt]) if allowed is not None
                                     else heads.vocab_logits(post[rows[ok], tgt], target)).float(), dim=-1)
        logp = torch.log_softmax(logits[ok].float(), dim=-1)
        # (M,); with a prompt vocabulary, -inf outside it (where the teacher is not 0)
        ce = -(teacher * (logp.clamp_min(-1e4) if allowed is not None else logp)).sum(-1)
        weight = cfg.decay ** k
        loss = loss + weight * ce.mean()
        if cfg.topk_weight > 0:  # HASS: the target's top-K, renormalised
            p, idx = teacher.topk(min(cfg.topk, teacher.shape[-1]), dim=-1)
            p = p / p.sum(-1, keepdim=True)
            loss = loss + weight * cfg.topk_weight * -(p * logp.gather(-1, idx)).sum(-1).mean()
        if cfg.argmax_weight > 0 and allowed is None:  # the target's greedy token, a hard label
            loss = loss + weight * cfg.argmax_weight * nn.functional.nll_loss(logp, teacher.argmax(-1))
        if cfg.hidden_weight > 0:
            ref = (pre[..., :post.shape[-1]] if heads.regression_space == "pre" else post)[rows[ok], tgt]
            loss = loss + weight * cfg.hidden_weight * nn.functional.smooth_l1_loss(z[ok].float(), ref.float())
        with torch.no_grad():
            best = teacher.argmax(-1)
            top5 = logp.topk(5, dim=-1).indices
            if exact_metrics and heads.draft_vocab is not None and allowed is None:
                best = target.head_logits(post[rows[ok], tgt]).argmax(-1)
                top5 = heads.draft_vocab[top5]
            entropy = -(teacher * torch.log(teacher.clamp_min(1e-30))).sum(-1)
            hit = torch.zeros_like(chain)
            hit[ok] = top5[:, 0] == best
            chain = chain & hit
            stats.append([int(ok.sum()), int((top5[:, 0] == best).sum()),
                          int((top5 == best[:, None]).any(-1).sum()), float(ce.sum()),
                          float((ce - entropy).sum()), int((chain & full).sum()), int(full.sum())])
    return loss, stats


def evaluate(heads, target, records, cfg: TrainConfig, pad: int, hidden: HiddenCache | None = None,
             prompt_vocab: bool = False) -> dict:
    """Per-head top-1 / top-5 accuracy, loss and KL on held-out conversations (all
    positions), and the chain acceptance: ``chain_tau``, the expected tokens per step of
    a greedy chain of the heads' top-1 drafts (1 + the sum over k of the share of
    positions where heads 1..k all draft the target's own next token; Clover's heads
    are teacher-forced on the true tokens, which are the drafted ones while the chain
    holds), and per head ``chain`` (that share).

    ``hidden``: a :class:`HiddenCache` to take the target's states from (else the target runs).
    ``prompt_vocab``: each conversation's draft vocabulary also holds its prompt's tokens
    (see :func:`batch_loss`).
    """
    heads.eval()
    totals = [[0, 0, 0, 0.0, 0.0, 0, 0] for _ in range(heads.config.num_heads)]
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        n = min(len(records), cfg.eval_conversations)
        for i in range(0, n, 4):
            batch = records[i: min(i + 4, n)]
            ids, mask = collate(batch, pad)
            ids, mask = ids.to(target.device), mask.to(target.device)
            states = (hidden([r["key"] for r in batch], ids, [len(r["input_ids"]) for r in batch])
                      if hidden is not None else None)
            _, stats = batch_loss(heads, target, ids, mask, cfg, gen, 0, hidden=states, exact_metrics=True,
                                  prompt_vocab=prompt_vocab)
            for t, s in zip(totals, stats):
                for j in range(7):
                    t[j] += s[j]
    heads.train()
    full = totals[0][6]
    out = {f"head{k + 1}": {"top1": t[1] / max(t[0], 1), "top5": t[2] / max(t[0], 1),
                            "loss": t[3] / max(t[0], 1), "kl": t[4] / max(t[0], 1),
                            "chain": t[5] / max(full, 1), "positions": t[0]}
           for k, t in enumerate(totals)}
    out["chain_tau"] = 1.0 + sum(t[5] for t in totals) / max(full, 1)
    return out


def lr_lambda(cfg: TrainConfig):
    def f(step: int) -> float:
        if step < cfg.warmup:
            return (step + 1) / cfg.warmup
        if cfg.schedule == "constant":
            return 1.0
        progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return f


def init_heads(cfg: TrainConfig, target) -> DraftHeads:
    """The heads in ``cfg.init_heads`` to continue training from, checked against ``cfg``.

    Raises:
        FileNotFoundError: when the folder holds no heads.
        ValueError: heads of another kind, head count or shape than ``cfg`` asks for, or
            made for another target.
    """
    heads = load_heads(cfg.init_heads, target)
    got = heads.config
    want = {"kind": cfg.method, "num_heads": cfg.num_heads}
    if cfg.method == "clover2":
        want["shared_recurrence"] = cfg.shared_recurrence
    for name, value in want.items():
        if getattr(got, name) != value:
            raise ValueError(f"--init-heads {cfg.init_heads} holds heads with {name}={getattr(got, name)!r}, "
                             f"not {value!r}")
    if cfg.draft_vocab and got.draft_vocab_size != cfg.draft_vocab:
        raise ValueError(f"--init-heads {cfg.init_heads} drafts among {got.draft_vocab_size or 'all'} tokens, "
                         f"not --draft-vocab {cfg.draft_vocab}")
    want_layers = parse_layers(cfg.fuse_layers)
    if got.fuse_layers != want_layers:
        if got.fuse_layers:
            raise ValueError(f"--init-heads {cfg.init_heads} holds heads with fuse_layers={got.fuse_layers}, "
                             f"not {want_layers}: pass --fuse-layers {','.join(map(str, got.fuse_layers))}")
        heads = add_fuse_layers(heads, target, want_layers)
    log.info("starting from the heads in %s", cfg.init_heads)
    return heads


def add_fuse_layers(heads: DraftHeads, target, layers: list[int]) -> DraftHeads:
    """Clover heads like ``heads`` (same weights) that also read the target's ``layers``
    (``HeadConfig.fuse_layers``) through a projection that starts at zero, so they draft
    exactly as ``heads`` until trained (EAGLE-3's multi-layer features added to trained
    heads)."""
    from dataclasses import replace as replace_config

    fused = DraftHeads.build(replace_config(heads.config, fuse_layers=list(layers)), target)
    missing, unexpected = fused.load_state_dict(heads.state_dict(), strict=False)
    if unexpected or set(missing) != {"fuse.weight"}:
        raise ValueError(f"cannot add fuse_layers to these heads (missing {missing}, unexpected {unexpected})")
    return fused.to(device=target.device, dtype=target.dtype)


def lineage(cfg: TrainConfig) -> dict:
    """``{"continued_from": ...}``: the ``training.json`` of the heads a run started from
    (``cfg.init_heads``) without its evaluations, which nests their own lineage, so the
    compute behind continued heads adds up; {} for fresh heads."""
    path = Path(cfg.init_heads) / "training.json" if cfg.init_heads else None
    if path is None or not path.is_file():
        return {"continued_from": {"path": cfg.init_heads}} if cfg.init_heads else {}
    before = json.loads(path.read_text())
    before.pop("evals", None)
    return {"continued_from": {"path": cfg.init_heads, **before}}


def train(target, data_dir, out_dir: str | Path, cfg: TrainConfig,
          resume: bool = True, progress: bool = True, cache_hidden: bool = True,
          hidden_cache: str | Path | None = None) -> dict:
    """Train heads for ``target`` on one or more data folders (``data_dir``: a path, a
    comma-separated list or a list) and save them to ``out_dir``.

    Checkpoints go to ``out_dir/checkpoint`` every ``save_every`` steps; with ``resume``
    a later call continues from there. With ``cache_hidden`` the target's hidden states
    are kept in host memory after their first use (about T x D x 4 bytes per
    conversation); with ``hidden_cache`` (a file path, see :class:`HiddenCache`) they are
    all computed up front and shared with later runs on the same data. With
    ``cfg.select == "chain"`` the heads of the evaluation with the best held-out chain
    acceptance are kept in ``out_dir/best`` and become the final heads. The final heads
    are written with ``save_pretrained`` plus ``training.json`` (config, evaluations,
    the selected step, wall time).

    Returns:
        the held-out evaluation of the final (selected) heads.
    Raises:
        ValueError: bad config or data; heads in a checkpoint that do not fit the target.
    """
    from accelerate import Accelerator
    from tqdm.auto import tqdm

    out_dir = Path(out_dir)
    ckpt = out_dir / "checkpoint"
    accelerator = Accelerator(mixed_precision=cfg.mixed_precision,
                              cpu=target.device.type == "cpu")
    torch.manual_seed(cfg.seed)
    train_set, held = load_split(data_dir, cfg, target.tokenizer)
    mix = mix_weights(train_set, cfg.category_weights)
    pad = min(target.eos_token_ids) if target.eos_token_ids else 0
    state = {"step": 0, "wall_s": 0.0, "evals": [], "config": asdict(cfg)}
    if resume and (ckpt / "state.json").is_file():
        state = json.loads((ckpt / "state.json").read_text())
        if state["config"]["method"] != cfg.method:
            raise ValueError(f"{ckpt} holds a {state['config']['method']} run, not {cfg.method}")
        for name in ("num_heads", "shared_recurrence", "fuse_layers"):  # the heads' shape: a resume cannot change it
            saved = state["config"].get(name, TrainConfig.__dataclass_fields__[name].default)
            if name == "fuse_layers" and parse_layers(saved) == parse_layers(cfg.fuse_layers):
                continue
            if saved != getattr(cfg, name):
                raise ValueError(f"{ckpt} holds a run with {name}={saved!r}, not {getattr(cfg, name)!r}: "
                                 "give the same setting, or --no-resume to start over")
        heads = load_heads(ckpt, target)
        log.info("resuming from step %d", state["step"])
    elif cfg.init_heads:
        heads = init_heads(cfg, target)
    else:
        vocab = (frequent_tokens(train_set, cfg.draft_vocab, target.vocab_size,
                                 sorted(target.eos_token_ids)) if cfg.draft_vocab else None)
        extra = {} if cfg.shared_recurrence else {"shared_recurrence": False}
        if cfg.fuse_layers:
            extra["fuse_layers"] = parse_layers(cfg.fuse_layers)
        heads = new_heads(cfg.method, target, num_heads=cfg.num_heads, draft_vocab=vocab, **extra)
    heads.train()
    for p in heads.parameters():
        if p.dtype != torch.float32:
            p.data = p.data.float()  # master weights in fp32
    frozen = set(heads.frozen_parameters())
    for n, p in heads.named_parameters():
        p.requires_grad_(n not in frozen)
    params = [p for p in heads.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(cfg))
    if resume and (ckpt / "optimizer.pt").is_file():
        saved = torch.load(ckpt / "optimizer.pt", map_location=target.device)
        opt.load_state_dict(saved["optimizer"])
        sched.load_state_dict(saved["scheduler"])
    heads, opt = accelerator.prepare(heads, opt)
    raw = accelerator.unwrap_model(heads)
    hidden = HiddenCache(target, enabled=cache_hidden or hidden_cache is not None, path=hidden_cache,
                         write=accelerator.is_main_process, layers=raw.config.fuse_layers,
                         precision=cfg.hidden_precision)
    if hidden_cache is not None:
        hidden.fill(train_set + held[: cfg.eval_conversations], pad, progress=progress)
    rng = random.Random(cfg.seed * 7919 + state["step"])
    gen = torch.Generator().manual_seed(cfg.seed * 104729 + state["step"])

    def save(path: Path):
        raw.save_pretrained(path)
        torch.save({"optimizer": opt.state_dict(), "scheduler": sched.state_dict()}, path / "optimizer.pt")
        (path / "state.json").write_text(json.dumps(state, indent=1))

    bar = tqdm(total=cfg.steps, initial=state["step"], desc=f"train {cfg.method}",
               disable=not progress or not accelerator.is_main_process)
    t_start = time.perf_counter() - state["wall_s"]
    while state["step"] < cfg.steps:
        batch = draw_batch(train_set, cfg.batch_size, rng, mix)
        ids, mask = collate(batch, pad)
        ids, mask = ids.to(target.device), mask.to(target.device)
        states = hidden([r["key"] for r in batch], ids, [len(r["input_ids"]) for r in batch])
        with accelerator.autocast():
            loss, stats = batch_loss(raw, target, ids, mask, cfg, gen, cfg.positions, states)
        accelerator.backward(loss)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        state["step"] += 1
        state["wall_s"] = time.perf_counter() - t_start
        acc = [s[1] / max(s[0], 1) for s in stats]
        bar.set_postfix(loss=f"{loss.item():.3f}", top1="/".join(f"{a:.2f}" for a in acc))
        bar.update(1)
        last = state["step"] == cfg.steps
        if (cfg.eval_every and state["step"] % cfg.eval_every == 0) or last:
            if held:
                ev = evaluate(raw, target, held, cfg, pad, hidden)
                state["evals"].append({"step": state["step"], "wall_s": round(state["wall_s"], 1),
                                       "train_loss": loss.item(), **ev})
                log.info("step %d held-out chain tau %.3f, top-1 %s", state["step"], ev["chain_tau"],
                         {k: round(v["top1"], 3) for k, v in ev.items() if isinstance(v, dict)})
                best = state.get("best")
                if cfg.select == "chain" and (best is None or ev["chain_tau"] > best["chain_tau"]):
                    state["best"] = {"step": state["step"], "chain_tau": ev["chain_tau"]}
                    raw.save_pretrained(out_dir / "best")
                if cfg.keep_evals:
                    raw.save_pretrained(out_dir / "steps" / str(state["step"]))
        if (cfg.save_every and state["step"] % cfg.save_every == 0) or last:
            save(ckpt)
    bar.close()
    raw.eval()
    final = state["evals"][-1] if state["evals"] else {}
    best = state.get("best")
    if cfg.select == "chain" and best is not None and best["step"] != state["step"]:
        raw.load_state_dict(load_heads(out_dir / "best", target).state_dict())
        final = next(e for e in state["evals"] if e["step"] == best["step"])
        log.info("kept the step-%d heads (held-out chain tau %.3f)", best["step"], best["chain_tau"])
    raw.save_pretrained(out_dir)
    (out_dir / "training.json").write_text(json.dumps(
        {"config": asdict(cfg), "target": target.name, "steps": state["step"],
         "wall_s": round(state["wall_s"], 1), "train_conversations": len(train_set),
         "heldout_conversations": len(held), "selected": best if cfg.select == "chain" else None,
         "evals": state["evals"], **lineage(cfg)}, indent=1) + "\n")
    return final
