"""Clover Studio's Gradio app: ``python app.py`` serves it on http://127.0.0.1:7860.

On a Hugging Face Space (``app_file: app.py``) the same file runs as is. Building the
demo loads the model (the embedded one by default); launching happens only under
``__main__``, so tests and tools can import this file and get ``demo``.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

from app import zerogpu  # noqa: E402  (the app/ package)

# ZeroGPU (Hugging Face): an explicit setting, read here once, before the app is built
zerogpu.configure(os.environ.get("CLOVER_ZEROGPU", os.environ.get("SPACES_ZERO_GPU", "")))

from app.ui import build_demo, launch_options  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None,
                        help="hub id or local folder (default: embedded SmolLM2-135M-Instruct)")
    parser.add_argument("--heads", default=None,
                        help="heads folder, or a folder with medusa/, clover/ and clover2/ "
                             "subfolders (default: shipped heads, else freshly initialised heads; "
                             "Clover-2 is offered only when this folder holds Clover-2 heads)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=7860)
    return parser.parse_args(argv)


args = parse_args(sys.argv[1:] if __name__ == "__main__" else [])
logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
try:
    demo = build_demo(args.model, args.heads)
except ValueError as e:  # a model or heads that cannot load: say so, no stack trace
    sys.exit(f"app.py: error: {e}")

if __name__ == "__main__":
    demo.launch(server_name=args.host, server_port=args.port, **launch_options())
