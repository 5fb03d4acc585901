"""The app's event handlers, called directly on a tiny model (no server, no browser):
Stop also cancels queued runs, and no handler runs on the server's event loop."""
from __future__ import annotations

import inspect
import time

import gradio as gr
import pytest

from app import registry, same_point
from app import settings as app_settings
from app.run_handler import Visitor
from app.ui import build_demo
from conftest import tiny_target


@pytest.fixture(scope="module")
def handlers():
    demo = build_demo(target=tiny_target("llama"), warm_up=False)
    fns = {}
    for block_fn in demo.fns.values():
        if block_fn.fn is not None:
            fns[block_fn.fn.__name__] = block_fn.fn
        elif "_cloverReplay" in str(block_fn.js or ""):  # the replay: browser code only
            fns["replay (js)"] = block_fn.js
    yield fns
    for key in [k for k in registry.model_keys() if k.startswith("app-")]:
        registry.forget_model(key)


def test_no_handler_blocks_the_event_loop(handlers):
    """Every handler is plain (sync) code: Gradio runs it in a worker thread, so a figure
    build never stalls other visitors' streams and Stop presses; the race replay has no
    server handler at all (app/race_replay.js runs in the page)."""
    assert {"on_run", "on_stop", "on_press", "replay (js)"} <= set(handlers)
    assert "on_replay" not in handlers
    for name, fn in handlers.items():
        if name == "replay (js)":
            continue
        assert not inspect.iscoroutinefunction(fn) and not inspect.isasyncgenfunction(fn), name


def test_stop_cancels_a_queued_run(handlers):
    on_press, on_stop, on_run = handlers["on_press"], handlers["on_stop"], handlers["on_run"]
    args = ("t5 t6 t7", "clover", 0, 6, "4", False, "", "")
    visitor = Visitor()
    on_press(visitor)  # Run pressed: the run waits in the queue ...
    on_stop(None, visitor)  # ... and Stop is pressed before it starts
    outputs = list(on_run(*args, None, False, visitor))
    assert len(outputs) == 1 and "Stopped** before it started" in outputs[0][0]
    # the next press runs normally and decodes
    on_press(visitor)
    outputs = list(on_run(*args, None, False, visitor))
    assert "Done" in outputs[-1][0]
    # two presses queued, one Stop: both are cancelled
    on_press(visitor)
    on_press(visitor)
    on_stop(None, visitor)
    assert all("before it started" in list(on_run(*args, None, False, visitor))[0][0] for _ in range(2))


def test_each_run_has_its_own_seed_and_a_seed_reproduces(handlers):
    on_run = handlers["on_run"]

    def text(seed):
        outputs = list(on_run("t5 t6 t7", "clover", 1.0, 24, "4", True, "", "", seed, False, Visitor()))
        assert "Done" in outputs[-1][0]
        return outputs[-1][5], outputs[-1][0]  # the plain text, the status

    a, status = text(11)
    assert "seed **11**" in status and "temperature 1" in status
    assert text(11)[0] == a  # the same seed reproduces the run
    assert text(12)[0] != a  # another seed samples another text
    seeds = {app_settings.parse_seed(None) for _ in range(5)}
    assert len(seeds) == 5  # empty: a fresh seed per run
    for bad in (-1, 2.5, "x", 2**31):
        with pytest.raises(ValueError, match="seed"):
            app_settings.parse_seed(bad)


def test_the_step_view_shows_text_and_metrics_up_to_that_step(handlers):
    on_run, on_browse = handlers["on_run"], handlers["on_browse"]
    outputs = list(on_run("t5 t6 t7", "clover", 0, 12, "4", False, "", "", 0, False, Visitor()))
    st = outputs[-1][-1]  # the RunState
    steps = st.runs["clover"]
    assert len(steps) >= 3
    tree, text, metrics, status = on_browse(2, "clover", st)
    assert f"step 2 of {len(steps)}" in status  # the status names the step on display
    assert tree.layout.title.text.startswith(f"Step 2 of {len(steps)}")
    assert f"step 2 · {steps[1].total_tokens} tokens" in metrics
    assert text.count(" data-step=") == len([t for s in steps[:2] for t in s.new_text if t])
    # Previous and Next move one step within the trace, and say which step is shown
    from app.step_view import on_next, on_previous

    slider, tree, text, metrics, status = on_next(2, "clover", st)
    assert slider["value"] == 3 and f"step 3 of {len(steps)}" in status
    assert on_previous(1, "clover", st)[0]["value"] == 1  # never before the first
    assert on_next(len(steps), "clover", st)[0]["value"] == len(steps)  # nor past the last
    last = on_browse(len(steps), "clover", st)
    assert f"step {len(steps)} · 12 tokens" in last[2]


def test_the_step_panels_come_from_the_step_trace(handlers):
    on_run, on_panels = handlers["on_run"], handlers["on_step_panels"]
    outputs = list(on_run("t5 t6 t7", "clover", 0, 12, "4", True, "", "", 0, False, Visitor()))
    st = outputs[-1][-1]
    steps = st.runs["clover"]
    (verify, mask, kv, regressive, speed, time_split, reading, same_clover, same_medusa,
     same) = on_panels(2, "clover", st)
    step = steps[1]
    assert list(verify.data[0].cells.values[0]) == [n.id for n in step.nodes[1:]]
    assert len(mask.data[0].z) == len(step.nodes) and mask.data[0].x[0].startswith("prefix")
    assert [int(x) for x in kv.data[0].x] == step.accepted + step.cut
    assert regressive.data[0].type == "table"
    # the comparison ran prompt lookup, which measured the verify cost curve
    assert "tokens per step" in reading and "measured: **" in reading
    assert list(speed.data[0].x)[:2] == [1, 2]
    # where the time goes: the watched method, Medusa and plain, parts summing to a step
    assert list(time_split.data[0].y) == ["Clover", "Medusa", "Plain"]
    for k, m in enumerate(("clover", "medusa", "ar")):
        parts = sum(bar.x[k] for bar in time_split.data)
        assert parts == pytest.approx(sum(s.draft_ms + s.verify_ms for s in st.runs[m])
                                      / len(st.runs[m]))
    # both trees from the same text: the one shown starts where the other method's did
    point = same_point.same_point(st.runs, "clover", 1)
    assert "<b>Clover</b>" in same_clover.layout.title.text and "accepted" in same
    assert (st.runs["clover"][point.clover_step].total_tokens
            - st.runs["clover"][point.clover_step].accepted_length == point.tokens
            == st.runs["medusa"][point.medusa_step].total_tokens
            - st.runs["medusa"][point.medusa_step].accepted_length)
    assert all(v == gr.skip() for v in on_panels(2, "clover", None))  # before a run: unchanged
    assert handlers["on_pick_trace_panels"]("ar", st)[3].layout.annotations


def _method_radio(demo):
    return next(b for b in demo.blocks.values() if getattr(b, "elem_id", None) == "method")


def test_clover2_is_offered_only_with_its_heads(handlers, tmp_path):
    """Without Clover-2 heads the method choice is unchanged and a Clover-2 run (e.g. from
    the API) ends in a message; with a clover2/ heads folder Clover-2 can be watched and
    races beside the others."""
    from clover.heads import new_heads

    outputs = list(handlers["on_run"]("t5 t6 t7", "clover2", 0, 6, "4", True, "", "", 0, False,
                                      Visitor()))
    assert "no Clover-2 heads" in outputs[-1][0] and "Traceback" not in outputs[-1][0]

    target = tiny_target("llama")
    new_heads("clover2", target, num_heads=3).save_pretrained(tmp_path / "clover2")
    before = set(registry.model_keys())
    demo = build_demo(target=target, heads=str(tmp_path), warm_up=False)
    plain_demo = build_demo(target=target, warm_up=False)
    try:
        values = [v for _, v in _method_radio(demo).choices]
        assert values == ["clover", "clover2", "medusa", "lookup", "ar"]
        assert [v for _, v in _method_radio(plain_demo).choices] == ["clover", "medusa", "lookup", "ar"]
        on_run = next(f.fn for f in demo.fns.values() if f.fn is not None and f.fn.__name__ == "on_run")
        outputs = list(on_run("t5 t6 t7", "clover2", 0, 8, "4", True, "", "", 0, False, Visitor()))
        assert "Done" in outputs[-1][0] and "racing in lockstep: Clover-2" in " ".join(
            o[0] for o in outputs if isinstance(o[0], str))
        st = outputs[-1][-1]
        assert st.results["clover2"].token_ids == st.results["ar"].token_ids
        race = outputs[-1][10]
        assert {t.y[0] for t in race.data if t.type == "bar"} == {
            "Plain", "Lookup", "Medusa", "Clover", "Clover-2"}
    finally:
        for key in set(registry.model_keys()) - before:
            registry.forget_model(key)


def test_the_cards_say_when_the_machine_was_busy(monkeypatch, tmp_path):
    """Plain steps far slower than the quiet plain step the calibration measured: the
    metrics say the machine was busy and the ratios less certain; at about the quiet
    time they say nothing."""
    from dataclasses import replace

    import clover.autotree
    from app import run_handler
    from clover import Engine

    monkeypatch.setenv("CLOVER_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(clover.autotree, "interleaved_ms",  # a quiet plain step: 10 ms
                        lambda fns, repeats, *_: [[10.0] * repeats] + [[0.01] * repeats] * (len(fns) - 1))
    target = tiny_target("llama", vocab_size=64)
    loaded = registry.register_model("test-busy", target, warm_up=True)
    try:
        assert loaded.sizing.plain_step_ms() == 10.0
        steps = Engine(target).generate([5, 6, 7], 6).steps
        st = run_handler.RunState("clover", model_key="test-busy")
        st.runs["ar"] = [replace(s, draft_ms=0.0, verify_ms=40.0) for s in steps]
        assert "machine was busy" in run_handler.busy_note(st) and "40 ms here, 10 ms" in run_handler.busy_note(st)
        assert "machine was busy" in run_handler.metrics_panel(st)
        # a busy machine's page is drawn once more, to say so, then not until the race ends
        assert run_handler.draw_due(st, shown=None) and st.busy_told
        assert "drawn again when the race ends" in run_handler._live_outputs(st, ["clover", "ar"], 6)[
            run_handler.RUN_OUTPUTS.index("status")]
        assert not run_handler.draw_due(st, shown=None)
        assert not run_handler.draw_due(st, shown=time.monotonic() - 60)
        st.stop = True  # ... but at once after Stop
        assert run_handler.draw_due(st, shown=time.monotonic())
        st.runs["ar"] = [replace(s, draft_ms=0.0, verify_ms=12.0) for s in steps]
        assert run_handler.busy_note(st) == "" and "machine was busy" not in run_handler.metrics_panel(st)
        st.stop = False  # quiet again, but the page said it is drawn after the race: not before
        assert not run_handler.draw_due(st, shown=time.monotonic() - 60)
        quiet = run_handler.RunState("clover", model_key="test-busy", runs=st.runs)
        # a quiet machine's page is drawn at most every LIVE_SECONDS
        assert run_handler.draw_due(quiet, shown=None)
        assert not run_handler.draw_due(quiet, shown=time.monotonic())
        assert run_handler.draw_due(quiet, shown=time.monotonic() - run_handler.LIVE_SECONDS)
        assert not quiet.busy_told
        quiet.threads = (1, 2)  # fewer threads at the start: busy from the first round
        assert run_handler.draw_due(quiet, shown=None) and not run_handler.draw_due(quiet, shown=None)
    finally:
        registry.forget_model("test-busy")


def test_before_any_run_the_cards_ask_for_a_run():
    """A page opens with Compare on: its empty cards ask for a run, never for Compare
    (a page without a recorded run to play, as here)."""
    demo = build_demo(target=tiny_target("llama"), warm_up=False)
    panel = next(b for b in demo.blocks.values() if getattr(b, "elem_id", None) == "metrics-panel")
    assert panel.value.count("press Run to measure here") == 2 and "Compare" not in panel.value
    compare = next(b for b in demo.blocks.values() if getattr(b, "label", None)
                   == "Compare with the other methods")
    assert compare.value is True
