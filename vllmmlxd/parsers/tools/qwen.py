"""Qwen calls (Qwen2.5, Qwen3, Qwen3-Coder): ``tool_call_parser: qwen``.

Each call is one ``<tool_call>`` block, in either of two bodies, told apart per call.
Qwen2.5 / Qwen3 write hermes JSON::

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

Qwen3-Coder writes XML, each parameter's value as raw text::

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call>

An XML value becomes the JSON its parameter's schema type asks for (integer, number,
boolean, object, array: the value read as JSON when it is; else it stays a string).
``render_call`` and ``grammar`` are hermes': both kinds of Qwen model read and write that
form, and one JSON schema per call holds it to the tool exactly (the XML form's raw values
could not be held to a schema as tightly).
"""

from __future__ import annotations

import json
import re
from typing import Any

from vllmmlxd.parsers.tools import hermes
from vllmmlxd.parsers.tools.base import MalformedCall, ToolCall, arguments_text, function_of

_FUNCTION = re.compile(r"\s*<function=([^>\n]+)>(.*)</function>\s*", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.DOTALL)
_JSON_TYPES = {"integer", "number", "boolean", "object", "array", "null"}


class QwenToolParser(hermes.HermesToolParser):
    name = "qwen"

    def parse_calls(self, body: str) -> list[ToolCall]:
        if body.lstrip().startswith("<function="):
            return [self._xml_call(body)]
        return super().parse_calls(body)

    def _xml_call(self, body: str) -> ToolCall:
        match = _FUNCTION.fullmatch(body)
        if match is None:
            raise MalformedCall("an XML call is one <function=NAME>...</function>")
        name, params = match.group(1).strip(), match.group(2)
        # Only whitespace may stand between parameters: anything else is not this format.
        if _PARAMETER.sub("", params).strip():
            raise MalformedCall("text outside the parameters")
        properties = self._properties(name)
        arguments = {}
        for key, raw in _PARAMETER.findall(params):
            key = key.strip()
            # The template puts the value on its own lines: one newline each side is layout.
            value = raw[1:] if raw.startswith("\n") else raw
            value = value[:-1] if value.endswith("\n") else value
            arguments[key] = _typed(value, properties.get(key))
        return ToolCall(name, arguments_text(arguments))

    def _properties(self, name: str) -> dict:
        for tool in self.tools:
            fn = function_of(tool)
            if fn.get("name") == name:
                return (fn.get("parameters") or {}).get("properties") or {}
        return {}


def _typed(value: str, schema: dict | None) -> Any:
    """A raw XML value as its schema's type wants it: JSON for non-string types when it parses."""
    types = (schema or {}).get("type")
    types = set(types) if isinstance(types, list) else {types}
    if schema is None or not types & _JSON_TYPES:
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        # Python spellings of booleans are common in XML values.
        return {"True": True, "False": False}.get(value.strip(), value)


Parser = QwenToolParser
