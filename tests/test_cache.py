"""KV-cache compaction: after verification the cache equals plain decoding's."""
from __future__ import annotations

import torch
from transformers import DynamicCache

from clover.cache import cache_length, compact_cache, crop_cache
from clover.tree import position_ids, tree_mask
from conftest import tiny_target


def fake_cache(n_layers=2, T=9):
    cache = DynamicCache()
    for layer in range(n_layers):
        k = torch.arange(T, dtype=torch.float32).view(1, 1, T, 1).expand(1, 2, T, 3) + 100 * layer
        cache.update(k.clone(), -k.clone(), layer)
    return cache


def test_compact_gathers_accepted_rows():
    cache = fake_cache(T=4 + 6)  # prefix 4, tree of 6 nodes
    compact_cache(cache, 4, [0, 2, 5])
    assert cache_length(cache) == 7
    for i, layer in enumerate(cache.layers):
        assert layer.keys[0, 0, :, 0].tolist() == [x + 100 * i for x in [0, 1, 2, 3, 4, 6, 9]]
        assert layer.values[0, 1, :, 2].tolist() == [-(x + 100 * i) for x in [0, 1, 2, 3, 4, 6, 9]]


def test_compact_chain_is_crop_and_crop():
    cache = fake_cache(T=8)
    compact_cache(cache, 3, [0, 1, 2])
    assert cache.layers[0].keys[0, 0, :, 0].tolist() == [0, 1, 2, 3, 4, 5]
    crop_cache(cache, 2)
    assert cache_length(cache) == 2


def test_compacted_cache_equals_plain_cache():
    """Verify a branching tree, keep a non-chain path; the cache must equal a plain
    prefill of the same tokens, and the next logits must match."""
    target = tiny_target("llama")
    seq = torch.randint(2, 96, (1, 12), generator=torch.Generator().manual_seed(0))
    prefix = 6
    with torch.inference_mode():
        cache = DynamicCache()
        target.forward(seq[:, :prefix], torch.arange(prefix)[None], None, cache)
        # tree: root=seq[6]; children: x (wrong), seq[7]; seq[7] -> y, seq[8]; seq[8] -> seq[9]
        tokens = torch.tensor([[seq[0, 6], 5, seq[0, 7], 7, seq[0, 8], seq[0, 9]]])
        parents = [-1, 0, 0, 2, 2, 4]
        depths = [0, 1, 1, 2, 2, 3]
        out = target.forward(tokens, position_ids(depths, prefix, "cpu"),
                             tree_mask(parents, prefix, torch.float32, "cpu"), cache)
        compact_cache(cache, prefix, [0, 2, 4, 5])
        ref_cache = DynamicCache()
        ref = target.forward(seq[:, :10], torch.arange(10)[None], None, ref_cache)
        # tree logits along the accepted path equal plain logits
        assert torch.allclose(out.logits[[0, 2, 4, 5]], ref.logits[6:10], atol=1e-5)
        for a, b in zip(cache.layers, ref_cache.layers):
            assert torch.allclose(a.keys, b.keys, atol=1e-5)
            assert torch.allclose(a.values, b.values, atol=1e-5)
        nxt = torch.tensor([[seq[0, 10]]])
        o1 = target.forward(nxt, torch.tensor([[10]]), None, cache)
        o2 = target.forward(nxt, torch.tensor([[10]]), None, ref_cache)
        assert torch.allclose(o1.logits, o2.logits, atol=1e-5)
