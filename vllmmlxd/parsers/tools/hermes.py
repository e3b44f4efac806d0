"""Hermes-style calls (NousResearch Hermes, Qwen2.5, Qwen3 and most ChatML models): ``tool_call_parser: hermes``.

What the model writes, one block per call::

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>
"""

from __future__ import annotations

import json

from vllmmlxd.parsers.grammar import json_rule
from vllmmlxd.parsers.tools.base import MalformedCall, ToolCall, ToolParser, arguments_text, function_of


class HermesToolParser(ToolParser):
    name = "hermes"
    start = "<tool_call>"
    end = "</tool_call>"
    markers = frozenset({start, end})

    def parse_calls(self, body: str) -> list[ToolCall]:
        call = json.loads(body)
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            raise MalformedCall("a call is an object with a name")
        return [ToolCall(call["name"], arguments_text(call.get("arguments", call.get("parameters", {}))))]

    @classmethod
    def render_call(cls, name: str, arguments: dict) -> str:
        return f"{cls.start}\n{json.dumps({'name': name, 'arguments': arguments}, ensure_ascii=False)}\n{cls.end}"

    @classmethod
    def grammar(cls, tools: list[dict], *, parallel: bool = True) -> str:
        # Nothing after the last call but the end of the turn: trailing whitespace would be an
        # empty answer beside the calls.
        return "\n".join(
            [
                'start: call ("\\n" call)*' if parallel else "start: call",
                f'call: "{cls.start}" ws body ws "{cls.end}"',
                f"body: {json_rule(call_schema(tools))}",
                "ws: /[ \\n]{0,2}/",
            ]
        )


def call_schema(tools: list[dict]) -> dict:
    """The JSON schema of ``{"name": ..., "arguments": ...}`` for any one of ``tools``."""
    options = []
    for tool in tools:
        fn = function_of(tool)
        options.append(
            {
                "type": "object",
                "properties": {"name": {"const": fn["name"]}, "arguments": fn.get("parameters") or {"type": "object"}},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
        )
    return options[0] if len(options) == 1 else {"anyOf": options}


Parser = HermesToolParser
