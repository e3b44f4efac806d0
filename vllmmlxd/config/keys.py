"""The ``api_keys`` section: named keys (kept only as SHA-256 digests), their scopes and limits,
and the grant each model entry gets of them."""

from __future__ import annotations

import fnmatch
import hashlib
import re
from typing import Any

from pydantic import Field, SecretStr, field_validator, model_validator

from ..usage import Budget
from .base import Strict as _Strict
from .fields import Names, Rate

SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
DIGEST_PREFIX = "sha256:"  # an api_key held as its digest: what the daemon and workers keep


def key_digest(key: str) -> str:
    """The hex SHA-256 of a key: the only form of a key kept after the config is read."""
    return hashlib.sha256(key.encode()).hexdigest()


class KeyBudget(_Strict):
    """``api_keys.NAME.budget``: what the key may use in a day or a month, across every model
    and worker (the daemon machine's local calendar); 0: no limit of that kind."""

    tokens_per_day: int = Field(0, ge=0, description="prompt and generated tokens a day; 0: no limit")
    tokens_per_month: int = Field(0, ge=0, description="prompt and generated tokens a month; 0: no limit")
    requests_per_day: int = Field(0, ge=0, description="requests a day; 0: no limit")

    def plain(self) -> Budget:
        return Budget(self.tokens_per_day, self.tokens_per_month, self.requests_per_day)


class KeyGrant(_Strict):
    """One named key as a model's worker knows it: its digest, whether it may use this model,
    and its own limits. Filled in from the top-level ``api_keys`` section, never by hand."""

    name: str
    sha256: str = Field(pattern=SHA256_RE.pattern, repr=False)
    allowed: bool
    rate_limit: int | str = 0
    tokens_per_minute: int = Field(0, ge=0)
    mcp: tuple[str, ...] | None = None  # the MCP servers this key may use here; None: all of the entry's
    budget: KeyBudget = KeyBudget()  # the key's budget, counted across every model and worker


class ApiKeyConfig(_Strict):
    """A named key of the ``api_keys`` section: the key (or its digest), the models it may use, its limits."""

    key: SecretStr | None = Field(None, description="the key itself: literal, ${env:NAME} or ${file:/path}")
    key_sha256: str | None = Field(None, repr=False, description="the key's SHA-256 in hex, instead of the key")
    models: Names = Field(("*",), description="entry names (shell patterns) this key may use")
    rate_limit: Rate = Field(0, description="this key's requests per minute, or text like '5/second'")
    tokens_per_minute: int = Field(0, ge=0, description="generated tokens per minute for this key; 0: no limit")
    mcp: Names | None = Field(None, description="MCP servers (names) this key may use; unset: all of a model's")
    budget: KeyBudget = Field(default_factory=KeyBudget, description="tokens and requests a day or month")

    @model_validator(mode="before")
    @classmethod
    def _digest_only(cls, data: Any) -> Any:
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
    def _hex_digest(cls, v: str | None) -> str | None:
        if v is not None and not SHA256_RE.match(v.lower()):
            raise ValueError("key_sha256 must be 64 hex digits (sha256sum of the key)")
        return v.lower() if v else v

    @model_validator(mode="after")
    def _has_a_key(self) -> ApiKeyConfig:
        if self.key_sha256 is None:
            raise ValueError("give the key as key (literal, ${env:NAME} or ${file:/path}) or key_sha256")
        return self

    def may_use(self, entry: str) -> bool:
        return any(fnmatch.fnmatchcase(entry, pattern) for pattern in self.models)
