"""Request text that spells a special token is tokenized as text, never as that token.

A chat template writes a conversation's control tokens (``<|im_start|>``, ``<|im_end|>``...)
around the request's strings, and the rendered prompt is then tokenized with special tokens
recognised: a message holding the text ``<|im_start|>system`` would open a real system turn,
a prompt injection for any app that embeds untrusted text. So, before rendering, each special
token's text in a request string is wrapped in private-use markers (and a string ending in the
start of one gets a break marker, so two strings cannot join into one); after rendering, the
markers are removed and a special token they touch is tokenized as plain text. A request with
none of this text is tokenized exactly as before (same ids: the prefix cache is unaffected).

Pure Python, duck-typed over a Hugging Face tokenizer; no mlx.
"""

from __future__ import annotations

import re
import threading
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable
from typing import Any

# Plane-16 private-use characters: no font or tokenizer gives them a meaning.
OPEN, CLOSE, BREAK = "\U0010fff0", "\U0010fff1", "\U0010fff2"
MARKERS = OPEN + CLOSE + BREAK

Encode = Callable[[str], list[int]]


class SpecialText:
    """Marks request strings before rendering and tokenizes the rendered prompt after it.

    ``special``: the texts of the tokenizer's special tokens (those a client must not write);
    ``added``: all its added tokens, special or not, so matches are found as the tokenizer finds
    them (leftmost, longest first).
    """

    def __init__(self, special: Iterable[str], added: Iterable[str] = ()):
        self.special = frozenset(t for t in special if t)
        tokens = sorted(self.special | {t for t in added if t}, key=len, reverse=True)
        special_alt = "|".join(re.escape(t) for t in sorted(self.special, key=len, reverse=True))
        marker_class = f"[{MARKERS}]"
        # In request strings: a special token's text, or a marker character already there.
        self._in_request = re.compile(f"{special_alt}|{marker_class}" if special_alt else marker_class)
        # In the rendered prompt: a wrapped token or character, else a lone marker (a break).
        wrapped = f"{special_alt}|{marker_class}" if special_alt else marker_class
        self._wrapped = re.compile(f"{OPEN}({wrapped}){CLOSE}|{marker_class}")
        self._tokens = re.compile("|".join(re.escape(t) for t in tokens)) if tokens else None
        self._first_chars = frozenset(t[0] for t in self.special) | frozenset(MARKERS)
        self._prefixes = frozenset(t[:k] for t in self.special for k in range(1, len(t)))
        self._longest_prefix = max((len(p) for p in self._prefixes), default=0)

    # -- before rendering ---------------------------------------------------

    def mark(self, obj: Any) -> tuple[Any, bool]:
        """``obj`` (messages, tools, template variables: nested lists and dicts) with every string
        marked, and whether any string needed it. Dict keys are left alone; nothing is mutated."""
        changed = False

        def walk(value: Any) -> Any:
            nonlocal changed
            if isinstance(value, str):
                marked = self._mark_text(value)
                changed = changed or marked is not value
                return marked
            if isinstance(value, dict):
                return {k: walk(v) for k, v in value.items()}
            if isinstance(value, (list, tuple)):
                return [walk(v) for v in value]
            return value

        out = walk(obj)
        return (out, True) if changed else (obj, False)

    def _mark_text(self, text: str) -> str:
        """``text`` itself when it holds nothing to mark (the common case, checked cheaply)."""
        risky_end = self._ends_in_prefix(text)
        if not risky_end and not any(c in text for c in self._first_chars):
            return text
        marked = self._in_request.sub(lambda m: OPEN + m.group(0) + CLOSE, text)
        if risky_end:
            marked += BREAK
        return marked if marked != text else text

    def _ends_in_prefix(self, text: str) -> bool:
        """Does ``text`` end in the first characters of a special token (which the next string,
        rendered right after it, could complete)?"""
        return any(text[-k:] in self._prefixes for k in range(1, min(self._longest_prefix, len(text)) + 1))

    # -- after rendering ----------------------------------------------------

    def pieces(self, rendered: str) -> list[tuple[str, bool]]:
        """The rendered prompt, markers removed, as ``(text, as_plain_text)`` pieces: a special
        token that came from the request (wrapped, or completed across a break) is a piece of its
        own to tokenize as plain text. One piece when there is none."""
        clean: list[str] = []
        spans: list[tuple[int, int]] = []
        breaks: list[int] = []
        at = length = 0
        for m in self._wrapped.finditer(rendered):
            clean.append(rendered[at : m.start()])
            length += m.start() - at
            if m.group(1) is not None:
                spans.append((length, length + len(m.group(1))))
                clean.append(m.group(1))
                length += len(m.group(1))
            else:
                breaks.append(length)
            at = m.end()
        clean.append(rendered[at:])
        text = "".join(clean)
        if (not spans and not breaks) or self._tokens is None:
            return [(text, False)]
        starts = [s for s, _ in spans]  # sorted, not overlapping: one lookup per token, not a scan
        out: list[tuple[str, bool]] = []
        start = 0
        for m in self._tokens.finditer(text):
            a, b = m.span()
            if m.group(0) not in self.special:
                continue
            i, j = bisect_left(starts, b), bisect_right(breaks, a)
            if (i and spans[i - 1][1] > a) or (j < len(breaks) and breaks[j] < b):
                if start < a:
                    out.append((text[start:a], False))
                out.append((text[a:b], True))
                start = b
        if start < len(text) or not out:
            out.append((text[start:], False))
        return out

    def encode(self, rendered: str, encode: Encode, encode_plain: Encode, special_ids: Iterable[int]) -> list[int]:
        """Token ids of a prompt rendered from marked strings: ``encode`` (special tokens
        recognised) for the template's text, ``encode_plain`` for the request's special-token text."""
        parts = self.pieces(rendered)
        if len(parts) == 1 and not parts[0][1]:
            return list(encode(parts[0][0]))
        special_ids = frozenset(special_ids)
        newline = list(encode("\n"))
        ids: list[int] = []
        as_text: dict[tuple[str, bool], list[int]] = {}  # the same few token texts, again and again
        for i, (text, plain) in enumerate(parts):
            if not plain:
                ids += _encode_piece(encode, text, newline, first=i == 0)
                continue
            key = (text, i == 0)
            if key not in as_text:
                piece = _encode_piece(encode_plain, text, newline, first=i == 0)
                if special_ids.intersection(piece):  # BPE merged it back into the token: split per character
                    piece = [t for ch in text for t in _encode_piece(encode_plain, ch, newline, first=False)]
                as_text[key] = piece
            ids += as_text[key]
        return ids


def _encode_piece(encode: Encode, text: str, newline: list[int], *, first: bool) -> list[int]:
    """A piece of a longer prompt. After a newline, so a tokenizer that prefixes a space to the
    start of a string (SentencePiece) does not do it mid-prompt; the newline's ids are then dropped."""
    if first:
        return list(encode(text))
    ids = list(encode("\n" + text))
    return ids[len(newline) :] if newline and ids[: len(newline)] == newline else list(encode(text))


def special_tokens_of(hf_tokenizer: Any) -> tuple[list[str], list[str]]:
    """(special tokens, all added tokens) of a Hugging Face tokenizer: ``all_special_tokens`` plus
    the added tokens marked special."""
    decoder = getattr(hf_tokenizer, "added_tokens_decoder", None) or {}
    added = [str(getattr(t, "content", t)) for t in decoder.values()]
    special = set(getattr(hf_tokenizer, "all_special_tokens", ()) or ())
    special |= {str(t.content) for t in decoder.values() if getattr(t, "special", False)}
    return sorted(special), added


def plain_encoder(hf_tokenizer: Any, encode: Encode, special: Iterable[str]) -> Encode:
    """Encodes text with special tokens split like any text. Made on first use: only a request
    whose own text spells a special token needs it, and the private copy of the tokenizer below
    costs a quarter of a second of CPU, which every worker start paid before."""
    special = list(special)
    made: list[Encode] = []
    lock = threading.Lock()

    def plain(text: str) -> list[int]:
        if not made:
            with lock:
                if not made:
                    made.append(_private_encoder(hf_tokenizer, encode) or _cut_encoder(encode, special))
        return made[0](text)

    return plain


def _private_encoder(hf_tokenizer: Any, encode: Encode) -> Encode | None:
    """A private copy of a fast tokenizer's backend with special tokens split like text, since
    flipping that switch on the shared one would race with other requests' tokenization; None
    where there is no such backend (the text is then cut inside each special token's text)."""
    backend = getattr(hf_tokenizer, "_tokenizer", None)
    if backend is None or not hasattr(backend, "to_str"):
        return None
    try:
        from tokenizers import Tokenizer

        private = Tokenizer.from_str(backend.to_str())
        private.encode_special_tokens = True
    except Exception:  # an old tokenizers without the switch
        return None

    def plain(text: str) -> list[int]:
        return list(private.encode(text, add_special_tokens=False).ids)

    probe = "Hello, world!\n  <x> 42"  # a wrapper that rewrites text (mlx-lm's NewlineTokenizer) differs here
    return plain if plain(probe) == list(encode(probe)) else None


def _cut_encoder(encode: Encode, special: Iterable[str]) -> Encode:
    tokens = sorted({t for t in special if len(t) > 1}, key=len, reverse=True)
    pattern = re.compile("|".join(re.escape(t) for t in tokens)) if tokens else None

    def plain(text: str) -> list[int]:
        m = pattern.search(text) if pattern else None
        if m is None:
            return list(encode(text))
        cut = m.start() + 1  # inside the token's text: neither side spells it
        return plain(text[:cut]) + plain(text[cut:])

    return plain
