"""Salesforce xLAM calls (xLAM-2 "fc-r" models, on Llama 3.1 and Qwen 2.5): ``tool_call_parser: xlam``.

What the model writes: the whole answer is a JSON array of calls::

    [{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_time", "arguments": {}}]

Also read, as the model sometimes writes them: the array in a fenced block (```` ```json ... ``` ````,
text before it kept), after ``[TOOL_CALLS]``, or within ``<tool_call>...</tool_call>``. A bare array
counts only as the answer's first text; text that is not a call array stays content.
"""

from __future__ import annotations

import json

from vllmmlxd.parsers.grammar import json_rule
from vllmmlxd.parsers.tools._jsoncalls import calls_array_schema, calls_from_json, json_call_end
from vllmmlxd.parsers.tools.base import ToolCall, ToolParser

TOOL_CALLS = "[TOOL_CALLS]"
_ENDS = {"```json": "```", "<tool_call>": "</tool_call>"}


class XlamToolParser(ToolParser):
    name = "xlam"
    starts = ("```json", TOOL_CALLS, "<tool_call>")
    bare_starts = "["
    markers = frozenset({TOOL_CALLS, "<tool_call>", "</tool_call>"})

    def call_end(self, buf: str) -> int | None:
        at = 0
        if self.opened == "":  # a bare "[": the array, or the answer's first text is "[TOOL_CALLS]"
            if buf.startswith(TOOL_CALLS):
                at = len(TOOL_CALLS)
            elif TOOL_CALLS.startswith(buf):
                return None
        return json_call_end(buf, _ENDS.get(self.opened or "", ""), at)

    def body_of(self, call_text: str) -> str:
        end = _ENDS.get(self.opened or "", "")
        body = call_text[: -len(end)] if end and call_text.endswith(end) else call_text
        return body.removeprefix(TOOL_CALLS) if self.opened == "" else body

    def parse_calls(self, body: str) -> list[ToolCall]:
        return calls_from_json(body)

    @classmethod
    def render_call(cls, name: str, arguments: dict) -> str:
        return json.dumps([{"name": name, "arguments": arguments}], ensure_ascii=False)

    @classmethod
    def grammar(cls, tools: list[dict], *, parallel: bool = True) -> str:
        return f"start: {json_rule(calls_array_schema(tools, parallel))}"


Parser = XlamToolParser
