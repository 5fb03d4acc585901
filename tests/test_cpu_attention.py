"""The GQA-aware SDPA attention equals transformers' own SDPA attention."""
import types

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from clover.kernels.attention import NAME, gqa_sdpa_attention
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


def test_other_cases_are_transformers_own_sdpa():
    """Bool masks, one KV head per query head and no mask all go to transformers' code."""
    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, 4, 3, 8, generator=g)
    k = torch.randn(1, 2, 5, 8, generator=g)
    v = torch.randn(1, 2, 5, 8, generator=g)
    bool_mask = torch.ones(1, 1, 3, 5, dtype=torch.bool).tril(diagonal=2)
    for groups, mask, kk, vv in ((2, bool_mask, k, v), (2, None, k, v),
                                 (1, tree_mask([-1, 0, 1], 2, torch.float32, "cpu"),
                                  k.repeat_interleave(2, 1), v.repeat_interleave(2, 1))):
        module = types.SimpleNamespace(num_key_value_groups=groups, is_causal=True)
        ours, _ = gqa_sdpa_attention(module, q, kk, vv, mask, scaling=0.3)
        ref, _ = sdpa_attention_forward(module, q, kk, vv, mask, scaling=0.3)
        assert torch.equal(ours, ref)


def test_models_without_grouped_kv_heads_keep_sdpa():
    assert tiny_target("gpt2").model.config._attn_implementation != NAME
