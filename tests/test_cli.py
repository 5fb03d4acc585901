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


@pytest.mark.slow
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
