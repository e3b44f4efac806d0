"""The gateway's HTTP apps: the public one (model APIs routed by ``model``, listings, ``/api/*``,
the web page) and the private one the daemon reaches over its Unix socket (health, settings pushes).

As for workers, two apps rather than one with a guard: the private routes do not exist on the
public port. The public app keeps the workers' defences (Host/Origin/Content-Type, request
ids), read per request from the current table's ``gateway`` section.
"""

from __future__ import annotations

import json
import logging
import mimetypes
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Route as HttpRoute

from .. import __version__
from ..api.errors import install_error_handlers
from ..config.gateway import GatewaySpec, Route
from ..http.access import presented_key
from ..http.browser import BrowserDefences
from ..http.request_id import RequestIdMiddleware
from ..http.tracing import TracingMiddleware
from ..log import log_event
from ..version import commit
from .cluster import make_router as make_cluster_router
from .dispatch import Gateway
from .routing import ReplicaSet, TableError, build_table, set_state
from .uploads import UPLOAD_PATHS, routed_upload

logger = logging.getLogger("vllmmlxd.gateway")

STATIC_DIR = Path(__file__).resolve().parent / "static"
# Model API paths routed by the body's ``model``; True: embeddings (the embedding model's name routes too).
ROUTED_PATHS = {
    "/v1/chat/completions": False,
    "/v1/completions": False,
    "/v1/embeddings": True,
    "/v1/messages": False,
    "/v1/messages/count_tokens": False,
    "/v1/responses": False,
    # A reranking entry is routed by its own name, like any model.
    "/v1/rerank": False,
    "/v2/rerank": False,
    "/rerank": False,
    "/v1/score": False,
    "/score": False,
    # A worker's Ollama routes, so that a gateway is an upstream for another host's Ollama listener too.
    "/ollama/api/chat": False,
    "/ollama/api/generate": False,
    "/ollama/api/embed": True,
    "/ollama/api/embeddings": True,
    "/ollama/api/show": True,
}


def model_cards(route: Route, created: int) -> list[dict]:
    """``/v1/models`` cards of one route: its model, and its embedding model when it has one."""
    card = {
        "id": route.served_model_name,
        "object": "model",
        "owned_by": route.owned_by,
        "created": created,
        "state": route.state,
        "entry": route.name,
        "aliases": list(route.aliases),
        "kind": route.kind,
    }
    cards = [card]
    if route.embedding_model:
        cards.append({**card, "id": route.embedding_model, "aliases": [], "embedding_of": route.served_model_name})
    return cards


def group_card(rset: ReplicaSet, created: int) -> dict:
    """The ``/v1/models`` card of a replica set: the group's name, once, with its members."""
    return {
        "id": rset.name,
        "object": "model",
        "owned_by": rset.first.owned_by,
        "created": created,
        "state": set_state(rset.members),
        "aliases": [],
        "kind": "group",
        "members": [m.name for m in rset.members],
    }


def _routed(gateway: Gateway, path: str, embeddings: bool) -> Callable[[Request], Awaitable[Response]]:
    async def routed(request: Request) -> Response:
        return await gateway.routed(request, path, embeddings)

    return routed


def _upload(gateway: Gateway, path: str) -> Callable[[Request], Awaitable[Response]]:
    async def upload(request: Request) -> Response:
        return await routed_upload(gateway, request, path)

    return upload


def create_app(gateway: Gateway) -> FastAPI:
    app = FastAPI(title="vllmmlxd gateway", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.gateway = gateway
    install_error_handlers(app)

    # Plain Starlette routes: the endpoint takes the request and nothing else. (FastAPI would read
    # an endpoint's parameters from the query string, and it costs a fraction of a millisecond.)
    for path, embeddings in ROUTED_PATHS.items():
        app.router.routes.append(HttpRoute(path, _routed(gateway, path, embeddings), methods=["POST"]))
    for path in UPLOAD_PATHS:  # multipart forms, routed by their model field
        app.router.routes.append(HttpRoute(path, _upload(gateway, path), methods=["POST"]))

    async def stored_response(request: Request) -> Response:
        rid = request.path_params["response_id"]
        return await gateway.stored(request, rid, request.url.path)

    for path, methods in (
        ("/v1/responses/{response_id}", ["GET", "DELETE"]),
        ("/v1/responses/{response_id}/input_items", ["GET"]),
    ):
        app.router.routes.append(HttpRoute(path, stored_response, methods=methods))

    # response_model=None: a dict is sent as built, not validated against the return annotation.
    @app.get("/v1/models", response_model=None)
    async def models(request: Request) -> dict[str, Any]:
        table, key, created = gateway.table, presented_key(request), int(gateway.started)
        cards = [c for r in table.routes if table.may_use(r, key) for c in model_cards(r, created)]
        cards += [group_card(s, created) for s in table.visible_sets(key)]
        return {"object": "list", "data": list({c["id"]: c for c in cards}.values())}

    @app.get("/health", response_model=None)
    async def health() -> dict[str, Any]:
        return {"status": "ok", "models": len(gateway.table.routes), "version": __version__, "commit": commit()}

    app.include_router(make_cluster_router(gateway))
    _install_ui(app, gateway)
    app.add_middleware(TracingMiddleware, model=None)  # the gateway's span: the workers' spans are its children
    app.add_middleware(BrowserDefences, config=lambda: gateway.table.spec.gateway)
    app.add_middleware(RequestIdMiddleware)  # outermost: every response, errors included, gets its id
    return app


def _install_ui(app: FastAPI, gateway: Gateway) -> None:
    """``/`` and ``/static/<file>``: the web page, when ``gateway.ui`` is on and its files exist."""
    not_found = PlainTextResponse("Not Found", status_code=404)
    headers = {"Cache-Control": "no-cache"}

    def static_file(name: str) -> Response:
        if not gateway.table.spec.gateway.ui:
            return not_found
        root = STATIC_DIR
        path = (root / name).resolve()
        # Files only, inside the folder: no listing, no way out through "..".
        if not path.is_relative_to(root) or not path.is_file():
            return not_found
        media = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
        if media.startswith("text/") or media in ("application/javascript", "application/json"):
            media += "; charset=utf-8"
        return FileResponse(path, media_type=media, headers=headers)

    @app.get("/", include_in_schema=False)
    async def index() -> Response:
        return static_file("index.html")

    @app.get("/static/{name:path}", include_in_schema=False)
    async def static(name: str) -> Response:
        return static_file(name)


def _validation_problems(exc: ValidationError) -> str:
    # Locations and messages only: the input holds keys.
    return "; ".join(
        f"{'.'.join(map(str, e['loc'])) or 'spec'}: {e['msg']}"
        for e in exc.errors(include_input=False, include_url=False)
    )


def create_private_app(gateway: Gateway) -> FastAPI:
    """The daemon's app on the private socket: ``GET /health`` and ``POST /internal/settings``."""
    app = FastAPI(title="vllmmlxd gateway (private)", docs_url=None, redoc_url=None, openapi_url=None)

    # response_model=None: a dict is sent as built, not validated against the return annotation.
    @app.get("/health", response_model=None)
    async def health() -> dict[str, Any]:
        spec = gateway.table.spec
        return {
            "status": "ok",
            "config_hash": spec.config_hash(),
            "version": spec.version,
            "load": {"requests": gateway.in_flight, "total_requests": gateway.total, "routes": len(spec.routes)},
        }

    @app.post("/internal/settings", response_model=None)
    async def settings(request: Request) -> JSONResponse | dict[str, Any]:
        def refused(status: int, error: str) -> JSONResponse:
            log_event(logger, "settings.refused", logging.WARNING, status=status, error=error)
            return JSONResponse({"ok": False, "error": error}, status_code=status)

        try:
            spec = GatewaySpec.model_validate(json.loads(await request.body()))
        except ValidationError as exc:
            return refused(422, _validation_problems(exc))
        except (ValueError, RecursionError):
            return refused(422, "the body is not a JSON gateway spec")
        current = gateway.table.spec
        if spec.gateway.listeners() != current.gateway.listeners():
            return refused(
                409, "gateway.host, gateway.port and gateway.ollama_port cannot change live: the gateway must restart"
            )
        try:
            table = build_table(spec)
        except TableError as exc:
            return refused(422, str(exc))
        gateway.swap(table)
        config_hash = spec.config_hash()
        log_event(logger, "settings.applied", version=spec.version, routes=len(spec.routes), config_hash=config_hash)
        return {"ok": True, "config_hash": config_hash}

    return app
