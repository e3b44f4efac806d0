"""Response ids that say which model made them: ``resp_<tag>_<random>``, the tag a short hash of
the served model's name. Stored responses live in the worker that made them, so the gateway
sends a retrieve, a delete or a ``previous_response_id`` to the model the tag names. Pure."""

from __future__ import annotations

import hashlib
import uuid

PREFIX = "resp_"


def response_tag(served_name: str) -> str:
    return hashlib.sha256(served_name.encode()).hexdigest()[:8]


def id_prefix(served_name: str) -> str:
    """What ``served_name``'s response ids start with."""
    return f"{PREFIX}{response_tag(served_name)}_"


def response_id(served_name: str, request_id: str | None = None) -> str:
    """The id of ``served_name``'s response served under ``request_id``: the request id itself when
    it is one of ours (no client ``x-request-id``), else one made from it; a new one without."""
    prefix = id_prefix(served_name)
    if request_id and request_id.startswith(prefix):
        return request_id
    body = hashlib.sha256(request_id.encode()).hexdigest()[:32] if request_id else uuid.uuid4().hex
    return prefix + body


def tag_of(response_id: str) -> str | None:
    """The tag of an id made here, or None."""
    if not response_id.startswith(PREFIX):
        return None
    tag, sep, rest = response_id[len(PREFIX) :].partition("_")
    return tag if sep and len(tag) == 8 and rest else None
