"""Clover-2 heads: the parts the design shares, drafting against its training forward,
greedy parity and lossless sampling, save/load."""
from __future__ import annotations

import json

import pytest
import torch

from clover import Engine, SamplingConfig, load_heads, new_heads, parse_tree_spec
from clover.heads import Clover2Heads, CloverHeads
from clover.models import decoder_layers
from conftest import perturb, tiny_target
from test_acceptance import V, draw_pairs, exact_two_token_joint, pooled_pvalue
from test_engine import ARCHS, TREES, plain, prompts


def test_heads_share_exactly_the_recurrent_weights():
    """One projector for head 1, one shared set (AttnDec2 + FC) for heads 2..K, and no
    other sharing: no module appears twice, no tensor backs two parameters."""
    target = tiny_target("llama")
    heads = new_heads("clover2", target, num_heads=4)
    params = list(heads.named_parameters(remove_duplicate=False))
    assert len({p.data_ptr() for _, p in params}) == len(params)
    names = {n.split(".")[0] for n, _ in params}
    assert names == {"decoder", "augment", "augment_norm", "first_fc", "recurrent_decoder",
                     "recurrent_fc", "head_norm"}
    z = torch.randn(3, target.hidden_size)
    toks = torch.tensor([[4, 5, 6], [7, 8, 9], [10, 11, 12]])  # tokens at depths 1..3

    def logits(h):
        out, r = [], z
        for k in range(4):
            r, lg = h.step(r, toks[k - 1] if k else toks[0], k, target)
            out.append(lg)
        return torch.stack(out)  # (K, n, V)

    before = logits(heads)
    with torch.no_grad():
        heads.recurrent_fc.weight.add_(0.1)
    after = logits(heads)
    assert torch.equal(after[0], before[0])  # head 1 does not use the shared projector
    assert all(not torch.allclose(after[k], before[k]) for k in range(1, 4))
    with torch.no_grad():
        heads.first_fc.weight.add_(0.1)
    again = logits(heads)
    assert not torch.allclose(again[0], after[0]) and torch.equal(again[1:], after[1:])


@pytest.mark.parametrize("arch", ARCHS)
def test_initialisation_from_the_target(arch):
    """Two augmenting layers, each a copy of the target's last layer; both norms start
    as the target's final norm; head 1 starts near the identity."""
    target = tiny_target(arch)
    heads = new_heads("clover2", target)
    assert heads.config.augment_layers == 2 and new_heads("clover", target).config.augment_layers == 1
    src = decoder_layers(target.base)[-1].state_dict()
    layers = decoder_layers(heads.augment)
    assert len(layers) == 2
    for layer in layers:
        for name, p in layer.state_dict().items():
            assert torch.equal(p, src[name]) and p.data_ptr() != src[name].data_ptr()
    for norm in (heads.augment_norm, heads.head_norm):
        assert torch.equal(norm.weight, target.final_norm.weight)
    w = heads.first_fc.weight
    assert torch.allclose(w, torch.eye(target.hidden_size), atol=0.011)
    assert torch.allclose(heads.recurrent_fc.weight[:, :target.hidden_size], w, atol=0.011)


def test_drafting_state_equals_the_training_forward():
    """Fed step by step, the drafter's Augmenting Block holds the same Z as one pass over
    the whole sequence, and its drafts equal the teacher-forced training forward."""
    target = tiny_target("llama")
    heads = perturb(new_heads("clover2", target, num_heads=3), 0.1)
    ids = torch.randint(2, 96, (1, 14), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        out = target.forward(ids, torch.arange(14)[None], None, None)
        pre, post = out.hidden_pre, out.hidden_post
        drafter = heads.drafter(target, parse_tree_spec("chain3"))
        tokens = ids[0].tolist()
        drafter.observe(pre[:5], post[:5], tokens[:5])  # prefill
        drafter.draft(tokens[5], 3)  # root: token 5
        drafter.observe(pre[5:8], post[5:8], tokens[5:8])  # accepted root, 6, 7
        drafter.observe(pre[8:11], post[8:11], tokens[8:11])  # a draft skipped (max_depth 0)
        tree = drafter.draft(tokens[11], 3)
        next_tokens = ids[:, 1:12]
        z = heads.context(pre[None, :11], next_tokens, None, 0, target)
        assert torch.allclose(drafter.z, z[0, -1], atol=1e-5)
        # head k's top-1 along the true continuation: the training forward at s = 10
        outs = heads.training_outputs(target, ids, pre[None], torch.tensor([0]), torch.tensor([10]))
        r = drafter.z[None]
        for k, (logits, g) in enumerate(outs):
            r, step_logits = heads.step(r, ids[0, 11 + k: 12 + k], k, target)
            assert torch.allclose(step_logits, logits, atol=1e-4)
        assert int(tree.tokens[1]) == int(outs[0][0].argmax())


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_parity(arch):
    target = tiny_target(arch)
    heads = perturb(new_heads("clover2", target, num_heads=3), scale=0.2, seed=1)
    for spec in TREES:
        engine = Engine(target, heads, parse_tree_spec(spec))
        for prompt in prompts(target.vocab_size):
            for n in (1, 16):
                out = engine.generate(prompt, n)
                assert out.token_ids == plain(target, prompt, n).token_ids, (arch, spec, len(prompt), n)
                assert out.method == "clover2"
                if n == 16:
                    assert max(len(s.nodes) for s in out.steps) > 1


def test_speculative_sampling_keeps_the_target_distribution():
    cfg = SamplingConfig(temperature=1.0)
    target = tiny_target("llama", vocab_size=V, seed=3)
    with torch.no_grad():  # flatten the tiny model's logits so many pairs occur
        target.lm_head.weight.mul_(0.25)
    prompt = [3, 1, 4, 1, 5]
    engine = Engine(target, perturb(new_heads("clover2", target), 0.3),
                    parse_tree_spec("dynamic:budget=6,topk=3"))
    counts = draw_pairs(engine, prompt, cfg, 2500)
    assert pooled_pvalue(counts, exact_two_token_joint(target, prompt, cfg)) > 1e-3


def test_save_and_reload_identical(tmp_path):
    target = tiny_target("llama")
    heads = perturb(new_heads("clover2", target, num_heads=4, draft_vocab=range(0, 96, 2)), 0.1)
    heads.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["kind"] == "clover2" and cfg["augment_layers"] == 2 and cfg["num_heads"] == 4
    assert cfg["target_fingerprint"] == target.fingerprint
    again = load_heads(tmp_path, target)
    assert isinstance(again, Clover2Heads) and Clover2Heads.from_pretrained(tmp_path, target) is not None
    with pytest.raises(ValueError, match="holds clover2 heads, not clover"):
        CloverHeads.from_pretrained(tmp_path, target)
    x, nxt = torch.randn(1, 6, target.hidden_size), torch.randint(0, 96, (1, 6))
    toks = torch.tensor([3, 4])
    with torch.inference_mode():
        z, z2 = heads.context(x, nxt, None, 0, target), again.context(x, nxt, None, 0, target)
        assert torch.equal(z, z2)
        for k in range(4):
            assert torch.equal(heads.step(z[0, :2], toks, k, target)[1], again.step(z[0, :2], toks, k, target)[1])
    prompt = prompts(96)[4]
    assert [s.nodes for s in Engine(target, heads).generate(prompt, 8).steps] == \
        [s.nodes for s in Engine(target, again).generate(prompt, 8).steps]
