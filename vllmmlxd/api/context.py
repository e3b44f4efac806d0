"""What every API route of a worker needs: the engine, the model's config, its names, ids.

A worker's settings change while it runs (``POST /internal/settings`` from the daemon), so
routes never keep a ``ServingContext``: ``LiveContext`` holds the current one, swapped whole,
and each request takes it once at its start (``capture``). A request therefore runs to its
end under the settings it started with, and never sees half of an update.
"""

from __future__ import annotations

import dataclasses
import re
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from starlette.requests import Request

from ..config.schema import ResolvedModel
from ..engine.embeddings.embedding_types import Embedder
from ..engine.types import Engine, Usage
from ..errors import ModelNotFound
from ..http.access import Access
from ..http.ratelimit import Quotas, RateStore
from ..http.request_id import new_request_id
from ..http.tracing import TRACING
from .image_budget import PixelBudget

if TYPE_CHECKING:
    from ..mcp.hub import McpHub


def shown_source(source: str) -> str:
    """Where a model came from, as a client may be told it: a hub id or a builtin as written, a
    folder by its name (the store's ``hub-ORG--NAME`` as ``ORG/NAME``), never the operator's path."""
    if "/" not in source.replace("\\", "/") or (not source.startswith(("/", "~", ".")) and source.count("/") == 1):
        return source  # builtin:NAME, org/name, a GGUF file's name
    name = source.replace("\\", "/").rstrip("/").rsplit("/", 1)[-1]
    if name.startswith("hub-") and "--" in name:
        return name[len("hub-") :].replace("--", "/", 1)
    builtin = re.fullmatch(r"builtin-(.+)-v\d+", name)
    return f"builtin:{builtin.group(1)}" if builtin else name


def owner_of(request: Request) -> str | None:
    """Whose a request's data is (its stored responses, its progress in /v1/status): the key it
    authenticated with, None on an open entry."""
    caller = getattr(request.state, "caller", None)
    return caller.key_name if caller is not None else None


@dataclass
class ServingContext:
    engine: Engine
    config: ResolvedModel
    key: str  # the config entry's name
    runtime: dict = field(default_factory=dict)  # BLAS, threads and cores of this process
    started: float = field(default_factory=time.time)
    access: Access | None = None  # who may call (built from config by LiveContext)
    quotas: Quotas | None = None  # request and token limits (likewise)
    embedder: Embedder | None = None  # the entry's embedding model (/v1/embeddings), if it has one
    mcp: McpHub | None = None  # the worker's MCP clients: one hub for its life, reconfigured on swaps
    pixels: PixelBudget | None = None  # decoded image pixels the worker holds at once (vision models)

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

    def charge(self, request: Request, usage: Usage) -> None:
        """Count a finished request's generated tokens against its caller's token limits."""
        caller = getattr(request.state, "caller", None)
        if caller is not None and self.quotas is not None:
            self.quotas.charge(caller, usage.completion_tokens)

    @staticmethod
    def request_id(request: Request, prefix: str) -> str:
        """This request's id (the client's ``x-request-id``, else a new one with the family's prefix),
        also used for the body's id, the engine's request and the ``x-request-id`` header."""
        rid = getattr(request.state, "client_request_id", None) or new_request_id(prefix)
        request.state.request_id = rid
        return rid


class LiveContext:
    """The worker's current ``ServingContext``, replaced whole by ``swap``."""

    def __init__(
        self,
        engine: Engine,
        config: ResolvedModel,
        key: str,
        runtime: dict | None = None,
        embedder: Embedder | None = None,
        mcp: McpHub | None = None,
    ):
        # One store of rate windows for the worker's life: an unchanged limit keeps its budget
        # across settings pushes, a changed one starts fresh.
        self.rates = RateStore()
        self.pixels = PixelBudget(config.image_pixel_budget)  # one budget for the worker's life, resized on swaps
        self._ctx = ServingContext(
            engine=engine,
            config=config,
            key=key,
            runtime=runtime or {},
            access=Access(config),
            quotas=Quotas(config, self.rates),
            embedder=embedder,
            mcp=mcp,
            pixels=self.pixels,
        )

    @property
    def current(self) -> ServingContext:
        return self._ctx

    def swap(self, config: ResolvedModel) -> ServingContext:
        """Serve new requests under ``config``; requests already running keep theirs."""
        TRACING.configure(config.telemetry)  # a changed telemetry section: spans go where it says now
        self.pixels.capacity = config.image_pixel_budget
        self.pixels.give(0)  # a larger budget lets waiting requests on
        # One attribute assignment on the event loop: a request sees the old context or the new one.
        self._ctx = dataclasses.replace(
            self._ctx, config=config, access=Access(config), quotas=Quotas(config, self.rates)
        )
        if self._ctx.mcp is not None:  # only servers whose definitions changed reconnect
            self._ctx.mcp.reconfigure(config.mcp_servers_resolved)
        return self._ctx

    def capture(self, request: Request) -> ServingContext:
        """This request's context: taken at its first call, the same one for the rest of it."""
        ctx = getattr(request.state, "ctx", None)
        if ctx is None:
            ctx = request.state.ctx = self._ctx
        return ctx
