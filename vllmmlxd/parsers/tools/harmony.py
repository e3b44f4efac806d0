"""GPT-OSS's harmony format: reasoning, tool calls and the answer, each a message on its channel.

An assistant turn is a series of messages, ``<|start|>assistant HEADER<|message|>BODY<|end|>``,
the last one ended by ``<|return|>`` (the answer) or ``<|call|>`` (a tool call), both of which
end generation (the engine stops on them: they never reach a parser). The header names the
channel, and for a call its recipient and content type, in either order of the two layouts
the format allows::

    <|channel|>analysis<|message|>the model reasons<|end|>
    <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}
    <|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}
    <|start|>assistant<|channel|>final<|message|>the answer

The ``analysis`` channel is reasoning; ``final`` is the answer, and so is a ``commentary``
message to no one (a preamble the user may see); a message to ``functions.NAME`` is a call of
NAME with its body as arguments. A message to anyone else (a built-in tool vllmmlxd does not
run) is given back as text, as a malformed call is in every family.

Written from the format's published description (OpenAI's harmony guide), not with the
``openai-harmony`` library: that library downloads its vocabulary at first use, and workers
run offline (docs/architecture.md). The markers are special tokens the engine decodes for
this parser; the parser holds back a trailing prefix of one all the same, so its result does
not depend on how text is split. Pure; no I/O.
"""

from __future__ import annotations

import json
import re

from vllmmlxd.parsers.grammar import json_rule
from vllmmlxd.parsers.tools.base import MalformedCall, Piece, ToolCall, ToolParser, arguments_text, per_tool_rules

START, END, MESSAGE, CHANNEL = "<|start|>", "<|end|>", "<|message|>", "<|channel|>"
CONSTRAIN, RETURN, CALL = "<|constrain|>", "<|return|>", "<|call|>"
MARKERS = (START, END, MESSAGE, CHANNEL, CONSTRAIN, RETURN, CALL)
_ENDS = (END, CALL, RETURN, START)  # what ends a message's body
_RECIPIENT = re.compile(r"(?:^|\s)to=(\S+?)(?=\s|$|<\|)")
_CHANNEL = re.compile(re.escape(CHANNEL) + r"\s*([A-Za-z_]+)")
FUNCTIONS = "functions."


def speaks_harmony(vocab: set[str] | None) -> bool:
    """Whether a tokenizer's special tokens are harmony's (a GPT-OSS model)."""
    return vocab is not None and all(marker in vocab for marker in (START, END, MESSAGE, CHANNEL, RETURN, CALL))


class HarmonyParser(ToolParser):
    """Splits one request's generated text into reasoning, answer and calls, by channel."""

    name = "harmony"
    markers = frozenset(MARKERS)

    def __init__(self, tools: list[dict] | None = None, *, calls: bool = True, prompt_tail: str = ""):
        """``calls``: messages to a function are calls (False: ``tool_choice: none``, they stay
        text). ``prompt_tail``: the end of the rendered prompt (a generation prompt that opened a
        message's header or body there)."""
        super().__init__(tools)
        self.parse = calls
        self._state, self._header, self._body = "header", "", ""
        self._channel: str | None = None
        self._recipient: str | None = None
        self._framed = False  # a marker was seen: the model writes harmony (else its text is the answer)
        tail = prompt_tail.rstrip()
        opened = tail.rfind(START)
        if opened >= 0 and MESSAGE in tail[opened:]:  # the prompt opened a body: its header is known
            self._open(tail[opened + len(START) : tail.rfind(MESSAGE)])
        elif opened >= 0:
            self._header = tail[opened + len(START) :]
        self._prompted = len(self._header)  # of the header, what the prompt wrote (the role)

    def feed(self, text: str) -> list[Piece]:
        out: list[Piece] = []
        buf, self._held = self._held + text, ""
        while buf:
            if self._state == "header":
                at = buf.find(MESSAGE)
                if at < 0:
                    keep = _marker_prefix(buf)
                    self._header += buf[: len(buf) - keep]
                    self._held = buf[len(buf) - keep :]
                    self._framed = self._framed or any(m in self._header for m in MARKERS)
                    break
                self._framed = True
                self._open(self._header + buf[:at])
                buf = buf[at + len(MESSAGE) :]
            elif self._state == "body":
                at, marker = _first(buf, _ENDS)
                if marker is None:
                    keep = _marker_prefix(buf)
                    self._take(out, buf[: len(buf) - keep])
                    self._held = buf[len(buf) - keep :]
                    break
                self._take(out, buf[:at])
                self._close_message(out)
                buf = buf[at + len(marker) :]
                self._state = "header" if marker == START else "between"
                self._header, self._prompted = "", 0
            else:  # between messages: only a new message's start means anything
                at = buf.find(START)
                if at < 0:
                    keep = _marker_prefix(buf)
                    self._held = buf[len(buf) - keep :]
                    break
                buf = buf[at + len(START) :]
                self._state, self._header, self._prompted = "header", "", 0
        return out

    def finish(self) -> list[Piece]:
        """Generation ended (on ``<|return|>`` or ``<|call|>``, which the engine never feeds, or on a
        limit): the message being written is complete; a call is parsed if it can be."""
        out: list[Piece] = []
        held, self._held = self._held, ""
        if self._state == "body":
            self._take(out, held)
            self._close_message(out)
        elif self._state == "header" and not self._framed:  # no harmony at all: the text is the answer
            self._content(out, self._header[self._prompted :] + held)
        self._state = "done"
        return out

    def _open(self, header: str) -> None:
        """A message's header is complete: its channel and recipient decide what its body is."""
        channel = _CHANNEL.search(header)
        recipient = _RECIPIENT.search(header.replace(CHANNEL, " " + CHANNEL).replace(CONSTRAIN, " " + CONSTRAIN))
        self._channel = channel.group(1) if channel else None
        self._recipient = recipient.group(1) if recipient else None
        self._state, self._body = "body", ""

    def _take(self, out: list[Piece], text: str) -> None:
        """Body text: streamed as reasoning or answer, or kept whole until a call's message ends."""
        if not text:
            return
        if self._recipient is not None:
            self._body += text
        elif self._channel == "analysis":
            if out and out[-1][0] == "reasoning":
                out[-1] = ("reasoning", out[-1][1] + text)
            else:
                out.append(("reasoning", text))  # type: ignore[arg-type]
        else:
            self._content(out, text)

    def _close_message(self, out: list[Piece]) -> None:
        recipient, body = self._recipient, self._body
        self._recipient, self._body = None, ""
        if recipient is None:
            return
        name = recipient[len(FUNCTIONS) :] if recipient.startswith(FUNCTIONS) else None
        try:
            if not self.parse or name is None or (self._names and name not in self._names):
                raise MalformedCall(f"not a call of an offered function: {recipient}")
            call = ToolCall(name, arguments_text(body))
        except MalformedCall:
            self._content(out, body)
            return
        out.append(("tool_call", call))
        self.calls += 1

    def parse_calls(self, body: str) -> list[ToolCall]:  # the machinery above reads calls itself
        raise NotImplementedError

    @classmethod
    def render_call(cls, name: str, arguments: dict) -> str:
        """A call as the model writes it after the generation prompt ``<|start|>assistant``; its
        ``<|call|>`` ends generation."""
        return f"{cls._call_header(name)}{json.dumps(arguments, ensure_ascii=False)}"

    @classmethod
    def grammar(cls, tools: list[dict], *, parallel: bool = True) -> str:
        # One call (its <|call|> ends generation), its header as the format writes it. The markers
        # are special tokens, written as their text (llguidance maps it to the token).
        calls, rules = per_tool_rules(
            tools, lambda name, schema: f"{json.dumps(cls._call_header(name))} {json_rule(schema)}"
        )
        return "\n".join([f"start: {calls}", *rules])

    @staticmethod
    def _call_header(name: str) -> str:
        return f"{CHANNEL}commentary to={FUNCTIONS}{name} {CONSTRAIN}json{MESSAGE}"


def _first(buf: str, markers: tuple[str, ...]) -> tuple[int, str | None]:
    best: tuple[int, str | None] = (-1, None)
    for marker in markers:
        at = buf.find(marker)
        if at >= 0 and (best[0] < 0 or at < best[0]):
            best = (at, marker)
    return best


def _marker_prefix(buf: str) -> int:
    """How many characters at the end of ``buf`` may be the beginning of a marker."""
    for n in range(min(max(len(m) for m in MARKERS) - 1, len(buf)), 0, -1):
        if any(m.startswith(buf[-n:]) for m in MARKERS):
            return n
    return 0


Parser = HarmonyParser
