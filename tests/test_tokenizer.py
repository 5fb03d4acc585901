"""The embedded tokenizer splits text exactly as SmolLM2's own tokenizer does.

The GGUF names its pre-tokenizer ``smollm``: every digit is split off on its own first,
then GPT-2's byte-level regex applies (SmolLM2's ``tokenizer.json``). transformers' GGUF
converter dropped the digit rule, which round trips hide, so ids are checked against a
reference tokenizer built here from the same vocabulary and merges with that rule.
"""
from __future__ import annotations

import json

import pytest

from clover.models import gguf_pre_tokenizer

STRINGS = [
    "   1. apple", "Total:  3 apples", "1. first\n2. second\n3. third",
    "| a | 12 |\n|---|----|\n|  b  |  345 |", "def f(x):\n    return x * 42\n",
    "    if n == 10:\n        n -= 1", "Call 555-0199 or +1 (800) 123 4567.",
    "The year 2024 had 366 days.", "3.14159 is pi; 2.71828 is e", "x=1,y=22,z=333",
    "  7", "\n\n9 lives", "\t\t8", "Room 101", "v2.13.0", "0x1F", "1e-38", "10,000,000",
    "¼ of 12 is 3", "٣ Arabic-Indic three", "Ⅻ", "①②③", "abc123def", "  \n  42",
    "Step 1:\n  a) 5 + 6 = 11\n  b) 7 * 8 = 56", "- 2 eggs\n- 300 g flour",
    "Version  2 and  3", "'s 've 're 1'st", "emoji 🦙 4🦙", "日本 2 語", "a  b   c    d",
    "trailing spaces 5   ", "1 2 3 4 5 6 7 8 9 0", "   ", "\n", "9",
]


def reference_tokenizer(backend):
    """SmolLM2's rule, built here from the converted tokenizer's vocabulary and merges."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    model = json.loads(backend.to_str())["model"]
    merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    ref = Tokenizer(models.BPE(vocab=model["vocab"], merges=merges, ignore_merges=False))
    ref.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    ref.decoder = decoders.ByteLevel()
    return ref


def test_smollm_pre_tokenizer_splits_digits_first():
    pre = gguf_pre_tokenizer("smollm")
    pieces = [p for p, _ in pre.pre_tokenize_str("   1. apple 23")]
    assert pieces == ["ĠĠĠ", "1", ".", "Ġapple", "Ġ", "2", "3"]
    assert gguf_pre_tokenizer("llama-bpe") is None


def test_embedded_tokenizer_matches_smollm2_rule(embedded):
    tok = embedded.tokenizer
    ref = reference_tokenizer(tok.backend_tokenizer)
    assert tok("   1. apple", add_special_tokens=False)["input_ids"] == [333, 33, 30, 11977]
    assert tok("Total:  3 apples", add_special_tokens=False)["input_ids"] == [17647, 42, 256, 35, 13855]
    differ = []
    for s in STRINGS:
        got = tok(s, add_special_tokens=False)["input_ids"]
        want = ref.encode(s, add_special_tokens=False).ids
        if got != want:
            differ.append((s, got, want))
        assert tok.decode(got) == s
    assert not differ, differ


def test_a_token_with_part_of_a_character_is_shown_as_its_bytes(embedded):
    """Tree labels and verify tables decode each token alone: a token holding only some
    of a character's UTF-8 bytes shows those bytes (``<0xF0><0x9F>``), never "�"; whole
    tokens decode as before."""
    from clover.models import token_texts

    tok = embedded.tokenizer
    ids = tok.encode("🦜 parrot", add_special_tokens=False)
    texts = token_texts(tok, ids)
    plain = tok.batch_decode([[i] for i in ids])
    assert any("\ufffd" in t for t in plain)  # the emoji is split across tokens
    assert not any("\ufffd" in t for t in texts)
    partial = [t for t, p in zip(texts, plain) if "\ufffd" in p]
    raw = b"".join(bytes(int(h, 16) for h in t[3:-1].split("><0x")) for t in partial)
    assert raw == "🦜".encode()
    assert [t for t, p in zip(texts, plain) if "\ufffd" not in p] == [
        p for p in plain if "\ufffd" not in p]
