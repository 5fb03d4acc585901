"""KV-cache bookkeeping for tree verification.

After verification the target's cache holds the committed prefix followed by every tree
node. Only the accepted path may stay: :func:`compact_cache` moves the accepted nodes'
keys and values right after the prefix and drops the rest, so the cache again equals
what plain decoding would have built (Medusa arXiv 2401.10774 §2.1.2, "tree
attention"; the same bookkeeping as its ``update_inference_inputs``).

Works on transformers' ``DynamicCache`` (layers holding ``keys`` / ``values`` tensors of
shape (B, H, T, hs)); other cache types raise a clear error.
"""
from __future__ import annotations

import torch
from transformers import DynamicCache


def _layers(cache) -> list:
    layers = getattr(cache, "layers", None)
    if layers is None:
        raise TypeError(f"unsupported KV cache type {type(cache).__name__}; use DynamicCache")
    for layer in layers:
        if not hasattr(layer, "keys") or getattr(layer, "is_sliding", False):
            raise TypeError(
                f"unsupported KV cache layer {type(layer).__name__}: tree verification needs "
                "full (non-sliding) dynamic layers"
            )
    return layers


def new_cache(model_config) -> DynamicCache:
    """An empty dynamic KV cache for a model."""
    return DynamicCache(config=model_config)


def cache_length(cache) -> int:
    """Number of cached positions T."""
    return cache.get_seq_length()


def crop_cache(cache, length: int) -> None:
    """Keep the first ``length`` positions of every layer (in place)."""
    for layer in _layers(cache):
        if layer.keys is not None and layer.keys.shape[-2] > length:
            layer.keys = layer.keys[..., :length, :]
            layer.values = layer.values[..., :length, :]


def compact_cache(cache, prefix_len: int, accepted: list[int]) -> None:
    """Keep the prefix and the accepted tree nodes, in path order (in place).

    Args:
        cache: a DynamicCache holding ``prefix_len + N`` positions after verifying a
            tree of N nodes.
        prefix_len: cached positions before the tree.
        accepted: accepted node ids, root first (node ids index the tree's flattened
            order, so node i sits at position ``prefix_len + i``).

    When the path is ``[0, 1, ..., m]`` (a chain, the common case) this is a crop;
    otherwise the accepted rows are gathered into place first.
    """
    keep = prefix_len + len(accepted)
    if accepted != list(range(len(accepted))):
        src = torch.tensor(accepted, device=_layers(cache)[0].keys.device) + prefix_len
        for layer in _layers(cache):
            # (B, H, m, hs) gathered, written after the prefix
            layer.keys[..., prefix_len:keep, :] = layer.keys.index_select(-2, src)
            layer.values[..., prefix_len:keep, :] = layer.values.index_select(-2, src)
    crop_cache(cache, keep)
