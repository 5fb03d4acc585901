"""Greedy parity and stopping: speculative output equals plain greedy output."""
from __future__ import annotations

import pytest
import torch

from clover import Engine, SamplingConfig, TreeConfig, new_heads, parse_tree_spec
from conftest import ScriptedHeads, oracle_tree_fn, perturb, tiny_target

ARCHS = ["llama", "qwen2", "gpt2"]
TREES = ["dynamic", "dynamic:budget=16,branching=4", "small", "chain3"]


def prompts(vocab, n=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = [1, 2, 5, 9, 17, 30][:n]
    return [torch.randint(2, vocab, (L,), generator=g).tolist() for L in lengths]


def plain(target, prompt, n):
    return Engine(target).generate(prompt, n)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("kind", ["medusa", "clover"])
def test_heads_greedy_parity(arch, kind):
    target = tiny_target(arch)
    heads = perturb(new_heads(kind, target, num_heads=3), scale=0.2, seed=1)
    for spec in TREES:
        engine = Engine(target, heads, parse_tree_spec(spec))
        for prompt in prompts(target.vocab_size):
            for n in (1, 16):
                ref = plain(target, prompt, n)
                out = engine.generate(prompt, n)
                assert out.token_ids == ref.token_ids, (arch, kind, spec, len(prompt), n)
                assert len(out.token_ids) == n
                # branching trees were really drafted after the first step
                if n == 16:
                    assert max(len(s.nodes) for s in out.steps) > 1


@pytest.mark.parametrize("arch", ARCHS)
def test_padded_verification_changes_nothing(arch):
    """Steps verified with padding tokens (``verify_widths``) give the same text, accepted
    paths and target probabilities as unpadded ones, greedy and sampled; batched steps
    are left unpadded."""
    from clover import engine_for

    target = tiny_target(arch)
    heads = perturb(new_heads("clover", target, num_heads=3), scale=0.2, seed=1)
    tree = parse_tree_spec("dynamic:budget=6,branching=2")
    base = Engine(target, heads, tree)
    padded = Engine(target, heads, tree, verify_widths=[k + 5 for k in range(1, 8)])
    for prompt in prompts(target.vocab_size, n=4):
        for sampling in (None, SamplingConfig(temperature=1.0, seed=3)):
            want, got = base.generate(prompt, 12, sampling), padded.generate(prompt, 12, sampling)
            assert got.token_ids == want.token_ids
            assert [s.accepted for s in got.steps] == [s.accepted for s in want.steps]
            for a, b in zip(got.steps, want.steps):
                assert [n.target_prob for n in a.nodes] == pytest.approx([n.target_prob for n in b.nodes], abs=1e-5)
    rows = padded.generate_batch(prompts(target.vocab_size, n=3), 8)
    assert [r.token_ids for r in rows] == [base.generate(p, 8).token_ids for p in prompts(target.vocab_size, n=3)]
    with pytest.raises(ValueError, match="verify_widths"):
        Engine(target, heads, tree, verify_widths=[1, 1])
    measured = engine_for("clover", target, tree, pad_verify=True)
    assert len(measured.verify_widths) == measured.max_step_tokens == 7
    assert all(w >= k for k, w in enumerate(measured.verify_widths, 1))
    from clover import LookupConfig  # a lookup chain is sized by what a padded step costs
    hybrid = engine_for("clover+lookup", target, tree, lookup=LookupConfig(max_tokens=4, costs=(9.0,) * 5),
                        pad_verify=True)
    assert len(hybrid.verify_widths) == 7 + 4 and len(hybrid.lookup.costs) == 5
    assert hybrid.lookup.costs != (9.0,) * 5 and list(hybrid.lookup.costs) == sorted(hybrid.lookup.costs)


@pytest.mark.parametrize("arch", ARCHS)
def test_multi_token_acceptance_parity(arch):
    """Trees that contain the true continuation at random ranks: long, non-chain paths
    are accepted and the KV cache is compacted by gathering; output must not change."""
    target = tiny_target(arch)
    for i, prompt in enumerate(prompts(target.vocab_size)):
        ref = plain(target, prompt, 40)
        heads = ScriptedHeads(target, oracle_tree_fn(prompt + ref.token_ids, target.vocab_size, seed=i))
        out = Engine(target, heads).generate(prompt, 40)
        assert out.token_ids == ref.token_ids
        assert out.mean_accepted_length > 1.5
        # some accepted path skipped the first child: the gather branch of compaction ran
        assert any(s.accepted != list(range(len(s.accepted))) for s in out.steps)


@pytest.mark.parametrize("arch", ARCHS)
def test_eos_inside_drafted_block(arch):
    target = tiny_target(arch)
    prompt = prompts(target.vocab_size)[3]
    ref = plain(target, prompt, 30).token_ids
    eos = ref[12]  # a token generated mid-way; plain decoding must stop at its first use
    target.eos_token_ids = {eos}
    ref_eos = plain(target, prompt, 30)
    first = ref.index(eos)
    assert ref_eos.token_ids == ref[: first + 1] and ref_eos.stop_reason == "eos"
    heads = ScriptedHeads(target, oracle_tree_fn(prompt + ref, target.vocab_size, seed=3, hit_rate=1.0))
    out = Engine(target, heads).generate(prompt, 30)
    assert out.token_ids == ref_eos.token_ids and out.stop_reason == "eos"
    # the trace counts only what was committed, wherever in the block the EOS came
    last = out.steps[-1]
    assert last.new_tokens[-1] == eos and last.stop_reason == "eos"
    assert last.accepted_length == len(last.new_tokens)
    assert sum(s.accepted_length for s in out.steps) == len(out.token_ids)


def test_max_new_tokens_never_overshot():
    target = tiny_target("llama")
    for prompt in prompts(target.vocab_size):
        ref = plain(target, prompt, 64).token_ids
        heads = ScriptedHeads(target, oracle_tree_fn(prompt + ref, target.vocab_size, hit_rate=1.0))
        for n in (1, 2, 3, 7, 16):
            out = Engine(target, heads).generate(prompt, n)
            assert out.token_ids == ref[:n] and out.stop_reason == "length"


def test_stop_strings_like_plain():
    target = tiny_target("llama")
    prompt = prompts(target.vocab_size)[2]
    ref = plain(target, prompt, 30).token_ids
    stop = target.tokenizer.decode(ref[8:10])  # two generated tokens, " "-joined
    p = Engine(target).generate(prompt, 30, stop_strings=[stop])
    heads = ScriptedHeads(target, oracle_tree_fn(prompt + ref, target.vocab_size, hit_rate=1.0))
    s = Engine(target, heads).generate(prompt, 30, stop_strings=[stop])
    assert p.stop_reason == "stop_string" and stop in p.text
    assert s.token_ids == p.token_ids and s.stop_reason == "stop_string"


def test_trace_records():
    target = tiny_target("llama")
    heads = perturb(new_heads("clover", target), 0.2)
    prompt = prompts(target.vocab_size)[4]
    run = Engine(target, heads, TreeConfig(budget=8, branching=3)).stream(prompt, 12)
    steps = list(run)
    result = run.result
    assert steps == result.steps and steps[-1].finished
    assert sum(len(s.new_tokens) for s in steps) == len(result.token_ids) == 12
    assert steps[-1].total_tokens == 12
    for s in steps:
        ids = [n.id for n in s.nodes]
        assert ids == list(range(len(s.nodes)))
        assert s.nodes[0].parent == -1 and s.accepted[0] == 0
        for n in s.nodes[1:]:
            assert 0 <= n.parent < n.id and n.depth == s.nodes[n.parent].depth + 1
            assert 0.0 <= n.draft_prob <= 1.0 and 0.0 <= n.target_prob <= 1.0
        assert all(s.nodes[b].parent == a for a, b in zip(s.accepted, s.accepted[1:]))
        assert s.draft_ms >= 0 and s.verify_ms > 0
        # the parts: verification is the forward then acceptance; drafting holds the update
        assert s.forward_ms > 0 and s.accept_ms > 0 and 0 < s.update_ms <= s.draft_ms
        assert s.forward_ms + s.accept_ms == pytest.approx(s.verify_ms)
        assert 0 < s.bonus_prob <= 1.0
        if s.bonus_committed:
            assert s.new_tokens[-1] == s.bonus_token and s.new_tokens[:-1] == [
                s.nodes[i].token_id for i in s.accepted[1:]]
        else:  # generation ended inside the accepted block: only the last step
            assert s is steps[-1] and s.new_tokens == [s.nodes[i].token_id for i in s.accepted[1:]]
    assert all(not s.finished for s in steps[:-1])
    assert result.decode_s == pytest.approx(sum(s.draft_ms + s.verify_ms for s in steps) / 1e3)
    summary = result.summary()
    assert summary["new_tokens"] == 12 and summary["tokens_per_second"] > 0
    assert summary["mean_accepted_length"] == pytest.approx(12 / len(steps))


def test_bad_input_errors():
    target = tiny_target("llama")
    engine = Engine(target)
    with pytest.raises(ValueError, match="empty"):
        engine.generate([], 4)
    with pytest.raises(ValueError, match="max_new_tokens"):
        engine.generate([3, 4], 0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        engine.generate([3, 4], -2)
    with pytest.raises(ValueError, match="context"):
        engine.generate([3] * 300, 4)
    with pytest.raises(ValueError, match="context"):
        engine.generate([3] * 250, 10)
    with pytest.raises(ValueError, match="vocabulary"):
        engine.generate([3, 10_000], 4)
    with pytest.raises(ValueError, match="temperature"):
        SamplingConfig(temperature=-1)
    with pytest.raises(ValueError, match="temperature > 0"):
        SamplingConfig(acceptance="sample")
    # the engine still works after the errors
    assert len(engine.generate([3, 4], 3).token_ids) == 3


def test_heads_for_another_model_rejected():
    small = tiny_target("llama", vocab_size=96)
    other = tiny_target("llama", vocab_size=80)
    heads = new_heads("medusa", other)
    with pytest.raises(ValueError, match="do not fit"):
        Engine(small, heads)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_multi_layer_clover_heads_stay_exact_beside_other_heads(arch):
    """Clover heads with fuse_layers make the target pack layer 0's output into its
    features; they draft from it (zeroing the projection changes the drafts), greedy
    output stays plain greedy's alone and batched, and heads that read the last layer
    only (Medusa, Clover-2) on the same target are unaffected."""
    target = tiny_target(arch)
    refs = {len(p): plain(target, p, 16).token_ids for p in prompts(target.vocab_size)}
    fused = perturb(new_heads("clover", target, num_heads=3, fuse_layers=[0]), scale=0.2, seed=1)
    assert target.feature_layers == (0,)
    with torch.no_grad():
        fused.fuse.weight.normal_(0, 0.5)
    others = [perturb(new_heads(kind, target, num_heads=3), scale=0.2, seed=2) for kind in ("medusa", "clover2")]
    for heads in [fused, *others]:
        engine = Engine(target, heads, parse_tree_spec("dynamic:budget=8,branching=2"))
        for prompt in prompts(target.vocab_size):
            assert engine.generate(prompt, 16).token_ids == refs[len(prompt)], (heads.config.kind, len(prompt))
        batch = engine.generate_batch(prompts(target.vocab_size), 16)
        assert [r.token_ids for r in batch] == [refs[len(p)] for p in prompts(target.vocab_size)]
    prompt = prompts(target.vocab_size)[4]
    first = Engine(target, fused).generate(prompt, 4).steps[0].nodes
    with torch.no_grad():
        fused.fuse.weight.zero_()
    again = Engine(target, fused).generate(prompt, 4).steps[0].nodes
    assert [n.draft_prob for n in first] != [n.draft_prob for n in again]
    with pytest.raises(ValueError, match="already packs layers \\[0\\]"):
        target.capture_layers([1])
    with pytest.raises(ValueError, match="must lie in 0..0"):
        tiny_target(arch).capture_layers([1])
