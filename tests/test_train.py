"""Self-distillation data and head training on a tiny random model (CPU, seconds)."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from clover import load_heads
from clover.training.data import DataConfig, build_dataset, read_prompts, read_records
from clover.training.config import TrainConfig, preset
from clover.training.train import evaluate, load_split, train
from conftest import tiny_target


@pytest.fixture()
def prompt_file(tmp_path):
    path = tmp_path / "prompts.jsonl"
    rows = []
    for i in range(10):
        turns = [" ".join(f"t{(i * 7 + j) % 90 + 4}" for j in range(3 + i % 4))]
        if i % 3 == 0:
            turns.append(f"t{i + 10} t{i + 11}")
        rows.append({"question_id": i, "category": "qa" if i % 2 else "multi_turn", "turns": turns})
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def data_cfg(**kw):
    return DataConfig(**{"temperatures": (0.0, 1.0), "max_new_tokens": 12, "batch_size": 4,
                         "records_per_shard": 8, **kw})


@pytest.fixture()
def tiny_data(tmp_path, prompt_file):
    """A tiny Llama target (EOS id 1) and a self-distillation folder it answered
    (greedy and sampled, 12 new tokens): ``(target, data folder)``."""
    target = tiny_target("llama", eos=1)
    data = tmp_path / "data"
    build_dataset(target, prompt_file, data, data_cfg(), progress=False)
    return target, data


def test_data_is_deterministic_and_masks_answers(tmp_path, prompt_file):
    target = tiny_target("llama", eos=1)
    n = build_dataset(target, prompt_file, tmp_path / "a", data_cfg(), progress=False)
    assert n == 20
    build_dataset(target, prompt_file, tmp_path / "b", data_cfg(), progress=False)
    a = sorted(read_records(tmp_path / "a"), key=lambda r: r["id"])
    b = sorted(read_records(tmp_path / "b"), key=lambda r: r["id"])
    assert a == b
    for r in a:
        assert len(r["input_ids"]) == len(r["loss_mask"])
        first = r["loss_mask"].index(1)
        assert r["input_ids"][first - 1] == 3  # the assistant marker t3 precedes the answer
        assert sum(r["loss_mask"]) >= 1
    # greedy answers are the target's own greedy continuation
    from clover import Engine
    r = next(x for x in a if x["temperature"] == 0.0 and x["category"] == "qa")
    start = r["loss_mask"].index(1)
    plain = Engine(target).generate(r["input_ids"][:start], 12).token_ids
    assert r["input_ids"][start:] == plain
    # multi-turn prompts have two answered turns
    mt = next(x for x in a if x["question_id"] == 0)
    assert mt["input_ids"].count(3) >= 2


def test_data_resumes_without_duplicates(tmp_path, prompt_file):
    target = tiny_target("llama", eos=1)
    build_dataset(target, prompt_file, tmp_path / "full", data_cfg(), progress=False)
    part = tmp_path / "part"
    build_dataset(target, prompt_file, part, data_cfg(max_prompts=6), progress=False)
    # simulate a run killed mid-write: tear the last shard
    shard = sorted(part.glob("shard-*.jsonl.gz"))[-1]
    raw = shard.read_bytes()
    shard.write_bytes(raw[: len(raw) - 20])
    n = build_dataset(target, prompt_file, part, data_cfg(), progress=False)
    ids = [r["id"] for r in read_records(part)]
    assert n == 20 and len(ids) == len(set(ids)) == 20
    # max_prompts=6 shifts the batches, so compare by id with the uninterrupted run
    full = {r["id"]: r for r in read_records(tmp_path / "full")}
    resumed = {r["id"]: r for r in read_records(part)}
    greedy = [k for k in full if k.endswith("@t0")]
    assert all(full[k] == resumed[k] for k in greedy)


def test_read_prompts_errors(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question_id": 1, "turns": []}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        read_prompts(bad)
    bad.write_text("not json\n")
    with pytest.raises(ValueError, match="not JSON"):
        read_prompts(bad)


@pytest.mark.parametrize("method", ["medusa", "clover", "clover2"])
def test_training_lowers_loss_and_reloads(tmp_path, prompt_file, method):
    target = tiny_target("llama", eos=1)
    data = tmp_path / "data"
    build_dataset(target, prompt_file, data, data_cfg(max_new_tokens=24), progress=False)
    cfg = TrainConfig(method=method, num_heads=2, steps=60, batch_size=4, positions=0, lr=1e-2,
                      warmup=2, eval_every=0, save_every=20, heldout_percent=0, seed=1,
                      hidden_weight=10.0 if method == "clover2" else 0.0)
    train_set, _ = load_split(data, cfg)
    torch.manual_seed(0)
    from clover.heads import new_heads
    before = evaluate(new_heads(method, target, num_heads=2), target, train_set, cfg, 1)
    out = tmp_path / "heads"
    train(target, data, out, cfg, progress=False)
    heads = load_heads(out, target)
    after = evaluate(heads, target, train_set, cfg, 1)
    for k in ("head1", "head2"):
        # the loss's floor is the teacher's entropy: its excess, the KL, must shrink
        assert after[k]["loss"] < before[k]["loss"], (k, before[k], after[k])
        assert after[k]["kl"] < 0.7 * before[k]["kl"], (k, before[k], after[k])
    log = json.loads((out / "training.json").read_text())
    assert log["steps"] == 60 and log["config"]["method"] == method
    # the reloaded heads give identical outputs to a second reload
    again = load_heads(out, target)
    h = torch.randn(3, target.hidden_size)
    if method == "medusa":
        assert torch.equal(heads(h, target), again(h, target))
    else:
        t = torch.tensor([4, 5, 6])
        assert torch.equal(heads.step(h, t, 1, target)[1], again.step(h, t, 1, target)[1])


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_training_leaves_the_declared_frozen_parameters(tmp_path, prompt_file, arch):
    """Each heads class names what training must not move (the Augmenting Block's
    embedding tables); training moves everything else."""
    target = tiny_target(arch, eos=1)
    data = tmp_path / "data"
    build_dataset(target, prompt_file, data, data_cfg(), progress=False)
    cfg = TrainConfig(method="clover", num_heads=2, steps=2, batch_size=2, lr=1e-2, warmup=1,
                      eval_every=0, heldout_percent=0)
    train(target, data, tmp_path / "first", cfg, progress=False)
    before = load_heads(tmp_path / "first", target)
    frozen = before.frozen_parameters()
    assert frozen and all(n.startswith("augment.") for n in frozen)
    train(target, data, tmp_path / "second", replace(cfg, init_heads=str(tmp_path / "first")), progress=False)
    after = load_heads(tmp_path / "second", target).state_dict()
    for name, value in before.state_dict().items():
        if name in frozen:
            assert torch.equal(value, after[name]), name
    moved = [n for n, v in before.state_dict().items() if n not in frozen and not torch.equal(v, after[n])]
    assert any(n.startswith("augment.") for n in moved) and any(not n.startswith("augment.") for n in moved)


def test_unshared_recurrence_ablation_trains_and_is_clover2_only(tmp_path, prompt_file):
    from clover.heads import new_heads

    target = tiny_target("llama", eos=1)
    data = tmp_path / "data"
    build_dataset(target, prompt_file, data, data_cfg(max_new_tokens=12), progress=False)
    cfg = TrainConfig(method="clover2", num_heads=3, steps=3, batch_size=2, positions=0, warmup=1,
                      eval_every=0, save_every=0, heldout_percent=0, shared_recurrence=False)
    train(target, data, tmp_path / "heads", cfg, progress=False)
    heads = load_heads(tmp_path / "heads", target)
    assert heads.config.shared_recurrence is False and len(heads.recurrent_fcs) == 2
    log = json.loads((tmp_path / "heads" / "training.json").read_text())
    assert log["config"]["shared_recurrence"] is False
    with pytest.raises(ValueError, match="Clover-2 ablation"):
        TrainConfig(method="clover", shared_recurrence=False)
    with pytest.raises(ValueError, match="Clover-2 ablation"):
        new_heads("clover", target, shared_recurrence=False)
    with pytest.raises(ValueError, match="shared_recurrence=False, not True"):  # resuming the ablation as the design
        train(target, data, tmp_path / "heads", TrainConfig(**{**cfg.__dict__, "shared_recurrence": True,
                                                              "steps": 4}), progress=False)


def test_category_weights_draw_the_training_mix_by_task_kind(tmp_path, tiny_data):
    """--category-weights draws each step's conversations without replacement, a named
    category in proportion to its weight; a malformed mix or a category the data lacks is
    a clear error; a weighted run trains."""
    import random

    from clover.training.train import draw_batch, mix_weights

    records = [{"key": i, "category": "rag" if i < 10 else "chat"} for i in range(100)]
    assert mix_weights(records, "") is None
    weights = mix_weights(records, "rag=9")
    assert weights == [9.0] * 10 + [1.0] * 90
    rng, draws, rag = random.Random(0), 4000, 0
    for _ in range(draws):
        batch = draw_batch(records, 4, rng, weights)
        assert len({r["key"] for r in batch}) == 4  # without replacement
        rag += sum(r["category"] == "rag" for r in batch)
    # rag is 10 of 100 conversations at weight 9 (90 of 180 weight): about half of each
    # batch, a little less because a batch holds each conversation once
    assert 0.42 < rag / (4 * draws) < 0.5
    uniform = sum(r["category"] == "rag" for _ in range(draws) for r in draw_batch(records, 4, rng))
    assert 0.08 < uniform / (4 * draws) < 0.12
    for bad in ("rag", "rag=0", "rag=-1", "rag=x", "=3", "rag=1,rag=2", "rag=inf"):
        with pytest.raises(ValueError, match="category_weights"):
            TrainConfig(category_weights=bad)
    with pytest.raises(ValueError, match="not have; its categories: chat, rag"):
        mix_weights(records, "rga=2")
    target, data = tiny_data
    cfg = TrainConfig(method="medusa", num_heads=2, steps=2, batch_size=2, eval_every=0,
                      heldout_percent=0, category_weights="qa=4")
    train(target, data, tmp_path / "mix", cfg, progress=False)
    saved = json.loads((tmp_path / "mix" / "training.json").read_text())
    assert saved["config"]["category_weights"] == "qa=4"


def test_training_resumes_from_checkpoint(tmp_path, tiny_data):
    target, data = tiny_data
    cfg = TrainConfig(method="clover", num_heads=2, steps=6, batch_size=2, eval_every=0,
                      save_every=3, heldout_percent=0)
    out = tmp_path / "heads"
    train(target, data, out, TrainConfig(**{**cfg.__dict__, "steps": 3}), progress=False)
    assert json.loads((out / "checkpoint" / "state.json").read_text())["step"] == 3
    train(target, data, out, cfg, progress=False)
    assert json.loads((out / "training.json").read_text())["steps"] == 6
    with pytest.raises(ValueError, match="holds a clover run"):
        train(target, data, out, TrainConfig(**{**cfg.__dict__, "method": "medusa"}), progress=False)
    with pytest.raises(ValueError, match="num_heads=2, not 3"):  # a resume cannot reshape the heads
        train(target, data, out, TrainConfig(**{**cfg.__dict__, "num_heads": 3}), progress=False)


def test_training_continues_from_given_heads(tmp_path, tiny_data):
    """--init-heads starts from saved heads (their weights and draft vocabulary) and
    refuses heads of another kind or shape."""
    target, data = tiny_data
    cfg = TrainConfig(method="clover", num_heads=2, steps=3, batch_size=2, eval_every=0,
                      heldout_percent=0, draft_vocab=16)
    train(target, data, tmp_path / "first", cfg, progress=False)
    first = load_heads(tmp_path / "first", target)
    # zero steps of learning (lr ~ 0): the continued heads are the first ones
    cont = replace(cfg, steps=1, lr=1e-12, warmup=1, init_heads=str(tmp_path / "first"))
    train(target, data, tmp_path / "second", cont, progress=False)
    second = load_heads(tmp_path / "second", target)
    before = json.loads((tmp_path / "second" / "training.json").read_text())["continued_from"]
    assert before["path"] == str(tmp_path / "first") and before["steps"] == 3 and "evals" not in before
    assert torch.equal(second.draft_vocab, first.draft_vocab)
    for (name, a), b in zip(first.state_dict().items(), second.state_dict().values()):
        assert torch.allclose(a.float(), b.float(), atol=1e-6), name
    fresh = replace(cfg, steps=1, lr=1e-12, warmup=1, seed=1)
    train(target, data, tmp_path / "fresh", fresh, progress=False)
    assert not all(torch.equal(a, b) for a, b in zip(first.state_dict().values(),
                                                     load_heads(tmp_path / "fresh", target).state_dict().values()))
    with pytest.raises(ValueError, match="kind='clover', not 'medusa'"):
        train(target, data, tmp_path / "x", replace(cont, method="medusa"), progress=False)
    with pytest.raises(ValueError, match="num_heads=2, not 3"):
        train(target, data, tmp_path / "y", replace(cont, num_heads=3), progress=False)
    with pytest.raises(ValueError, match="not --draft-vocab 32"):
        train(target, data, tmp_path / "z", replace(cont, draft_vocab=32), progress=False)


def test_heads_trained_for_another_target_fail_clearly(tmp_path, tiny_data):
    target, data = tiny_data
    cfg = TrainConfig(method="medusa", num_heads=1, steps=2, batch_size=2, heldout_percent=0)
    train(target, data, tmp_path / "heads", cfg, progress=False)
    with pytest.raises(ValueError, match="do not fit"):
        load_heads(tmp_path / "heads", tiny_target("llama", vocab_size=64))


def test_presets_by_exact_key():
    assert preset("smollm2-clover").method == "clover"
    assert preset("smollm2-medusa", steps=5).steps == 5
    p, m, c2 = preset("smollm2-clover"), preset("smollm2-medusa"), preset("smollm2-clover2")
    assert (p.steps, p.batch_size, p.positions, p.lr) == (m.steps, m.batch_size, m.positions, m.lr)
    assert (c2.steps, c2.batch_size, c2.positions, c2.lr, c2.draft_vocab) == \
        (p.steps, p.batch_size, p.positions, p.lr, p.draft_vocab)
    # Clover-2 keeps the reference recipe's decay and regression weight, and as many heads
    # as the other two (K chosen by measurement on this CPU, the preset's comment)
    assert (c2.method, c2.num_heads, c2.decay, c2.hidden_weight) == ("clover2", p.num_heads, 0.7, 10.0)
    assert p.num_heads == m.num_heads == 3
    with pytest.raises(ValueError, match="unknown preset"):
        preset("smollm2")


def test_hidden_cache_matches_a_fresh_forward():
    from clover.training.data import collate
    from clover.training.hidden_cache import HiddenCache, target_hidden

    target = tiny_target("llama")
    recs = [{"input_ids": list(range(4, 4 + n)), "loss_mask": [1] * n} for n in (5, 9, 3)]
    ids, _ = collate(recs, 0)
    cache = HiddenCache(target)
    first = cache([0, 1, 2], ids, [5, 9, 3])
    ids2, _ = collate([recs[2], recs[0]], 0)
    again = cache([2, 0], ids2, [3, 5])  # served from the store, in another batch
    direct = target_hidden(target, ids)
    for got, want in ((first[0][1, :9], direct[0][1, :9]), (again[0][1, :5], direct[0][0, :5]),
                      (again[1][0, :3], direct[1][2, :3])):
        assert torch.allclose(got, want, rtol=2e-3, atol=2e-3)  # stored in fp16
    assert len(cache.store) == 3


def test_hidden_cache_file_is_shared_between_runs(tmp_path, tiny_data):
    from clover.training.data import collate
    from clover.training.hidden_cache import HiddenCache, target_hidden

    target, data = tiny_data
    cfg = TrainConfig(method="medusa", steps=3, batch_size=2, positions=4, eval_every=0, save_every=0,
                      heldout_percent=30, eval_conversations=4)
    file = tmp_path / "hidden.safetensors"
    with_file = train(target, data, tmp_path / "a", cfg, progress=False, hidden_cache=file)
    without = train(target, data, tmp_path / "b", cfg, progress=False)
    with_file.pop("wall_s"), without.pop("wall_s")
    assert with_file == without  # same numbers whether the states come from the file or the target
    train_set, held = load_split(data, cfg)
    cache = HiddenCache(target, path=file)
    assert set(cache.store) == {r["key"] for r in train_set + held[:4]}
    ids, _ = collate([train_set[0]], 0)
    want = target_hidden(target, ids)[0][0]
    assert cache.store[train_set[0]["key"]].dtype == torch.float16
    assert torch.allclose(cache.store[train_set[0]["key"]].float(), want, rtol=2e-3, atol=2e-3)
    with pytest.raises(ValueError, match="hidden states of another target"):
        HiddenCache(tiny_target("qwen2"), path=file)
    with pytest.raises(ValueError, match="hidden states of another target"):
        HiddenCache(tiny_target("llama", eos=1, seed=5), path=file)  # same name, other weights
    with pytest.raises(ValueError, match="computed in fp32.*computed in bf16"):
        HiddenCache(target, path=file, precision="bf16")  # states of one precision only


def test_hidden_states_in_bf16_autocast(tmp_path, tiny_data):
    """hidden_precision "bf16": the states come back in the target's dtype, close to fp32's
    but not equal (so the option does something), a training run reads them, and their
    file is refused by an fp32 cache."""
    from clover.training.data import collate
    from clover.training.hidden_cache import HiddenCache, target_hidden

    target, data = tiny_data
    ids = torch.arange(4, 40).reshape(2, 18)
    (pre32, _), (pre16, post16) = target_hidden(target, ids), target_hidden(target, ids, precision="bf16")
    assert pre16.dtype == post16.dtype == target.dtype and pre16.shape == pre32.shape
    cos = torch.nn.functional.cosine_similarity(pre16, pre32, dim=-1)
    assert cos.min() > 0.99 and not torch.equal(pre16, pre32)
    with pytest.raises(ValueError, match="precision must be one of fp32, bf16"):
        target_hidden(target, ids, precision="fp8")
    with pytest.raises(ValueError, match="hidden_precision must be one of fp32, bf16"):
        TrainConfig(hidden_precision="fp16")
    cfg = TrainConfig(method="clover", steps=2, batch_size=2, positions=4, eval_every=0, save_every=0,
                      heldout_percent=30, eval_conversations=4, hidden_precision="bf16")
    file = tmp_path / "hidden-bf16.safetensors"
    train(target, data, tmp_path / "run", cfg, progress=False, hidden_cache=file)
    assert json.loads((tmp_path / "run" / "training.json").read_text())["config"]["hidden_precision"] == "bf16"
    train_set, _ = load_split(data, cfg)
    cache = HiddenCache(target, path=file, precision="bf16")
    ids, _ = collate([train_set[0]], 0)
    stored = cache.store[train_set[0]["key"]].float()
    assert torch.allclose(stored, target_hidden(target, ids, precision="bf16")[0][0], rtol=2e-3, atol=2e-3)
    with pytest.raises(ValueError, match="computed in bf16.*computed in fp32"):
        HiddenCache(target, path=file)


def test_training_with_a_draft_vocabulary(tmp_path, tiny_data):
    from clover.training.train import frequent_tokens

    recs = [{"input_ids": [5, 5, 6, 7, 7, 7], "loss_mask": [0, 1, 1, 1, 1, 1]}]
    assert frequent_tokens(recs, 3, 96, always=[1]) == [1, 5, 7]
    assert frequent_tokens(recs, 5, 96) == [0, 1, 5, 6, 7]
    target, data = tiny_data
    cfg = TrainConfig(method="clover", num_heads=2, steps=3, batch_size=2, heldout_percent=0,
                      draft_vocab=16, eval_every=0)
    train(target, data, tmp_path / "heads", cfg, progress=False)
    heads = load_heads(tmp_path / "heads", target)
    vocab = heads.draft_vocab.tolist()
    assert len(vocab) == 16 and 1 in vocab and vocab == sorted(vocab)
    train_set, _ = load_split(data, cfg)
    assert vocab == frequent_tokens(train_set, 16, 96, always=[1])
    ev = evaluate(heads, target, train_set, cfg, 1)
    assert 0 <= ev["head1"]["top1"] <= ev["head1"]["top5"] <= 1


def test_max_conversations_takes_the_first_records_in_file_order(tiny_data):
    target, data = tiny_data
    cfg = TrainConfig(method="medusa", heldout_percent=0)
    everything, _ = load_split(data, cfg)
    first, _ = load_split(data, replace(cfg, max_conversations=5))
    assert len(everything) > 5 and first == everything[:5]
    with pytest.raises(ValueError, match="max_conversations"):
        TrainConfig(max_conversations=-1)


def test_chain_acceptance_counts_leading_runs_of_right_drafts(tiny_data):
    """chain_tau = 1 + sum_k P(heads 1..k all give the target's greedy next token),
    recomputed here position by position from the heads' own outputs."""
    from clover.heads import new_heads
    from clover.training.data import collate
    from clover.training.hidden_cache import target_hidden
    from clover.training.train import sample_positions
    from conftest import perturb

    target, data = tiny_data
    cfg = TrainConfig(method="clover", num_heads=3, heldout_percent=0, eval_conversations=64)
    records, _ = load_split(data, cfg)
    heads = perturb(new_heads("clover", target, num_heads=3), 0.3).eval()
    ev = evaluate(heads, target, records, cfg, 1)
    chains, full = [0, 0, 0], 0
    with torch.no_grad():
        for i in range(0, len(records), 4):
            ids, mask = collate(records[i:i + 4], 1)
            pre, post = target_hidden(target, ids)
            rows, cols = sample_positions(mask, 0, torch.Generator())
            outs = heads.training_outputs(target, ids, pre, rows, cols)
            T = ids.shape[1]
            for j in range(len(rows)):
                b, s = int(rows[j]), int(cols[j])
                if s + 4 >= T or not mask[b, s + 4]:
                    continue  # the last head has no target here
                full += 1
                for k in range(3):
                    want = int(target.head_logits(post[b, s + k + 1]).argmax())
                    if int(outs[k][0][j].argmax()) != want:
                        break
                    chains[k] += 1
    assert full > 20 and ev["head1"]["chain"] == pytest.approx(chains[0] / full)
    assert ev["chain_tau"] == pytest.approx(1 + sum(chains) / full)
    assert ev["head1"]["chain"] >= ev["head2"]["chain"] >= ev["head3"]["chain"]


def test_regularised_training_and_checkpoint_choice_by_chain_acceptance(tmp_path, tiny_data):
    from clover.training.train import perturb_features

    x = torch.randn(4, 64)
    g = torch.Generator().manual_seed(0)
    noisy = perturb_features(x, 0.0, 0.1, g)
    ratio = (noisy - x).pow(2).mean().sqrt() / x.pow(2).mean().sqrt()
    assert 0.05 < float(ratio) < 0.2  # noise scaled to the features' RMS
    assert torch.equal(perturb_features(x, 0.0, 0.0, g), x)
    with pytest.raises(ValueError, match="dropout"):
        TrainConfig(dropout=1.0)
    with pytest.raises(ValueError, match="select"):
        TrainConfig(select="loss")

    target, data = tiny_data
    cfg = TrainConfig(method="clover", num_heads=2, steps=6, batch_size=4, heldout_percent=30,
                      eval_every=1, save_every=3, lr=3e-2, weight_decay=0.01, dropout=0.1,
                      feature_noise=0.2, topk_weight=0.5, topk=4)
    final = train(target, data, tmp_path / "heads", cfg, progress=False)
    info = json.loads((tmp_path / "heads" / "training.json").read_text())
    taus = {e["step"]: e["chain_tau"] for e in info["evals"]}
    assert len(taus) == 6 and all(t >= 1.0 for t in taus.values())
    best = max(taus, key=lambda s: (taus[s], -s))
    assert info["selected"]["step"] == best and final["chain_tau"] == taus[best]
    kept = load_heads(tmp_path / "heads", target)
    saved = load_heads(tmp_path / "heads" / "best", target)
    assert all(torch.equal(a, b) for a, b in zip(kept.state_dict().values(),
                                                 saved.state_dict().values()))
    # evaluation is deterministic: no noise or dropout outside training
    _, held = load_split(data, cfg)
    assert evaluate(kept, target, held, cfg, 1) == evaluate(kept, target, held, cfg, 1)


def test_argmax_term_adds_the_hard_cross_entropy_of_the_targets_greedy_token(tiny_data):
    """argmax_weight w adds w * decay**(k-1) * mean(-log p_head(argmax of the target))
    per head k to the soft loss, recomputed here position by position."""
    from clover.heads import new_heads
    from clover.training.data import collate
    from clover.training.hidden_cache import target_hidden
    from clover.training.train import batch_loss
    from conftest import perturb

    target, data = tiny_data
    cfg = TrainConfig(method="clover", num_heads=2, heldout_percent=0, positions=0, decay=0.5)
    records, _ = load_split(data, cfg)
    heads = perturb(new_heads("clover", target, num_heads=2), 0.3).eval()
    ids, mask = collate(records[:4], 1)
    hidden = target_hidden(target, ids)
    with torch.no_grad():
        soft, _ = batch_loss(heads, target, ids, mask, cfg, torch.Generator(), 0, hidden)
        both, _ = batch_loss(heads, target, ids, mask, replace(cfg, argmax_weight=2.0),
                             torch.Generator(), 0, hidden)
        rows = torch.nonzero(mask[:, 2:]).T  # (2, M): every position s whose s+2 is answer
        outs = heads.training_outputs(target, ids, hidden[0], rows[0], rows[1])
        T, want = ids.shape[1], 0.0
        for k, (logits, _) in enumerate(outs):
            terms = [-torch.log_softmax(logits[j], -1)[target.head_logits(hidden[1][b, s + k + 1]).argmax()]
                     for j, (b, s) in enumerate(rows.T.tolist()) if s + k + 2 < T and mask[b, s + k + 2]]
            want += 2.0 * 0.5 ** k * float(torch.stack(terms).mean())
    assert want > 0 and float(both - soft) == pytest.approx(want, rel=1e-4)
    with pytest.raises(ValueError, match="argmax_weight"):
        TrainConfig(argmax_weight=-1.0)


def test_training_data_from_several_folders(tmp_path, prompt_file):
    target = tiny_target("llama", eos=1)
    build_dataset(target, prompt_file, tmp_path / "greedy", data_cfg(temperatures=(0.0,)), progress=False)
    build_dataset(target, prompt_file, tmp_path / "sampled", data_cfg(temperatures=(1.0,)), progress=False)
    cfg = TrainConfig(method="medusa", heldout_percent=30)
    parts = [load_split(tmp_path / d, cfg) for d in ("greedy", "sampled")]
    both = load_split(f"{tmp_path / 'greedy'},{tmp_path / 'sampled'}", cfg)
    assert both[0] == parts[0][0] + parts[1][0] and both[1] == parts[0][1] + parts[1][1]
    # one prompt's greedy and sampled answers fall on the same side of the split
    held_q = {r["key"].split("@")[0] for r in both[1]}
    assert held_q and not held_q & {r["key"].split("@")[0] for r in both[0]}


def test_heads_report_reads_the_selected_evaluation(tmp_path):
    """scripts/heads_report.py: the row shows the selected step's held-out numbers, not
    the last evaluation's, and an unfinished run is named as such."""
    import importlib.util
    import json
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "heads_report", Path(__file__).resolve().parents[1] / "scripts" / "heads_report.py")
    report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report)
    run = tmp_path / "full-v2-clover"
    run.mkdir()
    ev = lambda step, tau, t1: {"step": step, "chain_tau": tau, "head1": {"top1": t1}, "head2": {"top1": t1 / 2}}
    (run / "training.json").write_text(json.dumps({
        "config": {"method": "clover"}, "train_conversations": 7665, "steps": 3000, "wall_s": 2400.0,
        "selected": {"step": 2000, "chain_tau": 1.9}, "evals": [ev(1000, 1.8, 0.5), ev(2000, 1.9, 0.52), ev(3000, 1.85, 0.51)]}))
    assert report.row(run) == "| full-v2-clover | clover | 7,665 | 3,000 | 40 min | 2,000 | 1.900 | 52.0 / 26.0 |"
    (tmp_path / "unfinished").mkdir()
    assert report.main([str(run), str(tmp_path / "unfinished")]) == 0


def test_yardstick_scores_per_task_and_six_task_mean(tmp_path, monkeypatch):
    """The yardstick answers a Spec-Bench-shaped file once into $CLOVER_CACHE_DIR, keeps
    MT-bench's categories as one task, and its six-task mean weights the tasks alike."""
    from clover.heads import new_heads
    from clover.training import yardstick
    from clover.training.hidden_cache import HiddenCache

    monkeypatch.setenv("CLOVER_CACHE_DIR", str(tmp_path / "cache"))
    cats = ["writing", "coding", "translation", "summarization", "qa", "math_reasoning", "rag"]
    rows = [{"question_id": i, "category": cats[i % len(cats)],
             "turns": [" ".join(f"t{(i * 5 + j) % 90 + 4}" for j in range(3 + i % 3))]} for i in range(21)]
    prompts = tmp_path / "question.jsonl"
    prompts.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    target = tiny_target("llama", eos=1)
    recs = yardstick.answer_records(target, prompts, "sb", max_new_tokens=10, progress=False)
    assert len(recs) == 21 and (tmp_path / "cache" / "yardstick" / "sb-10").is_dir()
    again = yardstick.answer_records(target, prompts, "sb", max_new_tokens=10, progress=False)
    assert again == recs  # read back, not regenerated differently
    heads = new_heads("clover", target, num_heads=2)
    hidden = HiddenCache(target, path=tmp_path / "hidden.safetensors")
    res = yardstick.score(heads, target, recs, hidden)
    assert yardstick.task_of("coding") == "mt_bench" and yardstick.task_of("rag") == "rag"
    assert res["mt_bench"]["head1"]["positions"] == res["writing"]["head1"]["positions"] + res["coding"]["head1"]["positions"]
    want = sum(res[t]["head1"]["top1"] for t in yardstick.SPEC_BENCH_TASKS) / 6
    assert res["six_task"]["head1_top1"] == pytest.approx(want)
    assert res["all"]["head1"]["positions"] == sum(res[t]["head1"]["positions"] for t in yardstick.SPEC_BENCH_TASKS)
    # the cached (fp16) states give the same accuracies as the target's own forward
    fresh = yardstick.score(heads, target, recs)["all"]
    for k in ("head1", "head2"):
        assert fresh[k]["top1"] == res["all"][k]["top1"] and fresh[k]["chain"] == res["all"][k]["chain"]
        assert fresh[k]["loss"] == pytest.approx(res["all"][k]["loss"], rel=1e-4)


@pytest.mark.parametrize("method", ["medusa", "clover"])
def test_prompt_vocabulary_scoring_counts_what_the_heads_would_draft(tmp_path, prompt_file, method):
    """evaluate(prompt_vocab=True) scores head 1 as if each conversation's draft
    vocabulary also held its prompt's tokens: its top-1 count equals a brute-force count
    over the whole vocabulary masked to (draft vocabulary + prompt tokens), and differs
    from the plain count (these prompts hold tokens outside the 12 drafted)."""
    from clover.training.data import collate
    from clover.training.train import head_outputs

    target = tiny_target("llama", eos=1)
    data = tmp_path / "data"
    build_dataset(target, prompt_file, data, data_cfg(max_new_tokens=16), progress=False)
    cfg = TrainConfig(method=method, num_heads=2, steps=1, heldout_percent=0, draft_vocab=12)
    from clover.training.hidden_cache import target_hidden

    records, _ = load_split(data, cfg)
    train(target, data, tmp_path / "h", replace(cfg, steps=30, lr=1e-2), progress=False)
    heads = load_heads(tmp_path / "h", target).eval()
    vocab = heads.draft_vocab.clone()
    plain = evaluate(heads, target, records, cfg, 1)
    extended = evaluate(heads, target, records, cfg, 1, prompt_vocab=True)
    assert torch.equal(heads.draft_vocab, vocab)  # the heads are left as they were
    hits = total = 0
    with torch.no_grad():
        for r in records:
            ids, mask = collate([r], 1)
            pre, post = target_hidden(target, ids)
            cols = torch.nonzero(mask[0, 2:]).flatten()  # every position whose head 1 has a target
            heads.draft_vocab = None  # head 1's logits over the whole vocabulary
            logits = head_outputs(heads, target, ids, pre, torch.zeros_like(cols), cols)[0][0]  # (M, V)
            heads.draft_vocab = vocab
            allowed = torch.zeros(target.vocab_size, dtype=torch.bool)
            allowed[vocab] = True
            allowed[ids[0][~mask[0].bool()]] = True
            guess = logits.masked_fill(~allowed, float("-inf")).argmax(-1)
            truth = target.head_logits(post[0, cols + 1]).argmax(-1)  # the target's next token
            hits += int((guess == truth).sum())
            total += len(cols)
    assert extended["head1"]["positions"] == plain["head1"]["positions"] == total
    assert extended["head1"]["top1"] == pytest.approx(hits / total)
    assert extended["head1"]["top1"] != plain["head1"]["top1"]  # the prompts hold tokens outside the 12


def test_multi_layer_features_cache_train_and_start_from_the_plain_input(tmp_path, tiny_data):
    """fuse_layers (EAGLE-3's multi-layer features): the hidden cache keeps each extra
    layer's outputs in its own file beside the shared last-layer one, equal to a fresh
    forward's; heads continued with fuse layers added draft exactly as before (the
    projection starts at zero) and then learn it; bad layer settings are clear errors."""
    from clover.heads.config import HeadConfig, check_fits
    from clover.training.data import collate
    from clover.training.hidden_cache import HiddenCache, target_hidden

    target, data = tiny_data
    cfg = TrainConfig(method="clover", num_heads=2, steps=3, batch_size=2, eval_every=0,
                      heldout_percent=30, eval_conversations=4)
    file = tmp_path / "hidden.safetensors"
    train(target, data, tmp_path / "plain", cfg, progress=False, hidden_cache=file)
    plain = load_heads(tmp_path / "plain", target)
    before = file.read_bytes()
    fused_cfg = replace(cfg, steps=2, lr=1e-2, warmup=1, init_heads=str(tmp_path / "plain"), fuse_layers="0")
    train(target, data, tmp_path / "fused", fused_cfg, progress=False, hidden_cache=file)
    assert file.read_bytes() == before  # the last layer's file is shared, unchanged
    layer_file = tmp_path / "hidden.layer0.safetensors"
    assert layer_file.is_file()
    train_set, held = load_split(data, cfg)
    cache = HiddenCache(target, path=file, layers=[0])
    assert set(cache.layer_stores[0]) == {r["key"] for r in train_set + held[:4]}
    batch = train_set[:2]
    ids, _ = collate(batch, 0)
    pre, post = cache([r["key"] for r in batch], ids, [len(r["input_ids"]) for r in batch])
    want_pre, want_post = target_hidden(target, ids, [0])
    D = target.hidden_size
    assert pre.shape[-1] == want_pre.shape[-1] == 2 * D
    n = len(batch[0]["input_ids"])
    assert torch.allclose(pre[0, :n], want_pre[0, :n], rtol=2e-3, atol=2e-3)  # stored in fp16
    assert torch.allclose(post[0, :n], want_post[0, :n], rtol=2e-3, atol=2e-3)
    assert torch.allclose(want_pre[..., D:], target.layer_states(ids, [0])[0])
    fresh = HiddenCache(target, layers=[0])  # nothing stored: both parts from one call
    got, _ = fresh([r["key"] for r in batch], ids, [len(r["input_ids"]) for r in batch])
    assert torch.allclose(got[0, :n], want_pre[0, :n], rtol=2e-3, atol=2e-3)
    assert set(fresh.store) == set(fresh.layer_stores[0]) == {r["key"] for r in batch}

    fused = load_heads(tmp_path / "fused", target)
    assert fused.config.fuse_layers == [0] and fused.fuse.weight.abs().sum() > 0  # learned
    # added at zero, the fused heads compute what the plain ones do
    from clover.training.train import add_fuse_layers
    start = add_fuse_layers(plain, target, [0])
    assert start.fuse.weight.abs().sum() == 0
    rows, cols = torch.tensor([0, 0, 1]), torch.tensor([1, 3, 2])
    for (a, _), (b, _) in zip(plain.training_outputs(target, ids, want_pre[..., :D], rows, cols),
                              start.training_outputs(target, ids, want_pre, rows, cols)):
        assert torch.allclose(a, b, atol=1e-6)
    with pytest.raises(ValueError, match="read the target's layers \\[0\\] too"):
        start.block_input(want_pre[..., :D])  # features without layer 0
    from clover.training.train import perturb_features
    noisy = perturb_features(want_pre, 0.0, 0.5, torch.Generator().manual_seed(0), width=D)
    for part in (slice(0, D), slice(D, 2 * D)):  # each layer's noise scales with its own RMS
        rel = (noisy[..., part] - want_pre[..., part]).pow(2).mean() / want_pre[..., part].pow(2).mean()
        assert 0.15 < float(rel) < 0.35  # 0.5 ** 2
    with pytest.raises(ValueError, match="pass --fuse-layers 0"):
        train(target, data, tmp_path / "again", replace(fused_cfg, init_heads=str(tmp_path / "fused"),
                                                         fuse_layers=""), progress=False)
    with pytest.raises(ValueError, match="fuse_layers='0', not ''"):
        train(target, data, tmp_path / "fused", replace(fused_cfg, steps=4, fuse_layers=""), progress=False)
    with pytest.raises(ValueError, match="for Clover heads, not medusa"):
        TrainConfig(method="medusa", fuse_layers="0")
    with pytest.raises(ValueError, match="distinct layer indices"):
        TrainConfig(fuse_layers="0,0")
    with pytest.raises(ValueError, match="for Clover heads, not clover2"):
        HeadConfig(kind="clover2", fuse_layers=[0])
    with pytest.raises(ValueError, match="before the target's last"):
        check_fits(HeadConfig.for_target("clover", target, fuse_layers=[1]), target)
    with pytest.raises(ValueError, match="do not exist"):
        target.layer_states(ids, [2])
    with pytest.raises(ValueError, match="another target, layer or precision .*layer 0, .*not of .*layer last, "):
        HiddenCache(target, path=layer_file)  # a layer's file is not the last layer's


def test_data_folders_expand_home_and_a_missing_one_is_an_error(tmp_path, monkeypatch):
    """`--data a,~/b`: the shell leaves a `~` after a comma alone, so the list expands it;
    a folder that does not exist stops training instead of being skipped silently."""
    from clover.training.train import data_dirs

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.setenv("HOME", str(tmp_path))
    assert data_dirs(f"{tmp_path / 'a'}, ~/b") == [tmp_path / "a", tmp_path / "b"]
    assert data_dirs([tmp_path / "a"]) == [tmp_path / "a"]
    with pytest.raises(FileNotFoundError, match="no data folder .*missing"):
        data_dirs(f"{tmp_path / 'a'},~/missing")
