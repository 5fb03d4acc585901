"""Clover Studio's Gradio app: watch speculative decoding step by step.

Pure parts (no Gradio): :mod:`app.settings` (what a visitor typed, validated),
:mod:`app.metrics` (numbers from traces) and :mod:`app.figures` (traces -> Plotly
figures and HTML). :mod:`app.registry` keeps the loaded models, :mod:`app.runner` drives
the decoding engine; :mod:`app.ui` builds the ``gr.Blocks`` from one module per tab
(:mod:`app.decode_tab`, :mod:`app.explainer_tab`). Importing this package loads no model.
"""
