"""The field types the config's sections share, each with its validator written once.

Messages name the key and what it accepts, never the value given: a value may come from
``${file:..}`` or ``${env:..}`` and be a secret written under the wrong key.
"""

from __future__ import annotations

import ipaddress
from typing import Annotated

from pydantic import AfterValidator, BeforeValidator, Field, ValidationInfo

from .names import BUILTIN_MODELS, BUILTIN_PREFIX


def one_is_a_list(value: object) -> object:
    """A single name written where a list goes (``aliases: x``) is a list of one."""
    return (value,) if isinstance(value, str) else value


def check_rate(value: int | str) -> int | str:
    """A rate limit: an int (requests per minute; 0: none) or ``limits`` text such as
    ``"60/minute"`` or ``"5/second;1000/day"``."""
    if isinstance(value, bool) or (isinstance(value, int) and value < 0):
        raise ValueError("a rate limit is a count per minute (0: none) or text like '60/minute'")
    if isinstance(value, str):
        from limits import parse_many  # only when a config says so: vllmmlxctl stays light

        try:
            items = parse_many(value)
        except ValueError:
            items = []
        if not items or any(item.amount < 1 for item in items):
            raise ValueError(
                "a rate limit is a count per minute or text like '60/minute', '5/second' or '10/second;1000/hour'"
            )
    return value


def known_builtin(spec: str) -> str:
    """A model spec; a ``builtin:NAME`` must name one of the builtins."""
    # Refused here rather than at load: `vllmmlxctl check` and a reload see it before a worker starts.
    if spec.startswith(BUILTIN_PREFIX) and spec[len(BUILTIN_PREFIX) :] not in BUILTIN_MODELS:
        known = ", ".join(BUILTIN_PREFIX + n for n in BUILTIN_MODELS)
        raise ValueError(f"unknown builtin model; the builtins are {known}")
    return spec


def ip_networks(value: tuple[str, ...], info: ValidationInfo) -> tuple[str, ...]:
    """Addresses or networks (``10.0.0.0/8``), each refused by its place in the list."""
    for i, net in enumerate(value):
        try:
            ipaddress.ip_network(net, strict=False)
        except ValueError:
            raise ValueError(f"{info.field_name}[{i}] is not an IP address or network") from None
    return value


def one_of(names: tuple[str, ...]) -> AfterValidator:
    """A name from ``names``, refused naming the key and the names it takes."""

    def check(value: str, info: ValidationInfo) -> str:
        if value not in names:
            raise ValueError(f"{info.field_name} must be one of {', '.join(names)}")
        return value

    return AfterValidator(check)


# A name, or a list of names: `aliases: x` is `aliases: [x]`.
Names = Annotated[tuple[str, ...], BeforeValidator(one_is_a_list)]
# Proxies and networks: each must parse as an address or a network.
Networks = Annotated[Names, AfterValidator(ip_networks)]
# Requests per minute, or text like '120/minute'; 0: none.
Rate = Annotated[int | str, AfterValidator(check_rate)]
# builtin:NAME, a .gguf path, a local MLX folder or a Hugging Face repo id.
ModelSpec = Annotated[str, AfterValidator(known_builtin)]
Port = Annotated[int, Field(ge=1, le=65535)]
