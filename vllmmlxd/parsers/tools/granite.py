"""IBM Granite calls: ``tool_call_parser: granite``. Both generations, told apart by what follows the marker.

Granite 3.0 writes the special token, then a JSON array of calls, with no end marker (the call
ends where the array closes); Granite 3.1-3.3 write the same after the plain text ``<tool_call>``::

    <|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_time", "arguments": {}}]

Granite 4.x writes hermes-style blocks, one per call::

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>
"""

from __future__ import annotations

from vllmmlxd.parsers.grammar import json_rule
from vllmmlxd.parsers.tools._jsoncalls import calls_array_schema, calls_from_json, json_call_end
from vllmmlxd.parsers.tools.base import ToolCall, ToolParser
from vllmmlxd.parsers.tools.hermes import HermesToolParser, call_schema


class GraniteToolParser(ToolParser):
    name = "granite"
    starts = ("<|tool_call|>", "<tool_call>")
    end = "</tool_call>"
    markers = frozenset({"<|tool_call|>", "<tool_call>", "</tool_call>"})

    def call_end(self, buf: str) -> int | None:
        # One JSON value either way (3.x's array, 4.x's object), then </tool_call> where 4.x closes it.
        return json_call_end(buf, self.end if self.opened == "<tool_call>" else "")

    def parse_calls(self, body: str) -> list[ToolCall]:
        return calls_from_json(body)

    @classmethod
    def render_call(cls, name: str, arguments: dict) -> str:
        return HermesToolParser.render_call(name, arguments)  # Granite 4.x, the current generation

    @classmethod
    def grammar(cls, tools: list[dict], *, parallel: bool = True) -> str:
        # Either generation's form; a model takes the one it was trained on.
        return "\n".join(
            [
                "start: three | four",
                'three: "<|tool_call|>" calls',
                f"calls: {json_rule(calls_array_schema(tools, parallel))}",
                'four: call ("\\n" call)*' if parallel else "four: call",
                'call: "<tool_call>" ws body ws "</tool_call>"',
                f"body: {json_rule(call_schema(tools))}",
                "ws: /[ \\n]{0,2}/",
            ]
        )


Parser = GraniteToolParser
