"""What every API route of a worker needs: the engine, the model's config, its names, ids.

A worker's settings change while it runs (``POST /internal/settings`` from the daemon), so
routes never keep a ``ServingContext``: ``LiveContext`` holds the current one, swapped whole,
and each request takes it once at its start (``capture``). A request therefore runs to its
end under the settings it started with, and never sees half of an update.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field

from starlette.requests import Request

from ..config.schema import ModelConfig
from ..engine.types import Engine
from ..errors import ModelNotFound
from ..http.ratelimit import RateLimiter
from ..http.request_id import new_request_id


@dataclass
class ServingContext:
    engine: Engine
    config: ModelConfig
    key: str  # the config entry's name
    runtime: dict = field(default_factory=dict)  # BLAS, threads and cores of this process
    started: float = field(default_factory=time.time)
    limiter: RateLimiter | None = None  # config.rate_limit's limiter; None: no limit

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


def _limiter_for(config: ModelConfig, previous: RateLimiter | None) -> RateLimiter | None:
    # An unchanged limit keeps its limiter, so a settings push does not hand out fresh budgets.
    if config.rate_limit <= 0:
        return None
    if previous is not None and previous.per_minute == config.rate_limit:
        return previous
    return RateLimiter(config.rate_limit)


class LiveContext:
    """The worker's current ``ServingContext``, replaced whole by ``swap``."""

    def __init__(self, engine: Engine, config: ModelConfig, key: str, runtime: dict | None = None):
        self._ctx = ServingContext(engine=engine, config=config, key=key, runtime=runtime or {},
                                   limiter=_limiter_for(config, None))

    @property
    def current(self) -> ServingContext:
        return self._ctx

    def swap(self, config: ModelConfig) -> ServingContext:
        """Serve new requests under ``config``; requests already running keep theirs."""
        # One attribute assignment on the event loop: a request sees the old context or the new one.
        self._ctx = dataclasses.replace(self._ctx, config=config, limiter=_limiter_for(config, self._ctx.limiter))
        return self._ctx

    def capture(self, request: Request) -> ServingContext:
        """This request's context: taken at its first call, the same one for the rest of it."""
        ctx = getattr(request.state, "ctx", None)
        if ctx is None:
            ctx = request.state.ctx = self._ctx
        return ctx
