"""Response ids that say which model made them: ``resp_<tag>_<random>``, the tag a short hash of
the served model's name. Stored responses live in the worker that made them, so the gateway
sends a retrieve, a delete or a ``previous_response_id`` to the model the tag names. The random
part is the server's own, 128 bits from the system's source: never a client's header, never the
request's id (which ``/v1/status`` and the logs show), so an id cannot be guessed or chosen."""

from __future__ import annotations

import hashlib
import secrets

PREFIX = "resp_"


def response_tag(served_name: str) -> str:
    return hashlib.sha256(served_name.encode()).hexdigest()[:8]


def id_prefix(served_name: str) -> str:
    """What ``served_name``'s response ids start with."""
    return f"{PREFIX}{response_tag(served_name)}_"


def response_id(served_name: str) -> str:
    """A new id for one of ``served_name``'s responses."""
    return id_prefix(served_name) + secrets.token_hex(16)


def tag_of(response_id: str) -> str | None:
    """The tag of an id made here, or None."""
    if not response_id.startswith(PREFIX):
        return None
    tag, sep, rest = response_id[len(PREFIX) :].partition("_")
    return tag if sep and len(tag) == 8 and rest else None
