"""The ``api_keys`` section: named keys (kept only as SHA-256 digests), their scopes and limits,
and the grant each model entry gets of them."""

from __future__ import annotations

import fnmatch
import hashlib
import re

from pydantic import Field, SecretStr, field_validator, model_validator

from .base import Strict as _Strict

SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
DIGEST_PREFIX = "sha256:"  # an api_key held as its digest: what the daemon and workers keep


def key_digest(key: str) -> str:
    """The hex SHA-256 of a key: the only form of a key kept after the config is read."""
    return hashlib.sha256(key.encode()).hexdigest()


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


class KeyGrant(_Strict):
    """One named key as a model's worker knows it: its digest, whether it may use this model,
    and its own limits. Filled in from the top-level ``api_keys`` section, never by hand."""

    name: str
    sha256: str = Field(pattern=SHA256_RE.pattern, repr=False)
    allowed: bool
    rate_limit: int | str = 0
    tokens_per_minute: int = Field(0, ge=0)
    mcp: tuple[str, ...] | None = None  # the MCP servers this key may use here; None: all of the entry's


class ApiKeyConfig(_Strict):
    """A named key of the ``api_keys`` section: the key (or its digest), the models it may use, its limits."""

    key: SecretStr | None = Field(None, description="the key itself: literal, ${env:NAME} or ${file:/path}")
    key_sha256: str | None = Field(None, repr=False, description="the key's SHA-256 in hex, instead of the key")
    models: tuple[str, ...] = Field(("*",), description="entry names (shell patterns) this key may use")
    rate_limit: int | str = Field(0, description="this key's requests per minute, or text like '5/second'")
    tokens_per_minute: int = Field(0, ge=0, description="generated tokens per minute for this key; 0: no limit")
    mcp: tuple[str, ...] | None = Field(
        None, description="MCP servers (names) this key may use; unset: all of a model's"
    )

    @model_validator(mode="before")
    @classmethod
    def _digest_only(cls, data):
        # Only the digest is kept: the key itself is dropped as soon as it is read.
        if isinstance(data, dict) and isinstance(data.get("key"), str):
            if data.get("key_sha256") is not None:
                raise ValueError("give either key or key_sha256, not both")
            if not data["key"]:
                raise ValueError("key is empty")
            data = {**data, "key": None, "key_sha256": key_digest(data["key"])}
        return data

    @field_validator("key_sha256")
    @classmethod
    def _hex_digest(cls, v):
        if v is not None and not SHA256_RE.match(v.lower()):
            raise ValueError("key_sha256 must be 64 hex digits (sha256sum of the key)")
        return v.lower() if v else v

    @field_validator("models", "mcp", mode="before")
    @classmethod
    def _one_model_is_a_list(cls, v):
        return (v,) if isinstance(v, str) else v

    @field_validator("rate_limit")
    @classmethod
    def _rate(cls, v):
        return check_rate(v)

    @model_validator(mode="after")
    def _has_a_key(self):
        if self.key_sha256 is None:
            raise ValueError("give the key as key (literal, ${env:NAME} or ${file:/path}) or key_sha256")
        return self

    def may_use(self, entry: str) -> bool:
        return any(fnmatch.fnmatchcase(entry, pattern) for pattern in self.models)
