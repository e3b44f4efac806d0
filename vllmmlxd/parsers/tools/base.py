"""What every tool-call family shares: find calls in a model's answer text, fed in any pieces. Pure.

One parser runs per request over the answer text (after any reasoning section) and
returns typed pieces: ``("content", text)`` and ``("tool_call", ToolCall)``, in the order
the model wrote them. A call is emitted whole, once its text is complete and parses: a
malformed call (bad JSON, an unknown tool, no end) is given back as the text the model
wrote, never half-sent as a call. Text before, between and after calls stays content.

Holding back: the result is the same however the text is split. Outside a call a parser
holds only a trailing prefix of a start marker; inside one it holds the call's text until
it ends.

A family is a subclass that sets its markers and says how a call's text becomes calls
(``parse_calls``); a family whose calls have no end marker overrides ``call_end``. A family
with several opening texts lists them in ``starts`` (``opened`` says which one opened the
call being read); one whose calls may open with no marker at all, as the answer's first
non-space text, lists the characters that open them in ``bare_starts`` (``opened`` is then
""). Each family also says how to write its format (``render_call``, for few-shot
instructions) and how to constrain a model to it (``grammar``, Lark for llguidance).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal


@dataclass(frozen=True)
class ToolCall:
    """One complete call: the function's name and its arguments as a JSON object's text."""

    name: str
    arguments: str


Piece = tuple[Literal["content"], str] | tuple[Literal["tool_call"], ToolCall]


class MalformedCall(ValueError):
    """A call's text that does not parse: it is returned as text."""


def tool_names(tools: list[dict] | None) -> set[str]:
    """The function names of OpenAI-style tool definitions (``{"type": "function", "function": {...}}``)."""
    return {function_of(t)["name"] for t in tools or () if function_of(t).get("name")}


def function_of(tool: dict) -> dict:
    """The ``{"name", "description", "parameters"}`` part of a tool definition, either shape."""
    return tool.get("function", tool) if isinstance(tool, dict) else {}


def arguments_text(arguments: Any) -> str:
    """Arguments as the JSON object text every family emits (a JSON string is decoded first)."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as exc:
            raise MalformedCall(f"arguments are not JSON: {exc}") from None
    if not isinstance(arguments, dict):
        raise MalformedCall("arguments are not a JSON object")
    return json.dumps(arguments, ensure_ascii=False)


def json_value_end(text: str, start: int = 0) -> int | None:
    """The index just past the JSON object or array starting at ``text[start]``, or None if unfinished."""
    return bracket_end(text, start)


def bracket_end(text: str, start: int = 0, *, quotes: str = '"', opens: str = "{[", closes: str = "}]") -> int | None:
    """The index just past the bracket that closes the one at ``text[start]``, or None if
    unfinished; strings in ``quotes`` (with backslash escapes) are skipped."""
    depth, quote, escaped = 0, "", False
    for i in range(start, len(text)):
        c = text[i]
        if quote:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == quote:
                quote = ""
        elif c in quotes:
            quote = c
        elif c in opens:
            depth += 1
        elif c in closes:
            depth -= 1
            if depth == 0:
                return i + 1
    return None


def per_tool_rules(tools: list[dict], body: Callable[[str, dict], str]) -> tuple[str, list[str]]:
    """One Lark rule per tool, ``call_I: body(name, parameters_schema)``, for grammars whose
    calls differ by tool; returns the alternation of the rules' names and the rule lines."""
    names = [f"call_{i}" for i in range(len(tools))]
    lines = []
    for rule, tool in zip(names, tools):
        fn = function_of(tool)
        lines.append(f"{rule}: {body(fn['name'], fn.get('parameters') or {'type': 'object'})}")
    return "(" + " | ".join(names) + ")", lines


class ToolParser:
    """Splits one request's answer text into content and tool calls.

    One instance per request; not thread-safe. Families set ``start`` / ``end`` and
    implement ``parse_calls``.
    """

    name: str = ""
    start: str = ""  # the text that opens a call (or a section of calls)
    starts: tuple[str, ...] = ()  # several texts that may open one; () means (start,)
    # Characters that open a call with no marker, where the answer's first non-space text is one
    # (bare JSON or a pythonic list); a family using it reads ``opened == ""`` in call_end.
    bare_starts: str = ""
    end: str = ""  # the text that closes it; "" when the call's own syntax says where it ends
    # Special-token texts the engine must decode for this parser (markers that are special tokens).
    markers: frozenset[str] = frozenset()

    def __init__(self, tools: list[dict] | None = None):
        self.tools = list(tools or ())
        self._names = tool_names(self.tools)
        self._held = ""
        self._in_call = False
        self._fresh = bool(self.bare_starts)  # only space seen so far: a bare call may still open
        # The start text of the call being read ("" for a bare call); None until feed opens one
        # (a subclass with its own feed then names its opening text in ``start``).
        self.opened: str | None = None
        self.calls = 0  # calls emitted so far

    # -- what a family says -------------------------------------------------

    def parse_calls(self, body: str) -> list[ToolCall]:
        """The calls written in ``body`` (the text between start and end); MalformedCall if it is not one."""
        raise NotImplementedError

    def call_end(self, buf: str) -> int | None:
        """In ``buf`` (the text after the start text, or a bare call's text from its first
        character), the index where the call's text ends and what follows begins, or None while
        it has not ended; 0 says at once that this is no call. Default: at ``end``."""
        cut = buf.find(self.end)
        return None if cut < 0 else cut + len(self.end)

    def body_of(self, call_text: str) -> str:
        """The call's text without its end marker."""
        return call_text[: -len(self.end)] if self.end and call_text.endswith(self.end) else call_text

    @classmethod
    def render_call(cls, name: str, arguments: dict) -> str:
        """How a model of this family writes one call (for instructions given in the system prompt)."""
        raise NotImplementedError

    @classmethod
    def grammar(cls, tools: list[dict], *, parallel: bool = True) -> str:
        """A Lark grammar (llguidance's dialect) for one or more calls in this format, each call's
        arguments held to its tool's JSON schema; ``parallel``: more than one call allowed."""
        raise NotImplementedError

    # -- the machinery ------------------------------------------------------

    def feed(self, text: str) -> list[Piece]:
        """Add the next piece of answer text; return the pieces that can be emitted now."""
        out: list[Piece] = []
        buf = self._held + text
        self._held = ""
        while buf:
            if self._in_call:
                cut = self.call_end(buf)
                if cut is None:
                    self._held = buf
                    break
                self._close(out, buf[:cut])
                buf = buf[cut:]
                continue
            if self._fresh:
                rest = buf.lstrip()
                if not rest:  # only space yet: what follows decides
                    self._held = buf
                    break
                self._fresh = False
                if rest[0] in self.bare_starts:
                    self._content(out, buf[: len(buf) - len(rest)])
                    buf, self.opened, self._in_call = rest, "", True
                    continue
            at, marker = self._find_start(buf)
            if marker:
                self._content(out, buf[:at])
                buf = buf[at + len(marker) :]
                self.opened, self._in_call, self._fresh = marker, True, False
                continue
            keep = self._start_prefix(buf)
            self._content(out, buf[: len(buf) - keep])
            self._held = buf[len(buf) - keep :]
            break
        return out

    def finish(self) -> list[Piece]:
        """Generation ended: an unclosed call is parsed if it can be, else given back as text."""
        held, self._held = self._held, ""
        out: list[Piece] = []
        if self._in_call:
            self._close(out, held)
        else:
            self._content(out, held)
        return out

    def _close(self, out: list[Piece], call_text: str) -> None:
        self._in_call = False
        try:
            calls = self.parse_calls(self.body_of(call_text))
            if not calls:
                raise MalformedCall("no call")
            for call in calls:
                if self._names and call.name not in self._names:
                    raise MalformedCall(f"no tool is named {call.name!r}")
        except (MalformedCall, ValueError, KeyError, TypeError, AttributeError, RecursionError):
            self._content(out, (self.start if self.opened is None else self.opened) + call_text)
            return
        for call in calls:
            out.append(("tool_call", call))
            self.calls += 1

    @property
    def _starts(self) -> tuple[str, ...]:
        return self.starts or ((self.start,) if self.start else ())

    def _find_start(self, buf: str) -> tuple[int, str]:
        """The first start text in ``buf`` (the longest of those at the same place): (index, text),
        or (-1, "") when none is there. No start text is part of another, so the first is the one."""
        best = (-1, "")
        for marker in self._starts:
            at = buf.find(marker)
            if at >= 0 and (best[0] < 0 or at < best[0] or (at == best[0] and len(marker) > len(best[1]))):
                best = (at, marker)
        return best

    def _start_prefix(self, buf: str) -> int:
        """How many characters at the end of ``buf`` may be the beginning of a start text."""
        return max((_partial_suffix(buf, marker) for marker in self._starts), default=0)

    def _content(self, out: list[Piece], text: str) -> None:
        if text:
            if out and out[-1][0] == "content":
                out[-1] = ("content", out[-1][1] + text)
            else:
                out.append(("content", text))


def _partial_suffix(buf: str, tag: str) -> int:
    """Length of the longest suffix of ``buf`` that is a proper prefix of ``tag``."""
    for n in range(min(len(tag) - 1, len(buf)), 0, -1):
        if buf.endswith(tag[:n]):
            return n
    return 0
