"""The recorded run a fresh page plays (assets/sample_run.json, app.sample_run): traces
survive JSON, the shipped recording is current (the shipped heads, the text plain greedy
decoding writes today), and the page opens on it."""
from __future__ import annotations

import json

import gradio as gr
import pytest

from app import decode_tab, registry, run_handler, sample_run, step_view
from app.run_handler import RUN_OUTPUTS
from clover import Engine, encode_prompt
from clover.trace import result_from_dict, result_to_dict, step_from_dict, step_to_dict
from conftest import ScriptedHeads, oracle_tree_fn, tiny_target


def test_traces_round_trip_through_json():
    target = tiny_target("llama", vocab_size=64)
    prompt = [5, 9, 11, 3]
    ref = Engine(target).generate(prompt, 24)
    heads = ScriptedHeads(target, oracle_tree_fn(prompt + ref.token_ids, 64, seed=1))
    out = Engine(target, heads).generate(prompt, 24)
    assert any(len(s.accepted) > 2 for s in out.steps) and out.steps[0].nodes[1].target_top
    back = [step_from_dict(json.loads(json.dumps(step_to_dict(s)))) for s in out.steps]
    assert back == out.steps
    assert result_from_dict(json.loads(json.dumps(result_to_dict(out)))) == out


def test_other_dicts_are_not_traces():
    with pytest.raises(ValueError, match="unknown field"):
        step_from_dict({"step": 0, "colour": "red"})
    with pytest.raises(ValueError, match="not a step trace"):
        step_from_dict({"step": 0})
    with pytest.raises(ValueError, match="not a generation result"):
        result_from_dict({"steps": []})


def test_a_damaged_recording_is_an_error_and_a_missing_one_is_none(tmp_path):
    assert sample_run.load(tmp_path / "none.json") is None
    (tmp_path / "bad.json").write_text('{"format": 1, "runs": {"ar": [{"x": 1}]}}')
    with pytest.raises(ValueError, match="not a recorded run"):
        sample_run.load(tmp_path / "bad.json")
    (tmp_path / "other.json").write_text('{"format": 999}')
    assert sample_run.load(tmp_path / "other.json") is None  # another layout: not shown


@pytest.fixture(scope="module")
def shipped(embedded, one_thread):
    """The embedded model with its shipped heads, registered as the app registers it."""
    loaded = registry.register_model("sample-test", embedded, warm_up=False)
    yield loaded
    registry.forget_model("sample-test")


def test_the_shipped_recording_is_current(shipped):
    """Recorded with the heads that ship (a heads change needs
    ``python scripts/record_sample_run.py``), on the first example, and every method's
    text is the one plain greedy decoding writes with today's code."""
    sample = sample_run.load()
    assert sample is not None, "assets/sample_run.json is missing"
    assert sample.fits(shipped), ("the shipped heads differ from the recorded ones: run "
                                  "python scripts/record_sample_run.py")
    examples = decode_tab.load_examples()
    assert sample.prompt == examples[0]["prompt"] and sample.method == "clover"
    assert {"ar", "medusa", "clover", "lookup"} <= set(sample.runs)
    ids = encode_prompt(shipped.target.tokenizer, sample.prompt)
    plain = Engine(shipped.target).generate(ids, sample.max_new_tokens)
    for m, result in sample.results.items():
        assert result.token_ids == plain.token_ids, m
        assert sum(s.accepted_length for s in sample.runs[m]) == len(plain.token_ids), m
    assert decode_tab.page_sample(shipped, examples) is not None


def test_other_heads_do_not_show_the_recording(embedded):
    """A page whose heads differ from the recorded ones opens empty, as before."""
    sample = sample_run.load()
    oracle = ScriptedHeads(embedded, oracle_tree_fn([1, 2, 3], embedded.vocab_size))
    loaded = registry.LoadedModel("other", embedded, {"ar": None, "clover": oracle,
                                                       "medusa": None})
    assert not sample.fits(loaded)
    assert decode_tab.page_sample(loaded, decode_tab.load_examples()) is None


def test_a_fresh_page_opens_on_the_recording_ready_to_play():
    sample = sample_run.load()
    out = dict(zip(RUN_OUTPUTS, step_view.on_open(sample, "no-such-model")))
    st = out["state"]
    assert st.done and st.recorded and st.method == "clover"
    assert "A recorded run" in out["status"] and "press **Run**" in out["status"]
    assert "step 1 of" in out["status"]
    assert out["slider"]["value"] == 1 and out["slider"]["interactive"]
    # the text so far is step 1's, outlined; the race and texts are the whole run's
    assert out["text"].count('class="current-step"') == st.runs["clover"][0].accepted_length
    assert out["textrace"].count("race-row") == len(sample.runs)
    # at the last step the cards show the recorded ratios, marked as recorded, and no
    # busy warning from this machine's load
    last = len(st.runs["clover"]) - 1
    metrics = step_view.step_view(st, "clover", last)[2]
    assert metrics.count('data-state="recorded"') == 2 and "×" in metrics
    assert run_handler.busy_note(st) == ""
    # Next and a click on a token move through it like a live run's trace
    nxt = step_view.on_next(1, "clover", st)
    assert nxt[0]["value"] == 2 and "step 2 of" in nxt[4]
    token = gr.SelectData(None, {"index": 5, "value": "5"})
    jump = step_view.on_token("clover", st, token)
    assert jump[0]["value"] == 5 and "step 5 of" in jump[4]
    assert jump[2].count('class="current-step"') == st.runs["clover"][4].accepted_length


def test_without_a_recording_the_page_opens_empty():
    assert step_view.on_open(None, "any") == run_handler.outputs()
