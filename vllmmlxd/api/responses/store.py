"""Stored responses: what ``previous_response_id``, retrieve, delete and ``input_items`` read.

Kept in the worker's memory (a restart forgets them, as it forgets the prefix cache), bounded by
count and bytes (the entry's ``stored_responses`` and ``stored_responses_mb``), oldest first out. Each response belongs to the key that made it: another key
asking for it gets a 404, as for one that never existed. Written and read on the worker's event
loop only (the routes), so one writer and no lock.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

MAX_RESPONSES = 2048
MAX_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class Stored:
    owner: str | None  # the key's name (None: an open entry)
    response: dict[str, Any]
    input_items: list[dict[str, Any]]  # the whole conversation it answered: earlier turns first
    nbytes: int


class ResponseStore:
    def __init__(self, max_responses: int = MAX_RESPONSES, max_bytes: int = MAX_BYTES):
        self.max_responses, self.max_bytes = max_responses, max_bytes
        self._items: OrderedDict[str, Stored] = OrderedDict()
        self.nbytes = 0

    def __len__(self) -> int:
        return len(self._items)

    def bound(self, max_responses: int, max_bytes: int) -> None:
        """New bounds (the entry's, read live): what no longer fits goes now, oldest first."""
        self.max_responses, self.max_bytes = max_responses, max_bytes
        self._evict()

    def put(self, owner: str | None, response: dict[str, Any], input_items: list[dict[str, Any]]) -> bool:
        """Keep ``owner``'s response; False when it is not kept (too large, none kept, or its id
        is another owner's: a put never replaces what another key stored)."""
        size = len(json.dumps(response)) + len(json.dumps(input_items))
        if size > self.max_bytes or self.max_responses == 0:
            return False  # one conversation bigger than the whole store, or none kept
        held = self._items.get(response["id"])
        if held is not None and held.owner != owner:
            return False
        self.delete(owner, response["id"])
        self._items[response["id"]] = Stored(owner, response, input_items, size)
        self.nbytes += size
        self._evict()
        return True

    def _evict(self) -> None:
        while self._items and (len(self._items) > self.max_responses or self.nbytes > self.max_bytes):
            _, old = self._items.popitem(last=False)
            self.nbytes -= old.nbytes

    def get(self, owner: str | None, rid: str) -> Stored | None:
        found = self._items.get(rid)
        return found if found is not None and found.owner == owner else None

    def delete(self, owner: str | None, rid: str) -> bool:
        found = self.get(owner, rid)
        if found is None:
            return False
        del self._items[rid]
        self.nbytes -= found.nbytes
        return True


def as_input(item: dict[str, Any]) -> dict[str, Any] | None:
    """An output item of an earlier response as the next turn's input item (None: nothing to send)."""
    kind = item.get("type")
    if kind == "message":
        text = "".join(p.get("text", "") for p in item.get("content") or [] if p.get("type") == "output_text")
        return {"type": "message", "role": "assistant", "content": text}
    if kind == "function_call":
        return {k: item[k] for k in ("type", "call_id", "name", "arguments", "namespace") if k in item}
    if kind == "mcp_call":  # a tool the worker ran: the model saw its result as text
        shown = item.get("output") if item.get("output") is not None else f"Error: {item.get('error')}"
        return {"type": "message", "role": "assistant", "content": f"[{item.get('name')}] {shown}"}
    return None  # reasoning: templates drop earlier thinking


def with_ids(rid: str, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Input items as ``input_items`` lists them: each with an id (its own, or one made from its
    place), a message's content as parts (a string is one text part)."""
    return [{**_listed(item), "id": item.get("id") or f"in_{rid[5:]}_{i}"} for i, item in enumerate(items)]


def _listed(item: dict[str, Any]) -> dict[str, Any]:
    if item.get("type", "message" if "role" in item else None) != "message":
        return item
    content = item.get("content")
    if isinstance(content, str):
        kind = "output_text" if item.get("role") == "assistant" else "input_text"
        content = [{"type": kind, "text": content}]
    return {**item, "type": "message", "content": content, "status": item.get("status", "completed")}
