"""The app over its API: launched on a free local port, driven with gradio_client, decoding
for real on the embedded model; and the explainer tab's Clover-2 figure."""
from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path

import pytest

from app import runner
from app.metrics import ACCEPTED, BONUS, REJECTED, ROOT
from app.ui import build_demo
from clover import Engine, encode_prompt
from conftest import BATCH_SWEEP, ScriptedHeads, oracle_tree_fn, serve, tiny_model, tiny_tokenizer


PROMPT = "Name three colours of the rainbow."
N = 20
# outputs of /run, in order
STATUS, BANNER, METRICS, TREE, TEXT, PLAIN = 0, 1, 2, 3, 4, 5


@pytest.fixture(scope="module")
def reference(embedded, one_thread):
    """Plain greedy output for PROMPT, computed with the engine directly."""
    ids = encode_prompt(embedded.tokenizer, PROMPT)
    return ids, Engine(embedded).generate(ids, N)


@pytest.fixture(scope="module")
def app_url(embedded, reference):
    """The app with oracle Clover heads (they draft the true continuation of PROMPT, so
    drafts get accepted) and the Medusa heads shipped for the embedded model."""
    from gradio_client import Client

    ids, ref = reference
    oracle = ScriptedHeads(embedded, oracle_tree_fn(ids + ref.token_ids, embedded.vocab_size))
    demo = build_demo(target=embedded, method_heads={"clover": oracle}, warm_up=False)
    url = serve(demo)
    yield url, Client(url, verbose=False)
    demo.close()


def run(client, prompt=PROMPT, method="clover", temperature=0.0, max_new=N, tree="auto",
        compare=True, model="", heads=""):
    job = client.submit(prompt, method, temperature, max_new, tree, compare, model, heads,
                        api_name="/run")
    streamed = list(job)
    return streamed, job.outputs()[-1]


def latest(streamed, index):
    """The last real value an output took (updates that skipped it are dicts)."""
    values = [o[index] for o in streamed if not (isinstance(o[index], dict)
                                                  and o[index].get("__type__") == "update")]
    return values[-1] if values else None


def tree_traces(value) -> dict:
    """Node traces of a streamed tree figure, by status."""
    assert isinstance(value, dict) and value["type"] == "plotly", value
    data = json.loads(value["plot"])["data"]
    return {t["meta"]: t for t in data if t.get("meta") in (ROOT, ACCEPTED, BONUS, REJECTED)}


def test_streams_trees_and_matches_plain_greedy(app_url, reference):
    _, client = app_url
    _, ref = reference
    # a fixed budget: the auto tree calibrates on other prompts, where these oracle heads
    # (they know PROMPT's continuation only) draft nothing right and so would be turned off
    streamed, final = run(client, tree="4")
    trees = [tree_traces(o[TREE]) for o in streamed if isinstance(o[TREE], dict)
             and o[TREE].get("type") == "plotly" and '"meta":"root"' in o[TREE]["plot"]]
    # one tree per Clover step at least (plus the after-run tree)
    assert len(trees) >= 3
    for t in trees:
        assert len(t[ROOT]["x"]) == 1 and len(t[BONUS]["x"]) == 1
    # some step accepted a path of drafted tokens, drawn from the root up to the bonus
    accepted = [t for t in trees if len(t[ACCEPTED]["x"]) >= 2]
    assert accepted
    t = accepted[0]
    assert sorted(t[ACCEPTED]["x"]) == list(range(1, len(t[ACCEPTED]["x"]) + 1))
    assert t[BONUS]["x"][0] == len(t[ACCEPTED]["x"]) + 1
    assert any(len(t[REJECTED]["x"]) > 0 for t in trees)
    # the final text is exactly plain greedy decoding's
    assert final[PLAIN] == ref.text
    assert "Done" in final[STATUS] and "exactly the same text" in final[STATUS]
    # live metrics were streamed; these oracle heads finish in fewer steps than a speedup
    # card needs, so the cards say so instead of showing a ratio of a few steps
    metrics = [o[METRICS] for o in streamed if isinstance(o[METRICS], str)]
    assert any("speedup vs plain" in m for m in metrics)
    assert final[METRICS].count('data-state="few"') == 2 and "shown after 8 steps" in final[METRICS]
    from app.metrics import reference_speedups

    assert f"Spec-Bench, idle: {reference_speedups('clover')[0]:.2f}×" in final[METRICS]
    text = latest(streamed, TEXT)
    assert "generated-text" in text and 'title="step 1: ' in text
    assert "accepted draft, depth 1" in text.split("generated-text")[1]
    assert "Medusa heads:** trained, shipped with the app" in latest(streamed, BANNER)


FIGURES = Path(__file__).resolve().parents[1] / "assets" / "figures"
SVG = "{http://www.w3.org/2000/svg}"


def svg_ids(root) -> list[str]:
    return [el.get("id") for el in root.iter() if el.get("id") is not None]


def test_clover2_figure_is_an_accessible_svg_with_its_own_ids():
    """The Clover-2 figure parses as SVG, is labelled by its own title and description,
    and shares no element id with the Clover/Medusa figure inlined on the same page."""
    from xml.etree import ElementTree

    root = ElementTree.parse(FIGURES / "clover2.svg").getroot()
    other = ElementTree.parse(FIGURES / "clover_vs_medusa.svg").getroot()
    assert root.tag == SVG + "svg"
    assert root.get("viewBox").split()[2] == "1000" and "width:100%" in root.get("style")
    title, desc = root.find(SVG + "title"), root.find(SVG + "desc")
    assert "Clover-2" in title.text and len(desc.text) > 100
    assert root.get("role") == "img"
    assert root.get("aria-labelledby").split() == [title.get("id"), desc.get("id")]
    ids = svg_ids(root)
    assert len(ids) == len(set(ids)) >= 5  # title, desc and three arrow markers
    assert not set(ids) & set(svg_ids(other))
    # every url(#...) reference (the arrow markers) points inside this figure
    text = (FIGURES / "clover2.svg").read_text(encoding="utf-8")
    refs = set(re.findall(r"url\(#([^)]+)\)", text))
    assert refs and refs <= set(ids)
    # the changes it marks, as clover/heads/clover2.py implements them
    for words in ("Attention Decoder 1", "2 decoder layers", "own KV cache", "lm_head",
                  "Regressive Connection", "SmoothL1", "shared set of weights"):
        assert words in text, words


def test_explainer_tab_shows_the_clover2_figure_below_the_first():
    import gradio as gr

    from app import explainer_tab

    with gr.Blocks() as demo:
        explainer_tab.build()
    blocks = {b.elem_id: b for b in demo.blocks.values() if b.elem_id}
    order = list(blocks)
    assert order.index("diagram") < order.index("clover2-diagram")
    svg = (FIGURES / "clover2.svg").read_text(encoding="utf-8")
    assert svg in blocks["clover2-diagram"].value
    assert svg not in blocks["diagram"].value
    text = blocks["clover2-explainer"].value
    assert "## Clover-2: what changed" in text
    assert 4 <= sum(line.startswith("- ") for line in text.splitlines()) <= 6
    assert "overfit" in text and "only when trained Clover-2" in text


def _explainer_blocks() -> dict:
    import gradio as gr

    from app import explainer_tab

    with gr.Blocks() as demo:
        explainer_tab.build()
    return {b.elem_id: b for b in demo.blocks.values() if b.elem_id}


def test_explainer_at_scale_without_a_committed_sweep_says_so(tmp_path, monkeypatch):
    """No assets/bench/batch_sweep.json: the text and a one-line note, no empty plot."""
    import gradio as gr

    from clover import assets_dir

    (tmp_path / "figures").symlink_to(assets_dir() / "figures")  # the diagrams, no sweep
    monkeypatch.setenv("CLOVER_ASSETS_DIR", str(tmp_path))
    blocks = _explainer_blocks()
    order = list(blocks)
    assert order.index("clover2-explainer") < order.index("at-scale-explainer") < order.index("at-scale-missing")
    assert "## At scale: batched serving" in blocks["at-scale-explainer"].value
    assert "Table 1" in blocks["at-scale-explainer"].value and "CPU" in blocks["at-scale-explainer"].value
    assert "not committed yet" in blocks["at-scale-missing"].value
    assert len(blocks["at-scale-missing"].value.splitlines()) == 1
    assert "at-scale-plot" not in blocks and "at-scale-command" not in blocks
    assert not [b for b in blocks.values() if isinstance(b, gr.Plot)]


def test_explainer_at_scale_draws_the_committed_sweep_with_its_command(tmp_path, monkeypatch):
    """A committed sweep (here conftest's hand-written fixture) is drawn by
    clover.bench.batch_sweep_figure, with the command that made it beneath; nothing runs."""
    from clover.bench import BATCH_SWEEP_FILE

    path = tmp_path / BATCH_SWEEP_FILE
    path.parent.mkdir()
    path.write_text(json.dumps(BATCH_SWEEP))
    from clover import assets_dir

    (tmp_path / "figures").symlink_to(assets_dir() / "figures")
    monkeypatch.setenv("CLOVER_ASSETS_DIR", str(tmp_path))
    monkeypatch.setattr(Engine, "generate_batch", lambda *a, **k: pytest.fail("the app re-ran the sweep"))
    blocks = _explainer_blocks()
    assert "at-scale-missing" not in blocks
    order = list(blocks)
    assert order.index("at-scale-explainer") < order.index("at-scale-plot") < order.index("at-scale-command")
    plot = json.loads(blocks["at-scale-plot"].value["plot"])
    speedups = {t["meta"]: t["y"] for t in plot["data"] if t.get("yaxis") == "y2"}
    assert speedups == {"ar": [1.0, 1.0], "hf-generate": [0.9, 0.95], "clover": [1.6, 1.1]}
    assert f"`{BATCH_SWEEP['meta']['command']}`" in blocks["at-scale-command"].value


def test_served_app_has_the_clover2_figure(app_url):
    import urllib.request

    url, _ = app_url
    with urllib.request.urlopen(url.rstrip("/") + "/config", timeout=30) as r:
        config = json.load(r)
    values = {c["props"].get("elem_id"): c["props"].get("value") for c in config["components"]}
    assert '<title id="c2-title">' in values["clover2-diagram"]
    assert '<title id="t">' in values["diagram"]
    assert "Clover-2: what changed" in values["clover2-explainer"]


def test_clear_messages_for_bad_input(app_url):
    _, client = app_url
    for kwargs, words in (
        (dict(prompt="   "), "The prompt is empty"),
        (dict(max_new=0), "Max new tokens must be a whole number from 1 to 512"),
        (dict(max_new=2.5), "whole number"),
        (dict(tree="banana"), "The tree setting 'banana' is not understood"),
        (dict(prompt="x " * 9000), "shorter than the model's context of 8192"),
        (dict(model="/no/such/model"), "Could not load the model '/no/such/model'"),
        (dict(heads="/no/such/heads"), "The heads folder /no/such/heads does not exist"),
    ):
        _, final = run(client, **kwargs)
        assert words in final[STATUS], (kwargs, final[STATUS])
        assert "Traceback" not in final[STATUS]
    # widgets reject out-of-range values with their own message
    job = client.submit(PROMPT, "clover", -1.0, N, "auto", True, "", "", api_name="/run")
    with pytest.raises(Exception, match="less than minimum value 0"):
        job.result()


def test_model_without_heads_says_so(app_url, tmp_path, one_thread):
    _, client = app_url
    folder = tmp_path / "tiny-llama"
    tiny_model("llama", vocab_size=96).save_pretrained(folder)
    tiny_tokenizer(96).save_pretrained(folder)
    streamed, final = run(client, prompt="t5 t6 t7", max_new=6, model=str(folder))
    banner = latest(streamed, BANNER)
    assert "tiny-llama" in banner and "Untrained draft heads" in banner
    assert "Done" in final[STATUS]


def test_visitors_get_their_own_runs_never_at_once(app_url, embedded, monkeypatch):
    url, _ = app_url
    from gradio_client import Client

    active, peak, lock = [0], [0], threading.Lock()
    decode = runner.decode

    def counting(*args, **kwargs):  # counts steps being computed (a visitor's methods
        run = decode(*args, **kwargs)  # race in lockstep: their runs are open together)
        while True:
            with lock:
                active[0] += 1
                peak[0] = max(peak[0], active[0])
            try:
                item = next(run)
            except StopIteration:
                return
            finally:
                with lock:
                    active[0] -= 1
            yield item

    monkeypatch.setattr(runner, "decode", counting)
    other = "Say hello in French."
    a, b = Client(url, verbose=False), Client(url, verbose=False)
    job_a = a.submit(PROMPT, "clover", 0, 10, "auto", True, "", "", api_name="/run")
    job_b = b.submit(other, "medusa", 0, 10, "auto", False, "", "", api_name="/run")
    out_a, out_b = job_a.result(), job_b.result()
    assert peak[0] == 1  # no two steps (of any visitor's runs) decoded at the same time
    for out, prompt in ((out_a, PROMPT), (out_b, other)):
        ids = encode_prompt(embedded.tokenizer, prompt)
        assert out[PLAIN] == Engine(embedded).generate(ids, 10).text
        assert "Done" in out[STATUS]


@pytest.mark.timing
def test_cancel_stops_decoding_promptly(app_url, monkeypatch):
    _, client = app_url
    active = []  # engine runs not yet closed
    decode = runner.decode

    def tracked(*args, **kwargs):
        active.append(1)
        try:
            yield from decode(*args, **kwargs)
        finally:
            active.pop()

    monkeypatch.setattr(runner, "decode", tracked)
    job = client.submit(PROMPT, "ar", 0, 400, "auto", False, "", "", api_name="/run")
    deadline = time.time() + 120
    while len(job.outputs()) < 4 and time.time() < deadline:
        time.sleep(0.05)
    assert len(job.outputs()) >= 4, "the run never started streaming"
    job.cancel()
    t0 = time.time()
    while active and time.time() - t0 < 10:
        time.sleep(0.05)
    assert not active
    assert time.time() - t0 < 5


@pytest.mark.timing
def test_app_answers_within_a_minute_on_a_busy_machine(embedded, tmp_path):
    """`python app.py` on a machine kept busy by two CPU hogs answers on its port within
    60 s: the auto tree is sized in the background (here with no stored calibration)."""
    import os
    import socket
    import subprocess
    import sys
    import urllib.request
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # the converted model is reused; the auto-tree store starts empty
    cache = Path(os.environ.get("CLOVER_CACHE_DIR") or Path.home() / ".cache" / "clover-studio")
    for item in cache.iterdir():
        if item.is_dir():
            (tmp_path / item.name).symlink_to(item)
    env = {**os.environ, "CLOVER_CACHE_DIR": str(tmp_path), "HF_HUB_OFFLINE": "1",
           "GRADIO_ANALYTICS_ENABLED": "False"}
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    app = subprocess.Popen([sys.executable, "app.py", "--port", str(port)], cwd=root, env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        start, answered = time.monotonic(), None
        while time.monotonic() - start < 90 and app.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as r:
                    if r.status == 200:
                        answered = time.monotonic() - start
                        break
            except OSError:
                time.sleep(1)
        assert app.poll() is None, app.stderr.read()
        assert answered is not None and answered < 60, answered
    finally:
        for p in hogs + [app]:
            p.kill()
            p.wait()


def test_the_examples_one_per_task_kind_none_loops(embedded, one_thread):
    """The page's examples: one per task kind, each with its own label, and none on which
    the embedded model falls into a loop (no 6-token sequence three times) in the page's
    default 64 greedy tokens. The first one fills the prompt when the page opens."""
    from app.decode_tab import load_examples
    from app.settings import DEFAULT_MAX_NEW_TOKENS

    examples = load_examples()
    kinds = [e["kind"] for e in examples]
    assert len(kinds) == len(set(kinds)) >= 6
    for e in examples:
        ids = Engine(embedded).generate(encode_prompt(embedded.tokenizer, e["prompt"]),
                                        DEFAULT_MAX_NEW_TOKENS).token_ids
        grams = [tuple(ids[i:i + 6]) for i in range(len(ids) - 5)]
        assert max((grams.count(g) for g in grams), default=0) < 3, e["kind"]
