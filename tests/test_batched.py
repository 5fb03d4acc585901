"""Batched decoding: every row of a batch decodes exactly what it decodes alone.

Each row's output equals that row's own plain greedy output, token for token, for batches
of 1 to 5 prompts of different lengths, rows stopping at different steps (EOS, their own
``max_new_tokens``, stop strings), for plain decoding, Medusa, Clover, prompt lookup and
trees that hold the true continuation (so rows accept different, non-chain paths and the
per-row compaction gathers); a batch of one is the unbatched engine; a sampled row keeps
the target's distribution. ``Engine.serve`` (rows that join a running batch, on the
buffered KV cache) gives every row that same output.
"""
from __future__ import annotations

import pytest
import torch

from clover import Engine, SamplingConfig, new_heads, parse_tree_spec
from collections import deque

from clover.cache import (append_rows, buffered_cache, cache_length, compact_rows, crop_cache, new_cache,
                          select_rows)
from clover.requests import Request, prefill_inputs, verify_inputs
from clover.heads import DraftHeads, HeadConfig, PlainDrafter, draft_rows
from clover.lookup import LookupConfig
from clover.tree import Tree
from conftest import oracle_tree_fn, perturb, tiny_target
from test_acceptance import V, draw_pairs, exact_two_token_joint, pooled_pvalue

ARCHS = ["llama", "qwen2", "gpt2"]
LENGTHS = [5, 1, 12, 2, 20]  # prompt lengths of rows 0..4


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def batch_prompts(vocab: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(2, vocab, (n,), generator=g).tolist() for n in LENGTHS]


class OracleDrafter:
    """Drafts :func:`conftest.oracle_tree_fn` trees for whichever reference sequence its
    row is decoding (found from the tokens it has observed), so every row of a batch gets
    trees holding its own true continuation at random ranks."""

    def __init__(self, sequences, vocab):
        self.sequences, self.vocab, self.seen = sequences, vocab, []

    def observe(self, hidden_pre, hidden_post, tokens):
        self.seen += [int(t) for t in tokens]

    def draft(self, root, max_depth):
        done = self.seen + [int(root)]
        i = next(i for i, s in enumerate(self.sequences) if s[:len(done)] == done)
        fn = oracle_tree_fn(self.sequences[i], self.vocab, seed=len(done) * 7 + i, hit_rate=0.9)
        return fn(len(done) - 1, root, max_depth)


class OracleHeads(DraftHeads):
    kind = "batch-oracle"

    def __init__(self, target, sequences):
        super().__init__(HeadConfig.for_target(self.kind, target))
        self.sequences = sequences

    def drafter(self, target, tree):
        return OracleDrafter(self.sequences, target.vocab_size)


def engines(target, refs, prompts) -> dict[str, Engine]:
    """Every method on ``target``: plain, Medusa, Clover, Clover-2 (fresh, perturbed heads),
    lookup, Clover + lookup, and oracle trees."""
    out = {"ar": Engine(target), "lookup": Engine(target, lookup=LookupConfig(max_tokens=4))}
    for kind in ("medusa", "clover", "clover2"):
        heads = perturb(new_heads(kind, target, num_heads=3), scale=0.2, seed=1)
        out[kind] = Engine(target, heads, parse_tree_spec("dynamic:budget=8,branching=3"))
    out["clover+lookup"] = Engine(target, out["clover"].heads, parse_tree_spec("small"),
                                  lookup=LookupConfig(max_tokens=4))
    # sized per step on a cost curve: each row picks heads, lookup or both (plan_step)
    out["medusa+lookup"] = Engine(target, out["medusa"].heads, parse_tree_spec("dynamic:budget=2,branching=2"),
                                  lookup=LookupConfig(max_tokens=4, costs=(10.0, 10.5, 11.0, 12.0, 13.0)))
    sequences = [p + r for p, r in zip(prompts, refs)]
    out["oracle"] = Engine(target, OracleHeads(target, sequences))
    return out


@pytest.mark.parametrize("arch", ARCHS)
def test_rows_equal_their_own_plain_greedy_output(arch):
    target = tiny_target(arch)
    prompts = batch_prompts(target.vocab_size)
    caps = [24, 24, 7, 24, 24]  # row 2 reaches its max_new_tokens first
    refs = [Engine(target).generate(p, 24).token_ids for p in prompts]
    for name, engine in engines(target, refs, prompts).items():
        for b in range(1, 6):
            outs = engine.generate_batch(prompts[:b], caps[:b])
            for row, out in enumerate(outs):
                assert out.token_ids == refs[row][:caps[row]], (arch, name, b, row)
                assert out.stop_reason == "length" and out.method == engine.method
        if name == "oracle":  # rows accepted different, non-chain paths in the same steps
            steps = list(zip(*(o.steps for o in outs)))
            assert any(len({len(s.accepted) for s in step}) > 1 for step in steps)
            assert any(s.accepted != list(range(len(s.accepted))) for o in outs for s in o.steps)
            assert min(o.mean_accepted_length for o in outs) > 1.5


@pytest.mark.parametrize("arch", ARCHS)
def test_rows_stop_at_eos_on_different_steps(arch):
    target = tiny_target(arch)
    prompts = batch_prompts(target.vocab_size, seed=1)
    refs = [Engine(target).generate(p, 30).token_ids for p in prompts]
    # end-of-sequence ids that rows 0, 2 and 3 produce at different places
    target.eos_token_ids = {refs[0][3], refs[2][8], refs[3][14]}
    alone = [Engine(target).generate(p, 30) for p in prompts]
    ends = {len(a.token_ids) for a in alone if a.stop_reason == "eos"}
    # (the tiny GPT-2 ties its embeddings and repeats its last prompt token, so a row
    # meets an EOS id at once or never; the other models meet them at different steps)
    assert len(ends) >= (1 if arch == "gpt2" else 2)
    for name, engine in engines(target, refs, prompts).items():
        run = engine.stream_batch(prompts, 30)
        per_step = list(run)
        for row, out in enumerate(run.results):
            assert out.token_ids == alone[row].token_ids, (arch, name, row)
            assert out.stop_reason == alone[row].stop_reason
            assert out.steps[-1].finished and not any(s.finished for s in out.steps[:-1])
        # finished rows leave the batch: each step traces the rows still decoding, in order
        for i, traces in enumerate(per_step):
            rows = [t.row for t in traces]
            assert rows == [r for r in range(5) if len(run.results[r].steps) > i]
            assert len({(t.draft_ms, t.verify_ms) for t in traces}) == 1  # one shared step


def test_stop_strings_per_row():
    target = tiny_target("llama")
    prompts = batch_prompts(target.vocab_size)
    refs = [Engine(target).generate(p, 30).token_ids for p in prompts]
    stop = target.tokenizer.decode(refs[3][6:8])
    alone = [Engine(target).generate(p, 30, stop_strings=[stop]) for p in prompts]
    assert alone[3].stop_reason == "stop_string"
    for name, engine in engines(target, refs, prompts).items():
        outs = engine.generate_batch(prompts, 30, stop_strings=[stop])
        assert [o.token_ids for o in outs] == [a.token_ids for a in alone], name
        assert [o.stop_reason for o in outs] == [a.stop_reason for a in alone], name


def test_batch_of_one_is_the_unbatched_engine():
    target = tiny_target("qwen2")
    heads = perturb(new_heads("clover", target), 0.2)
    engine = Engine(target, heads, parse_tree_spec("dynamic:budget=8,branching=3"))
    prompt = batch_prompts(target.vocab_size)[2]

    def record(result):
        return [(s.step, s.row, [(n.token_id, n.parent, n.draft_prob, n.target_prob) for n in s.nodes],
                 s.accepted, s.cut, s.bonus_token, s.bonus_prob, s.new_tokens, s.new_text,
                 s.total_tokens, s.finished, s.stop_reason) for s in result.steps]

    for sampling in (SamplingConfig(), SamplingConfig(temperature=0.9, seed=4)):
        alone = engine.generate(prompt, 16, sampling)
        (batched,) = engine.generate_batch([prompt], 16, sampling)
        assert batched.token_ids == alone.token_ids and record(batched) == record(alone)
        assert batched.text == alone.text and batched.stop_reason == alone.stop_reason
        if sampling.seed is not None:
            assert batched.seed == alone.seed == sampling.seed


def test_sampled_row_does_not_depend_on_its_batch():
    """A row samples from its own generator: with the same seed it draws what it draws
    alone (the logits agree to float rounding, far from any sampling threshold here)."""
    target = tiny_target("llama")
    heads = perturb(new_heads("medusa", target), 0.3)
    engine = Engine(target, heads, parse_tree_spec("small"))
    prompts = batch_prompts(target.vocab_size)
    cfg = SamplingConfig(temperature=1.0)
    for seed in range(3):
        seeds = [seed * 10 + b for b in range(5)]
        outs = engine.generate_batch(prompts, 12, cfg, seeds=seeds)
        for b, out in enumerate(outs):
            alone = engine.generate(prompts[b], 12, SamplingConfig(temperature=1.0, seed=seeds[b]))
            assert out.token_ids == alone.token_ids and out.seed == seeds[b]
    # default seeds: sampling.seed + row
    outs = engine.generate_batch(prompts[:3], 4, SamplingConfig(temperature=1.0, seed=7))
    assert [o.seed for o in outs] == [7, 8, 9]


def test_sampling_keeps_the_target_distribution_in_a_batch():
    """The chi-square test of ``test_acceptance`` on row 1 of batches of three prompts."""
    target = tiny_target("llama", vocab_size=V, seed=3)
    with torch.no_grad():  # flatten the tiny model's logits so many pairs occur
        target.lm_head.weight.mul_(0.25)
    prompt, others = [3, 1, 4, 1, 5], ([2, 7], [6, 5, 4, 3, 2, 1, 0, 7])
    cfg = SamplingConfig(temperature=1.0)
    probs = exact_two_token_joint(target, prompt, cfg)

    class Row1:  # draw_pairs' engine: row 1 of a batch
        def __init__(self, engine):
            self.engine = engine

        def generate(self, p, n, sampling):
            return self.engine.generate_batch([others[0], p, others[1]], n, sampling)[1]

    engine = Engine(target, perturb(new_heads("clover", target), 0.3), parse_tree_spec("dynamic:budget=6,branching=3"))
    counts = draw_pairs(Row1(engine), prompt, cfg, 2000)
    assert pooled_pvalue(counts, probs) > 1e-3
    runs = [engine.generate_batch([others[0], prompt], 2, SamplingConfig(temperature=1.0, seed=s))
            for s in range(100)]
    assert any(len(r[1].steps) == 1 for r in runs)  # drafts were accepted


def test_verify_inputs_layout():
    # row 0: 3 committed positions of P = 5, tree root -> a, root -> b, a -> c
    # row 1: all 5 committed, root only (padded with 3 nodes)
    t0 = Tree(torch.tensor([10, 11, 12, 13]), [-1, 0, 0, 1], [0, 1, 1, 2], [1.0, 0.5, 0.4, 0.3])
    t1 = Tree(torch.tensor([20]), [-1], [0], [1.0])
    ids, pos, mask = verify_inputs([t0, t1], [3, 5], 5, torch.float32, "cpu")
    assert ids.tolist() == [[10, 11, 12, 13], [20, 20, 20, 20]]
    assert pos.tolist() == [[3, 4, 4, 5], [5, 5, 5, 5]]
    assert mask.shape == (2, 1, 4, 9)
    seen = (mask[:, 0] == 0).int().tolist()
    assert seen[0] == [[1, 1, 1, 0, 0, 1, 0, 0, 0],
                       [1, 1, 1, 0, 0, 1, 1, 0, 0],
                       [1, 1, 1, 0, 0, 1, 0, 1, 0],
                       [1, 1, 1, 0, 0, 1, 1, 0, 1]]
    assert seen[1] == [[1, 1, 1, 1, 1, 1, 0, 0, 0],
                       [0, 0, 0, 0, 0, 0, 1, 0, 0],
                       [0, 0, 0, 0, 0, 0, 0, 1, 0],
                       [0, 0, 0, 0, 0, 0, 0, 0, 1]]
    assert float(mask.min()) == torch.finfo(torch.float32).min
    # one row (no padding) takes a short cut to the same inputs
    one = verify_inputs([t0], [5], 5, torch.float32, "cpu")
    two = verify_inputs([t0, t0], [5, 5], 5, torch.float32, "cpu")
    assert all(torch.equal(x[0], y[0]) for x, y in zip(one, two))
    # root-only trees on rows of equal length: plain causal attention, no mask
    assert verify_inputs([t1, t1], [5, 5], 5, torch.float32, "cpu")[2] is None
    with pytest.raises(ValueError, match="exceed"):
        verify_inputs([t1], [6], 5, torch.float32, "cpu")
    # padded to a width: extra root tokens at the root's position, seen by nothing but themselves
    ids, pos, mask = verify_inputs([t0], [5], 5, torch.float32, "cpu", width=6)
    assert ids.tolist() == [[10, 11, 12, 13, 10, 10]] and pos.tolist() == [[5, 6, 6, 7, 5, 5]]
    seen = (mask[0, 0] == 0).int()
    assert torch.equal(seen[:4, :9], (two[2][0, 0] == 0).int()) and not seen[:4, 9:].any()
    assert seen[4:].tolist() == [[0] * 9 + [1, 0], [0] * 10 + [1]]
    ids, pos, mask = prefill_inputs([[4, 5, 6], [7]], torch.float32, "cpu")
    assert ids.tolist() == [[4, 5, 6], [7, 0, 0]] and pos.tolist() == [[0, 1, 2], [0, 1, 2]]
    assert (mask[:, 0] == 0).int().tolist() == [[[1, 0, 0], [1, 1, 0], [1, 1, 1]],
                                               [[1, 0, 0], [1, 1, 0], [1, 0, 1]]]
    assert prefill_inputs([[4, 5], [6, 7]], torch.float32, "cpu")[2] is None


@torch.inference_mode()
def test_compact_rows_moves_each_path_into_its_own_gap():
    target = tiny_target("llama")
    cache = new_cache(target.config)
    target.forward_batch(torch.zeros((2, 9), dtype=torch.long), torch.arange(9).repeat(2, 1), None, cache)
    layer = cache.layers[0]
    # tag every column with its index and row so moves can be read back
    col = torch.arange(9.0)[None, None, :, None]
    layer.keys = (col + 100 * torch.arange(2.0)[:, None, None, None]).expand_as(layer.keys).clone()
    layer.values = layer.keys.clone()
    # P = 5: row 0 holds 3 positions and accepts nodes [0, 2]; row 1 holds 5 and accepts [0, 1, 3]
    lengths = compact_rows(cache, [3, 5], 5, [[0, 2], [0, 1, 3]])
    assert lengths == [5, 8] and cache.get_seq_length() == 8
    assert layer.keys[0, 0, :5, 0].tolist() == [0, 1, 2, 5, 7]
    assert layer.keys[1, 0, :8, 0].tolist() == [100, 101, 102, 103, 104, 105, 106, 108]
    assert torch.equal(layer.values, layer.keys)
    select_rows(cache, [1], 7)  # row 0 leaves; keep 7 positions
    assert cache.layers[0].keys.shape[:3] == (1, layer.keys.shape[1], 7)
    assert cache.layers[0].keys[0, 0, :, 0].tolist() == [100, 101, 102, 103, 104, 105, 106]
    with pytest.raises(ValueError, match="paths"):
        compact_rows(cache, [3], 8, [[0], [0]])


def test_batched_verify_equals_each_row_alone():
    """One verification forward over a padded batch gives every row the logits it gets
    alone (float rounding aside), and the compacted cache continues each row exactly."""
    target = tiny_target("gpt2")
    prompts = batch_prompts(target.vocab_size)[:3]
    trees = [Tree(torch.tensor([p[-1], 7, 9, 11]), [-1, 0, 0, 2], [0, 1, 1, 2], [1.0] * 4) for p in prompts[:2]]
    trees.append(Tree(torch.tensor([prompts[2][-1]]), [-1], [0], [1.0]))
    with torch.inference_mode():
        cache = new_cache(target.config)
        ids, pos, mask = prefill_inputs([p[:-1] for p in prompts], target.dtype, "cpu")
        target.forward_batch(ids, pos, mask, cache)
        lengths = [len(p) - 1 for p in prompts]
        P = cache.get_seq_length()
        ids, pos, mask = verify_inputs(trees, lengths, P, target.dtype, "cpu")
        out = target.forward_batch(ids, pos, mask, cache)
        for b, (p, tree) in enumerate(zip(prompts, trees)):  # each row's own verification
            c = new_cache(target.config)
            if len(p) > 1:
                target.forward(torch.tensor([p[:-1]]), torch.arange(len(p) - 1)[None], None, c)
            i, q, m = verify_inputs([tree], [len(p) - 1], len(p) - 1, target.dtype, "cpu")
            ref = target.forward(i, q, m, c)
            assert torch.allclose(out.logits[b, :len(tree)], ref.logits, atol=1e-5), b
        lengths = compact_rows(cache, lengths, P, [[0, 2, 3], [0, 1], [0]])
        # next step, root only: each row continues from its accepted path
        nxt = [Tree(torch.tensor([5]), [-1], [0], [1.0])] * 3
        ids, pos, mask = verify_inputs(nxt, lengths, cache.get_seq_length(), target.dtype, "cpu")
        out = target.forward_batch(ids, pos, mask, cache)
        for b, (p, path) in enumerate(zip(prompts, ([9, 11], [7], []))):
            ref = target.model(torch.tensor([p + path + [5]])).logits[0, -1]
            assert torch.allclose(out.logits[b, 0], ref, atol=1e-5), b


def test_bad_batches_refused():
    target = tiny_target("llama")
    engine = Engine(target)
    with pytest.raises(ValueError, match="no prompts"):
        engine.generate_batch([], 4)
    with pytest.raises(ValueError, match="prompt 1: the prompt is empty"):
        engine.generate_batch([[3, 4], []], 4)
    with pytest.raises(ValueError, match="prompt 0: .*vocabulary"):
        engine.generate_batch([[3, 10_000], [4]], 4)
    with pytest.raises(ValueError, match="caps"):
        engine.generate_batch([[3], [4]], [4])
    with pytest.raises(ValueError, match="prompt 1: max_new_tokens"):
        engine.generate_batch([[3], [4]], [4, 0])
    with pytest.raises(ValueError, match="seeds"):
        engine.generate_batch([[3], [4]], 4, seeds=[1])
    with pytest.raises(ValueError, match="the prompt is empty"):  # one prompt: no row named
        engine.generate_batch([[]], 4)
    assert [len(o.token_ids) for o in engine.generate_batch([[3], [4, 5]], [2, 3])] == [2, 3]
    with pytest.raises(ValueError, match="2 roots"):
        draft_rows([PlainDrafter()], [1, 2], [3])


def test_medusa_rows_draft_together():
    """Medusa drafts a batch in one heads call per step (``draft_many``), and each row's
    trees are the ones it drafts alone."""
    target = tiny_target("llama")
    heads = perturb(new_heads("medusa", target, num_heads=3), scale=0.2, seed=1)
    engine = Engine(target, heads, parse_tree_spec("dynamic:budget=8,branching=3"))
    prompts = batch_prompts(target.vocab_size)[:4]
    calls = []
    hook = heads.register_forward_hook(lambda module, args, out: calls.append(args[0].shape))
    try:
        run = engine.stream_batch(prompts, 12)
        steps = list(run)
    finally:
        hook.remove()
    # at most one call per step, and one in every step that drafts (none where no row has
    # depth left to draft); rows with a verified state (all but a one-token prompt's first step)
    assert sum(any(len(t.nodes) > 1 for t in step) for step in steps) <= len(calls) <= len(steps)
    assert calls[0] == (3, target.hidden_size) and calls[1][0] == 4
    for prompt, out in zip(prompts, run.results):
        alone = engine.generate(prompt, 12)
        assert [[n.token_id for n in s.nodes] for s in out.steps] == \
            [[n.token_id for n in s.nodes] for s in alone.steps]
        assert [[n.parent for n in s.nodes] for s in out.steps] == [[n.parent for n in s.nodes] for s in alone.steps]


def test_hybrid_rows_draft_their_heads_together():
    """Medusa + lookup in a batch: the rows' heads draft in one heads call per step
    (``HybridDrafter.draft_many``), each row merges its own lookup chain, and each row's
    trees are the ones it drafts alone."""
    target = tiny_target("llama")
    heads = perturb(new_heads("medusa", target, num_heads=3), scale=0.2, seed=1)
    engine = Engine(target, heads, parse_tree_spec("dynamic:budget=4,branching=2"), lookup=LookupConfig(max_tokens=3))
    prompts = [p + p[:4] for p in batch_prompts(target.vocab_size)[:4]]  # repeats for lookup to find
    calls = []
    hook = heads.register_forward_hook(lambda module, args, out: calls.append(args[0].shape[0]))
    try:
        run = engine.stream_batch(prompts, 12)
        steps = list(run)
    finally:
        hook.remove()
    assert len(calls) <= len(steps) and max(calls) > 1  # none in a step where no row has depth left
    sources = set()
    for prompt, out in zip(prompts, run.results):
        alone = engine.generate(prompt, 12)
        assert out.token_ids == alone.token_ids == Engine(target).generate(prompt, 12).token_ids
        assert [[(n.token_id, n.parent) for n in s.nodes] for s in out.steps] == \
            [[(n.token_id, n.parent) for n in s.nodes] for s in alone.steps]
        sources |= {n.source for s in out.steps for n in s.nodes}
    assert "lookup" in sources or "both" in sources


@pytest.mark.parametrize("kind", ["clover", "clover2"])
def test_recurrent_rows_grow_their_trees_together(kind):
    """Clover and Clover-2 grow a batch's trees in lock step (one head step per depth for
    all rows) and run their Augmenting Blocks once per step for all rows; each row's trees
    are the ones it grows alone."""
    target = tiny_target("qwen2")
    heads = perturb(new_heads(kind, target, num_heads=3), scale=0.2, seed=1)
    engine = Engine(target, heads, parse_tree_spec("dynamic:budget=8,branching=3"))
    prompts = batch_prompts(target.vocab_size)[:4]
    calls = []
    real = heads.step
    heads.step = lambda prev, *a: calls.append(prev.shape[0]) or real(prev, *a)
    try:
        run = engine.stream_batch(prompts, 10)
        steps = list(run)
    finally:
        del heads.step
    assert len(calls) <= 3 * len(steps)  # at most one step per depth, whatever the rows
    assert max(calls) > 3  # steps served several rows' nodes at once
    # the rows' Augmenting Blocks ran together: one forward a step
    blocks = []
    hook = heads.augment.register_forward_hook(lambda m, a, k, out: blocks.append(1), with_kwargs=True)
    try:
        steps = list(engine.stream_batch(prompts, 10))
    finally:
        hook.remove()
    assert len(blocks) <= len(steps) + 1  # + the prefill's (Clover)
    for prompt, out in zip(prompts, run.results):
        alone = engine.generate(prompt, 10)
        assert out.token_ids == alone.token_ids
        assert [[(n.token_id, n.parent) for n in s.nodes] for s in out.steps] == \
            [[(n.token_id, n.parent) for n in s.nodes] for s in alone.steps]


@torch.inference_mode()
@pytest.mark.parametrize("arch", ARCHS)
def test_augmenting_block_rows_run_together(arch):
    """One Augmenting Block forward over rows of different cache lengths (0 included)
    gives each row the outputs and the cache it gets alone."""
    from transformers import DynamicCache

    from clover.heads.clover import run_augmenting_block, run_augmenting_rows

    target = tiny_target(arch)
    block = perturb(new_heads("clover", target), 0.2).augment
    g = torch.Generator().manual_seed(0)
    past = [torch.randn(n, target.hidden_size, generator=g) for n in (4, 0, 7)]
    new = [torch.randn(n, target.hidden_size, generator=g) for n in (2, 3, 1)]
    alone = [DynamicCache(config=block.config) for _ in past]
    together = [DynamicCache(config=block.config) for _ in past]
    for a, t, h in zip(alone, together, past):
        if len(h):
            run_augmenting_block(block, h[None], a, 0)
            run_augmenting_block(block, h[None], t, 0)
    want = [run_augmenting_block(block, h[None], a, len(p))[0] for a, h, p in zip(alone, new, past)]
    got = run_augmenting_rows(block, new, together, [len(p) for p in past])
    for w, o, a, t in zip(want, got, alone, together):
        assert o.shape == w.shape and torch.allclose(o, w, atol=1e-5)
        for la, lt in zip(a.layers, t.layers):
            assert la.keys.shape == lt.keys.shape and torch.allclose(la.keys, lt.keys, atol=1e-5)
            assert torch.allclose(la.values, lt.values, atol=1e-5)


def test_batch_of_one_token_prompts():
    """No prefill at all (every prompt is its first root): rows still decode their own text."""
    target = tiny_target("llama")
    prompts = [[3], [4], [5]]
    want = [Engine(target).generate(p, 8).token_ids for p in prompts]
    clover = Engine(target, perturb(new_heads("clover", target), 0.2), parse_tree_spec("small"))
    for engine in (Engine(target), clover):
        assert [o.token_ids for o in engine.generate_batch(prompts, 8)] == want


def _batch_step_cost():
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "batch_step_cost", Path(__file__).resolve().parents[1] / "scripts" / "batch_step_cost.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_batch_step_cost_replay_and_breakdown():
    """scripts/batch_step_cost.py (the cost breakdown): the replay's bounds by hand,
    and every hooked part of a real step is timed."""
    cost = _batch_step_cost()
    steps = cost.step_costs({1: 10.0, 2: 12.0, 4: 20.0}, 4)
    assert steps == {1: 10.0, 2: 12.0, 3: 16.0, 4: 20.0}
    # two rows of 4 and 2 tokens: one batch of 2 takes 2 steps of 12 ms and 2 of 10 ms
    # (44 ms for 6 tokens) where one row at a time takes 60 ms
    assert cost.replay([4, 2], 2, steps) == {"static": round(60 / 44, 2), "continuous": round(60 / 44, 2)}
    # continuous batching refills the short row's slot: rows of 4, 1 and 3 tokens, b = 2.
    # Static: the first batch only (a last, smaller batch is left out): 1 step at 12 ms and
    # 3 at 10 (42 ms) for 5 tokens (50 ms one at a time). Continuous: rows 4 and 1 (12 ms),
    # then 3 and 3 (3 steps of 12): 48 ms for 8 tokens (80 ms one at a time).
    got = cost.replay([4, 1, 3], 2, steps)
    assert got == {"static": round(50 / 42, 2), "continuous": round(80 / 48, 2)}
    target = tiny_target("llama")
    hooks = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in target.model.modules())
    setups = {b: cost.step_inputs(target, b, 16) for b in (1, 3)}
    steps = cost.timed_steps(target, setups, 16, 4)
    for b in (1, 3):
        assert len(steps[b]) == 4
        ms, parts = cost.summarise(steps[b])
        assert set(parts) == {"projections", "attention", "mlp", "lm_head", "rest"}
        assert all(parts[k] > 0 for k in ("projections", "attention", "mlp", "lm_head"))  # every hook fired
        assert sum(parts.values()) == pytest.approx(ms, abs=0.05)
        assert setups[b][0].get_seq_length() == 16  # each step is cropped back
    # the timer's hooks are removed (the target keeps its own, which capture hidden states)
    assert sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in target.model.modules()) == hooks


def _serve_prompts(n: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(2, 96, (int(torch.randint(1, 25, (1,), generator=g)),), generator=g).tolist()
            for _ in range(n)]


def test_serve_admits_rows_mid_run():
    """Requests queued while iterating (a conversation's next turn) join the running batch;
    every row, early or late, decodes its own single-stream greedy output, for every method."""
    target = tiny_target("llama")
    prompts = _serve_prompts(7)
    refs = [Engine(target).generate(p, 10).token_ids for p in prompts]
    follow = [p + r + [7, 8] for p, r in zip(prompts, refs)]
    follow_refs = [Engine(target).generate(p, 10).token_ids for p in follow]
    batch_rows = []
    for name, engine in engines(target, refs + follow_refs, prompts + follow).items():
        queue = deque(Request(i, p, max_new_tokens=10 if i % 2 else None) for i, p in enumerate(prompts))
        got, traces = {}, {}
        for key, result in engine.serve(queue, 10, batch_size=4, on_step=batch_rows.append):
            got[key] = result.token_ids
            traces[key] = result.steps
            if isinstance(key, int):  # the next turn, queued while the batch runs
                queue.append(Request(("next", key), follow[key]))
        assert got == {**dict(enumerate(refs)), **{("next", i): r for i, r in enumerate(follow_refs)}}, name
        rows = [{s.row for s in steps} for steps in traces.values()]
        assert all(len(r) == 1 for r in rows) and sorted(r.pop() for r in rows) == list(range(14)), name
        assert all([s.step for s in steps] == list(range(len(steps))) for steps in traces.values()), name
        assert all(s.nodes for steps in traces.values() for s in steps)  # full traces by default
    assert max(batch_rows) == 4


def test_serve_rows_join_when_a_quarter_is_free():
    """Rows join a running batch once a quarter of it is free: with 4 rows, as soon as
    one ends; with 8, once two have ended. Every row still decodes its own output."""
    target = tiny_target("qwen2")
    prompts = _serve_prompts(12, seed=2)
    caps = [3, 4] + [9] * 10
    want = [Engine(target).generate(p, c).token_ids for p, c in zip(prompts, caps)]
    requests = [Request(i, p, max_new_tokens=c) for i, (p, c) in enumerate(zip(prompts, caps))]
    for batch_size, first_steps in ((4, [4, 4, 4, 4, 4]), (8, [8, 8, 8, 7, 8])):
        seen, order = [], []
        for key, result in Engine(target).serve(requests, 9, batch_size=batch_size, on_step=seen.append,
                                                trace_nodes=False):
            order.append(key)
            assert result.token_ids == want[key] and result.steps[0].nodes == []
            assert [s.step for s in result.steps] == list(range(len(result.steps)))
            assert result.steps[-1].stop_reason == "length" and result.steps[0].bonus_text
        assert order[:2] == [0, 1] and sorted(order) == list(range(12))
        assert seen[:5] == first_steps, batch_size  # rows 0 and 1 end at steps 3 and 4


def test_serve_respects_batch_tokens():
    """rows x (KV-cache columns + max_new_tokens) stays within batch_tokens; one row
    always runs."""
    target = tiny_target("llama")
    prompts = [[5 + i] * 10 for i in range(6)]
    want = [Engine(target).generate(p, 8).token_ids for p in prompts]
    for batch_tokens, most in ((3 * (10 + 8), 3), (1, 1)):
        seen = []
        got = dict(Engine(target).serve([Request(i, p) for i, p in enumerate(prompts)], 8, batch_size=64,
                                        batch_tokens=batch_tokens, on_step=seen.append))
        assert {k: r.token_ids for k, r in got.items()} == dict(enumerate(want))
        assert max(seen) == most


def test_serve_seeds_do_not_depend_on_batching():
    target = tiny_target("llama")
    prompts = _serve_prompts(10, seed=3)
    cfg = SamplingConfig(temperature=1.0)

    def answers(batch_size, seeds):
        out = Engine(target).serve([Request(i, p, s) for i, (p, s) in enumerate(zip(prompts, seeds))], 12, cfg,
                                   batch_size=batch_size)
        return {k: (r.token_ids, r.seed) for k, r in out}

    seeds = list(range(100, 110))
    one, four, all_ = answers(1, seeds), answers(4, seeds), answers(10, seeds)
    assert one == four == all_ and [all_[i][1] for i in range(10)] == seeds
    assert answers(10, [s + 1 for s in seeds]) != all_


def test_serve_refuses_bad_requests():
    target = tiny_target("llama")
    engine = Engine(target)
    for bad in ({"batch_size": 0}, {"batch_tokens": 0}, {"max_new_tokens": 0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            engine.serve([Request(0, [3])], **{"max_new_tokens": 4, **bad})  # at once, not on iteration
    with pytest.raises(ValueError, match="request 'b': the prompt is empty"):
        list(engine.serve([Request("a", [3]), Request("b", [])], 4))
    with pytest.raises(ValueError, match="request 1: .*exceeds"):
        list(engine.serve([Request(1, [3] * 10, max_new_tokens=target.max_context)], 4))


@torch.inference_mode()
def test_buffered_layer_follows_the_cache_bookkeeping():
    """compact_rows, crop_cache, select_rows and append_rows give a buffered KV cache the
    keys and values they give transformers' DynamicLayer, and appends continue in place."""
    target = tiny_target("llama")
    caches = [new_cache(target.config), buffered_cache(target.config)]

    def forward(cache, ids, start):
        n = ids.shape[1]
        return target.forward_batch(ids, torch.arange(start, start + n).repeat(ids.shape[0], 1), None, cache)

    ids = torch.randint(2, 96, (3, 9), generator=torch.Generator().manual_seed(0))
    for cache in caches:
        forward(cache, ids, 0)
        assert compact_rows(cache, [3, 5, 4], 5, [[0, 2], [0, 1, 3], [0]]) == [5, 8, 5]
        select_rows(cache, [2, 0], 6)
        crop_cache(cache, 5)
        other = new_cache(target.config)
        forward(other, ids[:1, :7], 0)
        append_rows(cache, other, 2, 1)
        assert cache_length(cache) == 7
        forward(cache, ids[:, :2], 7)  # appends after the merge
    buffered = caches[1].layers[0]
    assert buffered._k.shape[-2] > buffered.length == 9  # room kept for more positions
    for plain, buf in zip(caches[0].layers, caches[1].layers):
        assert torch.equal(plain.keys, buf.keys) and torch.equal(plain.values, buf.values)
    empty = buffered_cache(target.config)  # rows that join with nothing cached (1-token prompts)
    append_rows(caches[1], empty, 3, 2)
    assert caches[1].layers[0].keys.shape[0] == 5 and not caches[1].layers[0].keys[3:].any()
