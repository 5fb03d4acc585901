"""Greedy parity on the embedded SmolLM2-135M-Instruct (fp32, CPU)."""
from __future__ import annotations

import pytest
import torch

from clover import Engine, encode_prompt, new_heads, parse_tree_spec
from clover.heads import heads_for
from clover.methods import HEAD_KINDS
from conftest import ScriptedHeads, oracle_tree_fn, perturb


PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about autumn leaves.",
    "Explain in two sentences why the sky is blue.",
    "List three uses of a paperclip.",
    "Translate to French: The cat sleeps on the warm windowsill.",
    "If I have 3 apples and buy 5 more, how many apples do I have?",
]
N = 32


@pytest.fixture(scope="module")
def references(embedded):
    refs = {}
    for p in PROMPTS:
        ids = encode_prompt(embedded.tokenizer, p)
        refs[p] = (ids, Engine(embedded).generate(ids, N).token_ids)
    return refs


def assert_same_or_near_tie(target, prompt_ids, got, want, tol=1e-4):
    """Equal token for token, or the first difference is a logit near-tie."""
    if got == want:
        return
    i = next(k for k, (a, b) in enumerate(zip(got, want)) if a != b)
    with torch.inference_mode():
        logits = target.model(torch.tensor([prompt_ids + want[:i]])).logits[0, -1].float()
    top2 = logits.topk(2).values
    assert (top2[0] - top2[1]).item() < tol, f"flip at token {i} is not a near-tie"


@pytest.mark.parametrize("kind", ["medusa", "clover"])
@pytest.mark.parametrize("spec", ["dynamic", "small"])
def test_heads_parity_on_embedded(embedded, references, kind, spec):
    heads = perturb(new_heads(kind, embedded), scale=0.02, seed=2)
    engine = Engine(embedded, heads, parse_tree_spec(spec))
    for p, (ids, ref) in references.items():
        out = engine.generate(ids, N)
        assert_same_or_near_tie(embedded, ids, out.token_ids, ref)


@pytest.mark.parametrize("kind", HEAD_KINDS)
def test_default_heads_parity_on_embedded(embedded, references, kind):
    """The CLI's default heads (the shipped ones) keep greedy output."""
    engine = Engine(embedded, heads_for(kind, embedded)[0], parse_tree_spec("dynamic"))
    for p, (ids, ref) in list(references.items())[:3]:
        assert_same_or_near_tie(embedded, ids, engine.generate(ids, N).token_ids, ref)


def test_multi_token_acceptance_on_embedded(embedded, references):
    for i, (p, (ids, ref)) in enumerate(references.items()):
        heads = ScriptedHeads(embedded, oracle_tree_fn(ids + ref, embedded.vocab_size, seed=i))
        out = Engine(embedded, heads).generate(ids, N)
        assert_same_or_near_tie(embedded, ids, out.token_ids, ref)
        assert out.mean_accepted_length > 1.5


def test_eos_and_one_token_prompt_on_embedded(embedded, references):
    ids, ref = references[PROMPTS[0]]
    plain = Engine(embedded).generate(ids, 64)
    assert plain.stop_reason == "eos" and plain.token_ids[-1] in embedded.eos_token_ids
    heads = ScriptedHeads(embedded, oracle_tree_fn(ids + plain.token_ids, embedded.vocab_size,
                                                   hit_rate=1.0))
    out = Engine(embedded, heads).generate(ids, 64)
    assert out.token_ids == plain.token_ids and out.stop_reason == "eos"
    one = [ids[-1]]
    want = Engine(embedded).generate(one, 16).token_ids
    for kind in ("medusa", "clover"):
        got = Engine(embedded, perturb(new_heads(kind, embedded), 0.02)).generate(one, 16).token_ids
        assert_same_or_near_tie(embedded, one, got, want)


def test_over_long_prompt_on_embedded(embedded):
    with pytest.raises(ValueError, match="context"):
        Engine(embedded).generate([100] * (embedded.max_context + 1), 8)


def test_shipped_heads_fit_the_embedded_model_under_its_hub_name(embedded):
    """The Space loads SmolLM2-135M-Instruct by hub id: the shipped heads (trained on the
    GGUF copy) are chosen by fingerprint, and say so."""
    from clover.heads import SHIPPED, heads_for
    from clover.models import EMBEDDED_HUB_ID, EMBEDDED_NAME

    for kind in HEAD_KINDS:  # every kind ships trained heads for the embedded model
        heads, source = heads_for(kind, embedded)
        assert source == SHIPPED and heads.config.target_fingerprint == embedded.fingerprint
    try:
        embedded.name = EMBEDDED_HUB_ID
        heads, source = heads_for("clover", embedded)
        assert source == f"{SHIPPED} (trained on the embedded GGUF copy)"
    finally:
        embedded.name = EMBEDDED_NAME


@pytest.mark.parametrize("method", ["lookup", "medusa+lookup", "clover+lookup"])
def test_lookup_parity_on_embedded(embedded, references, method):
    """Prompt lookup alone and as a branch of the shipped heads' trees: the plain greedy
    text on the embedded model, with lookup tokens really accepted on a copying prompt."""
    from clover import engine_for

    engine = engine_for(method, embedded, parse_tree_spec("dynamic:budget=6"))
    for p, (ids, want) in references.items():
        assert_same_or_near_tie(embedded, ids, engine.generate(ids, N).token_ids, want)
    copy = encode_prompt(embedded.tokenizer, "Repeat exactly: the quick brown fox jumps over the lazy dog.")
    res = engine.generate(copy, 16)
    assert res.token_ids == Engine(embedded).generate(copy, 16).token_ids
    assert any(step.nodes[i].source in ("lookup", "both") for step in res.steps for i in step.accepted[1:])


def test_batched_rows_on_embedded(embedded, references):
    """A batch of all six prompts (different lengths): each row decodes its own greedy
    output; row 0 stops on EOS, row 5 at its own max_new_tokens first."""
    from clover import engine_for

    rows = [references[p][0] for p in PROMPTS]
    caps = [64, N, N, N, N, 16]
    eos_run = Engine(embedded).generate(rows[0], 64)
    assert eos_run.stop_reason == "eos" and len(eos_run.token_ids) < 64
    want = [eos_run.token_ids] + [references[p][1][:cap] for p, cap in zip(PROMPTS[1:], caps[1:])]
    engines = {"ar": Engine(embedded),
               "clover": Engine(embedded, heads_for("clover", embedded)[0], parse_tree_spec("dynamic")),
               "medusa+lookup": engine_for("medusa+lookup", embedded, parse_tree_spec("dynamic:budget=6"))}
    for name, engine in engines.items():
        outs = engine.generate_batch(rows, caps)
        for b, (ids, out) in enumerate(zip(rows, outs)):
            assert_same_or_near_tie(embedded, ids, out.token_ids, want[b])
        assert outs[0].stop_reason == "eos", name
        assert outs[5].stop_reason == "length" and len(outs[5].token_ids) == 16, name
