"""The Responses specification's required fields and their types, as our own table (read from
the Open Responses specification's published schema, version 2026-04-24, checked against its
launch version where they differ), and a checker that walks a response object or a stream event
and lists every field that is missing or of the wrong type.

A field is ``name: kind``; the kind says the JSON type (``str``, ``int``, ``num``, ``bool``,
``obj``, ``arr``, ``any``), a trailing ``?`` that null is allowed, and a ``<Schema>`` name that
the value is checked against that schema too. Extra fields are allowed, as the spec allows them.
"""

from __future__ import annotations

from typing import Any

SCHEMAS: dict[str, dict[str, str]] = {
    "Response": {
        "id": "str",
        "object": "str",
        "created_at": "int",
        "completed_at": "int?",
        "status": "str",
        "incomplete_details": "<IncompleteDetails>?",
        "model": "str",
        "previous_response_id": "str?",
        "instructions": "str?",
        "output": "arr<Item>",
        "error": "<Error>?",
        "tools": "arr<Tool>",
        "tool_choice": "any",
        "truncation": "str",
        "parallel_tool_calls": "bool",
        "text": "<TextField>",
        "top_p": "num",
        "presence_penalty": "num",
        "frequency_penalty": "num",
        "top_logprobs": "int",
        "temperature": "num",
        "reasoning": "<Reasoning>?",
        "usage": "<Usage>?",
        "max_output_tokens": "int?",
        "max_tool_calls": "int?",
        "store": "bool",
        "background": "bool",
        "service_tier": "str",
        "metadata": "obj",
        "safety_identifier": "str?",
        "prompt_cache_key": "str?",
    },
    "IncompleteDetails": {"reason": "str"},
    "Error": {"code": "str", "message": "str"},
    "Usage": {
        "input_tokens": "int",
        "output_tokens": "int",
        "total_tokens": "int",
        "input_tokens_details": "<InputTokensDetails>",
        "output_tokens_details": "<OutputTokensDetails>",
    },
    "InputTokensDetails": {"cached_tokens": "int"},
    "OutputTokensDetails": {"reasoning_tokens": "int"},
    "Reasoning": {"effort": "str?", "summary": "str?"},
    "TextField": {"format": "<Format>"},
    # Formats, tools, items and parts: by their ``type``.
    "Format:text": {"type": "str"},
    "Format:json_object": {"type": "str"},
    "Format:json_schema": {"type": "str", "name": "str", "description": "str?", "schema": "obj?", "strict": "bool"},
    "Tool:function": {"type": "str", "name": "str", "description": "str?", "parameters": "obj?", "strict": "bool?"},
    "Item:message": {"type": "str", "id": "str", "status": "str", "role": "str", "content": "arr<Part>"},
    "Item:function_call": {
        "type": "str",
        "id": "str",
        "call_id": "str",
        "name": "str",
        "arguments": "str",
        "status": "str",
    },
    "Item:function_call_output": {"type": "str", "id": "str", "call_id": "str", "output": "any", "status": "str"},
    "Item:reasoning": {"type": "str", "id": "str", "summary": "arr<Part>"},
    # Launch version: logprobs required on output text (the newest makes it optional).
    "Part:output_text": {"type": "str", "text": "str", "annotations": "arr", "logprobs": "arr<LogProb>"},
    "Part:summary_text": {"type": "str", "text": "str"},
    "Part:reasoning_text": {"type": "str", "text": "str"},
    "Part:refusal": {"type": "str", "refusal": "str"},
    "LogProb": {"token": "str", "logprob": "num", "bytes": "arr", "top_logprobs": "arr<TopLogProb>"},
    "TopLogProb": {"token": "str", "logprob": "num", "bytes": "arr"},
}
ENUMS = {
    ("Item:message", "status"): {"in_progress", "completed", "incomplete"},
    ("Item:message", "role"): {"user", "assistant", "system", "developer"},
    ("Item:function_call", "status"): {"in_progress", "completed", "incomplete"},
    ("Response", "truncation"): {"auto", "disabled"},
    ("Response", "object"): {"response"},
}
# Extensions this server writes that the spec does not define (the worker's own MCP calls).
OWN_ITEMS = frozenset({"mcp_call"})

_PART_AT = {"item_id": "str", "output_index": "int", "content_index": "int"}
_SUMMARY_AT = {"item_id": "str", "output_index": "int", "summary_index": "int"}
EVENTS: dict[str, dict[str, str]] = {
    **{
        f"response.{kind}": {"response": "<Response>"}
        for kind in ("created", "queued", "in_progress", "completed", "failed", "incomplete")
    },
    "response.output_item.added": {"output_index": "int", "item": "<Item>?"},
    "response.output_item.done": {"output_index": "int", "item": "<Item>?"},
    "response.content_part.added": {**_PART_AT, "part": "<Part>"},
    "response.content_part.done": {**_PART_AT, "part": "<Part>"},
    "response.output_text.delta": {**_PART_AT, "delta": "str", "logprobs": "arr<LogProb>"},
    "response.output_text.done": {**_PART_AT, "text": "str", "logprobs": "arr<LogProb>"},
    "response.refusal.delta": {**_PART_AT, "delta": "str"},
    "response.refusal.done": {**_PART_AT, "refusal": "str"},
    "response.reasoning.delta": {**_PART_AT, "delta": "str"},
    "response.reasoning.done": {**_PART_AT, "text": "str"},
    "response.reasoning_summary_part.added": {**_SUMMARY_AT, "part": "<Part>"},
    "response.reasoning_summary_part.done": {**_SUMMARY_AT, "part": "<Part>"},
    "response.reasoning_summary_text.delta": {**_SUMMARY_AT, "delta": "str"},
    "response.reasoning_summary_text.done": {**_SUMMARY_AT, "text": "str"},
    "response.function_call_arguments.delta": {"item_id": "str", "output_index": "int", "delta": "str"},
    "response.function_call_arguments.done": {"item_id": "str", "output_index": "int", "arguments": "str"},
    "error": {"error": "<ErrorPayload>"},
}
SCHEMAS["ErrorPayload"] = {"type": "str", "code": "str?", "message": "str", "param": "str?"}

_TYPES: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "int": (int,),
    "num": (int, float),
    "bool": (bool,),
    "obj": (dict,),
    "arr": (list,),
}


def check_response(body: Any, where: str = "response") -> list[str]:
    """Every way ``body`` (a response object) departs from the specification's required fields."""
    return _check(body, "Response", where)


def check_event(event: Any) -> list[str]:
    """Every way one stream event departs from the specification (its own fields, and the
    response or item it carries)."""
    if not isinstance(event, dict) or not isinstance(event.get("type"), str):
        return [f"event {str(event)[:80]}: no type"]
    kind = event["type"]
    if kind not in EVENTS:
        return [f"event {kind}: not an event of the specification"]
    where = f"event {kind} #{event.get('sequence_number')}"
    fields = {"type": "str", "sequence_number": "int", **EVENTS[kind]}
    return _fields(event, fields, where, kind)


def _check(value: Any, schema: str, where: str) -> list[str]:
    if not isinstance(value, dict):
        return [f"{where}: an object is required, got {type(value).__name__}"]
    if schema in ("Item", "Part", "Tool", "Format"):
        kind = value.get("type")
        if schema == "Item" and kind in OWN_ITEMS:
            return []
        if f"{schema}:{kind}" not in SCHEMAS:
            return [] if schema == "Tool" else [f"{where}: {schema.lower()} type {kind!r} is not in the specification"]
        schema = f"{schema}:{kind}"
    return _fields(value, SCHEMAS[schema], where, schema)


def _fields(value: dict, fields: dict[str, str], where: str, schema: str) -> list[str]:
    problems = []
    for name, kind in fields.items():
        here = f"{where}.{name}"
        if name not in value:
            problems.append(f"{here}: required, missing")
            continue
        problems += _value(value[name], kind, here)
        allowed = ENUMS.get((schema, name))
        if allowed is not None and value[name] not in allowed:
            problems.append(f"{here}: {value[name]!r} is not one of {sorted(allowed)}")
    return problems


def _value(value: Any, kind: str, where: str) -> list[str]:
    nullable = kind.endswith("?")
    kind = kind.rstrip("?")
    if value is None:
        return [] if nullable or kind == "any" else [f"{where}: null where the specification wants {kind}"]
    if kind == "any":
        return []
    if kind.startswith("<"):
        return _check(value, kind[1:-1], where)
    base, _, inner = kind.partition("<")
    expected = _TYPES[base]
    if not isinstance(value, expected) or (base in ("int", "num") and isinstance(value, bool)):
        return [f"{where}: {type(value).__name__} where the specification wants {base}"]
    if inner and isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _check(v, inner[:-1], f"{where}[{i}]")]
    return []
