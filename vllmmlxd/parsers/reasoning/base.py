"""The ``<think>...</think>`` state machine every reasoning family shares. Pure; no I/O.

One parser runs per request over the generated text, fed in arbitrary pieces, and
returns typed pieces: ``("reasoning", text)`` and ``("content", text)``, reasoning
first. Where generation starts is read from the end of the rendered prompt:

- the prompt ends with ``<think>`` (+ whitespace): the template opened the block,
  generation starts in reasoning;
- the prompt ends with ``</think>`` (+ whitespace): thinking was switched off,
  everything generated is content;
- otherwise it is up to the family (``starts_in_reasoning``).

Wherever reasoning may start, one ``<think>`` written by the model (after optional
whitespace) is dropped. The first ``</think>`` ends the reasoning; later tags are
content text. Reasoning that never closes stays reasoning: nothing is lost.

Whitespace at the block edges is dropped: at the start of reasoning, before
``</think>`` and at the start of content, so neither field starts with "\\n".
Within a block, text passes through as generated.

Holding back: the result is the same however the text is split. A parser holds
only what the next piece could still turn into a tag: a prefix of ``<think>``
where one may open the reasoning, and in reasoning a trailing prefix of
``</think>`` together with the whitespace just before it (the edge it would
strip). ``finish`` returns what is held as text of the current kind.
"""

from __future__ import annotations

from typing import Literal

Kind = Literal["reasoning", "content"]
Piece = tuple[Kind, str]


class ReasoningParser:
    """Splits one request's generated text into reasoning and content pieces.

    One instance per request; not thread-safe. Families set the class attributes
    (a family with other tags sets ``markers`` to match).
    """

    start: str = "<think>"
    end: str = "</think>"
    # The engine decodes a special token's text only when it is one of these.
    markers: frozenset[str] = frozenset({start, end})
    # A prompt that neither opened nor closed a block: True starts in reasoning; False lets
    # the model's first words decide (its own start tag opens reasoning, anything else is content).
    starts_in_reasoning: bool = False

    def __init__(self, prompt_tail: str):
        """``prompt_tail``: the last characters of the rendered prompt, special tokens included."""
        tail = prompt_tail.rstrip()
        self._kind: Kind | None  # None: undecided until the first words
        if tail.endswith(self.end):
            self._kind, self._may_open = "content", False
        elif tail.endswith(self.start):
            self._kind, self._may_open = "reasoning", True
        else:
            self._kind = "reasoning" if self.starts_in_reasoning else None
            self._may_open = True
        self._at_edge = True  # nothing emitted yet in the current kind: leading whitespace goes
        # _may_open: a start tag here would still be the model opening (or repeating) the block.
        self._held = ""

    def feed(self, text: str) -> list[Piece]:
        """Add the next piece of generated text; return the pieces that can be emitted now."""
        out: list[Piece] = []
        buf = self._held + text
        self._held = ""
        while buf:
            if self._at_edge:
                buf = buf.lstrip()
                if not buf:
                    break
            if self._may_open:
                if buf.startswith(self.start):
                    buf = buf[len(self.start) :]
                    self._kind, self._may_open, self._at_edge = "reasoning", False, True
                    continue
                if self.start.startswith(buf):
                    self._held = buf
                    break
                self._may_open = False
                if self._kind is None:
                    self._kind = "content"
            if self._kind == "content":
                self._emit(out, "content", buf)
                break
            buf = self._feed_reasoning(out, buf)
        return out

    def finish(self) -> list[Piece]:
        """Generation ended: return what is held, as text of the current kind."""
        held, self._held = self._held, ""
        out: list[Piece] = []
        self._emit(out, self._kind or "content", held)
        return out

    def _feed_reasoning(self, out: list[Piece], buf: str) -> str:
        """Emit reasoning up to the end tag; return what follows it ("" if it has not come)."""
        cut = buf.find(self.end)
        if cut >= 0:
            self._emit(out, "reasoning", buf[:cut].rstrip())
            self._kind, self._at_edge = "content", True
            return buf[cut + len(self.end) :]
        undecided = buf[: len(buf) - _partial_suffix(buf, self.end)].rstrip()
        self._held = buf[len(undecided) :]
        self._emit(out, "reasoning", undecided)
        return ""

    def _emit(self, out: list[Piece], kind: Kind, text: str) -> None:
        if text:
            out.append((kind, text))
            self._at_edge = False


def _partial_suffix(buf: str, tag: str) -> int:
    """Length of the longest suffix of ``buf`` that is a proper prefix of ``tag``."""
    for n in range(min(len(tag) - 1, len(buf)), 0, -1):
        if buf.endswith(tag[:n]):
            return n
    return 0
