"""The Gradio app: one page with two tabs, as Gradio's own multi-tab demos are built.
A thin UI over the pure parts:

- :mod:`app.settings`: what a visitor typed, validated;
- :mod:`app.registry`: the loaded models (read-only, shared by every visitor);
- :mod:`app.runner`: runs of the engine, one method after another;
- :mod:`app.figures` / :mod:`app.metrics`: traces -> pictures and numbers;
- one module per tab: :mod:`app.decode_tab` and :mod:`app.explainer_tab`.

Each visitor's runs and traces live in ``gr.State``. Decoding events share one
concurrency slot, so two methods (or two visitors' runs) never decode at the same time.
"""
from __future__ import annotations

import uuid

import gradio as gr

from app import decode_tab, explainer_tab, registry

CSS = """
#status { min-height: 2.2em; }
#text-panel [data-step] { cursor: pointer; }
#tree-plot, #race-plot { border-radius: 8px; }
.gradio-container { max-width: 1400px !important; }
#explainer { max-width: 940px; margin: 0 auto; }
/* Gradio pulses the border of every output while a run streams: an endless animation
   that a browser on the same small machine paints during every timed step */
.generating { animation: none !important; }
"""


def launch_options() -> dict:
    """Theme and CSS for ``demo.launch(**launch_options(), ...)`` (Gradio 6 takes them
    at launch, not in ``gr.Blocks``)."""
    return dict(theme=gr.themes.Soft(primary_hue="emerald", neutral_hue="slate"), css=CSS)


def build_demo(model: str | None = None, heads: str | None = None, *, target=None,
               method_heads: dict | None = None, warm_up: bool | str = "background") -> gr.Blocks:
    """Build the app.

    Args:
        model: hub id or local folder of the target (default: the embedded
            SmolLM2-135M-Instruct). Ignored when ``target`` is given.
        heads: a heads folder (or one with medusa/, clover/ and clover2/ subfolders);
            default: the heads shipped for the embedded model, else freshly initialised
            heads. Clover-2 is offered only where this folder holds Clover-2 heads.
        target: an already loaded :class:`clover.TargetModel` (tests, notebooks).
        method_heads: already built heads per method, e.g. {"clover": ..., "medusa": ...}.
        warm_up: size the auto trees and decode two tokens per method once, so the first
            timings are fair: "background" (default) serves at once and does it in a
            thread (stored sizes are reused at once), True before returning, False never.
    Raises:
        ValueError: when the model or heads cannot be loaded (a message for the user).
    """
    if target is None:
        target = registry.open_target(model)
    key = f"app-{uuid.uuid4().hex[:8]}"
    loaded = registry.register_model(key, target, heads=method_heads, heads_dir=heads,
                                     label=registry.target_label(target, model),
                                     warm_up=warm_up)
    with gr.Blocks(title="Clover Studio") as demo:
        gr.Markdown(
            "# Clover Studio\n"
            "Watch **Clover** speculative decoding write text step by step: the candidate tree "
            "the draft heads proposed, the branch the target model accepted, the bonus token it "
            "added, and the speed against plain decoding and **Medusa** on the same prompt.")
        banner = gr.Markdown(loaded.notice(), elem_id="model-notice")
        with gr.Tabs():
            with gr.Tab("Decode", id="decode"):
                decode_tab.build(demo, loaded, key, banner)
            with gr.Tab("How Clover works", id="explainer"):
                explainer_tab.build()
    demo.queue(max_size=64)
    return demo
