"""Calls written as JSON ``{"name", "arguments"}`` objects, alone or in a list: shared by the
granite, nemotron and xlam families."""

from __future__ import annotations

import json

from vllmmlxd.parsers.tools.base import MalformedCall, ToolCall, arguments_text, json_value_end
from vllmmlxd.parsers.tools.hermes import call_schema


def calls_from_json(text: str) -> list[ToolCall]:
    """The calls in ``text``: one object or a list (each call's arguments an object or its JSON text)."""
    value = json.loads(text)
    calls = []
    for item in value if isinstance(value, list) else [value]:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise MalformedCall("a call is an object with a name")
        calls.append(ToolCall(item["name"], arguments_text(item.get("arguments", item.get("parameters", {})))))
    return calls


def json_call_end(buf: str, end: str = "", at: int = 0) -> int | None:
    """Where a call written as one JSON value from ``buf[at:]`` stops: past ``end`` if that follows
    the value, else just past the value; None while that cannot be told yet. Text that is not JSON
    ends the call at once (so it goes back as text). Marker-like text inside strings is skipped."""
    i = _skip_space(buf, at)
    if i == len(buf):
        return None
    if buf[i] not in "[{":
        return i
    j = json_value_end(buf, i)
    if j is None or not end:
        return j
    k = _skip_space(buf, j)
    if buf.startswith(end, k):
        return k + len(end)
    return None if end.startswith(buf[k:]) else j


def calls_array_schema(tools: list[dict], parallel: bool) -> dict:
    """The JSON schema of a list of ``{"name", "arguments"}`` calls: one, or one or more."""
    schema = {"type": "array", "items": call_schema(tools), "minItems": 1}
    return schema if parallel else {**schema, "maxItems": 1}


def _skip_space(text: str, at: int) -> int:
    while at < len(text) and text[at].isspace():
        at += 1
    return at
