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

``POST /api/pull`` and ``DELETE /api/delete`` drive the daemon's model store through its control
socket (``DaemonClient``), as a lazy load does: a pull is started or joined there and its statuses
become Ollama's progress lines (``ollama_store.py`` decides, pure). ``/api/copy``, ``/api/create``
and ``/api/push`` are refused saying why (``REFUSED``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpcore
import httpx
from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route as HttpRoute
from starlette.types import ASGIApp, Receive, Scope, Send

from ..api.errors import install_error_handlers
from ..api.ollama.describe import OLLAMA_VERSION, tag_entry
from ..api.ollama.encode import created_at
from ..config.gateway import Route
from ..errors import Conflict, InvalidRequest, ModelNotFound, NotFound, NotServed, RequestError
from ..http.access import presented_key
from ..http.browser import BrowserDefences
from ..http.error_shapes import ErrorFamily
from ..http.request_id import RequestIdMiddleware
from ..log import log_event
from ..store.pulls import ENDED
from .cluster import require_some_route
from .dispatch import Gateway, Unavailable, parse_object
from .lazy import error_text
from .ollama_store import (
    PullAsk,
    ended_error,
    lost,
    progress_line,
    progress_lines,
    pull_ask,
    require_store_rights,
    served_name,
    store_name,
)
from .proxy import close_quietly
from .routing import SERVING_STATES, ReplicaSet, Table, Target

logger = logging.getLogger("vllmmlxd.gateway")

WORKER_PREFIX = "/ollama"  # where a worker serves Ollama's paths (api/ollama/routes.py: PREFIX)
# Ollama's model endpoints routed by the body's model; True: an embedding model's own name routes too.
ROUTED = {"/api/chat": False, "/api/generate": False, "/api/embed": True, "/api/embeddings": True, "/api/show": True}
# Ollama's model-store endpoints beside pull and delete (which drive the store): refused, saying why.
REFUSED = {
    "/api/copy": (
        "models are named by the config: a copy under a new name is an alias "
        "(aliases: [NEW] on the entry, then vllmmlxctl reload)"
    ),
    "/api/create": (
        "vllmmlxd makes no models: pull an MLX folder (/api/pull, vllmmlxctl pull) or name a folder or a "
        ".gguf file as an entry's model, with its defaults in the entry"
    ),
    "/api/push": "vllmmlxd does not publish models: push to the Hugging Face hub with its own tools",
}
NDJSON = "application/x-ndjson"
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


def create_ollama_app(gateway: Gateway) -> FastAPI:  # noqa: C901 - a factory: its count is the routes it defines, each simple
    """The Ollama listener's app."""
    app = FastAPI(title="vllmmlxd gateway (Ollama)", docs_url=None, redoc_url=None, openapi_url=None)
    install_error_handlers(app)

    def routed(path: str, embeddings: bool) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            raw = await gateway.read_body(request)
            data = parse_object(raw)
            table = gateway.table
            target, rename = resolve(table, requested_model(data), embeddings, presented_key(request))
            if rename is not None:
                data = {**data, "model": rename}
                raw = json.dumps(data).encode()
            gateway.admit(request, target)
            return await gateway.dispatch(request, target, WORKER_PREFIX + path, data, raw, sse=False)

        return endpoint

    for path, embeddings in ROUTED.items():
        app.router.routes.append(HttpRoute(path, routed(path, embeddings), methods=["POST"]))

    async def refused(request: Request) -> Response:
        raise NotServed(f"{request.url.path} is not served: {REFUSED[request.url.path]}")

    for path in REFUSED:
        app.router.routes.append(HttpRoute(path, refused, methods=["POST"]))

    @app.post("/api/pull")
    async def pull(request: Request) -> Response:
        data = parse_object(await gateway.read_body(request))
        table, key, name = gateway.table, presented_key(request), requested_model(data)
        served = served_name(name)
        target = table.lookup(served) if served is not None else None
        if target is not None and table.may_use(target, key):
            # Nothing to download: the config serves it. Said as a finished pull, for clients that pull first.
            lines = [{"status": f"{served} is served here (an entry of the config)"}, {"status": "success"}]
            return _answer(lines, data.get("stream") is not False)
        require_store_rights(table, key, "pulling a model")
        ask = pull_ask(name)
        started = await _start_pull(gateway, ask)
        log_event(logger, "gateway.pull", id=started.get("id"), repo=started.get("repo"), revision=ask.revision)
        if data.get("stream") is False:
            return JSONResponse(await _pull_end(gateway, started))
        return StreamingResponse(_pull_lines(gateway, started), media_type=NDJSON)

    @app.delete("/api/delete")
    async def delete(request: Request) -> Response:
        data = parse_object(await gateway.read_body(request))
        table, key = gateway.table, presented_key(request)
        require_store_rights(table, key, "deleting a model")
        name = store_name(requested_model(data))
        try:
            answer = await gateway.daemon.remove_model(name)
        except httpx.HTTPError as exc:
            raise _unreached(exc) from None
        if answer.status_code == 200:
            log_event(logger, "gateway.model_deleted", name=name)  # model= is each line's process (setup_logging)
            return JSONResponse({"status": "success", "message": _message(answer)})
        why = error_text(answer)
        if answer.status_code == 404:
            if table.lookup(name) is not None:
                why = (
                    f"{name} is a model of the config, not a download: remove its entry and vllmmlxctl reload; "
                    "/api/delete removes a downloaded model (org/name, as vllmmlxctl models lists it)"
                )
            raise NotFound(why, code="model_not_found")
        if answer.status_code == 409:
            raise Conflict(why)
        raise Unavailable(f"the daemon did not delete {name}: {why}", code="daemon_unavailable")

    # response_model=None: a dict is sent as built, not validated against the return annotation.
    @app.get("/api/tags", response_model=None)
    async def list_tags(request: Request) -> dict[str, Any]:
        table, key = gateway.table, presented_key(request)
        return tags(require_some_route(table, key), table.visible_sets(key), gateway.started)

    @app.get("/api/ps", response_model=None)
    async def ps(request: Request) -> dict[str, Any]:
        table, key = gateway.table, presented_key(request)
        loaded = [r for r in require_some_route(table, key) if r.kind == "local" and r.state in SERVING_STATES]
        lines = await asyncio.gather(*(_ps_lines(gateway, request, r) for r in loaded))
        return {"models": [line for found in lines for line in found]}

    @app.get("/api/version", response_model=None)
    async def version() -> dict[str, Any]:
        return {"version": OLLAMA_VERSION}

    @app.api_route("/", methods=["GET", "HEAD"])
    async def running() -> Response:
        return PlainTextResponse("Ollama is running")

    app.add_middleware(BrowserDefences, config=lambda: gateway.table.spec.gateway)
    app.add_middleware(ErrorFamily, family="ollama")  # every path here is Ollama's, /api/chat included
    app.add_middleware(RequestIdMiddleware)  # outermost: every response, errors included, gets its id
    return app


def _answer(lines: list[dict], stream: bool) -> Response:
    """Lines already known: streamed as NDJSON, or the last one alone (``stream: false``)."""
    if not stream:
        return JSONResponse(lines[-1])
    return Response(b"".join(_line(line) for line in lines), media_type=NDJSON)


def _message(answer: httpx.Response) -> str | None:
    try:
        body = answer.json()
    except ValueError:
        return None
    return body.get("message") if isinstance(body, dict) else None


def _line(line: dict) -> bytes:
    return json.dumps(line).encode() + b"\n"


def _unreached(exc: Exception) -> Unavailable:
    return Unavailable(f"the daemon cannot be reached: {type(exc).__name__}", code="daemon_unavailable")


async def _start_pull(gateway: Gateway, ask: PullAsk) -> dict:
    """The daemon's status of the pull it started or joined; its refusal in Ollama's shape otherwise."""
    try:
        answer = await gateway.daemon.start_pull(ask.source, ask.revision)
    except httpx.HTTPError as exc:
        raise _unreached(exc) from None
    if answer.status_code == 200:
        return answer.json()
    why = error_text(answer)
    if answer.status_code == 422:  # the source names no model: the daemon's words say what is accepted
        raise InvalidRequest(why, param="model")
    if answer.status_code == 409:
        raise Conflict(why)
    raise Unavailable(f"the daemon did not start the pull: {why}", code="daemon_unavailable")


async def _pull_statuses(gateway: Gateway, started: dict) -> AsyncIterator[dict]:
    """The pull's statuses from the daemon, ending with its final one, or with none when the daemon's
    answer broke off (``httpx.HTTPError`` when it cannot be followed at all)."""
    async with gateway.daemon.follow_pull(str(started.get("id"))) as statuses:
        try:
            async for status in statuses:
                yield status
        except (httpx.HTTPError, ValueError) as exc:
            log_event(logger, "gateway.pull_lost", logging.WARNING, id=started.get("id"), error=type(exc).__name__)


async def _pull_lines(gateway: Gateway, started: dict) -> AsyncIterator[bytes]:
    """The pull's progress as Ollama's NDJSON lines (a line is sent when it differs from the last one);
    a client that goes away ends this, and with it the following, never the pull."""
    repo, last, ended = str(started.get("repo")), None, None
    try:
        async for status in _pull_statuses(gateway, started):
            for line in progress_lines(status):
                if line != last:
                    last = line
                    yield _line(line)
            if status.get("state") in ENDED:
                ended = status
    except httpx.HTTPError as exc:
        log_event(logger, "gateway.pull_lost", logging.WARNING, id=started.get("id"), error=type(exc).__name__)
    if ended is None:
        yield _line(lost(repo))
    else:
        _log_pull_end(ended)


async def _pull_end(gateway: Gateway, started: dict) -> dict:
    """``stream: false``: wait for the pull's end; ``success``, or its error with its status code."""
    ended = None
    try:
        async for status in _pull_statuses(gateway, started):
            ended = status if status.get("state") in ENDED else None
    except httpx.HTTPError as exc:
        raise _unreached(exc) from None
    if ended is None:
        raise Unavailable(lost(str(started.get("repo")))["error"], code="daemon_unavailable")
    _log_pull_end(ended)
    if ended.get("state") != "done":
        raise ended_error(ended)
    return progress_line(ended)


def _log_pull_end(status: dict) -> None:
    done = status.get("state") == "done"
    log_event(
        logger,
        "gateway.pull_ended",
        logging.INFO if done else logging.WARNING,
        id=status.get("id"),
        repo=status.get("repo"),
        state=status.get("state"),
        error=None if done else status.get("error"),
    )


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
