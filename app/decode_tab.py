"""The Decode tab: settings, Run and Stop, the live tree, text and metrics of the watched
run, the step view the slider drives, and the per-depth bars, histogram and race after a
run.

This module lays the tab out (:func:`build`) and wires it; the handlers live apart: a run
and its state in :mod:`app.run_handler` (only Run needs the app's model key, so it is a
method of :class:`~app.run_handler.RunHandler`), the step view in :mod:`app.step_view`.
Per-visitor data lives in ``gr.State``; the handlers are plain functions of their inputs
(Gradio runs them in worker threads).
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

import gradio as gr

from app import figures, page_html, sample_run, step_panels
from app.metrics import run_stats
from app.registry import CORE_HEAD_KINDS, LoadedModel
from app.settings import DEFAULT_MAX_NEW_TOKENS, MAX_NEW_TOKENS
from clover.assets import assets_dir
from clover.methods import METHOD_LABELS
from app.run_handler import RUN_OUTPUTS, TIMING_NOTE, RunHandler, Visitor
from app.step_view import (PANEL_TITLES, SAME_POINT_CAPTION, on_browse, on_next, on_open, on_pick_trace,
                           on_pick_trace_panels, on_press, on_previous, on_step_panels, on_stop,
                           on_token)

log = logging.getLogger(__name__)

EXAMPLES_FILE = "examples.json"  # under clover.assets_dir(), read when the page is built

REPLAY_JS = (Path(__file__).parent / "race_replay.js").read_text()
# after a run the race replays by itself (texts and figure) when there is one to replay
AUTO_REPLAY_JS = ("() => { if (!document.querySelector('#text-race .race-row')) return []; "
                  f"return ({REPLAY_JS})(); }}")
PLAY_JS = """() => {
  if (window._cloverPlay) { clearInterval(window._cloverPlay); window._cloverPlay = null; return []; }
  const at = () => document.querySelector('#step-slider input[type=number]');
  window._cloverPlay = setInterval(() => {
    const box = at();
    if (!box || +box.value >= +box.max) {
      clearInterval(window._cloverPlay); window._cloverPlay = null; return;
    }
    document.querySelector('#next-step').click();
  }, 900);
  return [];
}"""
# Play's timer stopped: Run, the slider, Previous and a token click pause Play
STOP_PLAY = ("if (window._cloverPlay) { clearInterval(window._cloverPlay); "
             "window._cloverPlay = null; }")
# Run stops a playing Play (it would step through the new run), and on a narrow screen
# brings the results, which sit below the settings, into view
SHOW_RESULTS_JS = (f"() => {{ {STOP_PLAY} window._cloverRan = true; "
                   "if (window.innerWidth < 800) "
                   "document.querySelector('#status')?.scrollIntoView({behavior: 'smooth', "
                   "block: 'start'}); return []; }")
# a click on a generated token asks for the step that wrote it (a "select" event whose
# index is the token's data-step); the listener sits on the panel, so it outlives redraws
TOKEN_CLICK_JS = ("element.addEventListener('click', (e) => { const t = e.target.closest("
                  f"'[data-step]'); if (t) {{ {STOP_PLAY} trigger('select', {{index: "
                  "+t.dataset.step, value: t.dataset.step}); } });")
# for the slider and Previous (Next is what Play presses)
STOP_PLAY_JS = f"(...args) => {{ {STOP_PLAY} return args; }}"
# a fresh page plays the recorded run, unless Run was pressed before it had loaded (Play
# would then step through the visitor's own run)
OPEN_PLAY_JS = f"() => {{ if (window._cloverRan) return []; return ({PLAY_JS})(); }}"
OPEN_REPLAY_JS = f"() => {{ if (window._cloverRan) return []; return ({AUTO_REPLAY_JS})(); }}"


def load_examples() -> list[dict]:
    """Example prompts, one or more per task kind: [{"kind", "prompt"}, ...]."""
    return json.loads((assets_dir() / EXAMPLES_FILE).read_text(encoding="utf-8"))


def method_choices(loaded: LoadedModel) -> list[tuple[str, str]]:
    """The "Method to watch" choices (label, method): Clover, Medusa, prompt lookup and
    plain decoding, with Clover-2 after Clover when the model has Clover-2 heads."""
    extra = [(METHOD_LABELS[k], k) for k in loaded.head_kinds if k not in CORE_HEAD_KINDS]
    return [("Clover", "clover"), *extra, ("Medusa", "medusa"), ("Prompt lookup", "lookup"),
            ("Plain decoding", "ar")]


def page_sample(loaded: LoadedModel, examples: list[dict]) -> sample_run.SampleRun | None:
    """The recorded run a fresh page plays: the shipped one where it was recorded with
    this model and heads on the first example's prompt, else None (a damaged file is
    logged and skipped: the page works without it)."""
    try:
        sample = sample_run.load()
    except ValueError:
        log.warning("the recorded run is not shown", exc_info=True)
        return None
    if (sample is None or not examples or sample.prompt != examples[0]["prompt"]
            or sample.method not in sample.runs or not sample.fits(loaded)):
        return None
    return sample


def build(demo: gr.Blocks, loaded: LoadedModel, model_key: str, banner: gr.Markdown) -> None:
    """Lay out the Decode tab inside the current ``gr.Tab`` and wire its events.

    Args:
        demo: the page (a fresh page opens on the recorded run, :func:`app.step_view.on_open`).
        loaded: the app's default model (its methods and name fill the settings).
        model_key: its registry key (:func:`app.registry.register_model`).
        banner: the page's model notice, updated when a run loads another model.
    """
    examples = load_examples()
    sample = page_sample(loaded, examples)
    state = gr.State(None, time_to_live=3600)  # a visitor's traces, freed after an hour
    visitor = gr.State(Visitor())  # a copy per browser session
    with gr.Row(equal_height=False):
        with gr.Column(scale=4, min_width=330):
            prompt = gr.Textbox(
                examples[0]["prompt"] if examples else "", label="Prompt", lines=4,
                max_lines=14, elem_id="prompt",
                placeholder="Ask something, or pick an example below. For a "
                            "multi-turn chat write 'User: ...' / 'Assistant: ...' lines.")
            # right under the prompt, above every setting: one per task kind
            gr.Examples(examples=[[e["prompt"]] for e in examples], inputs=[prompt],
                        example_labels=[e["kind"] for e in examples],
                        label="Examples: one per task kind", examples_per_page=len(examples),
                        elem_id="examples")
            with gr.Row():
                run_btn = gr.Button("Run", variant="primary", elem_id="run-button")
                stop_btn = gr.Button("Stop", variant="stop", elem_id="stop-button")
            method = gr.Radio(method_choices(loaded), value="clover",
                              label="Method to watch", elem_id="method")
            lookup = gr.Checkbox(
                value=False, label="Add a prompt lookup branch to the heads' tree",
                elem_id="lookup",
                info="Medusa and Clover also draft what followed the last words "
                     "earlier in the prompt or answer (no training), in the same "
                     "tree, sized each step to what pays on this machine; "
                     "ringed nodes came from lookup.")
            temperature = gr.Slider(0.0, 2.0, value=0.0, step=0.05, label="Temperature",
                                    info="0 = greedy; above 0 = lossless speculative "
                                         "sampling")
            # a text box: a number box shows (and sends) 0 when empty, so every "random"
            # run would have been seed 0
            seed = gr.Textbox("", label="Seed", elem_id="seed", placeholder="random",
                              max_lines=1, info="for sampling; empty = a new random seed "
                                                "per run (shown after the run, to reproduce it)")
            max_new = gr.Number(value=DEFAULT_MAX_NEW_TOKENS, label="Max new tokens",
                                elem_id="max-new-tokens",
                                info=f"1 to {MAX_NEW_TOKENS}")
            tree = gr.Dropdown(
                ["auto", "4", "6", "10", "16", "24", "32"], value="auto",
                allow_custom_value=True, label="Tree budget (drafted tokens per step)",
                elem_id="tree-budget",
                info="auto (sized to this machine at start-up; the smallest tree where "
                     "no tree beats plain decoding here), a number, off, or a spec: "
                     "dynamic:budget=12,branching=4 · small · [[0],[1],[0,0]]")
            compare = gr.Checkbox(
                value=True, label="Compare with the other methods",
                info="Races plain decoding, prompt lookup and the other head types "
                     "alongside, one step of each in turn, for the speedups and the race.")
            with gr.Accordion("Model and heads", open=False):
                model_box = gr.Textbox(
                    "", label="Model: hub id or local folder",
                    placeholder=f"empty = {loaded.label}")
                heads_box = gr.Textbox(
                    "", label="Heads folder",
                    placeholder="empty = the model's shipped heads, else untrained heads",
                    info="A folder saved by save_pretrained, or one with medusa/, "
                         "clover/ and clover2/ subfolders.")
        with gr.Column(scale=7, min_width=480):
            status = gr.Markdown("Press **Run** to decode the prompt, or pick another example first.",
                                 elem_id="status")
            before = page_html.SpeedCard(None, "before")
            metrics = gr.HTML(page_html.metrics_html(
                "clover", run_stats([]), before, before, (), TIMING_NOTE),
                elem_id="metrics-panel")
            tree_plot = gr.Plot(figures.empty_figure(
                "The candidate tree of each step appears here"),
                show_label=False, elem_id="tree-plot")
            with gr.Row():
                step_slider = gr.Slider(1, 2, value=1, step=1, label="Revisit a step",
                                        interactive=False, elem_id="step-slider",
                                        scale=3)
                browse = gr.Radio([], label="Trace of", elem_id="browse", scale=2)
            with gr.Row():
                prev_btn = gr.Button("◀ Previous", size="sm", elem_id="previous-step")
                play_btn = gr.Button("▶ Play the steps", size="sm", elem_id="play-steps")
                next_btn = gr.Button("Next ▶", size="sm", elem_id="next-step")
            text = gr.HTML(page_html.tokens_html([]), elem_id="text-panel",
                           js_on_load=TOKEN_CLICK_JS)
            with gr.Accordion("The generated text, to copy", open=False):
                plain_text = gr.Textbox(show_label=False, lines=4, interactive=False,
                                        buttons=["copy"], elem_id="plain-text")
            with gr.Accordion("Clover and Medusa from the same text", open=True,
                              elem_id="panel-same-point"):
                gr.Markdown(SAME_POINT_CAPTION, elem_classes="panel-caption")
                with gr.Row(equal_height=False):
                    waiting = figures.empty_figure("After a run: both methods' trees from "
                                                   "the same text", height=140)
                    same_clover = gr.Plot(waiting, show_label=False, min_width=300,
                                          elem_id="same-point-clover")
                    same_medusa = gr.Plot(waiting, show_label=False, min_width=300,
                                          elem_id="same-point-medusa")
                same_text = gr.Markdown("", elem_id="same-point-text")
            panels = {}
            for name, title in PANEL_TITLES.items():
                with gr.Accordion(title, open=False, elem_id=f"panel-{name}"):
                    gr.Markdown(step_panels.CAPTIONS[name], elem_classes="panel-caption")
                    panels[name] = gr.Plot(figures.empty_figure(
                        "Run a prompt, then pick a step with the slider", height=140),
                        show_label=False, elem_id=f"{name}-plot")
                    if name == "speed":
                        speed_text = gr.Markdown("", elem_id="speed-reading")
    with gr.Row():
        accept_plot = gr.Plot(figures.empty_figure("Per-depth acceptance after a run"),
                              show_label=False, elem_id="acceptance-plot")
        hist_plot = gr.Plot(figures.empty_figure("Tokens per step after a run"),
                            show_label=False, elem_id="histogram-plot")
    text_race = gr.HTML(page_html.text_race_html({}), elem_id="text-race-panel")
    race_plot = gr.Plot(figures.empty_figure("The race of plain, Medusa and Clover "
                                             "after a run"),
                        show_label=False, elem_id="race-plot")
    replay_btn = gr.Button("▶ Replay the race", elem_id="replay-button", size="md")

    outputs = dict(status=status, banner=banner, metrics=metrics, tree=tree_plot, text=text,
                   plain=plain_text, slider=step_slider, browse=browse, accept=accept_plot,
                   hist=hist_plot, race=race_plot, textrace=text_race, state=state)
    run_outputs = [outputs[n] for n in RUN_OUTPUTS]
    run_inputs = [prompt, method, temperature, max_new, tree, compare, model_box, heads_box, seed,
                  lookup]
    on_run = RunHandler(model_key).on_run
    # the step view's folded panels, then both trees from the same text
    panel_outputs = [*panels.values(), speed_text, same_clover, same_medusa, same_text]
    # a press is counted at once, then the run waits its turn in the queue. Every press
    # and its run are accepted (trigger_mode "multiple" on each link of the chain): with
    # Gradio's default ("once") the run of a press made while another run is pending is
    # dropped after the press was counted, and Stop's bookkeeping, which cancels the
    # presses counted so far, would then cancel the next real run
    # on a narrow screen the results sit below the settings: bring them into view
    for trigger in (run_btn.click, prompt.submit):
        trigger(None, js=SHOW_RESULTS_JS, api_visibility="private")
    for trigger, api in ((run_btn.click, dict(api_name="run")),
                         (prompt.submit, dict(api_visibility="private"))):
        trigger(on_press, [visitor], None, api_visibility="private", concurrency_limit=None,
                show_progress="hidden", trigger_mode="multiple").then(
            on_run, run_inputs + [visitor], run_outputs, concurrency_limit=1,
            concurrency_id="decode", show_progress="hidden", trigger_mode="multiple", **api).then(
            None, js=AUTO_REPLAY_JS, api_visibility="private").then(
            on_step_panels, [step_slider, browse, state], panel_outputs,
            api_visibility="private", concurrency_limit=None, show_progress="hidden",
            trigger_mode="multiple")
    # Stop is cooperative: the run checks the flag between steps (at most one step away)
    # and draws its own final state; a queued run never starts; closing the page still
    # cancels the run outright.
    stop_btn.click(on_stop, [state, visitor], None, api_visibility="private",
                   concurrency_limit=None, show_progress="hidden")
    step_slider.input(on_browse, [step_slider, browse, state], [tree_plot, text, metrics, status],
                      api_visibility="private", concurrency_limit=None,
                      show_progress="hidden", trigger_mode="always_last", js=STOP_PLAY_JS)
    for button, fn in ((prev_btn, on_previous), (next_btn, on_next)):
        button.click(fn, [step_slider, browse, state],
                     [step_slider, tree_plot, text, metrics, status], api_visibility="private",
                     concurrency_limit=None, show_progress="hidden",
                     js=STOP_PLAY_JS if button is prev_btn else None).then(
            on_step_panels, [step_slider, browse, state], panel_outputs,
            api_visibility="private", concurrency_limit=None, show_progress="hidden")
    # Play presses Next every 0.9 s until the last step (a second press pauses)
    play_btn.click(None, js=PLAY_JS)
    # a click on a token of the text brings the step that wrote it
    text.select(on_token, [browse, state], [step_slider, tree_plot, text, metrics, status],
                api_visibility="private", concurrency_limit=None, show_progress="hidden").then(
        on_step_panels, [step_slider, browse, state], panel_outputs,
        api_visibility="private", concurrency_limit=None, show_progress="hidden")
    # a fresh page opens on the recorded run, its tree playing step by step and its
    # texts racing, before any press
    if sample is not None:
        def open_page():
            return on_open(sample, model_key)

        demo.load(open_page, None, run_outputs,
                  api_visibility="private", concurrency_limit=None,
                  show_progress="hidden").then(
            on_step_panels, [step_slider, browse, state], panel_outputs,
            api_visibility="private", concurrency_limit=None, show_progress="hidden").then(
            None, js=OPEN_PLAY_JS, api_visibility="private").then(
            None, js=OPEN_REPLAY_JS, api_visibility="private")
    browse.input(on_pick_trace, [browse, state], [step_slider, tree_plot, text, metrics, status],
                 api_visibility="private", concurrency_limit=None, show_progress="hidden")
    # the step panels follow the step view, as separate events so the tree never waits
    # for them
    step_slider.input(on_step_panels, [step_slider, browse, state], panel_outputs,
                      api_visibility="private", concurrency_limit=None,
                      show_progress="hidden", trigger_mode="always_last")
    browse.input(on_pick_trace_panels, [browse, state], panel_outputs, api_visibility="private",
                 concurrency_limit=None, show_progress="hidden")
    # the replay is drawn in the browser from the timelines the race figure carries: no
    # server work per frame, so replays never slow other visitors' runs
    replay_btn.click(None, js=REPLAY_JS)
