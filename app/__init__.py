"""Clover Studio's Gradio app: watch speculative decoding step by step.

Pure parts (no Gradio): :mod:`app.metrics` (numbers from traces) and :mod:`app.figures`
(traces -> Plotly figures and HTML). :mod:`app.runner` drives the decoding engine;
:mod:`app.ui` builds the ``gr.Blocks``. Importing this package loads no model.
"""
