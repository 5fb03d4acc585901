"""Streaming detokenisation: text that grows token by token without breaking characters."""
from __future__ import annotations


class TextStream:
    """Incremental detokenizer: the text each new token adds to the output.

    A character that spans several byte tokens (emoji, CJK, accented letters) appears
    with the token that completes it; the tokens before it add ``""``. So the pieces
    never hold a U+FFFD replacement character that the full decode does not, and their
    concatenation (after :meth:`flush`) equals ``tokenizer.decode(ids)`` with special
    tokens kept. The method of Hugging Face's ``TextStreamer`` / vLLM's detokenizer:
    decode a short window before the new tokens and emit the difference once it no
    longer ends in U+FFFD.

    Args:
        tokenizer: a Hugging Face tokenizer.
    """

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.prefix = 0  # window start: a few already emitted tokens, for merge context
        self.read = 0  # tokens before this were emitted

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False,
                                     clean_up_tokenization_spaces=False)

    def push(self, token_id: int) -> str:
        """Add one token; return the text it completes ("" while a character is open)."""
        self.ids.append(int(token_id))
        before = self._decode(self.ids[self.prefix:self.read])
        text = self._decode(self.ids[self.prefix:])
        if text.endswith("\ufffd") or len(text) <= len(before):
            return ""
        self.prefix, self.read = self.read, len(self.ids)
        return text[len(before):]

    def flush(self) -> str:
        """The text of tokens still held back (an unfinished character decodes to U+FFFD)."""
        before = self._decode(self.ids[self.prefix:self.read])
        text = self._decode(self.ids[self.prefix:])
        self.prefix = self.read = len(self.ids)
        return text[len(before):]
