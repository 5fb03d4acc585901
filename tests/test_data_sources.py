"""Training prompts and data at CPU speed: ShareGPT parsing, Magpie prompts, the benchmark
overlap filter, batched generation and forward labels (tiny models, seconds)."""
from __future__ import annotations

import json
import random
from collections import Counter

import pytest
import torch

from clover import Engine
from clover.training.batchgen import Request, generate_batch, generate_many
from clover.training.data import DataConfig, build_dataset, read_prompts, read_records
from clover.training.prompts import (OverlapFilter, build_prompt_mix, is_english, iter_json_array, magpie_prompts,
                            overlap_filter, sharegpt_turns)
from clover.training.hidden_cache import target_hidden
from conftest import tiny_target


def _prompts(n=40, seed=0):
    rng = random.Random(seed)
    return [[rng.randrange(2, 96) for _ in range(rng.randrange(1, 30))] for _ in range(n)]


def test_tolerant_parser_on_a_truncated_file(tmp_path):
    convs = [{"id": f"c{i}_0", "conversations": [{"from": "human", "value": f"Question number {i}, please?"},
                                                 {"from": "gpt", "value": "An answer."}]}
             for i in range(5)]
    text = json.dumps(convs, indent=2)
    cut = text[: text.index('"c3_0"') + 30]  # mid-way through the fourth conversation
    with pytest.raises(json.JSONDecodeError):
        json.loads(cut)
    assert [c["id"] for c in iter_json_array(cut)] == ["c0_0", "c1_0", "c2_0"]
    assert len(list(iter_json_array(text))) == 5
    with pytest.raises(ValueError):
        list(iter_json_array('{"a": 1}'))


def test_sharegpt_turns_keeps_user_turns_only(tmp_path):
    convs = [
        {"id": "a_0", "conversations": [{"from": "human", "value": "How do I bake bread at home?"},
                                        {"from": "gpt", "value": "GPT TEXT"},
                                        {"from": "human", "value": "And without yeast?"}]},
        {"id": "a_1", "conversations": [{"from": "human", "value": "continue the list please"}]},
        {"id": "b_0", "conversations": [{"from": "gpt", "value": "Opening by the model"}]},
        {"id": "c_0", "conversations": [{"from": "human", "value": "how do i  bake bread at home?"}]},
        {"id": "d_0", "conversations": [{"from": "human", "value": "Как испечь хлеб дома?"}]},
        {"id": "e_0", "conversations": [{"from": "human", "value": "hi"}]},
    ]
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(convs)[:-1])  # truncated: no closing bracket
    turns = sharegpt_turns(path)
    assert turns == {"sharegpt:a_0": ["How do I bake bread at home?", "And without yeast?"]}
    assert not any("GPT TEXT" in t for v in turns.values() for t in v)
    assert is_english("Plain English text.") and not is_english("日本語のテキストです")


def test_overlap_filter_drops_planted_near_duplicates():
    refs = ["Summarize the following news article about the new bridge over the river in two sentences.",
            "What is the capital of France?"]
    planted = {"question_id": 1, "turns": ["Please summarize the following news article about the new "
                                           "bridge over the river, thanks"]}
    short = {"question_id": 2, "turns": ["what is the capital of france"]}
    second_turn = {"question_id": 3, "turns": ["Hello there", "What is the capital of France?"]}
    clean = {"question_id": 4, "turns": ["Write a poem about a bridge over the river at night."]}
    kept, dropped = overlap_filter([planted, short, second_turn, clean], refs)
    assert [p["question_id"] for p in kept] == [4]
    assert [p["question_id"] for p in dropped] == [1, 2, 3]
    assert not OverlapFilter(refs).near("the capital")  # too short to judge: kept


def test_prompt_mix_writes_sharegpt_by_reference(tmp_path, monkeypatch):
    import clover.training.data
    import clover.training.prompts

    secret = {"sharegpt:x_0": ["A private question about gardening tomatoes?"],
              "sharegpt:y_0": ["What is the capital of France?", "And of Spain?"]}
    monkeypatch.setattr(clover.training.prompts, "sharegpt_turns", lambda *a, **k: dict(secret))
    monkeypatch.setattr(clover.training.prompts, "sharegpt_licence", lambda: "none declared")
    monkeypatch.setattr(clover.training.prompts, "_SHAREGPT", dict(secret))
    bench = tmp_path / "bench.jsonl"
    bench.write_text(json.dumps({"question_id": 9, "turns": ["What is the capital of France?"]}) + "\n")
    magpie = [{"question_id": "magpie:0:1", "category": "magpie", "turns": ["Tell me a fun fact about owls."]}]
    out = tmp_path / "mix.jsonl"
    counts = build_prompt_mix(out, magpie=magpie, exclude=[bench])
    assert counts["kept"] == {"sharegpt": 1, "magpie": 1} and counts["dropped"] == {"sharegpt": 1}
    assert "gardening" not in out.read_text()  # the text stays in the package
    prompts = read_prompts(out)
    assert prompts[0]["turns"] == secret["sharegpt:x_0"] and prompts[1]["category"] == "magpie"

    target = tiny_target("llama", eos=1)
    # the tiny tokenizer knows words t0..t95: give the ShareGPT prompt such words
    monkeypatch.setattr(clover.training.prompts, "_SHAREGPT", {"sharegpt:x_0": ["t5 t6 t7", "t8 t9"]})
    (tmp_path / "p.jsonl").write_text(json.dumps({"question_id": "sharegpt:x_0", "category": "sharegpt"}) + "\n")
    build_dataset(target, tmp_path / "p.jsonl", tmp_path / "data", DataConfig(max_new_tokens=6), progress=False)
    stored = next(read_records(tmp_path / "data"))
    assert "input_ids" not in stored and len(stored["answers"]) == 2
    rebuilt = next(read_records(tmp_path / "data", target.tokenizer))
    start = rebuilt["loss_mask"].index(1)
    assert rebuilt["input_ids"][start:start + len(stored["answers"][0])] == stored["answers"][0]
    assert sum(rebuilt["loss_mask"]) == sum(len(a) for a in stored["answers"])


def test_batched_generation_equals_plain_greedy_with_eos():
    t = tiny_target("llama", eos=1)
    prompts = _prompts()
    common = Counter(x for p in prompts for x in Engine(t).generate(p, 20).token_ids).most_common(3)[2][0]
    t = tiny_target("llama", eos=common)  # an EOS that real answers hit at varied lengths
    want = [Engine(t).generate(p, 20).token_ids for p in prompts]
    assert len({len(w) for w in want}) > 3
    for batch_size in (1, 3, 16, 64):
        assert generate_batch(t, prompts, 20, batch_size=batch_size) == want


def test_sampled_rows_do_not_depend_on_batching():
    t = tiny_target("qwen2", eos=5)
    prompts = _prompts(24, seed=1)
    a = generate_batch(t, prompts, 16, temperature=1.0, seeds=list(range(24)), batch_size=4)
    b = generate_batch(t, prompts, 16, temperature=1.0, seeds=list(range(24)), batch_size=24)
    c = generate_batch(t, prompts, 16, temperature=1.0, seeds=list(range(1, 25)), batch_size=24)
    assert a == b and a != c


def test_follow_up_requests_join_a_running_batch():
    from collections import deque

    t = tiny_target("llama", eos=1)
    prompts = _prompts(6)
    common = Counter(x for p in prompts for x in Engine(t).generate(p, 5).token_ids).most_common(1)[0][0]
    t = tiny_target("llama", eos=common)  # rows end at different steps
    queue = deque([Request(i, p) for i, p in enumerate(prompts)])
    got, forwards = {}, []
    # every target forward's (rows, new tokens): a follow-up's prefill (several tokens, its
    # rows only) runs while the other rows are still decoding (one token each)
    hook = t.model.register_forward_pre_hook(lambda m, args, kw: forwards.append(tuple(kw["input_ids"].shape)),
                                             with_kwargs=True)
    try:
        for key, answer in generate_many(t, queue, 5, batch_size=4):
            turn = 1 if (key, 0) in got else 0
            got[key, turn] = answer
            if turn == 0:  # the next turn, same key: the whole conversation is prefilled
                queue.appendleft(Request(key, prompts[key] + answer + [7, 8]))
    finally:
        hook.remove()
    assert sorted(got) == [(i, turn) for i in range(6) for turn in (0, 1)]
    for i, p in enumerate(prompts):
        assert got[i, 0] == Engine(t).generate(p, 5).token_ids
        assert got[i, 1] == Engine(t).generate(p + got[i, 0] + [7, 8], 5).token_ids
    # a prefill after the first decode step, followed by a step over more rows than it prefilled
    steps = [i for i, (rows, n) in enumerate(forwards) if n == 1]
    joins = [i for i in range(steps[0], len(forwards) - 1) if forwards[i][1] > 1
             and forwards[i + 1][1] == 1 and forwards[i + 1][0] > forwards[i][0]]
    assert joins
    with pytest.raises(ValueError, match="empty"):
        list(generate_many(t, [Request(0, [])], 4))
    with pytest.raises(ValueError, match="temperature"):
        generate_many(t, [], 4, temperature=-1.0)
    with pytest.raises(ValueError, match="batch_size"):
        generate_many(t, [], 4, batch_size=0)
    with pytest.raises(ValueError, match="prompt 1: .*exceeds"):
        generate_batch(t, [[3], [3] * (t.max_context - 2)], 4)


def test_forward_labels_equal_generation_time_labels():
    """The trainer labels text with one forward (teacher forcing); the distributions equal
    those the target had while generating it, step by step with its KV cache."""
    from transformers import DynamicCache

    t = tiny_target("llama")
    prompt = _prompts(1, seed=3)[0]
    answer = Engine(t).generate(prompt, 12).token_ids
    ids = torch.tensor([prompt + answer])
    step_logits = []
    with torch.inference_mode():
        cache = DynamicCache(config=t.config)
        out = t.model(input_ids=ids[:, : len(prompt)], cache=cache, use_cache=True)
        step_logits.append(out.logits[0, -1])
        for k in range(len(answer) - 1):
            out = t.model(input_ids=ids[:, len(prompt) + k: len(prompt) + k + 1], cache=cache, use_cache=True)
            step_logits.append(out.logits[0, -1])
        _, post = target_hidden(t, ids)
        forward = t.head_logits(post[0, len(prompt) - 1: len(prompt) + len(answer) - 1])
    gen = torch.stack(step_logits)
    torch.testing.assert_close(torch.softmax(forward, -1), torch.softmax(gen, -1), atol=1e-5, rtol=1e-4)
    assert forward.argmax(-1).tolist() == answer


def test_magpie_prompts_are_seeded_and_filtered():
    t = tiny_target("llama", eos=1)
    a = magpie_prompts(t, 12, seed=7, max_new_tokens=24, progress=False)
    b = magpie_prompts(t, 12, seed=7, max_new_tokens=24, progress=False)
    c = magpie_prompts(t, 12, seed=8, max_new_tokens=24, progress=False)
    assert a == b and a and a != c
    assert all(p["category"] == "magpie" and p["question_id"].startswith("magpie:7:") for p in a)
    texts = [p["turns"][0] for p in a]
    assert len(set(texts)) == len(texts) and all(10 <= len(x) <= 400 for x in texts)


def test_speed_check_measures_both_paths_in_one_run(tmp_path, capsys):
    from clover.training.data import measure_speed
    from conftest import tiny_target

    path = tmp_path / "p.jsonl"
    path.write_text("\n".join(json.dumps({"question_id": i, "turns": [f"t{i + 4} t{i + 5}"]})
                              for i in range(12)) + "\n")
    out = measure_speed(tiny_target("llama", eos=1), path, prompts=12, single=3,
                        max_new_tokens=6, batch_size=4, progress=False)
    assert out["single_prompts"] == 3 and out["batched_prompts"] == 12
    assert 0 < out["single_tokens"] <= 18 and 0 < out["batched_tokens"] <= 72
    assert out["ratio"] == pytest.approx(out["batched_tokens_per_s"] / out["single_tokens_per_s"],
                                         rel=0.02)
    with pytest.raises(ValueError, match=">= 1"):
        measure_speed(tiny_target("llama"), path, prompts=0)


def test_stdlib_docs_reads_public_docstrings_without_importing(tmp_path):
    from clover.training.prompts import stdlib_docs

    long = "Return the number of apples in the basket. " * 6
    (tmp_path / "fruit.py").write_text(
        f'"""{long}"""\nraise SystemExit("never imported")\n'
        f'def count():\n    """{long.replace("apples", "pears")}"""\n'
        f'def _hidden():\n    """{long.replace("apples", "plums")}"""\n'
        f'def short():\n    """Too short."""\n'
        f'class Basket:\n    """{long}"""\n')  # a duplicate text: dropped
    (tmp_path / "test").mkdir()
    (tmp_path / "test" / "t.py").write_text(f'"""{long.replace("apples", "figs")}"""\n')
    docs = stdlib_docs(root=tmp_path)
    assert [d["question_id"] for d in docs] == ["pydoc:fruit", "pydoc:fruit.count"]
    assert docs[1]["text"].startswith("Return the number of pears")


def test_text_records_are_labelled_by_the_forward_pass(tmp_path):
    from clover.training.data import build_text_dataset
    from clover.training.config import TrainConfig
    from clover.training.train import load_split
    from conftest import tiny_target

    target = tiny_target("llama", eos=1)
    texts = [{"question_id": f"pydoc:m{i}", "category": "docs", "name": f"m{i}",
              "text": " ".join(f"t{(i + j) % 90 + 4}" for j in range(20))} for i in range(6)]
    assert build_text_dataset(target.tokenizer, texts, tmp_path / "d", max_answer_tokens=12) == 6
    train_set, _ = load_split(tmp_path / "d", TrainConfig(heldout_percent=0))
    r = next(x for x in train_set if x["key"].startswith("pydoc:m0@"))
    start = r["loss_mask"].index(1)
    assert sum(r["loss_mask"]) == 12 and r["input_ids"][start - 1] == 3  # after the assistant marker
    assert r["input_ids"][start:] == target.tokenizer.encode(texts[0]["text"])[:12]


def test_package_docstrings_only_from_permissive_licences(monkeypatch):
    from clover.training import prompts

    assert prompts.is_permissive("Apache-2.0 AND Apache-2.0 WITH LLVM-exception AND MIT")
    assert prompts.is_permissive("BSD License")
    assert not prompts.is_permissive("MPL-2.0 AND MIT") and not prompts.is_permissive("GPL-3.0")
    assert not prompts.is_permissive("")
    docs, licences = prompts.package_docs(["safetensors"])  # Apache-2.0, a project dependency
    assert licences == {"safetensors": prompts.package_licence("safetensors")}
    assert docs and all(d["question_id"].startswith("pydoc:safetensors.") for d in docs)
    assert len({d["text"] for d in docs}) == len(docs)
    with pytest.raises(ValueError, match="not an installed package"):
        prompts.package_docs(["no_such_package_here"])
    monkeypatch.setattr(prompts, "package_licence", lambda name: "GPL-3.0-only")
    with pytest.raises(ValueError, match="GPL-3.0-only"):
        prompts.package_docs(["safetensors"])


def test_text_data_command_reports_sources_and_refuses_a_licence(tiny_dir, tmp_path, capsys,
                                                                 monkeypatch):
    import json

    from clover.cli import main
    from clover.training import prompts

    out = tmp_path / "docs"
    argv = ["text-data", "--out", str(out), "--model", str(tiny_dir), "--max-texts", "4"]
    assert main(argv + ["--packages", "safetensors"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["records"] == 4 and sorted(printed["docstrings of (licence)"]) == [
        "python-stdlib", "safetensors"]
    assert list(out.glob("*.jsonl.gz"))
    monkeypatch.setattr(prompts, "package_licence", lambda name: "GPL-3.0-only")
    assert main(argv + ["--packages", "safetensors"]) == 2
    assert "GPL-3.0-only" in capsys.readouterr().err


def test_the_shipped_prompt_files_are_what_build_prompts_writes():
    """scripts/build_prompts.py --check rebuilds train.jsonl and heldout.jsonl in memory
    (deterministic, standard library only) and compares them with assets/prompts/."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts" / "build_prompts.py"
    done = subprocess.run([sys.executable, str(script), "--check"], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0 and "files are up to date" in done.stdout, done.stdout + done.stderr
