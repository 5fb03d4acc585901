"""What the trace says agrees with what was committed: generation that ends inside an
accepted block (EOS, stop string, max_new_tokens) and characters that span several tokens."""
from __future__ import annotations

import pytest
import torch

from app import figures, metrics
from clover import Engine
from clover.models import TextStream
from clover.trace import acceptance_rates
from conftest import ScriptedHeads, chain_fn, tiny_target

@pytest.fixture(scope="module")
def case():
    """A tiny target, a prompt, and its plain greedy continuation whose 8th token does
    not occur among the first 7 (so it can serve as an EOS that first appears there)."""
    target = tiny_target("llama")
    g = torch.Generator().manual_seed(0)
    for _ in range(50):
        prompt = torch.randint(2, target.vocab_size, (6,), generator=g).tolist()
        ref = Engine(target).generate(prompt, 20).token_ids
        if ref[7] not in ref[:7]:
            return target, prompt, ref
    raise AssertionError("no suitable prompt")


def check_totals(result):
    """Every per-step figure sums to the committed tokens."""
    steps = result.steps
    assert sum(s.accepted_length for s in steps) == len(result.token_ids)
    assert [t for s in steps for t in s.new_tokens] == result.token_ids
    assert all(s.accepted_length == len(s.new_tokens) == len(s.new_text) for s in steps)
    counts = metrics.accepted_length_counts(steps)
    assert sum(k * v for k, v in counts.items()) == len(result.token_ids)
    assert len(metrics.token_origins(steps)) == len(result.token_ids)
    for s in steps:
        drafts = [s.nodes[i].token_id for i in s.accepted[1:]]
        assert s.new_tokens == drafts + ([s.bonus_token] if s.bonus_committed else [])
        assert all(s.nodes[b].parent == a for a, b in zip(s.accepted, s.accepted[1:]))
        placed = figures.tree_layout(s)
        assert (figures.BONUS in {p.status for p in placed}) == s.bonus_committed
        assert f"→ {len(s.new_tokens)} token" in figures.step_title(s)


def test_eos_inside_an_accepted_block(case):
    target, prompt, ref = case
    eos = ref[7]
    target.eos_token_ids = {eos}
    try:
        heads = ScriptedHeads(target, chain_fn(prompt + ref))
        out = Engine(target, heads).generate(prompt, 20)
        plain = Engine(target).generate(prompt, 20)
    finally:
        target.eos_token_ids = set()
    assert out.token_ids == plain.token_ids == ref[:8] and out.stop_reason == "eos"
    check_totals(out)
    assert metrics.accepted_length_counts(out.steps) == {5: 1, 3: 1}
    last = out.steps[-1]
    assert last.stop_reason == "eos" and last.finished and not last.bonus_committed
    assert len(last.accepted) == 4 and len(last.cut) == 1  # depths 1-3 committed, depth 4 cut
    assert metrics.node_statuses(last)[last.cut[0]] == metrics.CUT
    # depth 4 of the last step was verified but never committed: it counts nowhere
    assert metrics.acceptance_by_depth(out.steps) == [(1, 2, 2), (2, 2, 2), (3, 2, 2), (4, 1, 1)]
    # the bench's rates are the same counts (one definition): 0.0 where nothing was drafted
    assert acceptance_rates(out.steps, 5) == [1.0, 1.0, 1.0, 1.0, 0.0]
    assert "end of sequence" in figures.step_title(last)


@pytest.mark.parametrize("n, counts", [(8, {5: 1, 3: 1}), (4, {4: 1}), (10, {5: 2})])
def test_max_new_tokens_inside_an_accepted_block(case, n, counts):
    target, prompt, ref = case
    out = Engine(target, ScriptedHeads(target, chain_fn(prompt + ref))).generate(prompt, n)
    assert out.token_ids == ref[:n] and out.stop_reason == "length"
    check_totals(out)
    assert metrics.accepted_length_counts(out.steps) == counts
    # the engine drafts no deeper than the tokens still allowed, so the limit never cuts
    assert all(s.bonus_committed and not s.cut for s in out.steps)


def test_stop_string_inside_an_accepted_block(case):
    target, prompt, ref = case
    stop = target.tokenizer.decode(ref[5:7])
    plain = Engine(target).generate(prompt, 20, stop_strings=[stop])
    out = Engine(target, ScriptedHeads(target, chain_fn(prompt + ref))).generate(
        prompt, 20, stop_strings=[stop])
    assert out.token_ids == plain.token_ids and out.stop_reason == "stop_string"
    check_totals(out)
    assert out.steps[-1].stop_reason == "stop_string"
    assert "a stop string" in figures.step_title(out.steps[-1])


def test_step_text_joins_to_the_output(case):
    target, prompt, ref = case
    out = Engine(target, ScriptedHeads(target, chain_fn(prompt + ref))).generate(prompt, 13)
    pieces = [t for s in out.steps for t in s.new_text]
    assert "".join(pieces) == target.tokenizer.decode(out.token_ids)


def test_trace_records_what_verify_saw_and_where(case):
    """Each node carries the target's own top tokens after it (greedy accepts the child
    whose token is the first of them, and the bonus token is the first after the last
    accepted node), and each step says where its tree sat in the KV cache: the prompt but
    its last token, then every earlier step's accepted path."""
    from clover.trace import TARGET_TOP

    target, prompt, ref = case
    out = Engine(target, ScriptedHeads(target, chain_fn(prompt + ref))).generate(prompt, 13)
    assert out.steps[0].prefix_length == len(prompt) - 1
    for a, b in zip(out.steps, out.steps[1:]):
        assert b.prefix_length == a.prefix_length + len(a.accepted)
    for s in out.steps:
        for n in s.nodes:
            assert len(n.target_top) == TARGET_TOP
            probs = [p for _, _, p in n.target_top]
            assert probs == sorted(probs, reverse=True) and 0 < probs[0] <= 1
            assert all(text == target.tokenizer.decode([t]) for t, text, _ in n.target_top)
        for child in s.accepted[1:]:
            node = s.nodes[child]
            assert node.token_id == s.nodes[node.parent].target_top[0][0]
            assert node.target_prob == pytest.approx(s.nodes[node.parent].target_top[0][2])
        assert s.bonus_token == s.nodes[(s.accepted + s.cut)[-1]].target_top[0][0]


# ---------------------------------------------------------------- multi-token characters


@pytest.fixture(scope="module")
def byte_tokenizer():
    """A byte-level BPE tokenizer trained here on ASCII only, so every emoji, CJK or
    accented character is several byte tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["Emoji row: the quick brown fox jumps over the lazy dog."] * 20,
                            trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>")


TEXTS = ["Emoji row: 🦙 🦙 🦙 🦙", "naïve café, 東京", "a👍🏽b", "done<|im_end|>"]


@pytest.mark.parametrize("text", TEXTS)
def test_text_stream_completes_characters(byte_tokenizer, text):
    ids = byte_tokenizer.encode(text)
    assert len(ids) > len(text.split())  # really split into byte tokens
    stream = TextStream(byte_tokenizer)
    pieces = [stream.push(i) for i in ids]
    pieces[-1] += stream.flush()
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)
    if "🦙" in text:
        assert pieces.count("") >= 4  # the bytes before each llama's last add nothing
        assert sum(p.count("🦙") for p in pieces) == 4


def test_text_stream_ends_mid_character_like_the_decode(byte_tokenizer):
    ids = byte_tokenizer.encode("row: 🦙")[:-1]  # a run stopped inside the emoji
    stream = TextStream(byte_tokenizer)
    pieces = [stream.push(i) for i in ids]
    assert "\ufffd" not in "".join(pieces)  # while running, the open character is held
    assert "".join(pieces) + stream.flush() == byte_tokenizer.decode(ids)
