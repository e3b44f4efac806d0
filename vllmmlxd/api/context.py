"""What every API route of a worker needs: the engine, the model's config, its names, ids."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from starlette.requests import Request

from ..config.schema import ModelConfig
from ..engine.types import Engine
from ..errors import ModelNotFound
from ..http.request_id import new_request_id


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

    def names(self) -> set[str]:
        return {"default", self.name, self.key, *self.config.aliases}

    def check_model(self, requested: str | None) -> None:
        """One model per port: any name is answered as this model (agents send their own names),
        unless the entry sets ``strict_model_name``; then only ``default``, the served name, the
        key and the aliases are."""
        if not requested or not self.config.strict_model_name or requested in self.names():
            return
        raise ModelNotFound(f"model {requested!r} is not served here; this server serves {self.name!r}")

    @staticmethod
    def request_id(request: Request, prefix: str) -> str:
        """This request's id (the client's ``x-request-id``, else a new one with the family's prefix),
        also used for the body's id, the engine's request and the ``x-request-id`` header."""
        rid = getattr(request.state, "client_request_id", None) or new_request_id(prefix)
        request.state.request_id = rid
        return rid
