"""Bad numbers, bad files and bad bytes: each gets a clear error, never a traceback or
silent garbage (tiny models)."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from clover import Engine, SamplingConfig, TreeConfig, encode_prompt, load_heads, new_heads
from clover.requests import NonFiniteLogitsError, check_finite
from clover.lookup import LookupConfig
from conftest import tiny_target


def broken_lm_head(target, after: int, how: str):
    """Make the target model's forward return bad logits from its ``after``-th call on
    (the heads' own use of the lm_head weights is left alone): "nan" all NaN, "one-nan"
    one NaN, "inf" +inf at token 12."""
    calls = [0]

    def hook(module, args, kwargs, out):
        calls[0] += 1
        if calls[0] <= after:
            return out
        logits = out.logits.clone()
        if how == "nan":
            logits[:] = float("nan")
        elif how == "one-nan":
            logits[..., 5] = float("nan")
        else:
            logits[..., 12] = float("inf")
        out.logits = logits
        return out
    return target.model.register_forward_hook(hook, with_kwargs=True)


@pytest.mark.parametrize("how", ["nan", "one-nan", "inf"])
@pytest.mark.parametrize("method", ["ar", "lookup", "clover"])
def test_non_finite_logits_stop_every_method_with_a_clear_error(how, method):
    """A forward hook breaks the target's logits after its third forward: greedy plain,
    lookup and Clover decoding all stop naming non-finite logits and the decode step,
    and emit no step built on them; sampling stops the same way (not with torch's raw
    multinomial error)."""
    target = tiny_target("llama", vocab_size=64)
    heads = new_heads("clover", target, num_heads=2) if method == "clover" else None
    lookup = LookupConfig() if method == "lookup" else None
    tree = TreeConfig(kind="dynamic", budget=4) if heads is not None else TreeConfig()
    for temperature in (0.0, 0.8):
        handle = broken_lm_head(target, 3, how)
        try:
            run = Engine(target, heads, tree, lookup).stream(
                [5, 6, 7, 5, 6], 16, SamplingConfig(temperature=temperature, seed=1))
            steps = []
            with pytest.raises(NonFiniteLogitsError, match=r"non-finite logits \(NaN or inf\) at decode step 3"):
                for step in run:
                    steps.append(step)
            assert len(steps) == 2  # the steps before the broken forward, nothing after
        finally:
            handle.remove()


def test_non_finite_logits_in_the_prefill_are_named():
    target = tiny_target("llama", vocab_size=64)
    handle = broken_lm_head(target, 0, "nan")
    try:
        with pytest.raises(NonFiniteLogitsError, match="at the prompt's prefill"):
            Engine(target).generate([5, 6, 7, 8], 4)
    finally:
        handle.remove()


def test_the_finite_check_looks_at_real_nodes_only():
    logits = torch.zeros(2, 3, 10)
    logits[1, 2] = float("nan")  # padding of a row whose tree has 2 nodes
    check_finite(logits, [3, 2], "decode step 1")
    with pytest.raises(NonFiniteLogitsError, match=r"decode step 1 \(batch row 1\)"):
        check_finite(logits, [3, 3], "decode step 1")


def test_cli_reports_non_finite_logits_without_a_traceback(tiny_dir, capsys, monkeypatch):
    from clover import models
    from clover.cli import main

    real = models.TargetModel.forward_batch

    def nan_logits(self, *args, **kwargs):
        out = real(self, *args, **kwargs)
        out.logits.fill_(float("nan"))
        return out
    monkeypatch.setattr(models.TargetModel, "forward_batch", nan_logits)
    rc = main(["generate", "--model", str(tiny_dir), "--prompt", "t5 t6 t7", "--max-new-tokens", "4",
               "--method", "ar"])
    err = capsys.readouterr().err
    assert rc == 1 and "non-finite logits" in err and "Traceback" not in err


def _saved(tmp_path, target, kind="clover", name="heads"):
    heads = new_heads(kind, target, num_heads=2, draft_vocab_size=16) if kind == "medusa" else \
        new_heads(kind, target, num_heads=2)
    folder = tmp_path / name
    heads.save_pretrained(folder)
    return folder, load_file(str(folder / "model.safetensors"))


def test_heads_files_that_do_not_fit_are_refused_naming_the_tensor(tmp_path):
    """A missing, an extra and a wrongly shaped tensor, a NaN weight and a draft vocabulary
    id outside the vocabulary: each refused at load, naming the file, the tensor and what
    was expected; fp16 and bf16 weights still load."""
    target = tiny_target("llama", vocab_size=64)
    folder, state = _saved(tmp_path, target)
    weights = folder / "model.safetensors"
    name = sorted(k for k, v in state.items() if v.is_floating_point() and v.dim() == 2)[0]

    def refused(tensors, *patterns):
        save_file(tensors, str(weights))
        with pytest.raises(ValueError) as e:
            load_heads(folder, target)
        for p in (str(weights), *patterns):
            assert p in str(e.value), (p, str(e.value))

    refused({k: v for k, v in state.items() if k != name}, f"tensor {name!r} is missing (expected shape")
    refused({**state, "extra.weight": torch.zeros(2)}, "tensor 'extra.weight' is not part of these heads")
    bad_shape = torch.zeros(state[name].shape[0] + 1, state[name].shape[1])
    refused({**state, name: bad_shape}, f"tensor {name!r} has shape {tuple(bad_shape.shape)}, expected "
                                        f"{tuple(state[name].shape)}")
    nan = state[name].clone()
    nan[0, 0] = float("nan")
    refused({**state, name: nan}, f"tensor {name!r} holds NaN or infinite values")
    for dtype in (torch.float16, torch.bfloat16):  # other float dtypes keep working
        save_file({k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}, str(weights))
        assert load_heads(folder, target).config.kind == "clover"
    weights.write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match="is not a readable safetensors file"):
        load_heads(folder, target)
    weights.unlink()
    with pytest.raises(FileNotFoundError, match="expected config.json and model.safetensors"):
        load_heads(folder, target)


def test_a_draft_vocabulary_outside_the_target_is_refused_at_load(tmp_path):
    target = tiny_target("llama", vocab_size=64)
    folder, state = _saved(tmp_path, target, kind="medusa")
    key = next(k for k in state if k.endswith("draft_vocab"))
    weights = folder / "model.safetensors"
    outside = state[key].clone()
    outside[3] = 64  # one past the vocabulary
    save_file({**state, key: outside}, str(weights))
    with pytest.raises(ValueError, match=r"token ids outside the vocabulary \[0, 64\)"):
        load_heads(folder, target)
    repeated = state[key].clone()
    repeated[3] = repeated[2]
    save_file({**state, key: repeated}, str(weights))
    with pytest.raises(ValueError, match="repeats token ids"):
        load_heads(folder, target)


def test_bytes_that_are_not_utf8_get_a_clear_error(tiny_dir, capsys):
    """A Latin-1 byte on the command line (Python hands it over as a lone surrogate) and a
    lone surrogate in a chat message: a clear error naming the byte, in the library, the
    CLI (before the model loads) and the app's settings."""
    from app.settings import parse_settings
    from clover.cli import main

    target = tiny_target("llama", vocab_size=64)
    latin1 = b"caf\xe9".decode("utf-8", "surrogateescape")
    with pytest.raises(ValueError, match="not valid UTF-8 text: the byte 0xe9 at character 4"):
        encode_prompt(target.tokenizer, latin1)
    with pytest.raises(ValueError, match=r"the user message is not valid UTF-8 text: U\+D800"):
        encode_prompt(target.tokenizer, [{"role": "user", "content": "a\ud800b"}])
    rc = main(["generate", "--model", str(tiny_dir), "--prompt", latin1])
    err = capsys.readouterr().err
    assert rc == 2 and "not valid UTF-8 text: the byte 0xe9" in err and "Traceback" not in err
    json.dumps(err)  # the message itself is printable text
    with pytest.raises(ValueError, match="not valid UTF-8"):
        parse_settings(latin1, "clover", 0, 8, "auto")
    assert encode_prompt(target.tokenizer, "café ☕")  # real UTF-8 text is fine


def test_no_notebook_finds_files_through_the_working_directory(tmp_path, monkeypatch):
    """Notebooks find the repository's files through the package (clover.assets), not the
    kernel's working directory: no code cell uses Path.cwd() or a relative "../" path,
    and the data folder resolves from anywhere."""
    from pathlib import Path

    from clover.assets import assets_dir, data_dir

    root = Path(__file__).resolve().parents[1]
    for nb in sorted((root / "notebooks").glob("*.ipynb")):
        for cell in json.loads(nb.read_text())["cells"]:
            if cell["cell_type"] == "code":
                code = "".join(cell["source"])
                assert "Path.cwd()" not in code and '"../' not in code and "'../" not in code, nb.name
    monkeypatch.chdir(tmp_path)
    assert (data_dir() / "selfdistill-v2").is_dir() and data_dir().parent == assets_dir().parent
    monkeypatch.setenv("CLOVER_DATA_DIR", str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError, match="CLOVER_DATA_DIR"):
        data_dir()


@pytest.mark.model  # in the notebook's kernel
def test_notebook_02_runs_from_another_directory(tmp_path, monkeypatch):
    """Notebook 02 (it reads the training conversations) executed with its kernel started
    in an unrelated folder, in the test suite's fast mode."""
    from pathlib import Path

    import nbformat
    from nbclient import NotebookClient

    monkeypatch.setenv("CLOVER_NOTEBOOK_FAST", "1")
    nb_path = Path(__file__).resolve().parents[1] / "notebooks" / "02_clover_architecture.ipynb"
    nb = nbformat.read(nb_path, as_version=4)
    NotebookClient(nb, timeout=900, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not any(o.get("output_type") == "error" for o in outputs)


@pytest.mark.parametrize("text,expected", [
    ("{}", "field 'kind' is missing (one of medusa, clover, clover2)"),
    ('{"num_heads": 2}', "field 'kind' is missing"),
    ('{"kind": 3}', "field 'kind' must be a string, got 3"),
    ('{"kind": "eagle9"}', "unknown head kind 'eagle9'"),
    ('{"kind": "clover", "num_heads": "2"}', "field 'num_heads' must be an integer, got '2'"),
    ('{"kind": "clover", "num_heads": true}', "field 'num_heads' must be an integer, got True"),
    ('{"kind": "clover", "num_heads": 0}', "num_heads must be >= 1"),
    ('[1, 2]', "expected a JSON object of head settings, got list"),
    ("{'kind': 'clover'}", "is not valid JSON (Expecting property name"),
    (b"\xff\xfe{}", "is not UTF-8 text"),
])
def test_a_heads_config_fault_is_one_line_naming_the_file_and_the_field(tmp_path, tiny_dir, capsys, text, expected):
    """Every fault in a heads folder's config.json (missing or unknown kind, a field of the
    wrong type or out of range, not an object, not JSON, not text) is one ValueError line
    naming the file and the field, in the library, the CLI (exit 2, no traceback) and the
    app's model loader."""
    from app.registry import get_model
    from clover.cli import main

    target = tiny_target("llama", vocab_size=64)
    folder, _ = _saved(tmp_path, target)
    config = folder / "config.json"
    config.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ValueError) as e:
        load_heads(folder, target)
    message = str(e.value)
    assert message.startswith(str(config)) and expected in message and "\n" not in message
    rc = main(["generate", "--model", str(tiny_dir), "--heads", str(folder), "--method", "clover",
               "--prompt", "hi", "--max-new-tokens", "2", "--tree", "dynamic:budget=2"])
    err = capsys.readouterr().err
    assert rc == 2 and expected in err and str(config) in err and "Traceback" not in err
    with pytest.raises(ValueError) as e:
        get_model(str(tiny_dir), str(folder))
    assert expected in str(e.value) and str(config) in str(e.value)


def test_a_stop_text_with_a_byte_that_was_not_utf8_is_refused(tiny_dir, capsys):
    """A stop string holding a lone surrogate (a Latin-1 byte on the command line) could
    never match: it is refused like such a prompt, naming which stop string, in the
    library (every caller's check) and the CLI (exit 2, before the model loads)."""
    from clover.cli import main
    from clover.requests import validate_request

    target = tiny_target("llama", vocab_size=64)
    latin1 = b"fin\xe9".decode("utf-8", "surrogateescape")
    with pytest.raises(ValueError, match="the stop string is not valid UTF-8 text: the byte 0xe9 at character 4"):
        validate_request(target, [3, 4], 8, [latin1])
    with pytest.raises(ValueError, match=r"the stop string at index 1 is not valid UTF-8 text: U\+D800"):
        validate_request(target, [3, 4], 8, ["ok", "a\ud800"])
    with pytest.raises(ValueError, match="the stop string at index 1"):
        Engine(target).generate([3, 4], 4, stop_strings=["ok", latin1])
    for stops, named in (([latin1], "the --stop text is not valid UTF-8"),
                         (["ok", latin1], "the --stop text (the second) is not valid UTF-8")):
        args = ["generate", "--model", str(tiny_dir), "--prompt", "hi"]
        for s in stops:
            args += ["--stop", s]
        rc = main(args)
        err = capsys.readouterr().err
        assert rc == 2 and named in err and "Traceback" not in err
    validate_request(target, [3, 4], 8, ["fin", "café"])  # real text is fine


@pytest.mark.parametrize("transcript,turn", [
    ("System: be brief\nUser:", "turn 2 of the conversation (the user message) is empty"),
    ("System: be brief\nUser:   \nAssistant: ok\nUser: go on", "turn 2 of the conversation (the user message)"),
    ("System:\nUser: hi", "turn 1 of the conversation (the system message) is empty"),
    ("User: hi\nAssistant:\nUser: and?", "turn 2 of the conversation (the assistant message) is empty"),
])
def test_an_empty_turn_is_an_error_like_an_empty_prompt(transcript, turn):
    """A transcript with an empty turn (a 'User:' line with nothing after it, after a
    system line, or an empty system or assistant turn) is refused with the turn named,
    never sent as an empty message."""
    from app.settings import parse_chat

    target = tiny_target("llama", vocab_size=64)
    with pytest.raises(ValueError, match=turn.replace("(", r"\(").replace(")", r"\)")):
        encode_prompt(target.tokenizer, parse_chat(transcript))
