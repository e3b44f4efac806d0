"""What every API route of a worker needs: the engine, the model's config, its names."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from starlette.requests import Request

from ..config.schema import ModelConfig
from ..engine.types import Engine
from ..errors import ModelNotFound, Unauthorized
from ..http.auth import key_matches, presented_key


@dataclass
class ServingContext:
    engine: Engine
    config: ModelConfig
    key: str  # the config entry's name
    runtime: dict = field(default_factory=dict)  # BLAS, threads and cores of this process
    started: float = field(default_factory=time.time)

    @property
    def name(self) -> str:
        """The model name clients see."""
        return self.config.display_name(self.key)

    @property
    def max_body_bytes(self) -> int:
        return int(self.config.max_body_mb * 1024 * 1024)

    def check_model(self, requested: str | None) -> None:
        """The ``model`` field is optional; ``default``, the served name, the key and aliases all match."""
        if not requested:
            return
        if requested in {"default", self.name, self.key, *self.config.aliases}:
            return
        raise ModelNotFound(f"model {requested!r} is not served here; this server serves {self.name!r}")

    def check_api_key(self, request: Request) -> None:
        """Bearer token or ``x-api-key``, compared in constant time."""
        expected = self.config.api_key
        if expected is not None and not key_matches(presented_key(request), expected):
            raise Unauthorized("missing or invalid API key", code="invalid_api_key")
