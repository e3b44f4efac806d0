"""Tools for a model whose chat template ignores them: the definitions and how to call them,
written into the system message in the configured family's own format. Pure.

SmolLM2's template, like many small models', renders the same prompt with or without
``tools``; a client binding tools would silently get prose. With this text the model sees
the tools and an example call in the format the parser reads back.
"""

from __future__ import annotations

import json

from vllmmlxd.parsers.tools.base import ToolParser, function_of


def tool_instructions(tools: list[dict], parser: type[ToolParser]) -> str:
    """The system-prompt text that offers ``tools`` and shows the call format of ``parser``."""
    lines = ["You can call functions to help with the request. The functions, one JSON signature per line:"]
    for tool in tools:
        fn = function_of(tool)
        lines.append(
            json.dumps({k: fn[k] for k in ("name", "description", "parameters") if k in fn}, ensure_ascii=False)
        )
    example = function_of(tools[0])
    lines += [
        "",
        "To call a function, reply with the call alone, in exactly this format (one block per call):",
        parser.render_call(example.get("name", "function_name"), _example_arguments(example.get("parameters"))),
        "When a function's result is given to you, use it to answer.",
    ]
    return "\n".join(lines)


def with_tool_instructions(messages: list[dict], tools: list[dict], parser: type[ToolParser]) -> list[dict]:
    """``messages`` with the tool instructions added to (or as) the system message."""
    text = tool_instructions(tools, parser)
    if messages and messages[0].get("role") == "system":
        first = messages[0]
        content = first.get("content")
        merged: str | list
        if isinstance(content, list):  # content parts: keep them, add ours as one more text part
            merged = [*content, {"type": "text", "text": "\n\n" + text}]
        else:
            merged = f"{content}\n\n{text}" if content else text
        return [{**first, "content": merged}, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


def _example_arguments(schema: dict | None) -> dict:
    """Placeholder arguments shaped like ``schema``'s properties (just an example of the format)."""
    props = (schema or {}).get("properties") or {}
    return {name: _placeholder(spec) for name, spec in list(props.items())[:3]}


_PLACEHOLDERS: dict[str, object] = {
    "string": "...",
    "integer": 1,
    "number": 1.0,
    "boolean": True,
    "array": [],
    "object": {},
}


def _placeholder(spec: object) -> object:
    """An example value for one property's schema. A schema may be a bool, and its ``type`` a
    list of types (``["string", "null"]``): the first one named is the example's."""
    kind = spec.get("type") if isinstance(spec, dict) else None
    if isinstance(kind, list):
        kind = next((k for k in kind if isinstance(k, str)), None)
    return _PLACEHOLDERS.get(kind, "...") if isinstance(kind, str) else "..."


def calls_as_text(messages: list[dict], parser: type[ToolParser]) -> list[dict]:
    """Earlier assistant calls written into their text in the family's format, for a template that
    would drop ``tool_calls`` (the model should see what it called before each result)."""
    out = []
    for msg in messages:
        calls = msg.get("tool_calls")
        if msg.get("role") != "assistant" or not calls:
            out.append(msg)
            continue
        written = [
            parser.render_call(function_of(c).get("name", ""), _as_object(function_of(c).get("arguments")))
            for c in calls
        ]
        text = "\n".join(filter(None, [msg.get("content") or "", *written]))
        out.append({k: v for k, v in {**msg, "content": text}.items() if k != "tool_calls"})
    return out


def _as_object(arguments: object) -> dict:
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return {}
    return arguments if isinstance(arguments, dict) else {}
