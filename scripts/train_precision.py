"""Head training in bf16 autocast against fp32 on this CPU: speed and held-out acceptance.

Two copies of the same freshly initialised heads train in lockstep on identical batches
(every answer position, the v3 data), one step each in turn, alternating which goes
first, so a load change on a shared machine hits both alike. Reported: the median time
of a training step and the position-visits per second of each, their ratio, and each
copy's held-out acceptance (fp32 evaluation, :func:`clover.training.train.evaluate`)
after the same steps.

    python scripts/train_precision.py --steps 150 --conversations 400 --json out.json
"""
from __future__ import annotations

import argparse
import copy
import json
import random
import statistics
import sys
import time
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--method", default="clover", choices=("medusa", "clover", "clover2"))
    ap.add_argument("--data", default="data/selfdistill-v2,data/selfdistill-v2-magpie")
    ap.add_argument("--conversations", type=int, default=400, help="training conversations used")
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)

    import torch
    from tqdm.auto import tqdm

    from clover import load_target
    from clover.heads import new_heads
    from clover.training.config import TrainConfig
    from clover.training.data import collate
    from clover.training.hidden_cache import HiddenCache
    from clover.training.train import (batch_loss, evaluate, frequent_tokens, load_split,
                                       lr_lambda)

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    target = load_target(None, device="cpu")
    cfg = TrainConfig(method=args.method, positions=0, batch_size=args.batch_size, steps=args.steps,
                      schedule="constant", warmup=20, decay=0.8, draft_vocab=8192, eval_conversations=48)
    train_set, held = load_split(args.data, cfg, target.tokenizer)
    train_set = train_set[: args.conversations]
    pad = min(target.eos_token_ids) if target.eos_token_ids else 0
    vocab = frequent_tokens(train_set, cfg.draft_vocab, target.vocab_size, sorted(target.eos_token_ids))
    base = new_heads(args.method, target, num_heads=3, draft_vocab=vocab)
    hidden = HiddenCache(target)
    hidden.fill(train_set + held[:48], pad)

    runs = {}
    for name in ("fp32", "bf16"):
        heads = copy.deepcopy(base).float().train().requires_grad_(True)
        for n, p in heads.named_parameters():
            if "wpe" in n or "embed_tokens" in n:
                p.requires_grad_(False)
        opt = torch.optim.AdamW([p for p in heads.parameters() if p.requires_grad], lr=cfg.lr)
        runs[name] = {"heads": heads, "opt": opt, "sched": torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(cfg)),
                      "times": [], "positions": 0}
    rng = random.Random(0)
    gen = torch.Generator().manual_seed(0)
    for step in tqdm(range(args.steps), desc="lockstep fp32 / bf16"):
        batch = rng.sample(train_set, args.batch_size)
        ids, mask = collate(batch, pad)
        states = hidden([r["key"] for r in batch], ids, [len(r["input_ids"]) for r in batch])
        order = ("fp32", "bf16") if step % 2 == 0 else ("bf16", "fp32")
        for name in order:
            r = runs[name]
            t0 = time.perf_counter()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=name == "bf16"):
                loss, stats = batch_loss(r["heads"], target, ids, mask, cfg, gen, 0, states)
            loss.backward()
            r["opt"].step()
            r["sched"].step()
            r["opt"].zero_grad(set_to_none=True)
            r["times"].append(time.perf_counter() - t0)
            r["positions"] += stats[0][0]
    out = {"method": args.method, "steps": args.steps, "batch_size": args.batch_size,
           "train_conversations": len(train_set), "threads": args.threads,
           "processor": __import__("platform").processor() or __import__("platform").machine(),
           "torch": torch.__version__}
    for name, r in runs.items():
        ev = evaluate(r["heads"], target, held, cfg, pad, hidden)
        med = statistics.median(r["times"][5:])
        out[name] = {"median_step_s": med, "position_visits_per_s": r["positions"] / sum(r["times"]),
                     "heldout_chain_tau": ev["chain_tau"], "heldout_head1_top1": ev["head1"]["top1"]}
    out["bf16_speedup"] = out["fp32"]["median_step_s"] / out["bf16"]["median_step_s"]
    print(json.dumps(out, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
