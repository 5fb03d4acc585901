"""`clover bench` on a tiny random model: output files and their fields, not speeds."""
from __future__ import annotations

import json
import os
import statistics

import pytest

from clover.bench import BenchConfig
from clover.cli import main
from conftest import BATCH_SWEEP



@pytest.fixture()
def prompts(tmp_path):
    path = tmp_path / "q.jsonl"
    rows = [{"question_id": 1, "category": "qa", "turns": ["t4 t5 t6"]},
            {"question_id": 2, "category": "multi_turn", "turns": ["t7 t8", "t9 t10"]},
            {"question_id": 3, "category": "qa", "turns": ["t11 t12 t13 t14"]}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_bench_writes_results(tiny_dir, prompts, tmp_path, capsys):
    out = tmp_path / "bench"
    rc = main(["bench", "--model", str(tiny_dir), "--prompts", str(prompts), "--max-new-tokens", "8",
               "--repeats", "2", "--tree", "small", "--out", str(out)])
    assert rc == 0
    res = json.loads((out / "results.json").read_text())
    meta = res["meta"]
    for key in ("platform", "torch_threads", "dtype", "torch", "transformers", "device", "model"):
        assert key in meta
    assert meta["config"]["methods"] == ["ar", "medusa", "clover"] and meta["n_prompts"] == 3
    runs = res["runs"]
    assert len(runs) == 3 * 2 * 3
    # interleaved per prompt: A B C A B C
    assert [r["method"] for r in runs[:6]] == ["ar", "medusa", "clover"] * 2
    mt = next(r for r in runs if r["question_id"] == "2")
    assert len(mt["text"]) == 2  # answered turn by turn
    for r in runs:
        assert r["new_tokens"] > 0 and r["wall_s"] > 0 and r["steps"] > 0
        assert r["tokens_per_second"] == pytest.approx(r["new_tokens"] / r["wall_s"])
        assert r["mean_accepted_length"] >= 1.0
        assert len(r["acceptance_per_depth"]) == (0 if r["method"] == "ar" else 3)
        assert r["draft_ms"] >= 0 and r["verify_ms"] > 0
        split = r["time_split"]  # where the time goes: the parts add up to the step
        assert list(split) == ["draft", "update", "forward", "accept"] and min(split.values()) >= 0
        assert sum(split.values()) == pytest.approx(r["draft_ms"] + r["verify_ms"])
        if r["method"] != "ar":
            assert r["matches_plain"] is True  # greedy: every method's text equals plain
    summary = res["summary"]
    assert set(summary) == {"qa", "multi_turn", "all"}
    for cat in summary.values():
        assert cat["ar"]["speedup"] == pytest.approx(1.0)
        assert cat["ar"]["speedup_min"] == pytest.approx(1.0)
        for m in ("medusa", "clover"):
            e = cat[m]
            assert e["speedup_min"] <= e["speedup"] <= e["speedup_max"]
            assert e["speedup_p10"] <= e["speedup_geomean"] <= e["speedup_p90"]
            assert e["all_match_plain"] is True
    # the headline figures are ratios of totals, recomputed here from the run records
    rows = [r for r in runs if r["method"] == "clover" and r["repeat"] == 0]
    plain = [r for r in runs if r["method"] == "ar" and r["repeat"] == 0]
    total = (sum(r["new_tokens"] for r in rows) / sum(r["wall_s"] for r in rows)) / (
        sum(r["new_tokens"] for r in plain) / sum(r["wall_s"] for r in plain))
    assert total in (pytest.approx(summary["all"]["clover"]["speedup_min"]),
                     pytest.approx(summary["all"]["clover"]["speedup_max"]))
    assert "load" in res  # None: too few plain steps to judge the machine's load
    md = (out / "results.md").read_text()
    assert "## qa" in md and "## multi_turn" in md and "| clover |" in md and "speedup" in md
    assert "## Where the time goes" in md and "break-even" in md.lower()
    assert set(summary["all"]["clover"]["time_split"]) == {"draft", "update", "forward", "accept"}
    html = (out / "charts.html").read_text()
    assert "plotly" in html.lower() and "Speedup over plain" in html
    printed = json.loads(capsys.readouterr().out)
    assert printed["all"]["clover"]["all_match_plain"] is True


def test_bench_clover2_needs_its_heads_and_decodes_exactly(tiny_dir, prompts, tmp_path, capsys,
                                                            monkeypatch):
    """Where no Clover-2 heads ship (an install whose assets lack them), the bench refuses
    clover2 without --clover2-heads; with heads given, clover2 and clover2+lookup write the
    same text as plain decoding."""
    from clover import load_target, new_heads
    from clover.assets import ASSETS_ENV
    from conftest import perturb

    argv = ["bench", "--model", str(tiny_dir), "--prompts", str(prompts), "--max-new-tokens", "8",
            "--methods", "ar,clover2", "--tree", "small"]
    (tmp_path / "no-assets").mkdir()
    with monkeypatch.context() as m:
        m.setenv(ASSETS_ENV, str(tmp_path / "no-assets"))
        rc = main(argv + ["--out", str(tmp_path / "refused")])
    err = capsys.readouterr().err
    assert rc == 2 and "--clover2-heads DIR" in err and "Traceback" not in err
    assert not (tmp_path / "refused").exists()

    target = load_target(str(tiny_dir), device="cpu")
    heads_dir = tmp_path / "clover2-heads"
    perturb(new_heads("clover2", target, num_heads=3), scale=0.2, seed=1).save_pretrained(heads_dir)
    out = tmp_path / "bench"
    rc = main(argv + ["--lookup", "--clover2-heads", str(heads_dir), "--out", str(out)])
    assert rc == 0
    res = json.loads((out / "results.json").read_text())
    assert res["meta"]["config"]["methods"] == ["ar", "clover2", "clover2+lookup"]
    assert res["meta"]["heads"] == {"clover2": str(heads_dir), "clover2+lookup": str(heads_dir)}
    assert res["mismatches"] == []
    plain = {r["question_id"]: r["text"] for r in res["runs"] if r["method"] == "ar"}
    assert len(plain) == 3
    for m in ("clover2", "clover2+lookup"):
        runs = [r for r in res["runs"] if r["method"] == m]
        assert len(runs) == 3
        for r in runs:
            assert r["text"] == plain[r["question_id"]] and r["matches_plain"] is True
            assert r["mean_accepted_length"] >= 1.0 and r["steps"] > 0
            depths = len(r["acceptance_per_depth"])  # the heads draft 3 deep, lookup may go further
            assert depths == 3 if m == "clover2" else depths >= 3
    assert "| clover2 |" in (out / "results.md").read_text()


def test_bench_reads_spec_bench_format(tiny_dir, tmp_path):
    """The shared Spec-Bench file parses (only its first two questions are run)."""
    from pathlib import Path

    spec = Path(__file__).resolve().parents[2] / "shared" / "data" / "spec_bench" / "question.jsonl"
    if not spec.is_file():
        if os.environ.get("CLOVER_CI"):  # CI always has ../shared beside the checkout
            pytest.fail(f"{spec} is missing: CI must run with ../shared beside the checkout")
        pytest.skip("../shared/data/spec_bench is not beside this checkout")
    out = tmp_path / "sb"
    rc = main(["bench", "--model", str(tiny_dir), "--prompts", str(spec), "--max-prompts", "2",
               "--methods", "ar,clover", "--max-new-tokens", "4", "--out", str(out)])
    assert rc == 0
    res = json.loads((out / "results.json").read_text())
    assert res["meta"]["n_prompts"] == 2 and {r["method"] for r in res["runs"]} == {"ar", "clover"}
    assert len({r["category"] for r in res["runs"]}) == 2  # round-robin over categories


def test_bench_max_prompts_covers_every_category(tiny_dir, prompts, tmp_path):
    out = tmp_path / "few"
    rc = main(["bench", "--model", str(tiny_dir), "--prompts", str(prompts), "--max-prompts", "2",
               "--methods", "ar", "--max-new-tokens", "2", "--out", str(out)])
    assert rc == 0
    runs = json.loads((out / "results.json").read_text())["runs"]
    assert [(r["question_id"], r["category"]) for r in runs] == [("1", "qa"), ("2", "multi_turn")]


def test_bench_config_errors(tiny_dir, prompts, tmp_path, capsys):
    with pytest.raises(ValueError, match="unknown methods"):
        BenchConfig(methods=("ar", "eagle"))
    with pytest.raises(ValueError, match="without repeats"):
        BenchConfig(methods=("ar", "ar"))
    rc = main(["bench", "--model", str(tiny_dir), "--prompts", str(prompts), "--methods", "ar,eagle",
               "--out", str(tmp_path / "x")])
    assert rc == 2 and "unknown methods" in capsys.readouterr().err


def test_exactness_is_checked_whatever_the_order_and_a_mismatch_fails(tiny_dir, prompts, tmp_path,
                                                                       capsys, monkeypatch):
    out = tmp_path / "bench"
    rc = main(["bench", "--model", str(tiny_dir), "--prompts", str(prompts), "--max-new-tokens", "6",
               "--repeats", "1", "--methods", "clover,ar", "--tree", "small", "--out", str(out)])
    res = json.loads((out / "results.json").read_text())
    assert rc == 0 and res["mismatches"] == []
    assert all(r["matches_plain"] is True for r in res["runs"] if r["method"] == "clover")
    assert res["meta"]["method_order"].endswith("clover, ar")
    assert res["meta"]["warmup"]["new_tokens"] == 6 and "chat_template" in res["meta"]
    assert all(r["ttft_ms"] > 0 for r in res["runs"])
    capsys.readouterr()

    # a planted bug: the Clover engine's text changes after decoding
    from clover.engine import DecodeRun
    real = DecodeRun.__iter__

    def broken(self):
        yield from real(self)
        if self.engine.method == "clover":
            self.result.text += " (wrong)"

    monkeypatch.setattr(DecodeRun, "__iter__", broken)
    rc = main(["bench", "--model", str(tiny_dir), "--prompts", str(prompts), "--max-new-tokens", "6",
               "--repeats", "1", "--methods", "clover,ar", "--tree", "small", "--out", str(out)])
    err = capsys.readouterr().err
    res = json.loads((out / "results.json").read_text())
    assert rc == 1 and "differs from plain decoding" in err and "clover on 1" in err
    assert len(res["mismatches"]) == 3 and "Greedy output differs" in (out / "results.md").read_text()


def test_bench_lists_lookup_and_hybrids(tiny_dir, prompts, tmp_path, capsys):
    out = tmp_path / "bench"
    rc = main(["bench", "--model", str(tiny_dir), "--prompts", str(prompts), "--max-new-tokens", "8",
               "--methods", "ar,lookup,clover", "--lookup", "--tree", "small", "--out", str(out)])
    assert rc == 0
    res = json.loads((out / "results.json").read_text())
    assert res["meta"]["config"]["methods"] == ["ar", "lookup", "clover", "clover+lookup"]
    assert set(res["meta"]["lookup"]) == {"lookup", "clover+lookup"}
    # a fixed tree: the lookup chain keeps its fixed cap (no cost curve measured)
    assert res["meta"]["lookup"]["lookup"]["costs"] == []
    for r in res["runs"]:
        if r["method"] in ("ar", "clover"):
            assert r["lookup_share"] is None
        elif r["method"] == "lookup":  # everything lookup alone drafts is lookup's
            assert r["lookup_share"] in (None, 1.0)
        if r["method"] != "ar":
            assert r["matches_plain"] is True
    assert res["summary"]["all"]["clover+lookup"]["all_match_plain"] is True
    assert "| lookup |" in (out / "results.md").read_text()
    with pytest.raises(ValueError, match="unknown methods"):
        BenchConfig(methods=("ar", "eagle"))


def test_bench_reports_transformers_prompt_lookup_beside_ours(tiny_dir, prompts, tmp_path):
    out = tmp_path / "bench"
    rc = main(["bench", "--model", str(tiny_dir), "--prompts", str(prompts), "--max-new-tokens", "8",
               "--methods", "ar,lookup,hf-lookup,clover+lookup", "--out", str(out)])
    assert rc == 0
    res = json.loads((out / "results.json").read_text())
    # the auto tree (default): one cost curve, shared by every lookup method
    costs = res["meta"]["lookup"]["lookup"]["costs"]
    assert len(costs) == 11 and costs == res["meta"]["lookup"]["clover+lookup"]["costs"]
    hf = [r for r in res["runs"] if r["method"] == "hf-lookup"]
    assert len(hf) == 3 and all(r["matches_plain"] is True for r in hf)  # same greedy text
    assert all(r["steps"] >= 1 and r["tokens_per_second"] > 0 for r in hf)
    assert "| hf-lookup |" in (out / "results.md").read_text()
    with pytest.raises(ValueError, match="greedy decoding only"):
        BenchConfig(methods=("ar", "hf-lookup"), temperature=0.7)


def test_hf_lookup_steps_add_up():
    """Each forward of transformers' prompt lookup is one step; the committed tokens are
    read from the cache lengths and sum to the output, which equals plain greedy."""
    from clover import Engine
    from clover.bench import HFPromptLookup
    from conftest import tiny_target

    target = tiny_target("llama")
    prompt = [5, 6, 7, 8, 9, 10, 5, 6, 7, 8, 9, 10, 5, 6, 7]
    res = HFPromptLookup(target, num_tokens=4).generate(prompt, 20)
    assert res.token_ids == Engine(target).generate(prompt, 20).token_ids
    assert [s.accepted_length for s in res.steps] and all(s.accepted_length >= 1 for s in res.steps)
    assert sum(s.accepted_length for s in res.steps) == len(res.token_ids) == 20
    assert [s.total_tokens for s in res.steps] == sorted({s.total_tokens for s in res.steps})
    assert [t for s in res.steps for t in s.new_tokens] == res.token_ids
    assert all(len(s.accepted) <= len(s.nodes) for s in res.steps) and res.decode_s > 0
    assert max(s.accepted_length for s in res.steps) > 1  # lookup drafts were accepted


def test_bench_batch_size_sweep(tiny_dir, prompts, tmp_path, capsys):
    """--batch-size 1,2: every method on batches of 1 and 2 first turns; total tokens/s,
    speedup over plain at each batch size, and every row's text equal at both sizes."""
    out = tmp_path / "sweep"
    rc = main(["bench", "--model", str(tiny_dir), "--prompts", str(prompts), "--max-new-tokens", "8",
               "--methods", "ar,medusa,clover+lookup", "--tree", "small", "--batch-size", "1,2",
               "--out", str(out)])
    assert rc == 0
    res = json.loads((out / "results.json").read_text())
    assert res["meta"]["config"]["batch_sizes"] == [1, 2] and res["mismatches"] == []
    assert res["meta"]["method_order"] == "interleaved per batch: ar, medusa, clover+lookup"
    runs = res["runs"]
    assert [(r["batch_size"], r["question_id"]) for r in runs[::3]] == [(1, "1"), (1, "2"), (1, "3"), (2, "1,2")]
    assert [r["method"] for r in runs[:3]] == ["ar", "medusa", "clover+lookup"]
    for r in runs:
        assert len(r["text"]) == r["batch_size"] and r["new_tokens"] == 8 * r["batch_size"]
        assert r["tokens_per_second"] == pytest.approx(r["new_tokens"] / r["wall_s"])
        assert r["mean_accepted_length"] >= 1.0 and r["verify_ms"] > 0 and r["ttft_ms"] > 0
        if r["method"] != "ar":
            assert r["matches_plain"] is True
    # a prompt's text does not depend on the batch it was decoded in
    alone = {r["question_id"]: r["text"][0] for r in runs if r["batch_size"] == 1 and r["method"] == "ar"}
    pair = next(r for r in runs if r["batch_size"] == 2 and r["method"] == "ar")
    assert pair["text"] == [alone["1"], alone["2"]]
    summary = res["batch_summary"]
    assert list(summary) == ["1", "2"]
    for entries in summary.values():
        assert entries["ar"]["speedup"] == pytest.approx(1.0)
        assert entries["medusa"]["all_match_plain"] is True and entries["medusa"]["speedup"] > 0
    assert json.loads(capsys.readouterr().out)["batch"]["2"]["ar"]["runs"] == 1
    md = (out / "results.md").read_text()
    assert "## Speedup against batch size" in md and "| 2 | clover+lookup |" in md
    assert "Speedup over plain decoding at the same batch size" in (out / "charts.html").read_text()
    # the command that made the results, as typed (argv given to main)
    assert res["meta"]["command"] == ("clover bench --model " + str(tiny_dir) + " --prompts " + str(prompts)
                                      + " --max-new-tokens 8 --methods ar,medusa,clover+lookup --tree small"
                                      " --batch-size 1,2 --out " + str(out))
    assert f"Made with `{res['meta']['command']}`" in md


def test_bench_batch_size_errors(tiny_dir, prompts, tmp_path, capsys):
    base = ["bench", "--model", str(tiny_dir), "--prompts", str(prompts), "--methods", "ar",
            "--max-new-tokens", "2", "--out", str(tmp_path / "x")]
    for bad, message in (("0", "positive integers"), ("1,x", "positive integers"),
                         ("2,4", "batch sizes [4] exceed the 3 prompts")):
        assert main(base + ["--batch-size", bad]) == 2
        assert message in capsys.readouterr().err
    with pytest.raises(ValueError, match="distinct"):
        BenchConfig(batch_sizes=(2, 2))
    with pytest.raises(ValueError, match="one prompt at a time"):
        BenchConfig(methods=("ar", "hf-lookup"), batch_sizes=(1, 2))


def test_bench_sweep_reports_transformers_batched_generate(tiny_dir, prompts, tmp_path):
    """hf-generate, transformers' batched greedy generate on the same model object, is the
    reference for batched plain decoding: same text per row, its own tokens/s."""
    out = tmp_path / "hf"
    rc = main(["bench", "--model", str(tiny_dir), "--prompts", str(prompts), "--max-new-tokens", "6",
               "--methods", "ar,hf-generate", "--batch-size", "1,3", "--out", str(out)])
    assert rc == 0
    res = json.loads((out / "results.json").read_text())
    hf = [r for r in res["runs"] if r["method"] == "hf-generate"]
    assert [r["batch_size"] for r in hf] == [1, 1, 1, 3]
    assert all(r["matches_plain"] is True and r["tokens_per_second"] > 0 for r in hf)
    assert all(r["steps"] == 6 * r["batch_size"] and r["verify_ms"] > 0 for r in hf)
    assert res["batch_summary"]["3"]["hf-generate"]["speedup"] > 0
    with pytest.raises(ValueError, match="reference of a batch-size sweep"):
        BenchConfig(methods=("ar", "hf-generate"))
    with pytest.raises(ValueError, match="greedy decoding only"):
        BenchConfig(methods=("ar", "hf-generate"), temperature=0.5, batch_sizes=(1, 2))


def test_hf_generate_rows_end_at_their_eos():
    from clover import Engine
    from clover.bench import HFGenerate
    from conftest import tiny_target

    target = tiny_target("llama")
    prompts = [[5, 6, 7, 8], [9], [10, 11, 12, 13, 14, 15]]
    plain = [Engine(target).generate(p, 12).token_ids for p in prompts]
    target.eos_token_ids = {plain[0][4]}
    want = [Engine(target).generate(p, 12) for p in prompts]
    got = HFGenerate(target).generate_batch(prompts, 12)
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    assert [g.stop_reason for g in got] == [w.stop_reason for w in want]
    assert all(len(g.steps) == len(g.token_ids) and g.decode_s > 0 for g in got)


def test_bench_sweep_sizes_the_auto_tree_per_batch_size(tiny_dir, prompts, tmp_path, monkeypatch):
    """--tree auto in a sweep: each head method's tree is resolved for every batch size
    (the verify cost grows with rows x nodes) and recorded in the results."""
    import clover.calibration as at

    monkeypatch.setenv("CLOVER_CACHE_DIR", str(tmp_path / "cache"))
    sized = []
    real = at.auto_tree

    def spy(target, heads, base=None, **kw):
        sized.append(kw.get("batch_size", 1))
        return real(target, heads, base, tokens=4, repeats=1, prefix_len=8, budgets=(1, 4), **kw)

    monkeypatch.setattr(at, "auto_tree", spy)
    out = tmp_path / "auto"
    rc = main(["bench", "--model", str(tiny_dir), "--prompts", str(prompts), "--max-new-tokens", "4",
               "--methods", "ar,medusa", "--batch-size", "1,2", "--out", str(out)])
    assert rc == 0 and sorted(sized) == [1, 2]
    meta = json.loads((out / "results.json").read_text())["meta"]
    assert set(meta["tree_chosen_per_batch_size"]) == {"2"} and "medusa" in meta["tree_chosen_per_batch_size"]["2"]


def test_batch_sweep_figure_draws_one_line_per_method_per_panel():
    from clover.bench import batch_sweep_figure
    from clover.methods import METHOD_COLORS

    fig = batch_sweep_figure(BATCH_SWEEP)
    top = [t for t in fig.data if t.yaxis == "y"]
    bottom = [t for t in fig.data if t.yaxis == "y2"]
    assert [t.meta for t in top] == [t.meta for t in bottom] == ["ar", "hf-generate", "clover"]
    for t in fig.data:
        assert list(t.x) == [1, 4]
    assert {t.meta: list(t.y) for t in bottom} == {"ar": [1.0, 1.0], "hf-generate": [0.9, 0.95],
                                                   "clover": [1.6, 1.1]}
    assert {t.meta: list(t.y) for t in top} == {"ar": [10.0, 36.0], "hf-generate": [9.0, 34.0],
                                                "clover": [16.0, 40.0]}
    assert [t.line.color for t in top] == [METHOD_COLORS["ar"], METHOD_COLORS["ar"], METHOD_COLORS["clover"]]
    assert top[1].line.dash == "dash"  # transformers' generate: plain decoding's reference
    assert [t.showlegend for t in bottom] == [False] * 3 and [t.name for t in top][::2] == ["Plain", "Clover"]
    assert fig.layout.xaxis.type == "log" and fig.layout.xaxis2.title.text == "batch size"
    assert fig.layout.yaxis2.title.text == "speedup (x)"


def test_write_batch_charts_draws_the_same_figure(tmp_path):
    from clover.bench import write_charts

    write_charts(BATCH_SWEEP, tmp_path / "charts.html")
    html = (tmp_path / "charts.html").read_text()
    assert "Speedup against batch size: tiny on cpu" in html and '"meta":"hf-generate"' in html


def test_load_batch_sweep_reads_the_committed_file_or_none(tmp_path, monkeypatch):
    from clover.bench import BATCH_SWEEP_FILE, load_batch_sweep

    monkeypatch.setenv("CLOVER_ASSETS_DIR", str(tmp_path))
    assert load_batch_sweep() is None  # not committed yet
    assert load_batch_sweep(tmp_path / "elsewhere.json") is None
    path = tmp_path / BATCH_SWEEP_FILE
    path.parent.mkdir()
    path.write_text(json.dumps(BATCH_SWEEP))
    assert load_batch_sweep() == BATCH_SWEEP == load_batch_sweep(path)
    # a file that cannot say what it is or how it was made is refused, not drawn
    path.write_text(json.dumps({**BATCH_SWEEP, "meta": {**BATCH_SWEEP["meta"], "command": ""}}))
    with pytest.raises(ValueError, match="meta.command"):
        load_batch_sweep()
    path.write_text(json.dumps({"meta": BATCH_SWEEP["meta"], "summary": {}}))
    with pytest.raises(ValueError, match="not a batch-size sweep"):
        load_batch_sweep()


def test_one_disturbed_prompt_cannot_make_the_headline(tmp_path):
    """Ratio of totals: another process slowed plain decoding 10x on one prompt and Clover
    10x on another (per-prompt ratios 10x, 0.1x, 1x). The mean of per-prompt ratios would
    report a 3.7x speedup; the headline (totals) and the geometric mean say 1.0x, as the
    methods' tokens/s do. The load report flags plain steps far above their quiet floor."""
    from clover.bench import RunRecord, load_report, summarize

    def rec(qid, method, wall, speedup):
        return RunRecord(question_id=qid, category="qa", method=method, repeat=0, new_tokens=100,
                         wall_s=wall, tokens_per_second=100 / wall, steps=100,
                         mean_accepted_length=1.0, acceptance_per_depth=[], draft_ms=0.0,
                         verify_ms=wall * 10, speedup=speedup)
    walls = {"a": (40.0, 4.0), "b": (4.0, 40.0), "c": (4.0, 4.0)}  # (plain, clover) seconds
    records = []
    for q, (plain, clover) in walls.items():
        records += [rec(q, "ar", plain, 1.0), rec(q, "clover", clover, plain / clover)]
    e = summarize(records, BenchConfig(methods=("ar", "clover")))["all"]["clover"]
    assert statistics.fmean(x.speedup for x in records if x.method == "clover") == pytest.approx(3.7)
    assert e["speedup"] == pytest.approx(1.0) and e["speedup_geomean"] == pytest.approx(1.0)
    assert e["tokens_per_second"] == pytest.approx(300 / 48)
    assert e["speedup_p10"] < 1.0 < e["speedup_p90"]
    quiet = [40.0 + (i % 5) for i in range(100)]
    assert load_report(quiet)["busy"] is False
    assert load_report(quiet[:40] + [140.0] * 100)["busy"] is True
    assert load_report(quiet[:10]) is None


def test_bench_methods_advance_in_lockstep():
    """The bench runs a prompt's methods one step each in turn, as the app does
    (clover.methods.lockstep); closing the loop closes every run."""
    from clover.methods import lockstep

    order, closed = [], []

    def run(name, steps):
        try:
            for i in range(steps):
                order.append((name, i))
                yield i
        finally:
            closed.append(name)

    items = list(lockstep({"ar": run("ar", 3), "clover": run("clover", 1)}))
    assert items == [("ar", 0), ("clover", 0), ("ar", 1), ("ar", 2)]
    assert order == [("ar", 0), ("clover", 0), ("ar", 1), ("ar", 2)]
    closed.clear()
    loop = lockstep({"ar": run("ar", 3), "clover": run("clover", 3)})
    assert next(loop) == ("ar", 0) and next(loop) == ("clover", 0)
    loop.close()  # a stopped race: both runs are closed
    assert sorted(closed) == ["ar", "clover"]


def test_lockstep_rotates_and_marks_rounds():
    """With ``rotate`` each round starts one run later; with ``rounds`` a (None, None)
    marks the end of every round after which a run may go on: the app draws its page only
    there."""
    from clover.methods import lockstep

    def run(name, steps):
        yield from ((name, i) for i in range(steps))

    items = [n for n, _ in lockstep({"a": run("a", 3), "b": run("b", 3), "c": run("c", 2)},
                                    rotate=True, rounds=True)]
    assert items == ["a", "b", "c", None, "b", "c", "a", None, "a", "b", None]


def core_only_site(folder):
    """A folder that holds only what ``pip install clover-studio`` (no extras) installs: a
    link to each top-level module of the core dependencies' closure (read from this
    environment's package metadata), with their .dist-info folders. Python started with
    ``-S`` and ``PYTHONPATH=folder:<repo>`` then sees the core install and nothing else."""
    import re
    from importlib.metadata import PackageNotFoundError, distribution

    from packaging.requirements import Requirement

    seen, todo = set(), ["clover-studio"]
    while todo:
        name = todo.pop()
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key in seen:
            continue
        seen.add(key)
        try:
            dist = distribution(name)
        except PackageNotFoundError:
            continue
        todo += [r.name for r in map(Requirement, dist.requires or [])
                 if not r.marker or r.marker.evaluate({"extra": ""})]
        if key == "clover-studio":
            continue  # from the source tree
        for top in {f.parts[0] for f in dist.files or [] if f.parts[0] != ".."}:
            src = dist.locate_file(top)
            if not top.endswith(".pth") and src.exists() and not (folder / top).exists():
                (folder / top).symlink_to(src)
    return folder


CORE_CHECK = """
import importlib.util, sys
extras = [m for m in ("gradio", "plotly", "scipy", "playwright", "accelerate")
          if importlib.util.find_spec(m)]
assert not extras, f"not a core-only environment: {extras}"
from clover.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.install
def test_the_core_install_runs_the_bench_without_charts(tiny_dir, prompts, tmp_path):
    """With the core install only (no Plotly), `clover bench` says up front that
    charts.html is not written, then writes results.json and results.md and exits 0;
    every subcommand's help works."""
    import subprocess
    import sys
    from pathlib import Path

    (tmp_path / "site").mkdir()
    site = core_only_site(tmp_path / "site")
    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": f"{site}{os.pathsep}{repo}"}

    def clover(*args):
        return subprocess.run([sys.executable, "-S", "-c", CORE_CHECK, *args], capture_output=True,
                              text=True, timeout=600, env=env)

    out = tmp_path / "bench"
    done = clover("bench", "--model", str(tiny_dir), "--prompts", str(prompts),
                  "--max-new-tokens", "4", "--tree", "small", "--out", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    note = "charts.html is not written: Plotly is not installed"
    assert note in done.stderr.splitlines()[0]  # said before the run
    assert (out / "results.json").exists() and (out / "results.md").exists()
    assert not (out / "charts.html").exists()
    for command in ("generate", "data", "prompts", "text-data", "train", "bench"):
        shown = clover(command, "--help")
        assert shown.returncode == 0 and "usage:" in shown.stdout, (command, shown.stderr[-2000:])
    # the commands that need no extra run; training refuses up front, naming the extra
    done = clover("generate", "--model", str(tiny_dir), "--method", "clover", "--prompt", "Hi",
                  "--max-new-tokens", "3", "--json")
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert json.loads(done.stdout)["new_tokens"] == 3
    refused = clover("train", "--model", str(tiny_dir), "--method", "clover", "--data", str(tmp_path),
                     "--out", str(tmp_path / "run"))
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr[-3000:]
    assert "needs accelerate" in refused.stderr and "clover-studio[train]" in refused.stderr
    assert not (tmp_path / "run").exists()
