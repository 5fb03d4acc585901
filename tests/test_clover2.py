"""Clover-2 heads: the parts the design shares, drafting against its training forward,
greedy parity and lossless sampling, save/load, and the released checkpoints' layout."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from clover import Engine, SamplingConfig, load_heads, new_heads, parse_tree_spec
from clover.heads import Clover2Heads, CloverHeads
from clover.heads.clover2_checkpoint import RELEASED_ROPE, load_released_clover2
from clover.models import decoder_layers
from conftest import perturb, tiny_llama_target, tiny_target
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


def test_unshared_recurrence_gives_each_head_its_own_projector(tmp_path):
    """The ablation (``shared_recurrence=False``): heads 2..K each own one AttnDec2 + FC,
    nothing is shared, perturbing head k's set changes head k's logits only, the flag
    survives a save and reload, and greedy output still equals plain decoding's."""
    target = tiny_target("llama")
    heads = new_heads("clover2", target, num_heads=4, shared_recurrence=False)
    params = list(heads.named_parameters(remove_duplicate=False))
    assert len({p.data_ptr() for _, p in params}) == len(params)
    names = {n.split(".")[0] for n, _ in params}
    assert names == {"decoder", "augment", "augment_norm", "first_fc", "recurrent_decoders",
                     "recurrent_fcs", "head_norm"}
    assert len(heads.recurrent_decoders) == len(heads.recurrent_fcs) == 3
    shared = new_heads("clover2", target, num_heads=4)
    per_set = sum(p.numel() for p in shared.recurrent_decoder.parameters()) + \
        sum(p.numel() for p in shared.recurrent_fc.parameters())
    assert sum(p.numel() for p in heads.parameters()) == sum(p.numel() for p in shared.parameters()) + 2 * per_set
    for fc in heads.recurrent_fcs:  # each starts near the identity, like the shared one
        assert torch.allclose(fc.weight[:, :target.hidden_size], torch.eye(target.hidden_size), atol=0.011)
    z = torch.randn(3, target.hidden_size)
    toks = torch.tensor([4, 5, 6])

    def logits(h):
        out, r = [], z
        for k in range(4):
            r, lg = h.step(r, toks, k, target)
            out.append(lg)
        return torch.stack(out)

    before = logits(heads)
    with torch.no_grad():
        heads.recurrent_fcs[1].weight.add_(0.1)  # head 3's FC: its output only
    mid = logits(heads)
    assert torch.equal(mid[[0, 1, 3]], before[[0, 1, 3]]) and not torch.allclose(mid[2], before[2])
    with torch.no_grad():
        heads.recurrent_decoders[1].w_v.weight.add_(0.1)  # head 3's AttnDec2: its state r_3 feeds head 4
    after = logits(heads)
    assert torch.equal(after[:2], mid[:2])
    assert not torch.allclose(after[2], mid[2]) and not torch.allclose(after[3], mid[3])
    heads.save_pretrained(tmp_path)
    again = load_heads(tmp_path, target)
    assert again.config.shared_recurrence is False and torch.equal(logits(again), after)
    perturb(heads, scale=0.2, seed=1)
    for prompt in prompts(target.vocab_size):
        assert Engine(target, heads).generate(prompt, 16).token_ids == plain(target, prompt, 16).token_ids


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


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
def test_training_forward_runs_the_block_where_it_is_read(arch):
    """training_outputs runs the Augmenting Block's last layer at the sampled positions
    only (clover.heads.clover.block_at, for Llama/Qwen2 layers; GPT-2 takes the full
    forward): the same outputs and gradients as Z computed over whole sequences.

    block_at re-implements the installed transformers' Llama/Qwen2 decoder layer, so this
    is its guard: the partial path must be the one taken (a renamed layer class would
    otherwise fall back silently) and must match the layer's own forward."""
    from clover.heads import clover as clover_module

    target = tiny_target(arch)
    heads = perturb(new_heads("clover2", target, num_heads=3), 0.2).float().eval()  # no dropout
    partial = type(decoder_layers(heads.augment)[-1]).__name__ in clover_module._PARTIAL_LAYERS
    assert partial == (arch != "gpt2"), type(decoder_layers(heads.augment)[-1]).__name__
    g = torch.Generator().manual_seed(1)
    B, T, D = 3, 19, target.hidden_size
    ids = torch.randint(2, 96, (B, T), generator=g)
    pre = torch.randn(B, T, D, generator=g)
    rows = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 0])  # one row out of order
    cols = torch.tensor([0, 5, 11, 3, 15, 2, 7, 8, 4])  # none past position 15

    def reference():  # Z over whole sequences, then the heads at (rows, cols)
        r = heads.context(pre, torch.cat([ids[:, 1:], ids[:, -1:]], dim=1), None, 0, target)[rows, cols]
        outs = []
        for k in range(3):
            r, out = heads.head(r, ids[rows, (cols + k + 1).clamp(max=T - 1)], k, target)
            outs.append((heads.vocab_logits(out, target), out))
        return outs

    def run(fn):
        heads.zero_grad()
        outs = fn()
        sum((logits.sum() + out.square().sum()) * (k + 1) for k, (logits, out) in enumerate(outs)).backward()
        return ([(a.detach(), b.detach()) for a, b in outs],
                {n: p.grad.clone() for n, p in heads.named_parameters() if p.grad is not None})

    fast, fast_grads = run(lambda: heads.training_outputs(target, ids, pre, rows, cols))
    full, full_grads = run(reference)
    for (a, b), (c, d) in zip(fast, full):
        torch.testing.assert_close(a, c, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(b, d, atol=1e-5, rtol=1e-4)
    assert fast_grads.keys() == full_grads.keys() and any(n.startswith("augment.") for n in full_grads)
    for name in full_grads:
        torch.testing.assert_close(fast_grads[name], full_grads[name], atol=1e-4, rtol=1e-3)


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
                    parse_tree_spec("dynamic:budget=6,branching=3"))
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


# ---- the released checkpoints' layout (CLOVER2.md §3) ----

# our names -> the released ones, written here from CLOVER2.md's key table, not from the loader
RELEASED = {"augment.layers.": "layers.", "augment_norm.": "clover_norm.",
            "decoder.": "clover_head_mlp_rnn.", "first_fc.": "clover_head_mlp.",
            "recurrent_decoder.": "clover_head_mlp_rnn2.", "recurrent_fc.": "clover_head_mlp2.",
            "head_norm.": "clover_head_norm."}
PARTS = {"w_q.": "q.", "w_k.": "k.", "w_v.": "v.", "norm.": "input_layernorm."}


def released_state(heads, target, old_names=False) -> dict[str, torch.Tensor]:
    """The heads' weights under the released key names, with the frozen lm_head copies."""
    out = {"lm_head.weight": target.lm_head.weight.clone(),
           "clover_embed_tokens.weight": target.lm_head.weight.clone()}
    for name, t in heads.state_dict().items():
        if name.startswith("augment.embed_tokens."):
            continue
        ours = next(p for p in sorted(RELEASED, key=len, reverse=True) if name.startswith(p))
        rest = name[len(ours):]
        if ours in ("decoder.", "recurrent_decoder."):
            part = next(p for p in PARTS if rest.startswith(p))
            rest = PARTS[part] + rest[len(part):]
        key = RELEASED[ours] + rest
        if old_names and key.startswith("layers."):
            key = ("layer." if key.startswith("layers.0.") else "layer2.") + key.split(".", 2)[2]
        out[key] = t.detach().clone().contiguous()
    return out


def write_released(path, state, target, num_heads=5, **config):
    """A checkpoint folder as the reference writes it: config.json + model.safetensors."""
    path.mkdir(parents=True, exist_ok=True)
    c = target.config
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": c.hidden_size,
           "intermediate_size": c.intermediate_size, "num_attention_heads": c.num_attention_heads,
           "num_key_value_heads": c.num_key_value_heads, "vocab_size": c.vocab_size,
           "rms_norm_eps": 1e-6, "max_position_embeddings": 2048, "num_hidden_layers": 1,
           "rope_theta": 500000.0, "hidden_act": "silu",
           "clover": {"num_heads": num_heads, "num_layers": 2, "heads_coefficient": 1.0,
                      "decay_coefficient": 0.7}, **config}
    (path / "config.json").write_text(json.dumps(cfg))
    save_file({k: v.contiguous() for k, v in state.items()}, str(path / "model.safetensors"))
    return path


@pytest.fixture(scope="module")
def llama3_like():
    """A tiny Llama with Llama-3's RoPE base (500000), and Clover-2 heads for it built
    natively with the released checkpoints' settings (RoPE base 10000, eps 1e-6)."""
    target = tiny_llama_target(rope_theta=500000.0)
    heads = perturb(new_heads("clover2", target, num_heads=5, norm_eps=1e-6,
                              augment_config={"rope_parameters": dict(RELEASED_ROPE), "rms_norm_eps": 1e-6}),
                    0.1, seed=2)
    return target, heads


def same_drafts(a, b, target):
    """Identical Z, per-head draft logits and whole decoding traces."""
    g = torch.Generator().manual_seed(1)
    x, nxt = torch.randn(1, 7, target.hidden_size, generator=g), torch.randint(0, 96, (1, 7), generator=g)
    toks = torch.tensor([5, 9, 11])
    with torch.inference_mode():
        za, zb = a.context(x, nxt, None, 0, target), b.context(x, nxt, None, 0, target)
        assert torch.equal(za, zb)
        ra = rb = za[0, -3:]
        for k in range(a.config.num_heads):
            ra, la = a.step(ra, toks, k, target)
            rb, lb = b.step(rb, toks, k, target)
            assert torch.equal(la, lb), k
    prompt = prompts(96)[3]
    tree = parse_tree_spec("dynamic:budget=12,branching=3")
    assert [s.nodes for s in Engine(target, a, tree).generate(prompt, 10).steps] == \
        [s.nodes for s in Engine(target, b, tree).generate(prompt, 10).steps]


@pytest.mark.parametrize("old_names", [False, True], ids=["layers", "layer-layer2"])
def test_released_layout_loads_to_the_same_drafts(llama3_like, tmp_path, old_names):
    target, native = llama3_like
    path = write_released(tmp_path / "ckpt", released_state(native, target, old_names), target)
    loaded = load_released_clover2(path, target)
    assert isinstance(loaded, Clover2Heads) and loaded.config.num_heads == 5
    assert loaded.config.norm_eps == 1e-6 and loaded.config.target_fingerprint == target.fingerprint
    same_drafts(native, loaded, target)
    # and they save in our own format and load back as any heads
    loaded.save_pretrained(tmp_path / "ours")
    same_drafts(native, load_heads(tmp_path / "ours", target), target)


def test_released_checkpoint_with_both_layer_names_takes_the_current(llama3_like, tmp_path):
    target, native = llama3_like
    state = released_state(native, target)
    stale = {k: torch.zeros_like(v) for k, v in released_state(native, target, old_names=True).items()
             if k.startswith(("layer.", "layer2."))}
    loaded = load_released_clover2(write_released(tmp_path, {**state, **stale}, target), target)
    same_drafts(native, loaded, target)


def test_released_rope_base_is_10000_whatever_the_target(llama3_like, tmp_path):
    target, native = llama3_like
    loaded = load_released_clover2(write_released(tmp_path, released_state(native, target), target), target)
    d = target.hidden_size // target.config.num_attention_heads
    base10k = 1.0 / (10000.0 ** (torch.arange(0, d, 2).float() / d))
    assert torch.allclose(loaded.augment.rotary_emb.inv_freq, base10k)
    assert not torch.allclose(target.base.rotary_emb.inv_freq, base10k)  # the target: 500000
    # the same weights with the target's own RoPE compute another Z: the quirk matters
    own = new_heads("clover2", target, num_heads=5, norm_eps=1e-6)
    own.load_state_dict(loaded.state_dict())
    x, nxt = torch.randn(1, 9, target.hidden_size), torch.randint(0, 96, (1, 9))
    with torch.inference_mode():
        assert not torch.allclose(own.context(x, nxt, None, 0, target), loaded.context(x, nxt, None, 0, target))


def test_released_head_formula(llama3_like, tmp_path):
    """Head 2 computed by hand from the released tensors as CLOVER2.md §2.2 writes it:
    r = x + concat_h(cos(q_h, k_h) v_h), q = W_q RMSNorm(x) + b_q, k/v = W e + b with e the
    raw lm_head row; g = RMSNorm(W_2 [r ; e] + b_2); logits = W_lm g."""
    target, native = llama3_like
    state = released_state(native, target)
    loaded = load_released_clover2(write_released(tmp_path, state, target), target)
    H = target.config.num_attention_heads

    def rms(x, w, eps=1e-6):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w

    x, c = torch.randn(2, target.hidden_size), torch.tensor([7, 30])
    e = state["clover_embed_tokens.weight"][c]
    p = "clover_head_mlp_rnn2."
    q = rms(x, state[p + "input_layernorm.weight"]) @ state[p + "q.weight"].T + state[p + "q.bias"]
    k = e @ state[p + "k.weight"].T + state[p + "k.bias"]
    v = e @ state[p + "v.weight"].T + state[p + "v.bias"]
    gate = torch.cosine_similarity(q.view(2, H, -1), k.view(2, H, -1), dim=-1, eps=1e-6)
    r = x + (gate[..., None] * v.view(2, H, -1)).reshape(2, -1)
    g = rms(torch.cat([r, e], -1) @ state["clover_head_mlp2.weight"].T + state["clover_head_mlp2.bias"],
            state["clover_head_norm.weight"])
    with torch.inference_mode():
        r_ours, logits = loaded.step(x, c, 1, target)
    assert torch.allclose(r_ours, r, atol=1e-5)
    assert torch.allclose(logits, g @ state["lm_head.weight"].T, atol=1e-4)


def test_released_checkpoint_for_another_target_is_refused(llama3_like, tmp_path):
    target, native = llama3_like
    path = write_released(tmp_path / "ckpt", released_state(native, target), target)
    other_vocab = tiny_target("llama", vocab_size=80)
    with pytest.raises(ValueError, match=r"made for another target .*vocab_size 96 != target's 80"):
        load_released_clover2(path, other_vocab)
    with pytest.raises(ValueError, match=r"model type 'llama' != target's 'gpt2'"):
        load_released_clover2(path, tiny_target("gpt2"))
    # same sizes, other weights (as Vicuna's checkpoint for Llama-2-7B): the lm_head differs
    same_sizes = tiny_target("llama", seed=5)
    with pytest.raises(ValueError, match=r"lm_head.weight differs from 'tiny-llama''s lm_head"):
        load_released_clover2(path, same_sizes)


def test_released_checkpoint_keys_are_checked(llama3_like, tmp_path):
    target, native = llama3_like
    state = released_state(native, target)
    broken = {k: v for k, v in state.items() if k not in ("clover_head_mlp2.bias", "layers.1.mlp.up_proj.weight")}
    broken["clover_head_mlp3.weight"] = torch.zeros(2, 2)
    broken["layers.2.mlp.up_proj.weight"] = state["layers.1.mlp.up_proj.weight"]
    with pytest.raises(ValueError) as err:
        load_released_clover2(write_released(tmp_path / "a", broken, target), target)
    msg = str(err.value)
    assert "missing keys (2): layers.1.mlp.up_proj.weight, clover_head_mlp2.bias" in msg
    assert "unexpected keys (2): clover_head_mlp3.weight, layers.2.mlp.up_proj.weight" in msg
    wrong = {**state, "clover_head_mlp.weight": torch.zeros(3, 3)}
    with pytest.raises(ValueError, match=r"wrong shapes \(1\): clover_head_mlp.weight \(3, 3\) != \(64, 64\)"):
        load_released_clover2(write_released(tmp_path / "b", wrong, target), target)
    with pytest.raises(ValueError, match="missing keys .*clover_embed_tokens.weight"):
        load_released_clover2(write_released(tmp_path / "c", {k: v for k, v in state.items()
                                                              if k != "clover_embed_tokens.weight"}, target), target)
    (tmp_path / "d").mkdir()
    with pytest.raises(FileNotFoundError, match="expected config.json and model.safetensors"):
        load_released_clover2(tmp_path / "d", target)
    path = write_released(tmp_path / "e", state, target)
    cfg = json.loads((path / "config.json").read_text())
    del cfg["clover"]
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="no 'clover' block"):
        load_released_clover2(path, target)
