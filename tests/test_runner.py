"""app.settings, app.registry and app.runner: settings validation, trees, chat
transcripts, heads lookup, runs advanced from any thread, and runs of several methods
in lockstep (tiny models)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from app import registry, runner, sizing
from app import settings as app_settings
from clover import Engine, TreeConfig
from clover.heads import new_heads
from conftest import ScriptedHeads, oracle_tree_fn, tiny_target


@pytest.fixture(autouse=True)
def own_auto_tree_store(tmp_path, monkeypatch):
    """Each test keeps its measured auto trees in its own store (``$CLOVER_CACHE_DIR``), so
    that a budget stored by an earlier run on a busy machine (even "off") cannot decide
    them; these tests use tiny models only, never the embedded model's cache. The
    machine's timings are scripted (any tree cheap against a plain step), so that the
    auto tree always drafts: whether untrained heads on a tiny model clear the auto
    tree's margin (MIN_GAIN) is the machine's load, not what these tests check."""
    import clover.autotree
    import clover.calibration

    monkeypatch.setenv("CLOVER_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(clover.autotree, "interleaved_ms",
                        lambda fns, repeats, *_: [[10.0] * repeats] + [[0.01] * repeats] * (len(fns) - 1))


def test_tree_config_choices():
    assert app_settings.tree_config("auto") == app_settings.auto_tree() == TreeConfig(auto=True)
    # a bare number is a dynamic tree of that budget with the library's other defaults
    assert app_settings.tree_config(" 16 ") == TreeConfig(kind="dynamic", budget=16)
    assert app_settings.tree_config("16").branching == TreeConfig().branching == 10
    assert app_settings.tree_config("dynamic:budget=12,branching=4").budget == 12
    assert app_settings.tree_config("small").kind == "static"
    assert app_settings.tree_config("[[0],[1],[0,0]]").paths == ((0,), (1,), (0, 0))
    for bad, words in (("banana", "not understood"), ("0", "from 1 to 256"),
                       ("2.5", "whole number"), ("[[1,0]]", "not understood")):
        with pytest.raises(ValueError, match=words):
            app_settings.tree_config(bad)


def test_parse_chat_transcripts():
    assert app_settings.parse_chat("Hi there") == "Hi there"
    chat = app_settings.parse_chat("User: Name a fruit.\nAssistant: Apple.\nUser: Another?\nOne word.")
    assert chat == [{"role": "user", "content": "Name a fruit."},
                    {"role": "assistant", "content": "Apple."},
                    {"role": "user", "content": "Another?\nOne word."}]
    with pytest.raises(ValueError, match="must end with a 'User:' turn"):
        app_settings.parse_chat("User: hi\nAssistant: hello")


def test_parse_settings_accepts_and_rejects():
    s = app_settings.parse_settings("Hello", "clover", 0, 32.0, "auto", True, " ", "")
    assert (s.method, s.max_new_tokens, s.model, s.heads) == ("clover", 32, None, None)
    assert s.sampling.temperature == 0 and s.tree == TreeConfig(auto=True)
    cases = [
        (("  ", "clover", 0, 8, "auto"), "the prompt is empty"),
        (("x" * (app_settings.MAX_PROMPT_CHARS + 1), "clover", 0, 8, "auto"), "prompt is too long"),
        (("Hi", "turbo", 0, 8, "auto"), "unknown method 'turbo'"),
        (("Hi", "ar", -1, 8, "auto"), "temperature must be between 0 and 5"),
        (("Hi", "ar", "hot", 8, "auto"), "temperature must be a number"),
        (("Hi", "ar", float("nan"), 8, "auto"), "temperature must be between"),
        (("Hi", "ar", 0, 0, "auto"), "from 1 to 512"),
        (("Hi", "ar", 0, 7.5, "auto"), "whole number"),
        (("Hi", "ar", 0, 10_000, "auto"), "from 1 to 512"),
        (("Hi", "ar", 0, None, "auto"), "whole number"),
        (("Hi", "ar", 0, 8, "banana"), "tree setting 'banana' is not understood"),
    ]
    for args, words in cases:
        with pytest.raises(ValueError, match=words):
            app_settings.parse_settings(*args)


def test_all_the_apps_torch_work_runs_on_the_engine_thread():
    """Loading, warm-up and every step of every method run on the one engine thread,
    whichever thread registers the model or advances the run: torch's OpenMP keeps a
    pool of threads per calling thread, and two pools on a small machine made every
    step of the page about 1.5-2.5x slower than the benchmark's (app.engine_thread)."""
    from app import engine_thread

    target = tiny_target("llama", vocab_size=64)
    seen = set()
    target.model.register_forward_pre_hook(lambda *_: seen.add(threading.get_ident()))
    loaded = in_other_thread(lambda: registry.register_model("test-one-thread", target,
                                                             warm_up=True))
    try:
        chosen = app_settings.parse_settings("t5 t6 t7", "clover", 0, 6, "4")
        prompt = runner.encode(loaded, chosen)
        events = runner.run_methods(loaded, chosen, prompt)
        kinds = []
        while (ev := in_other_thread(lambda: next(events, None))) is not None:
            kinds.append(ev.kind)
        assert kinds.count("done") == 4 and kinds.count("round") >= 2
        engine = engine_thread.call(threading.get_ident)
        assert seen == {engine} and engine != threading.get_ident()
    finally:
        registry.forget_model("test-one-thread")


def in_other_thread(fn):
    """``fn()`` run on a new thread; its result."""
    out = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    t.join()
    return out[0]


def test_a_run_can_be_advanced_and_closed_from_any_thread():
    """Gradio advances a handler's generator from whichever worker thread is free and
    closes it from another: each step taken in a fresh thread gives the same run as one
    thread, and a close from another thread ends it."""
    target = tiny_target("llama", vocab_size=64)
    loaded = registry.register_model("test-threads", target, warm_up=False)
    try:
        chosen = app_settings.parse_settings("t5 t6 t7", "clover", 0, 12, "4", compare=False)
        prompt = runner.encode(loaded, chosen)
        alone = [e for e in runner.run_methods(loaded, chosen, prompt) if e.kind == "done"]

        events = runner.run_methods(loaded, chosen, prompt)
        hopped = []
        while True:
            ev = in_other_thread(lambda: next(events, None))
            if ev is None:
                break
            hopped.append(ev)
        assert [e.kind for e in hopped].count("step") >= 2
        done = [e for e in hopped if e.kind == "done"]
        assert done[0].result.token_ids == alone[0].result.token_ids
        events = runner.run_methods(loaded, chosen, prompt)
        assert [next(events).kind, next(events).kind] == ["start", "step"]
        in_other_thread(events.close)
        assert next(events, None) is None
    finally:
        registry.forget_model("test-threads")


def test_heads_folder_lookup(tmp_path):
    target = tiny_target("llama")
    new_heads("clover", target, num_heads=2).save_pretrained(tmp_path / "clover")
    heads, sources = registry.load_heads_for(target, str(tmp_path))
    assert sources["clover"] == f"loaded from {tmp_path / 'clover'}"
    assert heads["clover"].config.num_heads == 2
    assert sources["medusa"].startswith("untrained")
    with pytest.raises(ValueError, match="does not exist"):
        registry.load_heads_for(target, str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="holds no Medusa, Clover or Clover-2 heads"):
        registry.load_heads_for(target, str(tmp_path / "empty"))


def test_clover2_joins_only_with_its_heads(tmp_path):
    """No Clover-2 heads ship for a tiny model: it gets Medusa and Clover only, and a Clover-2 run is
    refused with a message; a heads folder with clover2/ adds Clover-2 to the methods, the
    banner and the comparison, decoding exactly as plain."""
    target = tiny_target("llama", vocab_size=64)
    plain_model = registry.register_model("test-no-clover2", target, warm_up=False)
    assert "clover2" not in plain_model.heads and plain_model.methods == registry.CORE_METHODS
    settings = app_settings.parse_settings("t5 t6 t7", "clover2", 0, 10, "4")
    with pytest.raises(ValueError, match="no Clover-2 heads for tiny-llama"):
        list(runner.run_methods(plain_model, settings, [5, 6, 7]))
    with pytest.raises(ValueError, match="no Clover-2 heads"):
        plain_model.check_method("clover2+lookup")
    plain_model.check_method("clover+lookup")  # the core kinds are always there

    new_heads("clover", target, num_heads=2).save_pretrained(tmp_path / "both" / "clover")
    new_heads("clover2", target, num_heads=3).save_pretrained(tmp_path / "both" / "clover2")
    heads, sources = registry.load_heads_for(target, str(tmp_path / "both"))
    assert list(heads) == ["medusa", "clover", "clover2"]
    assert sources["clover2"] == f"loaded from {tmp_path / 'both' / 'clover2'}"
    assert sources["medusa"].startswith("untrained") and heads["clover2"].config.kind == "clover2"
    # a folder that holds Clover-2 heads alone is a heads folder too
    new_heads("clover2", target, num_heads=2).save_pretrained(tmp_path / "only")
    heads, sources = registry.load_heads_for(target, str(tmp_path / "only"))
    assert heads["clover2"].config.num_heads == 2 and sources["clover"].startswith("untrained")

    loaded = registry.register_model("test-clover2", target, heads_dir=str(tmp_path / "both"),
                                   warm_up=False)
    assert loaded.methods == (*registry.CORE_METHODS, "clover2")
    assert "**Clover-2 heads:** loaded from" in loaded.notice()
    prompt = runner.encode(loaded, settings)
    ref = Engine(target).generate(prompt, 10)
    events = list(runner.run_methods(loaded, settings, prompt))
    assert [(e.method, e.live) for e in events if e.kind == "start"] == [
        ("clover2", True), ("ar", False), ("lookup", False), ("medusa", False), ("clover", False)]
    done = {e.method: e.result for e in events if e.kind == "done"}
    assert all(r.token_ids == ref.token_ids for r in done.values()) and len(done) == 5
    hybrid = app_settings.parse_settings("t5 t6 t7", "clover2+lookup", 0, 10, "4", compare=False)
    assert hybrid.method == "clover2+lookup" and hybrid.lookup
    events = list(runner.run_methods(loaded, hybrid, prompt))
    assert [e.result.token_ids for e in events if e.kind == "done"] == [ref.token_ids]


def test_model_notice_says_untrained():
    target = tiny_target("llama")
    loaded = registry.register_model("test-notice", target, warm_up=False)
    assert loaded.untrained == ["medusa", "clover"]
    assert "Untrained draft heads" in loaded.notice() and "tiny-llama" in loaded.notice()
    given = registry.register_model("test-given", target, heads={"medusa": None, "clover": None},
                                  warm_up=False)
    assert given.untrained == [] and "Untrained" not in given.notice()


def test_auto_never_turns_speculation_off_in_the_app(monkeypatch):
    """Where the calibration finds that no tree pays on this machine (here every tree
    costs 20x a plain step), "auto" in the app still drafts the smallest tree, and the
    banner says why, with the figures; the calibration itself stays "off" (CLI, bench)."""
    import clover.autotree
    import clover.calibration

    monkeypatch.setattr(clover.autotree, "interleaved_ms",
                        lambda fns, repeats, *_: [[10.0] * repeats] + [[100.0] * repeats] * (len(fns) - 1))
    target = tiny_target("llama", vocab_size=64)
    loaded = registry.register_model("test-never-off", target, warm_up=True)
    try:
        for kind in ("medusa", "clover"):
            assert loaded.sizing.calibrations[kind].tree.off
            tree = loaded.sizing.tree_for(kind, app_settings.auto_tree())
            assert tree.kind == "dynamic" and tree.budget == sizing.SHOW_BUDGET
            out = Engine(target, loaded.heads[kind], tree).generate([5, 6, 7], 8)
            assert all(len(s.nodes) == 1 + sizing.SHOW_BUDGET for s in out.steps[:-1])
        notice = loaded.notice()
        assert "no tree pays on this machine for Clover and Medusa" in notice
        assert "they draft the smallest tree to show the method" in notice
    finally:
        registry.forget_model("test-never-off")


def test_auto_tree_is_measured_once_per_method(monkeypatch):
    import clover.autotree
    import clover.calibration

    target = tiny_target("llama", vocab_size=64)
    loaded = registry.register_model("test-auto", target, warm_up=True)
    assert set(loaded.sizing.auto_trees) == {"medusa", "clover"}
    for tree in loaded.sizing.auto_trees.values():
        assert tree.kind == "dynamic" and not tree.auto and tree.budget >= 1
    assert "auto tree:" in loaded.notice()

    def no_more(*a, **k):
        raise AssertionError("measured twice")

    monkeypatch.setattr(clover.calibration, "auto_tree", no_more)
    assert loaded.sizing.tree_for("clover", app_settings.tree_config("auto")) == loaded.sizing.auto_trees["clover"]
    fixed = app_settings.tree_config("6")
    assert loaded.sizing.tree_for("clover", fixed) == fixed
    assert loaded.sizing.tree_for("ar", app_settings.tree_config("auto")).auto  # plain decoding has no tree
    registry.forget_model("test-auto")


def test_run_methods_in_lockstep():
    """The watched method starts first and every round takes one step of each method in
    turn (the watched first in the first round, then rotating), so the watched tree is drawn after one step, not after every
    baseline's run; on ZeroGPU (lockstep=False) the methods run one after another."""
    target = tiny_target("llama", vocab_size=64)
    settings = app_settings.parse_settings("t5 t6 t7", "clover", 0, 12, "auto")
    loaded = registry.register_model("test-runs", target, warm_up=True)
    prompt = runner.encode(loaded, settings)
    ref = Engine(target).generate(prompt, 12)
    loaded.heads["clover"] = ScriptedHeads(target, oracle_tree_fn(prompt + ref.token_ids,
                                                                  target.vocab_size))
    events = list(runner.run_methods(loaded, settings, prompt))
    starts = [(e.method, e.live) for e in events if e.kind == "start"]
    assert starts == [("clover", True), ("ar", False), ("lookup", False), ("medusa", False)]
    kinds = [(e.kind, e.method) for e in events]
    # the first step of the run is the watched method's, and its first round takes one
    # step of every method before any takes a second
    first_round = [m for k, m in kinds if k == "step"][:4]
    assert first_round == ["clover", "ar", "lookup", "medusa"]
    # a "round" event closes each round (the page is drawn only there), and each round
    # starts one method later, so no method always steps first after the page was drawn
    end = kinds.index(("round", ""))
    assert [m for k, m in kinds[:end] if k == "step"] == first_round
    second = kinds[end + 1:kinds.index(("round", ""), end + 1)]
    assert [m for k, m in second if k == "step"] == ["ar", "lookup", "medusa", "clover"]
    # the oracle-drafted Clover finishes while plain decoding is still running
    assert kinds.index(("done", "clover")) < kinds.index(("done", "ar"))
    steps = {m: sum(1 for k, mm in kinds if k == "step" and mm == m) for m in ("clover", "ar")}
    assert steps["ar"] == 12 and steps["clover"] < 12
    sequential = list(runner.run_methods(loaded, settings, prompt, lockstep=False))
    seq_kinds = [(e.kind, e.method) for e in sequential]
    assert seq_kinds.index(("done", "clover")) < seq_kinds.index(("start", "ar"))
    assert ({e.method: e.result.token_ids for e in sequential if e.kind == "done"}
            == {e.method: e.result.token_ids for e in events if e.kind == "done"})
    done = {e.method: e.result for e in events if e.kind == "done"}
    assert all(r.token_ids == ref.token_ids for r in done.values())
    assert done["clover"].mean_accepted_length > 1.5
    assert [e.method for e in runner.run_methods(loaded, app_settings.parse_settings(
        "t5", "medusa", 0, 3, "auto", compare=False), prompt) if e.kind == "start"] == ["medusa"]
    # with the lookup branch, the head methods run as hybrids; lookup alone and plain stay
    hybrid = app_settings.parse_settings("t5 t6 t7", "clover", 0, 12, "auto", lookup=True)
    assert hybrid.method == "clover+lookup"
    events = list(runner.run_methods(loaded, hybrid, prompt))
    assert [e.method for e in events if e.kind == "start"] == ["clover+lookup", "ar", "lookup",
                                                               "medusa+lookup"]
    done = {e.method: e.result for e in events if e.kind == "done"}
    assert all(r.token_ids == ref.token_ids for r in done.values())
    assert app_settings.parse_settings("t5", "ar", 0, 3, "auto", lookup=True).method == "ar"
    too_long = app_settings.parse_settings("t5 " * 300, "ar", 0, 8, "auto")
    with pytest.raises(ValueError, match="context"):
        runner.encode(loaded, too_long)


def test_run_methods_hands_over_steps_only_where_pause_says(monkeypatch):
    """``pause`` (asked on the engine thread after each round) decides where the caller
    sees the events so far: never -> one hand-over for the whole race (the caller's
    thread, and the server and browser it would wake, sleep while every step is timed);
    every round -> one per round; the steps and texts are the same either way."""
    from app import engine_thread

    target = tiny_target("llama", vocab_size=64)
    settings = app_settings.parse_settings("t5 t6 t7", "clover", 0, 10, "4")
    loaded = registry.register_model("test-pause", target, warm_up=True)
    calls = []
    real_call = engine_thread.call
    monkeypatch.setattr(engine_thread, "call", lambda fn, *a, **k: (calls.append(fn), real_call(fn, *a, **k))[1])
    try:
        prompt = runner.encode(loaded, settings)
        asked = []

        def never():
            asked.append(engine_thread.on_engine_thread())
            return False

        calls.clear()
        quiet = list(runner.run_methods(loaded, settings, prompt, pause=never))
        handovers = len(calls)
        assert asked and all(asked)  # asked after every round, on the engine thread
        assert [e.kind for e in quiet].count("round") == 0
        calls.clear()
        every = list(runner.run_methods(loaded, settings, prompt))
        rounds = [e.kind for e in every].count("round")
        assert rounds == len(asked) and len(calls) >= rounds + 1 > handovers
        assert handovers <= 3  # the race in one part (plus the end and the close)
        # every step arrives either way, and the events are the same but for the rounds
        assert [(e.kind, e.method) for e in quiet] == [(e.kind, e.method) for e in every
                                                       if e.kind != "round"]
        assert ({e.method: e.result.token_ids for e in quiet if e.kind == "done"}
                == {e.method: e.result.token_ids for e in every if e.kind == "done"})
        # a pause every other round: a round event there only
        flip = iter([False, True] * 50)
        some = list(runner.run_methods(loaded, settings, prompt, pause=lambda: next(flip)))
        assert [e.kind for e in some].count("round") == len(asked) // 2
    finally:
        registry.forget_model("test-pause")


def test_decoding_runs_inside_spaces_gpu_when_zerogpu_is_switched_on(tmp_path):
    """ZeroGPU is an explicit setting (app.zerogpu.configure, from $CLOVER_ZEROGPU or the
    platform's $SPACES_ZERO_GPU in app.py): with the ``spaces`` package importable but the
    setting off, decoding runs as itself, in lockstep; switched on, inside a
    ``spaces.GPU`` function, the methods one after another. A stand-in ``spaces`` module
    records the calls; without any, switching on is a clear ImportError."""
    (tmp_path / "spaces.py").write_text(textwrap.dedent('''
        calls = []
        def GPU(fn=None, duration=None):
            def wrap(f):
                def inner(*args, **kwargs):
                    calls.append((f.__name__, duration))
                    return f(*args, **kwargs)
                return inner
            return wrap(fn) if fn is not None else wrap
    '''))
    script = textwrap.dedent('''
        import spaces
        from app import registry, runner, zerogpu
        from app import settings as app_settings
        from conftest import tiny_target
        loaded = registry.register_model("zero", tiny_target("llama"), warm_up=False)
        settings = app_settings.parse_settings("t5 t6", "clover", 0, 4, "auto")
        for setting, calls in (("", []), ("true", [("decode", 120)] * 4), ("0", [])):
            zerogpu.configure(setting)
            spaces.calls.clear()
            events = list(runner.run_methods(loaded, settings, runner.encode(loaded, settings)))
            assert spaces.calls == calls, (setting, spaces.calls)
            assert sum(e.kind == "done" for e in events) == 4
            assert zerogpu.active() == bool(calls)
        print("ok")
    ''')
    tests_dir = Path(__file__).resolve().parent
    env_path = f"{tmp_path}:{tests_dir}:{tests_dir.parent}"
    env = {**os.environ, "PYTHONPATH": env_path, "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                         timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
    import importlib.util

    if importlib.util.find_spec("spaces") is None:  # the dev install has no `spaces`
        missing = subprocess.run([sys.executable, "-c", "from app import zerogpu; zerogpu.configure('1')"],
                                 capture_output=True, text=True, timeout=120,
                                 env={**env, "PYTHONPATH": str(tests_dir.parent)})
        assert missing.returncode != 0 and "pip install spaces" in missing.stderr, missing.stderr[-500:]


def test_start_up_does_not_wait_for_the_auto_tree(monkeypatch, tmp_path):
    """register_model(warm_up="background") returns at once; runs use the default budget
    until the measurement lands, and a method already sized never waits for the others'
    measurement; the measured budget is stored and reused next start."""
    import clover.autotree
    import clover.calibration

    monkeypatch.setenv("CLOVER_CACHE_DIR", str(tmp_path))
    gates, measured = [threading.Event(), threading.Event()], []  # one per measurement
    real = clover.autotree.auto_tree

    def slow(target, heads, base=None, **kw):
        gates[len(measured)].wait(60)
        measured.append(heads)
        return real(target, heads, base, repeats=1, **kw)

    monkeypatch.setattr(clover.calibration, "auto_tree", slow)
    target = tiny_target("llama", vocab_size=64)
    heads = {"medusa": new_heads("medusa", target), "clover": new_heads("clover", target)}
    loaded = registry.register_model("test-bg", target, heads=dict(heads), warm_up="background")
    assert loaded.sizing.calibrating.is_set() and not loaded.sizing.auto_trees
    assert "being sized for this machine (a run pressed meanwhile starts when it ends" in loaded.notice()
    default = loaded.sizing.tree_for("clover", app_settings.auto_tree())
    assert not default.auto and default.budget == app_settings.auto_tree().budget
    gates[0].set()
    for _ in range(600):
        if loaded.sizing.auto_trees:
            break
        threading.Event().wait(0.1)
    (first,) = loaded.sizing.auto_trees  # sized; the other method's measurement holds the lock
    began = time.monotonic()
    assert loaded.sizing.tree_for(first, app_settings.auto_tree()) == loaded.sizing.auto_trees[first]
    assert time.monotonic() - began < 5  # did not wait for the other measurement
    gates[1].set()
    for _ in range(600):
        if not loaded.sizing.calibrating.is_set():
            break
        threading.Event().wait(0.1)
    assert set(loaded.sizing.auto_trees) == {"medusa", "clover"} and len(measured) == 2
    assert "background" not in loaded.notice() and "auto tree:" in loaded.notice()
    assert (tmp_path / "autotree.json").is_file()

    def no_more(*a, **k):
        raise AssertionError("measured again despite the stored calibration")

    monkeypatch.setattr(clover.calibration, "auto_tree", no_more)
    again = registry.register_model("test-bg2", target, heads=dict(heads), warm_up="background")
    assert not again.sizing.calibrating.is_set() and again.sizing.auto_trees == loaded.sizing.auto_trees
    other = registry.register_model("test-bg3", target, warm_up=False)  # other weights
    assert clover.calibration.stored_auto_tree(target, other.heads["clover"], measure=False) is None
    for key in ("test-bg", "test-bg2", "test-bg3"):
        registry.forget_model(key)


def test_a_busy_machine_decodes_on_fewer_threads(monkeypatch):
    """Other processes keeping both CPUs of a 2-core machine busy: the run uses one torch
    thread (two threads there wait for each other), and the count comes back after; with
    the CPUs free, or unknown load, nothing changes. The probe itself reads /proc/stat."""
    import torch

    from app.engine_thread import call

    target = tiny_target("llama", vocab_size=64)
    loaded = registry.register_model("test-load-threads", target, warm_up=False)
    before = call(torch.get_num_threads)  # the count of the thread that runs the engine
    try:
        call(torch.set_num_threads, 2)
        monkeypatch.setattr("os.cpu_count", lambda: 2)
        for others, want in ((2.0, 1), (1.2, 1), (0.3, None), (None, None)):
            monkeypatch.setattr("clover.machine.others_cpu_load", lambda window_s=0.15, x=others: x)
            assert runner.threads_for_load(loaded) == want, others
        monkeypatch.setattr("clover.machine.others_cpu_load", lambda window_s=0.15: 2.0)
        with runner.load_threads(loaded) as used:
            assert used == (1, 2) and call(torch.get_num_threads) == 1
        assert call(torch.get_num_threads) == 2
    finally:
        call(torch.set_num_threads, before)
        registry.forget_model("test-load-threads")
    monkeypatch.undo()
    from clover.machine import others_cpu_load

    load = others_cpu_load(0.05)
    assert load is None or load >= 0.0
