"""Streaming detokenization that gives exactly the text the tokenizer would decode.

A token's text depends on its neighbours (a SentencePiece word marker, a byte split across
tokens), so each new token is decoded together with a few tokens before it and only the
difference is emitted. Starting from the prompt's last tokens keeps a completion's leading
space ("is" → " Paris"), which decoding the new tokens alone would drop. No mlx.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

CONTEXT_TOKENS = 6  # prompt tokens decoded before the first new one


class IncrementalDetokenizer:
    """``add_token`` then read ``last_segment``; ``finalize`` flushes an incomplete character."""

    def __init__(self, decode: Callable[[list[int]], str], context: Sequence[int] = ()):
        self._decode = decode
        self._ids = list(context[-CONTEXT_TOKENS:])
        self._prefix = 0  # where the decoded window starts
        self._read = len(self._ids)  # tokens up to here are already emitted
        self.last_segment = ""

    def add_token(self, token: int) -> None:
        self._ids.append(token)
        self.last_segment = self._advance(final=False)

    def finalize(self) -> None:
        self.last_segment = self._advance(final=True)

    def _advance(self, *, final: bool) -> str:
        if self._read >= len(self._ids):
            return ""
        before = self._decode(self._ids[self._prefix : self._read])
        after = self._decode(self._ids[self._prefix :])
        # An incomplete UTF-8 sequence decodes to U+FFFD: wait for the bytes that complete it.
        if len(after) <= len(before) or (after.endswith("\ufffd") and not final):
            return ""
        self._prefix, self._read = self._read, len(self._ids)
        return after[len(before) :]
