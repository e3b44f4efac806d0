"""Server-sent events framing."""

from __future__ import annotations

import json

DONE = "data: [DONE]\n\n"


def sse_data(obj: dict) -> str:
    """One ``data:`` event carrying compact JSON."""
    return "data: " + json.dumps(obj, separators=(",", ":"), ensure_ascii=False) + "\n\n"


def sse_event(name: str, obj: dict) -> str:
    """A named event (``event:`` + ``data:``), as Anthropic's stream uses."""
    return f"event: {name}\n" + sse_data(obj)
