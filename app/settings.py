"""What a visitor typed, validated: the prompt (or a chat transcript), the method, the
sampling and tree settings. Pure parsing: no model, no Gradio; every error is a
``ValueError`` whose message is written for the visitor.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from clover import SamplingConfig, TreeConfig, parse_tree_spec
from clover.methods import ALL_METHODS, HEAD_KINDS, split_method, with_lookup
from clover.models import check_text

MAX_NEW_TOKENS = 512
DEFAULT_MAX_NEW_TOKENS = 64  # the "Max new tokens" box when the page opens
MAX_PROMPT_CHARS = 20_000
MAX_TEMPERATURE = 5.0


def auto_tree() -> TreeConfig:
    """The tree setting "auto": the library's default dynamic tree, marked ``auto`` so each
    model and method gets the budget measured for this machine (see
    :meth:`app.sizing.TreeSizing.tree_for`)."""
    return TreeConfig(auto=True)


def tree_config(choice) -> TreeConfig:
    """A tree from the budget setting: "auto", a node budget (e.g. "10"), or any
    ``clover.parse_tree_spec`` spec ("dynamic:budget=12,branching=4", "small", "[[0],[1]]").

    Raises:
        ValueError: with a message for the visitor.
    """
    text = str(choice if choice is not None else "").strip()
    if text in ("", "auto"):
        return auto_tree()
    try:
        budget = float(text)
    except ValueError:
        pass
    else:
        if not budget.is_integer() or not 1 <= budget <= 256:
            raise ValueError(f"the tree budget must be a whole number from 1 to 256, got {text}")
        return TreeConfig(kind="dynamic", budget=int(budget))
    try:
        return parse_tree_spec(text)
    except ValueError as e:
        raise ValueError(f"the tree setting {text!r} is not understood ({e}); use auto, a "
                         "number of drafted nodes such as 10, or a spec such as "
                         "dynamic:budget=12,branching=4") from None


ROLES = ("system", "user", "assistant")  # the speaker labels of a chat transcript


def parse_chat(text: str) -> str | list[dict]:
    """A prompt box's text as one user message, or as a chat when it is written as a
    transcript whose lines start with 'User:' / 'Assistant:' (a multi-turn prompt),
    optionally opened by a 'System:' line (the system prompt: the chat template then
    uses it, or refuses it with a clear message when it has no system role).

    Raises:
        ValueError: a transcript that does not end with a 'User:' turn, or a 'System:'
            line after the first turn.
    """
    lines = text.strip().splitlines()
    first = lines[0].lower() if lines else ""
    if not first.startswith(("user:", "system:")):
        return text
    messages: list[dict] = []
    for line in lines:
        role, colon, content = line.partition(":")
        if colon and role.strip().lower() in ROLES and role == role.lstrip():
            role = role.strip().lower()
            if role == "system" and messages:
                raise ValueError("a 'System:' line may only open a chat transcript, before the "
                                 "first 'User:' turn")
            messages.append({"role": role, "content": content.strip()})
        else:
            messages[-1]["content"] += "\n" + line
    for m in messages:
        m["content"] = m["content"].strip()
    if messages[-1]["role"] != "user":
        raise ValueError("a chat transcript must end with a 'User:' turn")
    return messages


@dataclass(frozen=True)
class Settings:
    """What a visitor asked for, validated.

    Attributes:
        prompt: one user message, or chat messages (multi-turn).
        method: the method streamed step by step: "ar", "lookup", "medusa", "clover",
            "clover2" (where the model has Clover-2 heads, see :meth:`app.registry.LoadedModel.check_method`),
            or a head method with a lookup branch ("medusa+lookup", "clover+lookup", ...).
        lookup: add a prompt lookup branch to the head methods' trees (the watched run and
            the compared ones).
        sampling: temperature 0 (greedy) or lossless sampling.
        max_new_tokens: 1..MAX_NEW_TOKENS.
        tree: the candidate tree config (ignored by plain decoding).
        compare: also run the other methods, in lockstep with it, for the speedups.
        model / heads: a hub id or folder, and a heads folder; None = the app's default.
    """

    prompt: str | list
    method: str
    sampling: SamplingConfig
    max_new_tokens: int
    tree: TreeConfig
    compare: bool = True
    model: str | None = None
    heads: str | None = None
    lookup: bool = False


MAX_SEED = 2**31 - 1


def parse_seed(seed) -> int:
    """The sampling seed of a run: the given whole number (0..MAX_SEED), or a fresh random
    one when empty, so two runs differ unless a seed is repeated to reproduce one.

    Raises:
        ValueError: with a message for the visitor.
    """
    import secrets

    if seed is None or str(seed).strip() == "":
        return secrets.randbelow(MAX_SEED + 1)
    try:
        value = float(seed)
    except (TypeError, ValueError):
        raise ValueError(f"the seed must be a whole number, got {seed!r}") from None
    if not value.is_integer() or not 0 <= value <= MAX_SEED:
        raise ValueError(f"the seed must be a whole number from 0 to {MAX_SEED}, got {seed!r}")
    return int(value)


def parse_settings(prompt, method, temperature, max_new_tokens, tree, compare=True,
                   model=None, heads=None, seed=None, lookup=False) -> Settings:
    """Validate the raw values of the settings widgets (or of an API call). ``seed``:
    see :func:`parse_seed` (empty = a new random seed for this run). ``lookup``: add a
    prompt lookup branch to the head methods (see ``clover.methods.with_lookup``).

    Raises:
        ValueError: with a message for the visitor.
    """
    if prompt is None or not str(prompt).strip():
        raise ValueError("the prompt is empty: type a prompt or pick an example")
    check_text(str(prompt))
    if len(str(prompt)) > MAX_PROMPT_CHARS:
        raise ValueError(f"the prompt is too long ({len(str(prompt))} characters); this app "
                         f"takes up to {MAX_PROMPT_CHARS}")
    if method in ALL_METHODS and method.endswith("+lookup"):  # a full name, e.g. from the API
        method, lookup = split_method(method)[0], True
    known = ("ar", "lookup", *HEAD_KINDS)
    if method not in known:
        raise ValueError(f"unknown method {method!r}; choose one of {', '.join(known)}, or a "
                         f"head method with +lookup (e.g. clover+lookup)")
    try:
        temperature = float(temperature)
    except (TypeError, ValueError):
        raise ValueError(f"the temperature must be a number, got {temperature!r}") from None
    if not math.isfinite(temperature) or not 0.0 <= temperature <= MAX_TEMPERATURE:
        raise ValueError(f"the temperature must be between 0 and {MAX_TEMPERATURE:g} "
                         f"(0 = greedy), got {temperature:g}")
    try:
        n = float(max_new_tokens)
    except (TypeError, ValueError):
        raise ValueError(f"max new tokens must be a whole number, got {max_new_tokens!r}") from None
    if not n.is_integer() or not 1 <= n <= MAX_NEW_TOKENS:
        raise ValueError(f"max new tokens must be a whole number from 1 to {MAX_NEW_TOKENS}, "
                         f"got {max_new_tokens:g}")
    return Settings(
        prompt=parse_chat(str(prompt)), method=with_lookup(method, bool(lookup)),
        lookup=bool(lookup),
        sampling=SamplingConfig(temperature=temperature, seed=parse_seed(seed)),
        max_new_tokens=int(n), tree=tree_config(tree), compare=bool(compare),
        model=(str(model).strip() or None) if model else None,
        heads=(str(heads).strip() or None) if heads else None,
    )
