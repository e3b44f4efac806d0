"""NVIDIA Llama-Nemotron calls (Llama-3.1/3.3-Nemotron Nano/Super/Ultra, Nemotron Nano 2 9B):
``tool_call_parser: nemotron``.

What the model writes: one block holding a JSON array of calls, each call's arguments an object
or that object's JSON text::

    <TOOLCALL>[{"name": "get_weather", "arguments": {"city": "Paris"}},
    {"name": "get_time", "arguments": "{}"}]</TOOLCALL>

(shown on two lines here; the model writes one). The block ends at ``</TOOLCALL>`` after its JSON
closes, or where the JSON closes if the model leaves the tag out.
"""

from __future__ import annotations

import json

from vllmmlxd.parsers.grammar import json_rule
from vllmmlxd.parsers.tools._jsoncalls import calls_array_schema, calls_from_json, json_call_end
from vllmmlxd.parsers.tools.base import ToolCall, ToolParser


class NemotronToolParser(ToolParser):
    name = "nemotron"
    start = "<TOOLCALL>"
    end = "</TOOLCALL>"
    markers = frozenset({start, end})  # plain text in Llama-Nemotron; listed for tokenizers where they are special

    def call_end(self, buf: str) -> int | None:
        # The block ends after its JSON closes, so "</TOOLCALL>" inside an argument string does not end it.
        return json_call_end(buf, self.end)

    def parse_calls(self, body: str) -> list[ToolCall]:
        return calls_from_json(body)

    @classmethod
    def render_call(cls, name: str, arguments: dict) -> str:
        return f"{cls.start}{json.dumps([{'name': name, 'arguments': arguments}], ensure_ascii=False)}{cls.end}"

    @classmethod
    def grammar(cls, tools: list[dict], *, parallel: bool = True) -> str:
        return "\n".join(
            [
                f'start: "{cls.start}" calls "{cls.end}"',
                f"calls: {json_rule(calls_array_schema(tools, parallel))}",
            ]
        )


Parser = NemotronToolParser
