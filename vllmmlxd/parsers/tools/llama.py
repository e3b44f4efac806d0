"""Llama calls (Llama 3.1-3.3, Llama 3.2 small models, Llama 4): ``tool_call_parser: llama``.

Llama 3.x writes JSON, bare as the whole answer or after ``<|python_tag|>``, several calls
joined by ``;``::

    {"name": "get_weather", "parameters": {"city": "Paris"}}
    <|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "get_time", "parameters": {}}

Llama 4 (and Llama 3.2 1B/3B prompted so) writes a pythonic list, bare as the whole answer
or between ``<|python_start|>`` and ``<|python_end|>``::

    [get_weather(city="Paris"), get_time()]

Which one is told by the call's first character. A bare call is only read where the answer
begins with it (after space): a ``{`` or ``[`` later in an answer is ordinary text. Pythonic
argument values are read as literals only (``ast.literal_eval``, JSON's true/false/null
allowed), never evaluated. ``render_call`` and ``grammar`` write the Llama 3 JSON form.
"""

from __future__ import annotations

import ast
import json

from vllmmlxd.parsers.grammar import json_rule
from vllmmlxd.parsers.tools.base import (
    MalformedCall,
    ToolCall,
    ToolParser,
    arguments_text,
    bracket_end,
    function_of,
    json_value_end,
)

PYTHON_TAG, PYTHON_START, PYTHON_END = "<|python_tag|>", "<|python_start|>", "<|python_end|>"
_JSON_NAMES = {"true": True, "false": False, "null": None}


class LlamaToolParser(ToolParser):
    name = "llama"
    starts = (PYTHON_TAG, PYTHON_START)
    bare_starts = "{["
    markers = frozenset({PYTHON_TAG, PYTHON_START, PYTHON_END})

    def call_end(self, buf: str) -> int | None:
        if self.opened == PYTHON_START:
            cut = buf.find(PYTHON_END)
            return None if cut < 0 else cut + len(PYTHON_END)
        at = _skip_space(buf, 0)
        if at == len(buf):
            return None
        if buf[at] == "[":
            return _python_list_end(buf, at)
        if buf[at] != "{":
            return 0  # e.g. a built-in tool's "brave_search.call(...)": not a call we read
        while True:  # JSON objects joined by ";": hold until what follows one says whether another comes
            end = json_value_end(buf, at)
            if end is None:
                return None
            after = _skip_space(buf, end)
            if after == len(buf):
                return None
            if buf[after] != ";":
                return end
            at = _skip_space(buf, after + 1)
            if at == len(buf):
                return None
            if buf[at] != "{":
                return end

    def body_of(self, call_text: str) -> str:
        return call_text.removesuffix(PYTHON_END) if self.opened == PYTHON_START else call_text

    def parse_calls(self, body: str) -> list[ToolCall]:
        body = body.strip()
        if body.startswith("{"):
            return _json_calls(body)
        try:
            return _pythonic_calls(body)
        except (SyntaxError, MalformedCall, ValueError):
            return _json_calls(body)  # a JSON array of call objects, as some fine-tunes write

    @classmethod
    def render_call(cls, name: str, arguments: dict) -> str:
        return json.dumps({"name": name, "parameters": arguments}, ensure_ascii=False)

    @classmethod
    def grammar(cls, tools: list[dict], *, parallel: bool = True) -> str:
        options = []
        for tool in tools:
            fn = function_of(tool)
            options.append(
                {
                    "type": "object",
                    "properties": {
                        "name": {"const": fn["name"]},
                        "parameters": fn.get("parameters") or {"type": "object"},
                    },
                    "required": ["name", "parameters"],
                    "additionalProperties": False,
                }
            )
        schema = options[0] if len(options) == 1 else {"anyOf": options}
        return "\n".join(
            [
                'start: call (";" " "? call)*' if parallel else "start: call",
                f"call: {json_rule(schema)}",
            ]
        )


def _skip_space(text: str, i: int) -> int:
    while i < len(text) and text[i].isspace():
        i += 1
    return i


def _python_list_end(text: str, start: int) -> int | None:
    """The index just past the bracket closing the Python list at ``text[start]``, or None if unfinished."""
    return bracket_end(text, start, quotes="'\"", opens="([{", closes=")]}")


def _json_calls(body: str) -> list[ToolCall]:
    decoder, calls, at = json.JSONDecoder(), [], 0
    while True:
        value, at = decoder.raw_decode(body, at)
        for call in value if isinstance(value, list) else [value]:
            if not isinstance(call, dict) or not isinstance(call.get("name"), str):
                raise MalformedCall("a call is an object with a name")
            calls.append(ToolCall(call["name"], arguments_text(call.get("parameters", call.get("arguments", {})))))
        at = _skip_space(body, at)
        if at == len(body):
            return calls
        if body[at] != ";":
            raise MalformedCall("calls are joined by ';'")
        at = _skip_space(body, at + 1)


def _pythonic_calls(body: str) -> list[ToolCall]:
    tree = ast.parse(body, mode="eval").body
    if not isinstance(tree, ast.List) or not tree.elts:
        raise MalformedCall("a pythonic call list is [f(a=1), ...]")
    calls = []
    for node in tree.elts:
        if not isinstance(node, ast.Call) or node.args or any(k.arg is None for k in node.keywords):
            raise MalformedCall("each call has keyword arguments only")
        arguments = {k.arg: ast.literal_eval(_JsonNames().visit(k.value)) for k in node.keywords}
        calls.append(ToolCall(_dotted(node.func), arguments_text(arguments)))
    return calls


def _dotted(func: ast.expr) -> str:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return f"{_dotted(func.value)}.{func.attr}"
    raise MalformedCall("a call's function is a (dotted) name")


class _JsonNames(ast.NodeTransformer):
    """Models write JSON's true/false/null inside Python calls; read them as those constants."""

    def visit_Name(self, node: ast.Name) -> ast.expr:
        if node.id in _JSON_NAMES:
            return ast.copy_location(ast.Constant(_JSON_NAMES[node.id]), node)
        return node


Parser = LlamaToolParser
