"""What a span holds of a request's content when the operator asks (``telemetry.capture_content``):
its messages and its answer, as OpenTelemetry's generative-AI conventions shape them
(``gen_ai.input.messages``, ``gen_ai.output.messages``: JSON of ``{role, parts: [{type, content}]}``).

Read from the request's own body (every family: chat's and Anthropic's ``messages`` and
``system``, Responses' ``instructions`` and ``input``, a completion's ``prompt``, Ollama's
``messages`` and ``prompt``) and from the answer's text as the engine wrote it. Text only, each
part cut at ``PART_CHARS``; an image or a file is its type without its data. Never a header,
so never a key. Pure functions.
"""

from __future__ import annotations

import json
from typing import Any

PART_CHARS = 16_384  # characters of one part's text at most
BODY_BYTES = 1 << 20  # a request body read for its content at most (a larger one is not captured)


def _text_parts(content: Any) -> list[dict[str, Any]]:
    """A message's content (a string, or the family's list of parts) as the conventions' parts."""
    if isinstance(content, str):
        return [{"type": "text", "content": content[:PART_CHARS]}]
    parts: list[dict[str, Any]] = []
    for part in content if isinstance(content, list) else ():
        if not isinstance(part, dict):
            continue
        kind = str(part.get("type") or "text")
        text = part.get("text")
        if isinstance(text, str) and kind in ("text", "input_text", "output_text"):
            parts.append({"type": "text", "content": text[:PART_CHARS]})
        else:
            parts.append({"type": kind})  # an image, a file, a tool call: its kind, not its data
    return parts


def input_messages(body: bytes) -> str | None:
    """``gen_ai.input.messages`` of a request body (None: not JSON, or nothing to show)."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(data, dict):
        return None
    out: list[dict[str, Any]] = []
    for key in ("system", "instructions"):
        if data.get(key):
            out.append({"role": "system", "parts": _text_parts(data[key])})
    messages = data.get("messages")
    if isinstance(data.get("input"), str):
        messages = [{"role": "user", "content": data["input"]}]
    elif isinstance(data.get("input"), list):
        messages = data["input"]
    for m in messages if isinstance(messages, list) else ():
        if isinstance(m, dict):
            out.append({"role": str(m.get("role") or m.get("type") or "user"), "parts": _text_parts(m.get("content"))})
    prompt = data.get("prompt")
    if isinstance(prompt, str):
        out.append({"role": "user", "parts": _text_parts(prompt)})
    return json.dumps(out) if out else None


def output_messages(text: str, finish_reason: str | None) -> str:
    """``gen_ai.output.messages`` of an answer's text."""
    message: dict[str, Any] = {"role": "assistant", "parts": _text_parts(text)}
    if finish_reason:
        message["finish_reason"] = finish_reason
    return json.dumps([message])
