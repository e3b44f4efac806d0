"""Mistral calls: ``tool_call_parser: mistral``.

Tokenizers before v11 (Mistral 7B v0.3, Nemo, Small 3.1, Large 2411) write one JSON array
of calls after the marker::

    [TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "a1b2c3d4e"}]

v11 and later (Mistral Small 3.2, Devstral, Magistral, Ministral 3) write each call as its
name, an optional call id, then its arguments, the marker repeated for every call::

    [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{}
    [TOOL_CALLS]get_weather[CALL_ID]a1b2c3d4e[ARGS]{"city": "Paris"}

``[TOOL_CALLS]``, ``[ARGS]`` and ``[CALL_ID]`` are special tokens. Nothing closes a call:
it ends where its JSON closes. ``render_call`` and ``grammar`` use the v11 form.
"""

from __future__ import annotations

import json
import re

from vllmmlxd.parsers.grammar import json_rule
from vllmmlxd.parsers.tools.base import (
    MalformedCall,
    ToolCall,
    ToolParser,
    arguments_text,
    json_value_end,
    per_tool_rules,
)

ARGS, CALL_ID = "[ARGS]", "[CALL_ID]"
# name, then an optional [CALL_ID]id, then [ARGS] (which a decoder that drops special tokens loses).
_HEADER = re.compile(r"\s*([\w.\-]+)(?:\[CALL_ID\]\s*(\w*))?(?:\[ARGS\])?\s*(?=\{)")
_NAME = re.compile(r"\s*[\w.\-]+")


class MistralToolParser(ToolParser):
    name = "mistral"
    start = "[TOOL_CALLS]"
    markers = frozenset({start, ARGS, CALL_ID})

    def call_end(self, buf: str) -> int | None:
        head = buf.lstrip()
        if not head:
            return None
        at = len(buf) - len(head)
        if head[0] in "[{":
            return json_value_end(buf, at)  # the older JSON array (or one object)
        match = _HEADER.match(buf)
        if match is None:
            # Hold while the text may still become a header; once it cannot, it is no call.
            return None if _may_become_header(buf) else 0
        return json_value_end(buf, match.end())

    def parse_calls(self, body: str) -> list[ToolCall]:
        match = _HEADER.match(body)
        if match is None:
            payload = json.loads(body)
            calls = payload if isinstance(payload, list) else [payload]
            if not all(isinstance(c, dict) and isinstance(c.get("name"), str) for c in calls):
                raise MalformedCall("each call is an object with a name")
            return [ToolCall(c["name"], arguments_text(c.get("arguments", {}))) for c in calls]
        arguments = json.loads(body[match.end() :])
        return [ToolCall(match.group(1), arguments_text(arguments))]

    @classmethod
    def render_call(cls, name: str, arguments: dict) -> str:
        return f"{cls.start}{name}{ARGS}{json.dumps(arguments, ensure_ascii=False)}"

    @classmethod
    def grammar(cls, tools: list[dict], *, parallel: bool = True) -> str:
        # The markers are special tokens; written here as their text, which matches where
        # llguidance's tokenizer maps that text to the token (and as plain text in tests).
        calls, rules = per_tool_rules(
            tools, lambda name, schema: f'{json.dumps(name, ensure_ascii=False)} "{ARGS}" {json_rule(schema)}'
        )
        lines = [f"start: call{'+' if parallel else ''}", f'call: "{cls.start}" {calls}', *rules]
        return "\n".join(lines)


def _may_become_header(buf: str) -> bool:
    """Is ``buf`` the beginning of ``NAME[CALL_ID]id[ARGS] {``, not yet up to its ``{``?"""
    name = _NAME.match(buf)
    if name is None:
        return False
    rest = buf[name.end() :]
    if rest.startswith(CALL_ID):
        rest = re.sub(r"^\s*\w*", "", rest[len(CALL_ID) :])
    return not rest.strip() or any(
        m.startswith(rest) or (rest.startswith(m) and not rest[len(m) :].strip()) for m in (CALL_ID, ARGS)
    )


Parser = MistralToolParser
