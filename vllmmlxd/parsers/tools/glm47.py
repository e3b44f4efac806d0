"""Zhipu GLM-4.5 / 4.6 / 4.7 calls: ``tool_call_parser: glm47``.

What the model writes, one block per call, each argument a key and its value as raw text (a
string as is, anything else as JSON); GLM-4.5/4.6 put newlines between the parts::

    <tool_call>get_weather
    <arg_key>city</arg_key>
    <arg_value>Paris</arg_value>
    <arg_key>days</arg_key>
    <arg_value>3</arg_value>
    </tool_call>

GLM-4.7 writes the same with no newlines (``<tool_call>get_weather<arg_key>city</arg_key>...``).
A value is read by its parameter's schema type: integer, number, boolean, null, object, array are
JSON (kept as the string if it does not parse); everything else is the string written.
"""

from __future__ import annotations

import json
import re
from typing import Any

from vllmmlxd.parsers.grammar import json_rule
from vllmmlxd.parsers.tools._jsoncalls import calls_from_json
from vllmmlxd.parsers.tools.base import MalformedCall, ToolCall, ToolParser, arguments_text, function_of

_NAME = re.compile(r"\s*([\w.-]+)\s*")
_PAIR = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>\s*", re.DOTALL)
_JSON_TYPES = {"integer", "number", "boolean", "null", "object", "array"}
# A raw-text value with its close: llguidance lexes greedily, so text that may hold "<" cannot
# stop before a separate "</arg_value>" literal; the terminal ends at the first close instead.
_RAW_VALUE = r"/(.|\n)*<\/arg_value>/ & ~/(.|\n)*<\/arg_value>(.|\n)+/"


class Glm47ToolParser(ToolParser):
    name = "glm47"
    start = "<tool_call>"
    end = "</tool_call>"
    markers = frozenset({start, end, "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"})

    def __init__(self, tools: list[dict] | None = None):
        super().__init__(tools)
        self._params = {
            function_of(t).get("name"): (function_of(t).get("parameters") or {}).get("properties") or {}
            for t in self.tools
        }

    def call_end(self, buf: str) -> int | None:
        # A value is raw text and may hold "</tool_call>": look for the end only between values
        # (so an unclosed value holds the call to the end of the answer, then it goes back as text).
        at = 0
        while True:
            close, value = buf.find(self.end, at), buf.find("<arg_value>", at)
            if value < 0 or 0 <= close < value:
                return None if close < 0 else close + len(self.end)
            done = buf.find("</arg_value>", value)
            if done < 0:
                return None
            at = done + len("</arg_value>")

    def parse_calls(self, body: str) -> list[ToolCall]:
        if body.lstrip().startswith("{"):
            return calls_from_json(body)  # GLM sometimes writes a hermes-style JSON call instead
        head = _NAME.match(body)
        if not head:
            raise MalformedCall("a call starts with its function's name")
        name, at, arguments = head.group(1), head.end(), {}
        while at < len(body):
            pair = _PAIR.match(body, at)
            if not pair:
                raise MalformedCall("arguments are <arg_key>/<arg_value> pairs")
            key = pair.group(1).strip()
            arguments[key] = self._value(self._params.get(name, {}).get(key), pair.group(2))
            at = pair.end()
        return [ToolCall(name, arguments_text(arguments))]

    @staticmethod
    def _value(schema: dict | None, raw: str) -> Any:
        types = _types(schema or {})
        if types and "string" not in types and types <= _JSON_TYPES:
            try:
                return json.loads(raw)
            except ValueError:
                pass
        return raw

    @classmethod
    def render_call(cls, name: str, arguments: dict) -> str:
        pairs = "".join(f"<arg_key>{k}</arg_key>\n<arg_value>{_raw(v)}</arg_value>\n" for k, v in arguments.items())
        return f"{cls.start}{name}\n{pairs}{cls.end}"  # GLM-4.5/4.6 spacing

    @classmethod
    def grammar(cls, tools: list[dict], *, parallel: bool = True) -> str:
        # Per tool, its parameters in declared order (required ones present); values as the format
        # writes them: strings raw (up to "</arg_value>"), string enums literal, the rest JSON by schema.
        lines = [
            "start: call (nl call)*" if parallel else "start: call",
            "call: " + " | ".join(f"call{i}" for i in range(len(tools))),
            'nl: "\\n"?',
            f"RAW_VALUE: {_RAW_VALUE}",
        ]
        for i, tool in enumerate(tools):
            fn = function_of(tool)
            params = fn.get("parameters") or {}
            required = set(params.get("required") or ())
            parts = []
            for j, (key, schema) in enumerate((params.get("properties") or {}).items()):
                pair = f"arg{i}_{j}"
                parts.append(pair if key in required else f"{pair}?")
                key_text = json.dumps(key, ensure_ascii=False)
                lines.append(f'{pair}: "<arg_key>" {key_text} "</arg_key>" nl "<arg_value>" val{i}_{j} nl')
                lines.append(f"val{i}_{j}: {_value_rule(schema)}")
            lines.append(f'call{i}: "{cls.start}" {json.dumps(fn["name"])} nl {" ".join(parts)} "{cls.end}"')
        return "\n".join(lines)


def _raw(value: Any) -> str:
    """A value as the template writes it: a string as is, anything else as JSON."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _types(schema: dict) -> set[str]:
    """The JSON types a schema allows (``type``, or its ``anyOf``/``oneOf`` members')."""
    kind = schema.get("type")
    types = {kind} if isinstance(kind, str) else set(kind or ())
    for member in schema.get("anyOf", []) + schema.get("oneOf", []):
        types |= _types(member)
    return types


def _value_rule(schema: dict) -> str:
    """A value's text and its closing "</arg_value>", as the parser reads it back."""
    types = _types(schema)
    if types and "string" not in types and types <= _JSON_TYPES:
        return f'{json_rule(schema)} "</arg_value>"'
    if types == {"string"} and schema.get("enum"):
        return "(" + " | ".join(json.dumps(v, ensure_ascii=False) for v in schema["enum"]) + ') "</arg_value>"'
    return "RAW_VALUE"


Parser = Glm47ToolParser
