"""Token ids to text for the llama.cpp engine, one sequence at a time."""

from __future__ import annotations

from core.engines.llama_native import llama_cpp

_MAX_HELD_TOKENS = 8  # a UTF-8 character that has not completed by then never will
_REPLACEMENT = "\ufffd"


class Utf8Pieces:
    """Token ids in, text out, never ending inside a multibyte character.

    The binding decodes pieces with replacement characters, so a character whose bytes
    span tokens shows up as U+FFFD. Such tokens are held back and decoded together with
    the following ones until the character completes. The binding's `detokenize` also
    strips leading whitespace, so held runs are decoded behind a visible anchor token
    whose text is then cut off.
    """

    def __init__(self, vocab: llama_cpp.LlamaVocab) -> None:
        self._vocab = vocab
        self._anchor = vocab.tokenize("a", False, False)[-1]
        self._anchor_text = self._detokenize([self._anchor])
        self._held: list[int] = []

    def push(self, token: int) -> str:
        self._held.append(token)
        text = self._decode()
        if _REPLACEMENT in text and len(self._held) < _MAX_HELD_TOKENS:
            return ""
        self._held.clear()
        return text

    def flush(self) -> str:
        """The text still held, at the end of a generation: a character whose bytes were
        cut off by the end (`max_output_tokens` reached mid-character) is left out, not
        shown as U+FFFD."""
        text = self._decode() if self._held else ""
        self._held.clear()
        return text.rstrip(_REPLACEMENT)

    def _decode(self) -> str:
        if len(self._held) == 1:
            return self._vocab.token_to_piece(self._held[0], 0, False)
        return self._detokenize([self._anchor, *self._held])[len(self._anchor_text) :]

    def _detokenize(self, tokens: list[int]) -> str:
        return self._vocab.detokenize(tokens, 4096, False, False)
