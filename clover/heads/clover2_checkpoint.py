"""Load the released Clover-2 checkpoints as ``clover2`` heads (``../shared/CLOVER2.md`` §3).

The Clover-2 reference code (github XiaoBin1992/clover) saves the whole ``Clover2Model``
state dict; its authors published two, for Llama-family targets (F32 safetensors):

* ``BinXiao/clover-2-vicuna-7b-v1.5`` for ``lmsys/vicuna-7b-v1.5``;
* ``BinXiao/clover-2-llama-3-8b-instruct`` for ``meta-llama/Meta-Llama-3-8B-Instruct``.

A checkpoint folder holds ``config.json`` (a one-layer Llama config of the draft plus a
``"clover"`` block: ``num_heads``, ``num_layers``, ...) and ``model.safetensors``. Its keys
map onto :class:`~clover.heads.clover2.Clover2Heads` as follows (``*``: the rest of the
name; inside both Attention Decoders ``q``/``k``/``v`` become ``w_q``/``w_k``/``w_v`` and
``input_layernorm`` becomes ``norm``):

=================================  =========================
released                           ours
=================================  =========================
``layers.{i}.*``                   ``augment.layers.{i}.*``
``layer.*`` / ``layer2.*`` (older)  ``augment.layers.0.*`` / ``augment.layers.1.*``
``clover_norm.*``                  ``augment_norm.*``
``clover_head_mlp_rnn.*``          ``decoder.*``
``clover_head_mlp.*``              ``first_fc.*``
``clover_head_mlp_rnn2.*``         ``recurrent_decoder.*``
``clover_head_mlp2.*``             ``recurrent_fc.*``
``clover_head_norm.*``             ``head_norm.*``
``lm_head.weight``,                not loaded: frozen copies of the target's lm_head,
``clover_embed_tokens.weight``     compared with it instead
=================================  =========================

Quirks kept (CLOVER2.md §3-4): the Augmenting Block uses RoPE base 10000 whatever the
target's (the reference's draft config drops ``rope_theta``, so Llama-3's 500000 is
ignored) and the checkpoint's own ``rms_norm_eps`` (1e-6 for Vicuna, whose base uses
1e-5); both are recorded in ``HeadConfig.augment_config``. Checkpoints that hold both the
older and the current layer names take the current ones. The reference loads with
``strict=False``, failing silently; here every missing, unexpected or misshapen key is an
error, and so is a checkpoint made for another target.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from safetensors.torch import load_file

from clover.heads.clover2 import Clover2Heads

log = logging.getLogger(__name__)

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
# the released layer names -> ours, by prefix (each ends with a dot, so none is a prefix
# of another)
PREFIXES = {
    "layers.": "augment.layers.",
    "layer.": "augment.layers.0.",  # before commit 45d45b5
    "layer2.": "augment.layers.1.",
    "clover_norm.": "augment_norm.",
    "clover_head_mlp_rnn.": "decoder.",
    "clover_head_mlp.": "first_fc.",
    "clover_head_mlp_rnn2.": "recurrent_decoder.",
    "clover_head_mlp2.": "recurrent_fc.",
    "clover_head_norm.": "head_norm.",
}
OLD_PREFIXES = ("layer.", "layer2.")
# parts of the reference ResAttentionBlock -> our AttentionDecoder
DECODER_PARTS = {"q": "w_q", "k": "w_k", "v": "w_v", "input_layernorm": "norm"}
# frozen copies of the target's lm_head
FROZEN_KEYS = ("lm_head.weight", "clover_embed_tokens.weight")
# ours, never in a release: the Augmenting Block's one-row token embedding (it reads
# hidden states, never token ids)
NATIVE_ONLY_PREFIX = "augment.embed_tokens."
# sizes the checkpoint's config must share with the target's
SIZE_FIELDS = ("hidden_size", "vocab_size", "intermediate_size", "num_attention_heads",
               "num_key_value_heads")
# the reference Augmenting Block's RoPE (CLOVER2.md §4 item 2)
RELEASED_ROPE = {"rope_type": "default", "rope_theta": 10000.0}
# largest relative difference (Frobenius) between the checkpoint's lm_head copy and the
# target's: a bf16 cast differs by ~0.3%, another model by far more
LM_HEAD_TOLERANCE = 1e-2


def native_name(key: str) -> str | None:
    """Our state-dict name for a released key; None for a key with no counterpart."""
    for old, new in PREFIXES.items():
        if key.startswith(old):
            rest = key[len(old):]
            if new in ("decoder.", "recurrent_decoder."):
                part, dot, tail = rest.partition(".")
                if part not in DECODER_PARTS:
                    return None
                rest = DECODER_PARTS[part] + dot + tail
            return new + rest
    return None


def released_name(name: str) -> str:
    """The current released key for one of our state-dict names (inverse of :func:`native_name`)."""
    for old, new in PREFIXES.items():
        if old not in OLD_PREFIXES and name.startswith(new):
            rest = name[len(new):]
            if new in ("decoder.", "recurrent_decoder."):
                part, dot, tail = rest.partition(".")
                rest = {v: k for k, v in DECODER_PARTS.items()}.get(part, part) + dot + tail
            return old + rest
    return name


def read_released(path: str | Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """The config dict and the CPU state dict of a released checkpoint folder.

    Raises:
        FileNotFoundError: when ``path`` lacks ``config.json`` or ``model.safetensors``.
        ValueError: when the config has no ``"clover"`` block (not a Clover-2 checkpoint).
    """
    path = Path(path)
    if not (path / CONFIG_FILE).is_file() or not (path / WEIGHTS_FILE).is_file():
        raise FileNotFoundError(f"no released Clover-2 checkpoint in {path}: expected "
                                f"{CONFIG_FILE} and {WEIGHTS_FILE} (download the hub folder first)")
    config = json.loads((path / CONFIG_FILE).read_text())
    if not isinstance(config.get("clover"), dict):
        raise ValueError(f"{path / CONFIG_FILE} has no 'clover' block: not a Clover-2 checkpoint")
    return config, load_file(str(path / WEIGHTS_FILE))


def check_target(config: dict, target, where: str) -> None:
    """Refuse a checkpoint whose config does not describe ``target``'s architecture.

    Raises:
        ValueError: naming every size or model type that differs.
    """
    want = {k: config.get(k) for k in SIZE_FIELDS}
    if want["num_key_value_heads"] is None:  # absent in Vicuna's: no grouped-query attention
        want["num_key_value_heads"] = want["num_attention_heads"]
    have = {k: getattr(target.config, k, None) for k in SIZE_FIELDS}
    have["vocab_size"] = target.vocab_size
    problems = [f"{k} {want[k]} != target's {have[k]}" for k in SIZE_FIELDS if want[k] != have[k]]
    model_type = config.get("model_type", "llama")
    if target.config.model_type != model_type:
        problems.insert(0, f"model type {model_type!r} != target's {target.config.model_type!r}")
    if problems:
        raise ValueError(f"the Clover-2 checkpoint in {where} was made for another target and "
                         f"does not fit {target.name!r}: " + "; ".join(problems))


def relative_difference(a: torch.Tensor, b: torch.Tensor, rows: int = 8192) -> float:
    """||a - b|| / ||b|| (Frobenius), in float32, ``rows`` rows at a time."""
    diff = norm = 0.0
    for i in range(0, b.shape[0], rows):
        x, y = a[i: i + rows].float(), b[i: i + rows].to(a.device).float()
        diff += float((x - y).pow(2).sum())
        norm += float(y.pow(2).sum())
    return (diff / max(norm, 1e-30)) ** 0.5


def map_state(state: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], where: str):
    """Released state dict -> ours, strictly.

    Args:
        expected: our heads' state dict (names and shapes to fill).
    Returns:
        our state dict for every expected key but :data:`NATIVE_ONLY_PREFIX`'s.
    Raises:
        ValueError: listing missing, unexpected and misshapen keys.
    """
    mapped: dict[str, torch.Tensor] = {}
    source: dict[str, str] = {}
    unexpected, superseded = [], []
    for key in sorted(state, key=lambda k: k.startswith(OLD_PREFIXES)):  # current names first
        if key in FROZEN_KEYS:
            continue
        name = native_name(key)
        if name is None or name not in expected:
            unexpected.append(key)
        elif name in mapped:  # an older name beside the current one
            superseded.append(key)
            if not torch.equal(state[key], mapped[name]):
                log.warning("%s: %s differs from %s; using %s", where, key, source[name], source[name])
        else:
            mapped[name], source[name] = state[key], key
    missing = [released_name(k) for k in expected
               if k not in mapped and not k.startswith(NATIVE_ONLY_PREFIX)]
    missing += [k for k in FROZEN_KEYS if k not in state]
    shapes = [f"{source[k]} {tuple(v.shape)} != {tuple(expected[k].shape)}"
              for k, v in mapped.items() if v.shape != expected[k].shape]
    if superseded:
        log.info("%s: took the current layer names over the older %s", where, superseded)
    if missing or unexpected or shapes:
        def some(names):
            return ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
        parts = [f"{what} ({len(names)}): {some(names)}" for what, names in
                 (("missing keys", missing), ("unexpected keys", unexpected), ("wrong shapes", shapes))
                 if names]
        raise ValueError(f"the Clover-2 checkpoint in {where} does not match its config: " + "; ".join(parts))
    return mapped


def load_released_clover2(path: str | Path, target) -> Clover2Heads:
    """Released Clover-2 weights (a downloaded hub folder) as ``clover2`` heads for ``target``.

    The heads then behave like any others: ``heads.save_pretrained(dir)`` writes them in
    this project's format (config and safetensors with the target's fingerprint, without
    the 1 GB of lm_head copies), which :func:`clover.heads.load_heads` reads.

    Raises:
        FileNotFoundError: ``path`` holds no checkpoint.
        ValueError: not a Clover-2 checkpoint; made for another target (model type,
            sizes, vocabulary, or an lm_head that is not the target's); missing,
            unexpected or misshapen keys.
    """
    from clover.heads import new_heads

    where = str(path)
    config, state = read_released(path)
    check_target(config, target, where)
    for key in FROZEN_KEYS:
        if key in state and state[key].shape == target.lm_head.weight.shape:
            diff = relative_difference(state[key], target.lm_head.weight.detach())
            if diff > LM_HEAD_TOLERANCE:
                raise ValueError(
                    f"the Clover-2 checkpoint in {where} was made for another target: its {key} "
                    f"differs from {target.name!r}'s lm_head by {diff:.1%} (at most "
                    f"{LM_HEAD_TOLERANCE:.0%} expected, e.g. from a dtype cast)")
    clover = config["clover"]
    eps = float(config.get("rms_norm_eps", 1e-6))
    heads = new_heads("clover2", target, num_heads=int(clover.get("num_heads", 5)),
                      augment_layers=int(clover.get("num_layers", 2)), norm_eps=eps,
                      augment_config={"rope_parameters": dict(RELEASED_ROPE), "rms_norm_eps": eps})
    expected = heads.state_dict()
    mapped = map_state(state, expected, where)
    heads.load_state_dict({**expected, **mapped})
    return heads.eval().requires_grad_(False)
