"""transformers' SDPA attention without copying grouped KV heads under a tree mask.

Models with grouped-query attention (SmolLM2: 9 query heads share 3 KV heads) hand
PyTorch's ``scaled_dot_product_attention`` the KV heads as they are (``enable_gqa``) only
when no attention mask is given (a single query is regrouped instead); with a mask over
several queries, transformers 5 first copies every cached key and value once per query
head (``repeat_kv``). Verification always passes the tree attention mask, so each verify
step copied the whole KV cache of every layer. PyTorch's CPU kernel takes a float mask
together with ``enable_gqa``, so this attention function passes both; everything else is
transformers' own ``sdpa_attention_forward``. (transformers' process-wide switch
``TRANSFORMERS_SDPA_FORCE_GQA=1`` would do the same for every model in the process, GPU
ones included, where a mask with GQA falls back to a slow kernel; this is per model.)

Measured on the 2-core development VM (SmolLM2-135M, 256 cached tokens): a forward over
2 / 5 tokens takes 33 / 52 ms instead of 36 / 56 ms. Registered with transformers'
``AttentionInterface`` (and the SDPA mask builder) as :data:`NAME`; see
https://huggingface.co/docs/transformers/attention_interface.
"""
from __future__ import annotations

import torch

NAME = "clover_sdpa"


def gqa_sdpa_attention(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                       attention_mask: torch.Tensor | None, dropout: float = 0.0,
                       scaling: float | None = None, **kwargs):
    """An ``AttentionInterface`` function: query (B, H, T, d), key and value (B, H_kv, S, d),
    attention_mask None or (B or 1, 1, T, S) additive float -> ((B, T, H, d), None)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = getattr(module, "num_key_value_groups", 1)
    plain_case = (attention_mask is not None and attention_mask.dtype.is_floating_point
                  and attention_mask.shape[-1] == key.shape[-2]
                  and groups > 1 and query.device.type == "cpu"
                  and kwargs.get("position_bias") is None and kwargs.get("softcap") is None
                  and kwargs.get("s_aux") is None and kwargs.get("sinks") is None)
    if not plain_case:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout,
        scale=scaling, enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


def register() -> str:
    """Register :func:`gqa_sdpa_attention` and its mask builder with transformers (idempotent);
    returns the implementation name to pass to ``model.set_attn_implementation``."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, gqa_sdpa_attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    return NAME


def use_gqa_sdpa(model) -> bool:
    """Switch a transformers model with grouped KV heads that runs "sdpa" attention on the
    CPU to :func:`gqa_sdpa_attention`, in place; returns whether it switched. Models
    without grouped KV heads, on other devices or attention backends, and architectures
    that cannot switch attention functions are left as they are."""
    cfg = model.config
    kv_heads = getattr(cfg, "num_key_value_heads", None)
    heads = getattr(cfg, "num_attention_heads", None)
    if (getattr(cfg, "_attn_implementation", None) != "sdpa" or model.device.type != "cpu"
            or not kv_heads or not heads or kv_heads >= heads):
        return False
    can_switch = getattr(model, "_can_set_attn_implementation", None)
    if can_switch is None or not can_switch():
        return False
    model.set_attn_implementation(register())
    return cfg._attn_implementation == NAME
