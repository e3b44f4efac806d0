"""A request's ``chat_template_kwargs``, checked: switches the model's template reads, with
plain scalar values. Anything else is a 400 naming it (see ``engine/text/template_vars.py``). Pure."""

from __future__ import annotations

import math

from ..errors import InvalidRequest

MAX_STRING = 1024
MAX_INT = 2**31


def checked_template_kwargs(kwargs: object, switches: frozenset[str]) -> dict:
    """``kwargs`` if every key is one of ``switches`` and every value a small scalar."""
    if kwargs is None:
        return {}
    if not isinstance(kwargs, dict):
        raise InvalidRequest("chat_template_kwargs must be an object", param="chat_template_kwargs")
    for key, value in kwargs.items():
        param = f"chat_template_kwargs.{str(key)[:64]}"
        if key not in switches:
            known = ", ".join(sorted(switches)) or "none"
            raise InvalidRequest(
                f"{str(key)[:64]!r} is not a switch of this model's chat template (it reads: {known})", param=param
            )
        if not _scalar(value):
            raise InvalidRequest("chat template switches take a boolean, a number or a short string", param=param)
    return dict(kwargs)


def _scalar(value: object) -> bool:
    if value is None or isinstance(value, bool):
        return True
    if isinstance(value, int):
        return abs(value) <= MAX_INT
    if isinstance(value, float):
        return math.isfinite(value)
    return isinstance(value, str) and len(value) <= MAX_STRING
