"""Ollama's API on the gateway's own listener (``gateway.ollama_port``, 11434 being Ollama's).

The listener is a second socket of the same server (``ListenerSplit`` sends its connections to
this app), so it drains, bounds connections and restarts with the gateway. Its paths are
Ollama's own; each request is routed as the OpenAI and Anthropic ones are (names, aliases, a
``:latest`` tag, lazy loads, upstreams, replica sets, keys: ``dispatch.Gateway``) and forwarded
to the worker's Ollama routes under ``/ollama/api/...`` (``api/ollama/routes.py``), which run
the shared chat pipeline. A lazy model is loaded before the answer's head (Ollama's clients read
NDJSON, where the SSE comments the other families wait with would be garbage).

What the routing table knows is answered here: ``GET /api/tags`` (the models the caller's key
may use), ``GET /api/version``, ``GET``/``HEAD /``. ``GET /api/ps`` asks each loaded model's
worker for its line (its size, and when its idle time runs out). Every error on this listener
is Ollama's ``{"error": "..."}`` (``http.error_shapes.ErrorFamily``).

Model pulls, deletes and copies (``STORE_PATHS``) are the model store's: until it is there they
are a 501 that says how models are served here.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

import httpcore
from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route as HttpRoute
from starlette.types import ASGIApp, Receive, Scope, Send

from ..api.errors import install_error_handlers
from ..api.ollama.describe import OLLAMA_VERSION, tag_entry
from ..api.ollama.encode import created_at
from ..config.gateway import Route
from ..errors import ModelNotFound, NotServed, RequestError
from ..http.access import presented_key
from ..http.browser import BrowserDefences
from ..http.error_shapes import ErrorFamily
from ..http.request_id import RequestIdMiddleware
from ..log import log_event
from .cluster import require_some_route
from .dispatch import Gateway, parse_object
from .proxy import close_quietly
from .routing import SERVING_STATES, ReplicaSet, Table, Target

logger = logging.getLogger("vllmmlxd.gateway")

WORKER_PREFIX = "/ollama"  # where a worker serves Ollama's paths (api/ollama/routes.py: PREFIX)
# Ollama's model endpoints routed by the body's model; True: an embedding model's own name routes too.
ROUTED = {"/api/chat": False, "/api/generate": False, "/api/embed": True, "/api/embeddings": True, "/api/show": True}
# The model store's endpoints (pull, delete, copy, create, push): the seam for it. Each is answered by
# ``store_endpoint`` until the store serves them through the daemon's control API.
STORE_PATHS = {
    "/api/pull": "POST",
    "/api/push": "POST",
    "/api/create": "POST",
    "/api/copy": "POST",
    "/api/delete": "DELETE",
}
TAG = ":latest"  # Ollama's default tag: "tiny:latest" is "tiny"
PS_TIMEOUT_S = 5.0  # a worker's ps line is a small answer from memory; one that is slow is left out


def requested_model(data: dict) -> object:
    """The model a body names: ``model``, or ``name`` (older clients' show, pull and delete)."""
    model = data.get("model")
    return data.get("name") if model is None else model


def resolve(table: Table, model: object, embeddings: bool, key: str | None) -> tuple[Target, str | None]:
    """The route for ``model`` (a ``:latest`` tag dropped when the bare name is known) and the name to
    send the worker when it is not the one the client gave; 404 in Ollama's words when unknown."""
    if isinstance(model, str) and model.endswith(TAG) and table.lookup(model, embeddings) is None:
        bare = model[: -len(TAG)]
        if table.lookup(bare, embeddings) is not None:
            return table.resolve(bare, embeddings, key), bare
    try:
        return table.resolve(model, embeddings, key), None
    except ModelNotFound:
        shown = ", ".join(table.names(embeddings, key)) or "none"
        raise ModelNotFound(f"model {json.dumps(model)} not found; available models: {shown}") from None


def tags(routes: list[Route], sets: list[ReplicaSet], started: float) -> dict:
    """``/api/tags``: every model the caller may use, by the name it serves under, an embedding model
    and a replica set's name too. Pure."""
    when = created_at(started)
    names: list[tuple[str, str]] = []
    for route in routes:
        names.append((route.served_model_name, ""))
        if route.embedding_model:
            names.append((route.embedding_model, "bert"))
    names += [(s.name, "") for s in sets]
    return {"models": [tag_entry(n, when, family=family) for n, family in dict(names).items()]}


class ListenerSplit:
    """ASGI middleware: connections to the Ollama listener's port go to the Ollama app, the rest on."""

    def __init__(self, app: ASGIApp, ollama: ASGIApp, port: int):
        self.app, self.ollama, self.port = app, ollama, port

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        server = scope.get("server")
        if scope["type"] == "http" and server is not None and server[1] == self.port:
            await self.ollama(scope, receive, send)
            return
        await self.app(scope, receive, send)


def create_ollama_app(gateway: Gateway) -> FastAPI:
    """The Ollama listener's app."""
    app = FastAPI(title="vllmmlxd gateway (Ollama)", docs_url=None, redoc_url=None, openapi_url=None)
    install_error_handlers(app)

    def routed(path: str, embeddings: bool):
        async def endpoint(request: Request) -> Response:
            raw = await gateway.read_body(request)
            data = parse_object(raw)
            table = gateway.table
            target, rename = resolve(table, requested_model(data), embeddings, presented_key(request))
            if rename is not None:
                data = {**data, "model": rename}
                raw = json.dumps(data).encode()
            table.access_of(target).identify(request)
            return await gateway.dispatch(request, target, WORKER_PREFIX + path, data, raw, sse=False)

        return endpoint

    for path, embeddings in ROUTED.items():
        app.router.routes.append(HttpRoute(path, routed(path, embeddings), methods=["POST"]))

    async def store_endpoint(request: Request) -> Response:
        raise NotServed(
            f"{request.url.path} is not served yet: vllmmlxd serves the models its config names "
            "(add an entry, then vllmmlxctl reload)"
        )

    for path, method in STORE_PATHS.items():
        app.router.routes.append(HttpRoute(path, store_endpoint, methods=[method]))

    @app.get("/api/tags")
    async def list_tags(request: Request):
        table, key = gateway.table, presented_key(request)
        return tags(require_some_route(table, key), table.visible_sets(key), gateway.started)

    @app.get("/api/ps")
    async def ps(request: Request):
        table, key = gateway.table, presented_key(request)
        loaded = [r for r in require_some_route(table, key) if r.kind == "local" and r.state in SERVING_STATES]
        lines = await asyncio.gather(*(_ps_lines(gateway, request, r) for r in loaded))
        return {"models": [line for found in lines for line in found]}

    @app.get("/api/version")
    async def version():
        return {"version": OLLAMA_VERSION}

    @app.api_route("/", methods=["GET", "HEAD"])
    async def running():
        return PlainTextResponse("Ollama is running")

    app.add_middleware(BrowserDefences, config=lambda: gateway.table.spec.gateway)
    app.add_middleware(ErrorFamily, family="ollama")  # every path here is Ollama's, /api/chat included
    app.add_middleware(RequestIdMiddleware)  # outermost: every response, errors included, gets its id
    return app


async def _ps_lines(gateway: Gateway, request: Request, route: Route) -> list[dict]:
    """A loaded model's line of ``/api/ps``, from its worker (nothing when it does not answer in time)."""
    started = time.monotonic()
    try:
        async with asyncio.timeout(PS_TIMEOUT_S):
            upstream = await gateway.open(request, route, WORKER_PREFIX + "/api/ps", b"", retry=False)
            try:
                body = await upstream.aread() if upstream.status_code == 200 else b""
            finally:
                await close_quietly(upstream)
        found = json.loads(body).get("models") if body else None
    except (TimeoutError, RequestError, httpcore.NetworkError, ValueError, AttributeError) as exc:
        log_event(logger, "gateway.ps_skipped", logging.DEBUG, route=route.name, error=type(exc).__name__)
        return []
    log_event(logger, "gateway.ps", logging.DEBUG, route=route.name, ms=round((time.monotonic() - started) * 1000, 1))
    # The worker names itself by its served name: the one the gateway lists.
    return [{**line, "name": route.served_model_name, "model": route.served_model_name} for line in found or ()]
