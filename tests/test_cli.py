"""The ``clover generate`` command."""
from __future__ import annotations

import json

import pytest

from clover import Engine, encode_prompt
from clover.cli import main


def test_generate_json_on_a_local_folder(tiny_dir, capsys):
    rc = main(["generate", "--method", "clover", "--model", str(tiny_dir), "--prompt",
               "t5 t6 t7", "--max-new-tokens", "9", "--raw", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["method"] == "clover" and out["new_tokens"] == 9 and out["lossless"] is True
    assert set(out) >= {"text", "token_ids", "steps", "mean_accepted_length", "tokens_per_second"}
    main(["generate", "--method", "ar", "--model", str(tiny_dir), "--prompt", "t5 t6 t7",
          "--max-new-tokens", "9", "--raw", "--json"])
    assert json.loads(capsys.readouterr().out)["token_ids"] == out["token_ids"]


@pytest.mark.parametrize("argv,msg", [
    (["--prompt", "  "], "the prompt is empty"),
    (["--prompt", "t3", "--tree", "[[0,1]]"], "needs its parent"),
    (["--prompt", "t3", "--tree", "wide"], "unknown tree spec"),
    (["--prompt", "t3", "--temperature", "-1"], "temperature"),
    (["--prompt", "t3", "--heads", "/nonexistent/heads"], "no heads"),
])
def test_generate_errors_are_clear(tiny_dir, capsys, argv, msg):
    rc = main(["generate", "--model", str(tiny_dir), "--raw"] + argv)
    err = capsys.readouterr().err
    assert rc == 2 and msg in err and "Traceback" not in err


def test_unknown_method_and_bad_numbers(capsys):
    with pytest.raises(SystemExit):
        main(["generate", "--method", "eagle", "--prompt", "hi"])
    assert "invalid choice" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["generate", "--prompt", "hi", "--max-new-tokens", "0"])
    assert "must be > 0" in capsys.readouterr().err


def test_generate_clover_json_on_embedded(embedded, capsys):
    rc = main(["generate", "--method", "clover", "--prompt", "Name a color.",
               "--max-new-tokens", "12", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    ids = encode_prompt(embedded.tokenizer, "Name a color.")
    assert out["token_ids"] == Engine(embedded).generate(ids, 12).token_ids


def test_tree_off_decodes_plainly_and_says_so(tiny_dir, capsys):
    rc = main(["generate", "--method", "clover", "--model", str(tiny_dir), "--prompt", "t5 t6 t7",
               "--max-new-tokens", "6", "--raw", "--json", "--tree", "off"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["steps"] == 6 and out["tree"].startswith("speculation off")


def test_generate_with_lookup_methods(tiny_dir, capsys):
    """--method lookup and --lookup (a lookup branch in the heads' tree) decode exactly."""
    prompt = ["--model", str(tiny_dir), "--prompt", "t5 t6 t7 t8 t5 t6 t7 t8 t5 t6",
              "--max-new-tokens", "12", "--raw", "--json", "--tree", "dynamic:budget=4"]
    assert main(["generate", "--method", "ar"] + prompt) == 0
    plain = json.loads(capsys.readouterr().out)["token_ids"]
    for argv, method in ((["--method", "lookup"], "lookup"), (["--method", "clover", "--lookup"], "clover+lookup"),
                         (["--method", "medusa+lookup"], "medusa+lookup")):
        assert main(["generate"] + argv + prompt) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["method"] == method and out["token_ids"] == plain
    rc = main(["generate", "--method", "ar", "--lookup"] + prompt)
    assert rc == 2 and "--method lookup" in capsys.readouterr().err


def test_generate_with_clover2_heads_from_a_folder(tiny_dir, tmp_path, capsys):
    """--method clover2 --heads DIR decodes with those heads exactly as plain decoding;
    heads of another kind in DIR are refused clearly."""
    from clover import load_target, new_heads
    from conftest import perturb

    target = load_target(str(tiny_dir), device="cpu")
    heads_dir = tmp_path / "clover2"
    perturb(new_heads("clover2", target, num_heads=3), scale=0.2, seed=1).save_pretrained(heads_dir)
    common = ["--model", str(tiny_dir), "--prompt", "t5 t6 t7 t5 t6", "--max-new-tokens", "12",
              "--raw", "--json", "--tree", "dynamic:budget=6"]
    assert main(["generate", "--method", "ar"] + common) == 0
    plain = json.loads(capsys.readouterr().out)["token_ids"]
    for method in ("clover2", "clover2+lookup"):
        assert main(["generate", "--method", method, "--heads", str(heads_dir)] + common) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["method"] == method and out["token_ids"] == plain
        assert not out["tree"].startswith("speculation off")
    rc = main(["generate", "--method", "clover", "--heads", str(heads_dir)] + common)
    err = capsys.readouterr().err
    assert rc == 2 and "holds clover2 heads, not clover" in err and "Traceback" not in err


def test_train_options_are_the_config_fields(monkeypatch):
    """`clover train` has one option per TrainConfig field, with the attribute's docstring
    text as its help, and every given value reaches the config; an option not given
    leaves the preset's value."""
    from dataclasses import fields

    import clover.cli as cli
    import clover.training.train as train_module
    from clover.training.config import CHOICES, TrainConfig, preset

    parser = cli.build_parser()
    train_parser = next(a for a in parser._subparsers._group_actions[0].choices.values()
                        if a.prog.endswith("train"))
    options = {a.dest: a for a in train_parser._actions}
    for f in fields(TrainConfig):
        if f.name == "method":
            continue
        assert f.name in options, f.name
        assert options[f.name].default is None and options[f.name].help, f.name
        if f.name in CHOICES:
            assert tuple(options[f.name].choices) == CHOICES[f.name]
    seen = {}
    monkeypatch.setattr("clover.models.load_target", lambda *a, **k: None)
    monkeypatch.setattr(train_module, "train", lambda target, data, out, cfg, **kw: seen.update(cfg=cfg) or {})
    assert main(["train", "--preset", "smollm2-clover", "--data", "d", "--out", "o", "--steps", "7",
                 "--lr", "0.5", "--schedule", "constant", "--keep-evals", "--heldout-percent", "9"]) == 0
    cfg = seen["cfg"]
    assert (cfg.steps, cfg.lr, cfg.schedule, cfg.keep_evals, cfg.heldout_percent) == (7, 0.5, "constant", True, 9)
    assert cfg.batch_size == preset("smollm2-clover").batch_size and cfg.method == "clover"
    seen.clear()
    assert main(["train", "--method", "clover2", "--no-shared-recurrence", "--data", "d", "--out", "o"]) == 0
    assert seen["cfg"].shared_recurrence is False and seen["cfg"].steps == TrainConfig().steps
