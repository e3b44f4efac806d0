"""Kimi K2 calls: ``tool_call_parser: kimi``.

A section of one or more calls, each named ``functions.NAME:IDX`` (IDX counts the calls of
the conversation) and followed by its JSON arguments; every marker is a special token::

    <|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>

Some outputs write the section's markers singular (``<|tool_call_section_begin|>``); they
are read the same. The ``functions.`` prefix is optional when reading.
"""

from __future__ import annotations

import json
import re

from vllmmlxd.parsers.grammar import json_rule
from vllmmlxd.parsers.tools.base import MalformedCall, ToolCall, ToolParser, arguments_text, per_tool_rules

SECTION_BEGIN, SECTION_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
SECTION_BEGIN_1, SECTION_END_1 = "<|tool_call_section_begin|>", "<|tool_call_section_end|>"
CALL_BEGIN, ARGUMENT_BEGIN, CALL_END = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"
_HEADER = re.compile(r"\s*(?:functions\.)?(\S+?):\d+\s*")


class KimiToolParser(ToolParser):
    name = "kimi"
    starts = (SECTION_BEGIN, SECTION_BEGIN_1)
    markers = frozenset(
        {SECTION_BEGIN, SECTION_END, SECTION_BEGIN_1, SECTION_END_1, CALL_BEGIN, ARGUMENT_BEGIN, CALL_END}
    )

    def call_end(self, buf: str) -> int | None:
        ends = [(at, len(end)) for end in (SECTION_END, SECTION_END_1) if (at := buf.find(end)) >= 0]
        return sum(min(ends)) if ends else None

    def body_of(self, call_text: str) -> str:
        return call_text.removesuffix(SECTION_END).removesuffix(SECTION_END_1)

    def parse_calls(self, body: str) -> list[ToolCall]:
        first, *calls = body.split(CALL_BEGIN)
        if first.strip():
            raise MalformedCall("a section holds calls only")
        out = []
        for i, part in enumerate(calls):
            text, closed, rest = part.partition(CALL_END)
            # Only the last call may lack its end (generation stopped right after its JSON).
            if rest.strip() or (not closed and i < len(calls) - 1):
                raise MalformedCall("a call is <|tool_call_begin|>...<|tool_call_end|>")
            header, sep, arguments = text.partition(ARGUMENT_BEGIN)
            name = _HEADER.fullmatch(header)
            if not sep or name is None:
                raise MalformedCall("a call is functions.NAME:IDX<|tool_call_argument_begin|>{...}")
            out.append(ToolCall(name.group(1), arguments_text(json.loads(arguments))))
        return out

    @classmethod
    def render_call(cls, name: str, arguments: dict, index: int = 0) -> str:
        call = (
            f"{CALL_BEGIN}functions.{name}:{index}{ARGUMENT_BEGIN}{json.dumps(arguments, ensure_ascii=False)}{CALL_END}"
        )
        return SECTION_BEGIN + call + SECTION_END

    @classmethod
    def grammar(cls, tools: list[dict], *, parallel: bool = True) -> str:
        # The markers are special tokens; written here as their text, which matches where
        # llguidance's tokenizer maps that text to the token (and as plain text in tests).
        calls, rules = per_tool_rules(
            tools,
            lambda name, schema: (
                f'{json.dumps(name, ensure_ascii=False)} ":" /[0-9]+/ "{ARGUMENT_BEGIN}" {json_rule(schema)}'
            ),
        )
        lines = [
            f'start: "{SECTION_BEGIN}" call{"+" if parallel else ""} "{SECTION_END}"',
            f'call: "{CALL_BEGIN}functions." {calls} "{CALL_END}"',
            *rules,
        ]
        return "\n".join(lines)


Parser = KimiToolParser
