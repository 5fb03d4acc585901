"""Settings for notebooks executed as tests: offline, no telemetry, fast mode.

`python -m pytest` collects tests/ and, through nbmake, executes notebooks/*.ipynb; the
notebook kernels inherit this environment (CLOVER_NOTEBOOK_FAST=1: fewer prompts,
tokens and steps).
"""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("CLOVER_NOTEBOOK_FAST", "1")


def pytest_collection_modifyitems(config, items):
    """Notebooks load the embedded model: mark them so (``-m "not model"`` skips them)."""
    import pytest

    for item in items:
        if str(item.fspath).endswith(".ipynb"):
            item.add_marker(pytest.mark.model)
