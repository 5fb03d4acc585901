"""Medusa and Clover heads: independent weights, Clover's parts, save and load."""
from __future__ import annotations

import json

import pytest
import torch

from clover import load_heads, new_heads
from clover.heads import HeadConfig
from clover.models import decoder_layers
from conftest import perturb, tiny_llama_target, tiny_target


@pytest.mark.parametrize("kind", ["medusa", "clover"])
def test_heads_built_in_a_loop_do_not_share_weights(kind):
    target = tiny_target("llama")
    heads = new_heads(kind, target, num_heads=4)
    blocks = heads.blocks if kind == "medusa" else heads.mlps
    ptrs = {b.linear.weight.data_ptr() for b in blocks}
    assert len(ptrs) == 4
    with torch.no_grad():
        blocks[0].linear.weight.fill_(1.0)
    assert all((b.linear.weight == 0).all() for b in blocks[1:])


def test_medusa_own_lm_head_starts_from_target():
    target = tiny_target("llama")
    heads = new_heads("medusa", target, num_heads=2, own_lm_head=True)
    assert len({h.weight.data_ptr() for h in heads.lm_heads}) == 2
    assert torch.equal(heads.lm_heads[1].weight, target.lm_head.weight)
    h = torch.randn(3, target.hidden_size)
    # zero-initialised residual blocks + copied projection = the target's own lm_head
    assert torch.allclose(heads(h, target)[:, 0], target.head_logits(h), atol=1e-5)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
def test_augmenting_block_is_the_targets_last_layer(arch):
    """Initialised from the last layer, the block applied to the second-to-last layer's
    output reproduces the target's last hidden state (before the final norm)."""
    target = tiny_target(arch)
    heads = new_heads("clover", target)
    src = decoder_layers(target.base)[-1]
    dst = decoder_layers(heads.augment)[0]
    for (n1, p1), (n2, p2) in zip(src.state_dict().items(), dst.state_dict().items()):
        assert n1 == n2 and torch.equal(p1, p2)
    assert p1.data_ptr() != p2.data_ptr()  # a copy, not the target's own tensor
    ids = torch.randint(2, 96, (1, 10), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        out = target.model(ids, output_hidden_states=True)
        h_in = out.hidden_states[-2]  # input of the last layer
        pre = target.forward(ids, torch.arange(10)[None], None, None).hidden_pre
        aug = heads.augment_hidden(h_in, None, 0)
    assert torch.allclose(aug[0], pre, atol=1e-5)


def test_clover_parts():
    target = tiny_target("llama")
    heads = perturb(new_heads("clover", target, num_heads=3), 0.1)
    e = heads.regressive_embedding(torch.tensor([3, 7]), target)
    assert e.shape == (2, target.hidden_size)
    assert torch.allclose(e.norm(dim=-1), torch.ones(2), atol=1e-5)
    h0 = torch.randn(2, target.hidden_size)
    h1, logits = heads.step(h0, torch.tensor([3, 7]), 0, target)
    assert h1.shape == (2, target.hidden_size) and logits.shape == (2, target.vocab_size)
    # the regressive connection matters: another previous token changes the draft
    _, logits_b = heads.step(h0, torch.tensor([4, 7]), 0, target)
    assert not torch.allclose(logits[0], logits_b[0]) and torch.allclose(logits[1], logits_b[1])
    # at init W_V = 0: the attention decoder is the identity (training starts from Medusa)
    fresh = new_heads("clover", target)
    assert torch.equal(fresh.decoder(h0, e), h0)


def test_attention_decoder_reads_keys_and_values_from_a_table_while_drafting():
    """While drafting, K = W_K e and V = W_V e come from a table over the draft
    vocabulary (a token outside it computed directly): the same values as the direct
    products, the same draft; the table follows in-place weight changes, and training
    (or gradients) never reads it."""
    target = tiny_target("llama")
    vocab = [2, 7, 11, 30, 64]
    heads = perturb(new_heads("clover", target, num_heads=2, draft_vocab=vocab), 0.1).eval()
    dec = heads.decoder
    embed = lambda t: heads.regressive_embedding(t, target)  # noqa: E731
    tokens = torch.tensor([7, 3, 64, 7])  # 3 lies outside the draft vocabulary
    e = embed(tokens)
    with torch.no_grad():
        k, v = dec.token_kv(tokens, embed, heads.draft_vocab, target.lm_head.weight)
        torch.testing.assert_close(k, dec.w_k(e), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(v, dec.w_v(e), rtol=1e-5, atol=1e-6)
        h0 = torch.randn(4, target.hidden_size)
        torch.testing.assert_close(dec.attend(h0, k, v), dec(h0, e), rtol=1e-5, atol=1e-6)
        h1, logits = heads.step(h0, tokens, 0, target)
        torch.testing.assert_close(h1, dec(h0, e), rtol=1e-5, atol=1e-6)
        table = dec._kv_kept[1]
        assert table.shape == (len(vocab), 2 * target.hidden_size)
        dec.w_v.weight.mul_(2)  # an in-place change: the table is made again
        k2, v2 = dec.token_kv(tokens, embed, heads.draft_vocab, target.lm_head.weight)
        torch.testing.assert_close(v2, dec.w_v(e), rtol=1e-5, atol=1e-6)
        assert dec._kv_kept[1] is not table
    heads.train()
    calls = []
    real = dec._kv_table
    dec._kv_table = lambda *a: calls.append(1) or real(*a)
    k3, _ = dec.token_kv(tokens, embed, heads.draft_vocab, target.lm_head.weight)
    assert k3.requires_grad and not calls  # training: direct products, with gradients


@pytest.mark.parametrize("kind", ["medusa", "clover"])
def test_save_and_reload_identical(kind, tmp_path):
    target = tiny_target("llama")
    heads = perturb(new_heads(kind, target), 0.1)
    heads.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["kind"] == kind and cfg["target"] == "tiny-llama" and cfg["hidden_size"] == 64
    again = load_heads(tmp_path, target)
    h = torch.randn(4, target.hidden_size)
    with torch.inference_mode():
        if kind == "medusa":
            assert torch.equal(heads(h, target), again(h, target))
        else:
            toks = torch.tensor([1, 2, 3, 4])
            assert torch.equal(heads.step(h, toks, 2, target)[1], again.step(h, toks, 2, target)[1])
            x = torch.randn(1, 5, target.hidden_size)
            assert torch.equal(heads.augment_hidden(x, None, 0), again.augment_hidden(x, None, 0))


def test_loading_heads_for_another_model_fails_clearly(tmp_path):
    other = tiny_target("llama", vocab_size=80)
    new_heads("clover", other).save_pretrained(tmp_path / "clover")
    target = tiny_target("llama", vocab_size=96)
    with pytest.raises(ValueError, match=r"made for 'tiny-llama'.*vocabulary 80 != target's 96"):
        load_heads(tmp_path / "clover", target)
    gpt = tiny_target("gpt2")
    cfg = json.loads((tmp_path / "clover" / "config.json").read_text())
    cfg["hidden_size"] = 32
    (tmp_path / "clover" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="hidden size 32 != target's 64"):
        load_heads(tmp_path / "clover", gpt)
    with pytest.raises(FileNotFoundError, match="no heads"):
        load_heads(tmp_path / "missing", target)


def test_head_config_errors():
    with pytest.raises(ValueError, match="unknown head kind"):
        HeadConfig(kind="eagle")
    with pytest.raises(ValueError, match="num_heads"):
        HeadConfig(kind="clover", num_heads=0)
    with pytest.raises(ValueError, match="divide"):
        HeadConfig(kind="clover", hidden_size=10, num_attention_heads=3)


def test_a_heads_class_declares_its_kind():
    """Kinds are open: a DraftHeads subclass (here the tests' scripted double) declares its
    own kind, and the engine names its runs after it; a kind nobody declares is refused."""
    from clover import Engine
    from clover.heads import DraftHeads, MedusaHeads
    from conftest import ScriptedHeads, chain_fn

    target = tiny_target("llama")
    prompt = [5, 6, 7]
    ref = Engine(target).generate(prompt, 6)
    heads = ScriptedHeads(target, chain_fn(prompt + ref.token_ids))
    out = Engine(target, heads).generate(prompt, 6)
    assert heads.config.kind == "scripted" and out.method == "scripted"
    assert out.token_ids == ref.token_ids and out.mean_accepted_length > 1
    assert isinstance(DraftHeads.build(HeadConfig.for_target("medusa", target), target), MedusaHeads)
    with pytest.raises(ValueError, match="unknown head kind"):
        HeadConfig(kind="eagle")


def test_from_pretrained_checks_kind(tmp_path):
    from clover.heads import CloverHeads, DraftHeads, MedusaHeads

    target = tiny_target("llama")
    new_heads("medusa", target).save_pretrained(tmp_path)
    assert isinstance(DraftHeads.from_pretrained(tmp_path, target), MedusaHeads)
    assert isinstance(MedusaHeads.from_pretrained(tmp_path, target), MedusaHeads)
    with pytest.raises(ValueError, match="holds medusa heads, not clover"):
        CloverHeads.from_pretrained(tmp_path, target)


@pytest.mark.parametrize("kind", ["medusa", "clover"])
def test_draft_vocabulary(kind, tmp_path):
    target = tiny_target("llama")
    vocab = [1, 5, 9, 17, 33, 40, 41, 80]
    heads = perturb(new_heads(kind, target, draft_vocab=reversed(vocab), own_lm_head=False)
                    if kind == "medusa" else new_heads(kind, target, draft_vocab=vocab), 0.1)
    assert heads.draft_vocab.tolist() == vocab and heads.config.draft_vocab_size == 8
    h = torch.randn(3, target.hidden_size)
    assert torch.allclose(heads.vocab_logits(h, target), target.head_logits(h)[:, vocab], atol=1e-6)
    with pytest.raises(RuntimeError), heads.whole_vocabulary():  # every token, until the block ends
        assert torch.equal(heads.vocab_logits(h, target), target.head_logits(h))
        raise RuntimeError
    assert heads.draft_vocab.tolist() == vocab and heads.vocab_logits(h, target).shape == (3, 8)
    # drafted trees use only draft-vocabulary tokens
    from clover import Engine, TreeConfig
    engine = Engine(target, heads, TreeConfig(budget=12, branching=3))
    run = engine.stream([4, 5, 6], 10)
    for step in run:
        assert all(n.token_id in vocab for n in step.nodes[1:])
    assert run.result.token_ids == Engine(target).generate([4, 5, 6], 10).token_ids
    heads.save_pretrained(tmp_path)
    again = load_heads(tmp_path, target)
    assert again.draft_vocab.tolist() == vocab
    assert torch.equal(again.vocab_logits(h, target), heads.vocab_logits(h, target))
    with pytest.raises(ValueError, match="distinct draft token ids"):
        heads.set_draft_vocab([1, 2])


@pytest.mark.parametrize("kind", ["medusa", "clover"])
def test_draft_vocabulary_with_a_biased_lm_head_and_few_row_linears(kind, tmp_path):
    """An lm_head bias is sliced with its weight; new and loaded heads take the few-row path."""
    from clover.kernels.linear import FewRowLinear
    target = tiny_target("llama")
    vocab = [2, 7, 11, 30, 64]
    heads = new_heads(kind, target, draft_vocab=vocab, own_lm_head=False)
    h = torch.randn(4, target.hidden_size)
    before = heads.vocab_logits(h, target)
    target.lm_head.bias = torch.nn.Parameter(torch.randn(target.vocab_size))
    heads.set_draft_vocab(vocab)  # drops the cached slice
    assert torch.allclose(heads.vocab_logits(h, target), target.head_logits(h)[:, vocab], atol=1e-6)
    assert not torch.allclose(heads.vocab_logits(h, target), before)
    heads.save_pretrained(tmp_path)
    for hs in (heads, load_heads(tmp_path, target)):
        linears = [m for m in hs.modules() if isinstance(m, torch.nn.Linear)]
        assert linears and all(type(m) is FewRowLinear for m in linears)


def test_medusa_own_lm_head_over_draft_vocabulary():
    target = tiny_target("llama")
    heads = new_heads("medusa", target, num_heads=2, own_lm_head=True, draft_vocab=[3, 4, 5, 70])
    assert heads.lm_heads[0].weight.shape == (4, target.hidden_size)
    assert torch.equal(heads.lm_heads[1].weight, target.lm_head.weight[[3, 4, 5, 70]])


def test_fingerprint_accepts_the_same_model_in_any_dtype_and_refuses_another(tmp_path):
    """Heads are for a target's architecture and vocabulary, not only its sizes."""
    fp32 = tiny_llama_target()
    new_heads("clover", fp32).save_pretrained(tmp_path / "h")
    saved = json.loads((tmp_path / "h" / "config.json").read_text())["target_fingerprint"]
    assert saved == fp32.fingerprint and set(saved) == {"architecture", "vocabulary"}
    # the same model in bf16 under another name (e.g. loaded from the hub): accepted
    bf16 = tiny_llama_target(name="org/tiny-llama", dtype=torch.bfloat16)
    assert bf16.fingerprint == fp32.fingerprint
    heads = load_heads(tmp_path / "h", bf16)
    assert heads.config.target_fingerprint == bf16.fingerprint
    # same sizes, other RoPE base: refused, naming the architecture
    with pytest.raises(ValueError, match=r"do not fit 'tiny-llama'.*architecture config .* differs"):
        load_heads(tmp_path / "h", tiny_llama_target(rope_theta=500000.0))
    # same sizes, other token ids: refused, naming the vocabulary
    with pytest.raises(ValueError, match=r"tokenizer vocabulary \(token ids\) differs"):
        load_heads(tmp_path / "h", tiny_llama_target(shuffle_vocab=True))
    # the engine refuses them too
    from clover import Engine
    with pytest.raises(ValueError, match="architecture config"):
        Engine(tiny_llama_target(rope_theta=500000.0), heads)
    # heads saved before fingerprints existed are checked by sizes only
    cfg = json.loads((tmp_path / "h" / "config.json").read_text())
    del cfg["target_fingerprint"]
    (tmp_path / "h" / "config.json").write_text(json.dumps(cfg))
    assert load_heads(tmp_path / "h", tiny_llama_target(rope_theta=500000.0)).config.target_fingerprint == {}


def test_fingerprint_rounds_float_fields_and_ignores_dtype():
    """A GGUF copy stores eps as float32 (9.99999975e-06) and RoPE base as 100000.0; the hub
    config says 1e-05 and 100000: one fingerprint."""
    from transformers import LlamaConfig

    from clover.models import target_fingerprint
    from conftest import tiny_tokenizer

    tok = tiny_tokenizer(96)
    sizes = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=96)
    hub = LlamaConfig(rms_norm_eps=1e-05, rope_parameters={"rope_type": "default", "rope_theta": 100000},
                      dtype="bfloat16", **sizes)
    gguf = LlamaConfig(rms_norm_eps=9.999999747378752e-06, dtype="float32",
                       rope_parameters={"rope_type": "default", "rope_theta": 100000.0}, **sizes)
    assert target_fingerprint(hub, tok) == target_fingerprint(gguf, tok)
    deeper = LlamaConfig(rms_norm_eps=1e-05, rope_parameters={"rope_type": "default", "rope_theta": 100000},
                         **{**sizes, "num_hidden_layers": 3})
    assert target_fingerprint(deeper, tok)["architecture"] != target_fingerprint(hub, tok)["architecture"]
    assert target_fingerprint(deeper, tok)["vocabulary"] == target_fingerprint(hub, tok)["vocabulary"]


def test_heads_for_names_where_heads_came_from(tmp_path):
    from clover.heads import UNTRAINED, heads_for

    target = tiny_llama_target()
    assert heads_for(None, target) == (None, "")
    heads, source = heads_for("clover", target)  # no shipped heads fit a tiny model
    assert source == UNTRAINED and heads.config.kind == "clover"
    heads.save_pretrained(tmp_path / "c")
    assert heads_for("clover", target, tmp_path / "c")[1] == f"loaded from {tmp_path / 'c'}"
    with pytest.raises(ValueError, match="holds clover heads, not medusa"):
        heads_for("medusa", target, tmp_path / "c")
    for wrong in ("eagle", "ar"):  # head kinds only: plain decoding has none (None)
        with pytest.raises(ValueError, match="unknown head kind"):
            heads_for(wrong, target)


@pytest.mark.parametrize("spec", ["dynamic:budget=1", "dynamic:budget=2,branching=2", "dynamic:budget=10", "chain3"])
def test_medusa_drafts_with_the_heads_its_tree_can_reach(spec, monkeypatch):
    """A Medusa tree only as deep as k levels runs heads 1..k, and is the tree all K give."""
    from clover.heads.medusa import MedusaDrafter
    from clover.tree import parse_tree_spec

    target = tiny_target("llama")
    heads = perturb(new_heads("medusa", target, num_heads=4), scale=0.5)
    h = torch.randn(3, target.config.hidden_size)
    assert torch.allclose(heads(h, target, 2), heads(h, target)[:, :2], atol=1e-6)
    with pytest.raises(ValueError, match="num_heads"):
        heads(h, target, 5)
    tree = parse_tree_spec(spec)
    drafter = heads.drafter(target, tree)
    drafter.observe(h, h, [1, 2, 3])
    ran = []
    real = type(heads).forward
    monkeypatch.setattr(type(heads), "forward", lambda self, x, t, k=None: ran.append(k) or real(self, x, t, k))
    got = drafter.draft(5, 8)
    assert ran == [min(4, tree.deepest)]
    monkeypatch.setattr(type(heads), "forward", real)
    probs = torch.softmax(heads(h[-1:], target).float(), dim=-1)[0]  # all K heads
    want = MedusaDrafter._grow(drafter, 5, 8, probs)
    assert (got.tokens.tolist(), got.parents, got.depths) == (want.tokens.tolist(), want.parents, want.depths)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
def test_augment_at_equals_the_full_block(arch):
    """Training reads h_0 at sampled positions only; CloverHeads.augment_at must give the
    full Augmenting Block's values there, and the same gradients (a partial forward for
    Llama/Qwen2 layers, the full one otherwise)."""
    target = tiny_target(arch)
    heads = perturb(new_heads("clover", target, num_heads=2), scale=0.2).float().train()
    g = torch.Generator().manual_seed(1)
    B, T, D = 3, 19, target.hidden_size
    pre = torch.randn(B, T, D, generator=g)
    rows = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 2, 0])  # one row out of order, repeats allowed
    cols = torch.tensor([0, 5, 11, 3, 18, 2, 7, 8, 16, 4])
    weights = torch.randn(len(rows), D, generator=g)

    def run(fn):
        heads.zero_grad()
        torch.manual_seed(0)  # GPT-2's block has dropout in training mode: the same masks
        out = fn()
        (out * weights).sum().backward()
        return out.detach(), {n: p.grad.clone() for n, p in heads.augment.named_parameters() if p.grad is not None}

    fast, fast_grads = run(lambda: heads.augment_at(pre, rows, cols))
    full, full_grads = run(lambda: heads.augment_hidden(pre, None, 0)[rows, cols])
    assert fast.shape == (len(rows), D)
    torch.testing.assert_close(fast, full, atol=1e-5, rtol=1e-4)
    assert fast_grads.keys() == full_grads.keys() and full_grads
    for name in full_grads:  # sums over positions in another order: fp32 rounding, by the CPU's kernels
        torch.testing.assert_close(fast_grads[name], full_grads[name], atol=5e-5, rtol=1e-3)


@pytest.mark.parametrize("arch,kind", [("llama", "clover"), ("qwen2", "clover"), ("llama", "clover2"),
                                       ("gpt2", "clover")])
def test_the_drafters_block_run_equals_the_transformers_forward(arch, kind, monkeypatch):
    """Drafting runs the Augmenting Block over the one to three positions each step adds
    without the transformers model's wrapper (Llama/Qwen2 layers; other blocks take the
    model's forward); its outputs and cache must be the model's, step after step, for one
    layer (Clover) and two (Clover-2's block, cache layers 0 and 1)."""
    from transformers import DynamicCache

    import clover.heads.clover as ch

    target = tiny_target(arch)
    heads = perturb(new_heads(kind, target, num_heads=2), scale=0.2).float().eval()
    block = heads.augment
    assert ch.lean_block(block) == (arch != "gpt2")
    lean_calls, lean_run = [], ch.run_lean_block
    monkeypatch.setattr(ch, "run_lean_block", lambda *a: lean_calls.append(1) or lean_run(*a))
    pre = torch.randn(2, 24, target.hidden_size, generator=torch.Generator().manual_seed(3))
    from clover.cache import buffered_cache

    lean, full = DynamicCache(config=block.config), DynamicCache(config=block.config)
    last = buffered_cache(block.config)  # as the drafter runs it: the last position's output alone
    start = 0
    with torch.inference_mode():
        for t in (9, 1, 2, 3, 1, 4):  # a prefill, then decoding steps
            got = ch.run_augmenting_block(block, pre[:, start: start + t], lean, start)
            pos = torch.arange(start, start + t).unsqueeze(0).expand(2, -1)
            want = block(inputs_embeds=pre[:, start: start + t], position_ids=pos, cache=full,
                         use_cache=True).last_hidden_state  # the model's own forward
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
            only = ch.run_augmenting_block(block, pre[:, start: start + t], last, start, last_only=True)
            assert only.shape == (2, 1, target.hidden_size)
            torch.testing.assert_close(only, want[:, -1:], atol=1e-5, rtol=1e-4)
            start += t
    assert len(lean_calls) == (12 if arch != "gpt2" else 0)  # the lean run is what was compared
    assert lean.get_seq_length() == full.get_seq_length() == last.get_seq_length() == start
    assert len(lean.layers) == len(full.layers) == block.config.num_hidden_layers
    for a, b, c in zip(lean.layers, full.layers, last.layers):
        for x in (a, c):
            torch.testing.assert_close(x.keys, b.keys, atol=1e-5, rtol=1e-4)
            torch.testing.assert_close(x.values, b.values, atol=1e-5, rtol=1e-4)


def test_clover_drafter_runs_its_block_only_when_it_drafts(monkeypatch):
    """Clover's drafter queues the verified states and runs the Augmenting Block when a
    tree is next grown: steps that draft no head tree (a lookup chain alone) cost no
    block forward, and h_0 is still the block's output over every verified position,
    alone and for rows drafting together."""
    import clover.heads.clover as ch
    from clover.heads.drafter import draft_rows, observe_rows
    from clover.tree import TreeConfig

    target = tiny_target("llama")
    heads = perturb(new_heads("clover", target, num_heads=2), scale=0.2).float().eval()
    runs, run = [], ch.run_augmenting_block
    monkeypatch.setattr(ch, "run_augmenting_block", lambda *a: runs.append(a[1].shape[1]) or run(*a))
    pre = torch.randn(2, 12, target.hidden_size, generator=torch.Generator().manual_seed(5))
    with torch.inference_mode():
        want = [heads.augment_hidden(pre[b: b + 1], None, 0)[0] for b in range(2)]  # (T, D) per row
        runs.clear()
        drafter = heads.drafter(target, TreeConfig())
        for start, t in ((0, 6), (6, 2), (8, 3)):  # a prefill and two steps with no head tree
            drafter.observe(pre[0, start: start + t], pre[0, start: start + t], list(range(t)))
        assert runs == []
        tree = drafter.draft(4, 2)
        assert runs == [11] and len(tree) > 1  # one block run over the 11 waiting positions
        torch.testing.assert_close(drafter.state, want[0][10], atol=1e-5, rtol=1e-4)
        drafter.observe(pre[0, 11:12], pre[0, 11:12], [7])
        drafter.draft(4, 0)  # nothing to draft: the block does not run
        assert runs == [11] and drafter.length == 11
        torch.testing.assert_close(drafter.state, want[0][11], atol=1e-5, rtol=1e-4)

        rows = [heads.drafter(target, TreeConfig()) for _ in range(2)]
        observe_rows(rows, [pre[0, :7], pre[1, :5]], [pre[0, :7], pre[1, :5]], [[0] * 7, [0] * 5])
        observe_rows(rows, [pre[0, 7:9], pre[1, 5:6]], [pre[0, 7:9], pre[1, 5:6]], [[0] * 2, [0]])
        draft_rows(rows, [4, 4], [2, 2])  # one block forward over both rows' waiting positions
        assert [r.length for r in rows] == [9, 6] and not any(r.waiting for r in rows)
        torch.testing.assert_close(rows[0].state, want[0][8], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(rows[1].state, want[1][5], atol=1e-5, rtol=1e-4)
