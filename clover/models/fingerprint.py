"""The target's fingerprint: what heads record of the model they were trained for."""
from __future__ import annotations

import hashlib
import json

# the config fields that decide what a model computes (not its dtype, file format or
# generation defaults); floats are rounded so that a GGUF copy (float32 fields) and the
# hub's config.json give the same fingerprint
_ARCHITECTURE_FIELDS = ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
                        "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size",
                        "hidden_act", "activation_function", "tie_word_embeddings",
                        "max_position_embeddings", "n_positions", "sliding_window",
                        "rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon")


def _rounded(value):
    if isinstance(value, float):  # 1e-05 and 9.99999974e-06, 100000 and 100000.0 agree
        value = float(f"{value:.4g}")
        return int(value) if value.is_integer() else value
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in sorted(value.items())}
    if isinstance(value, (list, tuple)):
        return [_rounded(v) for v in value]
    return value


def target_fingerprint(config, tokenizer) -> dict[str, str]:
    """Two short hashes that tell whether draft heads were made for this target.

    Sizes alone cannot: two models with the hidden size and vocabulary size of
    SmolLM2-135M may still differ in layers, RoPE base or token ids. The fingerprint hashes
    the architecture config (the fields that decide what the model computes, plus RoPE
    parameters, floats rounded to 4 significant digits) and the tokenizer vocabulary (every
    token string and its id). It leaves out the dtype and the file format, so the embedded
    GGUF copy and the hub checkpoint in bf16 or fp32 share one fingerprint.

    Args:
        config: a transformers ``PretrainedConfig``.
        tokenizer: its tokenizer (``get_vocab()``).
    Returns:
        ``{"architecture": 16 hex digits, "vocabulary": 16 hex digits}``.
    """
    arch = {k: _rounded(getattr(config, k)) for k in _ARCHITECTURE_FIELDS
            if getattr(config, k, None) is not None}
    rope = getattr(config, "rope_parameters", None) or {}
    if not rope and getattr(config, "rope_theta", None) is not None:  # older configs
        rope = {"rope_theta": config.rope_theta, "rope_type": "default"}
    if rope:
        arch["rope"] = _rounded(dict(rope))
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])

    def digest(obj) -> str:
        return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return {"architecture": digest(arch), "vocabulary": digest(vocab)}
