"""The GQA-aware SDPA attention equals transformers' own SDPA attention."""
import types

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from clover.cpu_attention import NAME, gqa_sdpa_attention
from clover.tree import tree_mask
from conftest import tiny_target


def test_matches_transformers_sdpa_under_a_tree_mask():
    g = torch.Generator().manual_seed(0)
    module = types.SimpleNamespace(num_key_value_groups=3, is_causal=True)
    prefix, parents = 7, [-1, 0, 0, 1, 2]
    q = torch.randn(1, 6, len(parents), 16, generator=g)
    k = torch.randn(1, 2, prefix + len(parents), 16, generator=g)
    v = torch.randn(1, 2, prefix + len(parents), 16, generator=g)
    mask = tree_mask(parents, prefix, torch.float32, "cpu")
    ours, _ = gqa_sdpa_attention(module, q, k, v, mask, scaling=0.25)
    ref, _ = sdpa_attention_forward(module, q, k, v, mask, scaling=0.25)
    assert ours.shape == (1, len(parents), 6, 16)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-6)


def test_target_models_with_grouped_kv_switch_to_it():
    target = tiny_target("llama")  # 4 query heads share 2 KV heads
    assert target.model.config._attn_implementation == NAME
