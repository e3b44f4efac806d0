"""What can be read of a JSON object cut short (a tool call's arguments ended by ``max_tokens``). Pure."""

from __future__ import annotations

import json
from typing import Any

MAX_ATTEMPTS = 64  # cuts tried, from the end: each drops the last member that was being written


def partial_object(text: str) -> dict[str, Any] | None:
    """The object that the longest readable start of ``text`` closes into, or None.

    The whole text is closed first (an open string and open brackets); where that is not JSON
    (the cut came inside a key, after a colon, in ``tru``), the text is cut back before its
    last comma and closed again, member by member; ``{`` alone gives ``{}``."""
    start = text.find("{")
    if start < 0:
        return None
    text = text[start:]
    ends = [len(text)]
    at = len(text)
    while len(ends) < MAX_ATTEMPTS:
        at = text.rfind(",", 0, at)
        if at <= 0:
            break
        ends.append(at)
    ends.append(1)
    for end in ends:
        closed = _closed(text[:end])
        try:
            value = json.loads(closed)
        except (ValueError, RecursionError):
            continue
        if isinstance(value, dict):
            return value
    return None


def _closed(prefix: str) -> str:
    """``prefix`` with its open string and brackets closed."""
    stack: list[str] = []
    in_string = escaped = False
    for ch in prefix:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "{[":
            stack.append("}" if ch == "{" else "]")
        elif ch in "}]" and stack:
            stack.pop()
    if escaped:  # a cut right after a backslash: the escape it began is dropped
        prefix = prefix[:-1]
    return prefix + ('"' if in_string else "") + "".join(reversed(stack))
