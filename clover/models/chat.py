"""Prompt encoding: chat templates, their quirks, and the checks on prompt text."""
from __future__ import annotations


def _special_strings(tokenizer) -> list[str]:
    """Every added or special token's text (what a tokenizer would turn into a control id)."""
    texts = set(getattr(tokenizer, "all_special_tokens", []) or [])
    try:
        texts.update(tokenizer.get_added_vocab())
    except (AttributeError, NotImplementedError):
        pass
    return [t for t in texts if t]


def merge_same_role(messages: list[dict]) -> list[dict]:
    """Consecutive messages of one role joined into one (separated by a blank line), so
    that templates requiring alternating roles accept any transcript."""
    out: list[dict] = []
    for m in messages:
        if out and out[-1]["role"] == m["role"]:
            out[-1] = {"role": m["role"], "content": out[-1]["content"] + "\n\n" + m["content"]}
        else:
            out.append({"role": m["role"], "content": m["content"]})
    return out


def chat_ids(tokenizer, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
    """Token ids of a conversation under the tokenizer's chat template, where every
    message's content is ordinary text.

    A user who types ``<|im_end|>`` means those characters, not the end of a turn:
    ``apply_chat_template`` would turn them into the control token (and a typed
    ``<|im_start|>system`` would forge a system turn). So where some content holds the text
    of a special or added token, each such span is swapped for a placeholder of invisible
    characters, the template renders the conversation as it is (its own trims, joins and
    folds apply to the real content, whatever they are), and the rendered text is
    tokenised with control tokens where the template put them and each span restored as
    plain text (``split_special_tokens=True``). The ids then differ from
    ``apply_chat_template``'s only in those spans; without such text they are
    ``apply_chat_template``'s own.

    Args:
        messages: ``{"role", "content"}`` dicts; consecutive same-role messages are merged
            (:func:`merge_same_role`).
    Returns:
        the token ids (control tokens only where the template puts them).
    Raises:
        ValueError: when the template rejects the conversation (e.g. roles it does not
            know), with the template's own message, or changes message text so that a
            protected span cannot be found again.
    """
    import re

    import jinja2

    messages = merge_same_role(messages)
    special = sorted(_special_strings(tokenizer), key=len, reverse=True)  # longest first: "<|a|>b" before "<|a|>"
    typed = [t for t in special if any(t in m["content"] for m in messages)]
    try:
        if not typed:
            ids = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt,
                                                tokenize=True)
            return [int(i) for i in (ids if isinstance(ids, list) else ids["input_ids"])]
        marks = {t: f"\u2063\u2064{i}\u2064\u2063" for i, t in enumerate(typed)}
        spans = re.compile("|".join(re.escape(t) for t in typed))
        protected = [{**m, "content": spans.sub(lambda x: marks[x.group()], m["content"])} for m in messages]
        text = tokenizer.apply_chat_template(protected, add_generation_prompt=add_generation_prompt,
                                             tokenize=False)
    except jinja2.TemplateError as e:
        raise ValueError(f"the model's chat template rejected this conversation: {e}") from None
    typed_of = {k: t for t, k in marks.items()}
    found = re.compile("|".join(re.escape(k) for k in typed_of))
    if len(found.findall(text)) != sum(len(spans.findall(m["content"])) for m in messages):
        raise ValueError("the model's chat template changes message text, so a message "
                         "holding special-token text cannot be encoded safely")
    ids: list[int] = []
    at = 0
    for x in found.finditer(text):
        ids += tokenizer(text[at: x.start()], add_special_tokens=False)["input_ids"]
        ids += tokenizer(typed_of[x.group()], add_special_tokens=False, split_special_tokens=True)["input_ids"]
        at = x.end()
    ids += tokenizer(text[at:], add_special_tokens=False)["input_ids"]
    return [int(i) for i in ids]


def user_turn_prefix(tokenizer) -> list[int]:
    """Token ids of the chat template up to the start of a user message (the prompt of
    Magpie, arXiv 2406.08464, which lets the target write the user's message).

    Raises:
        ValueError: when the tokenizer has no chat template.
    """
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("Magpie prompts need a chat template")
    sentinel = "\u2063MAGPIE\u2063"
    text = tokenizer.apply_chat_template([{"role": "user", "content": sentinel}], tokenize=False,
                                         add_generation_prompt=False)
    return tokenizer(text[: text.index(sentinel)], add_special_tokens=False)["input_ids"]


def check_text(text, what: str = "the prompt") -> None:
    """Refuse text that cannot be encoded as UTF-8: lone surrogates, which is what Python
    makes of bytes that were not UTF-8 (command-line arguments read with
    ``surrogateescape``, e.g. a Latin-1 "\xe9"), or a JSON string carrying ``"\udce9"``.

    Raises:
        ValueError: naming the position and the byte (or code point); never quoting the
            bad character itself, so the message is always printable.
    """
    if not isinstance(text, str):
        raise ValueError(f"{what} must be text, not {type(text).__name__}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        ch = ord(text[e.start])
        byte = f"the byte 0x{ch - 0xDC00:02x}" if 0xDC80 <= ch <= 0xDCFF else f"U+{ch:04X}"
        raise ValueError(f"{what} is not valid UTF-8 text: {byte} at character {e.start + 1} "
                         f"(save or type it as UTF-8)") from None


def encode_prompt(tokenizer, prompt, chat: bool = True) -> list[int]:
    """Token ids for a prompt; what the user typed is always ordinary text (see
    :func:`chat_ids`).

    Args:
        prompt: a user message (str) or a list of chat messages ({"role", "content"}).
        chat: apply the tokenizer's chat template (with the generation prompt) when it
            has one; plain text otherwise.
    Raises:
        ValueError: for an empty prompt or an empty turn of a conversation, text that is
            not valid Unicode (:func:`check_text`), or a conversation the chat template
            rejects.
    """
    if isinstance(prompt, str):
        if not prompt.strip():
            raise ValueError("the prompt is empty")
        check_text(prompt)
        messages = [{"role": "user", "content": prompt}]
    else:
        messages = list(prompt)
        if not messages or not any(str(m.get("content", "")).strip() for m in messages):
            raise ValueError("the prompt is empty")
        for i, m in enumerate(messages, 1):
            check_text(m.get("content", ""), f"the {m.get('role', 'chat')} message")
            if not m.get("content", "").strip():
                raise ValueError(f"turn {i} of the conversation (the {m.get('role', 'chat')} message) is empty: "
                                 f"every turn needs text")
    if chat and getattr(tokenizer, "chat_template", None):
        return chat_ids(tokenizer, messages)
    text = prompt if isinstance(prompt, str) else "\n".join(m["content"] for m in messages)
    return tokenizer(text, add_special_tokens=True, split_special_tokens=True)["input_ids"]


def token_texts(tokenizer, ids: list[int]) -> list[str]:
    """Each token of ``ids`` decoded on its own, for display (tree labels, verify
    tables). A token that holds only part of a character's UTF-8 bytes decodes to "�";
    it is shown as its bytes instead, in the notation SentencePiece uses for its byte
    tokens (``<0xE2><0x80>``), so two such drafts stay tell-apart. Byte-level BPE
    pieces (GPT-2 style, SmolLM2's) are mapped back to their bytes; other tokenizers'
    byte tokens are shown as their vocabulary entry, else left as "�"."""
    texts = tokenizer.batch_decode([[i] for i in ids])
    if not any("\ufffd" in t for t in texts):
        return texts
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    to_byte = {c: b for b, c in bytes_to_unicode().items()}
    out = []
    for i, text in zip(ids, texts):
        piece = tokenizer.convert_ids_to_tokens(int(i)) if "\ufffd" in text else None
        if isinstance(piece, str) and piece.startswith("<0x") and piece.endswith(">"):
            text = piece  # SentencePiece's own byte token
        elif isinstance(piece, str) and piece and all(c in to_byte for c in piece):
            raw = bytes(to_byte[c] for c in piece)
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                text = "".join(f"<0x{b:02X}>" for b in raw)
        out.append(text)
    return out
