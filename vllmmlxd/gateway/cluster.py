"""``/api/*``: the web page's endpoints (the cluster's "passerelle web").

``/api/chat`` and ``/api/complete`` take a short body (the entry key, served name or alias as
``model``; ``system`` beside the messages) and forward it as the OpenAI request it stands for,
streamed, so the page reads one OpenAI SSE stream whatever the model. ``/api/models`` and
``/api/health`` describe the routes; ``/api/status`` passes the daemon's status through.
The body translations and the listings are pure functions, tested without a server.
"""

from __future__ import annotations

import json

import httpx
from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..config.gateway import Route
from ..errors import InvalidRequest, Unauthorized
from ..http.access import presented_key
from .dispatch import Gateway, Unavailable, parse_object
from .routing import Table, health_summary

_USAGE = {"include_usage": True}  # the page shows token counts: the last chunk carries them


def _stream_options(data: dict) -> dict:
    given = data.get("stream_options")
    return {**(given if isinstance(given, dict) else {}), **_USAGE}


def chat_body(data: dict) -> dict:
    """``/api/chat``'s body as a streamed OpenAI chat completion: ``system`` becomes the first message."""
    messages = data.get("messages")
    if not isinstance(messages, list):
        raise InvalidRequest("messages must be a list of messages", param="messages")
    body = {k: v for k, v in data.items() if k != "system"}
    system = data.get("system")
    if system not in (None, ""):
        messages = [{"role": "system", "content": system}, *messages]
    body.update(messages=messages, stream=True, stream_options=_stream_options(data))
    return body


def complete_body(data: dict) -> dict:
    """``/api/complete``'s body as an OpenAI completion: streamed unless it says ``"stream": false``."""
    if "prompt" not in data:
        raise InvalidRequest("prompt is required", param="prompt")
    body = dict(data)
    body["stream"] = data.get("stream") is not False
    if body["stream"]:
        body["stream_options"] = _stream_options(data)
    else:
        body.pop("stream_options", None)
    return body


def model_entry(route: Route) -> dict:
    """One line of ``/api/models``."""
    return {"id": route.name, "name": route.served_model_name, "aliases": list(route.aliases), "state": route.state,
            "kind": route.kind, "load": route.load, "owned_by": route.owned_by, "embedding_model": route.embedding_model}


def visible_routes(table: Table, key: str | None) -> list[Route]:
    return [r for r in table.routes if table.may_use(r, key)]


def make_router(gateway: Gateway) -> APIRouter:
    router = APIRouter()

    async def translated(request: Request, path: str, translate) -> Response:
        data = parse_object(await gateway.read_body(request))
        table = gateway.table
        route = table.resolve(data.get("model"))
        table.access[route.name].identify(request)
        body = translate(data)
        if route.kind == "upstream":
            body["model"] = route.served_model_name
        return await gateway.forward(request, route, path, json.dumps(body).encode(), body["stream"])

    @router.post("/api/chat")
    async def chat(request: Request):
        return await translated(request, "/v1/chat/completions", chat_body)

    @router.post("/api/complete")
    async def complete(request: Request):
        return await translated(request, "/v1/completions", complete_body)

    @router.get("/api/models")
    async def models(request: Request):
        routes = visible_routes(gateway.table, presented_key(request))
        return {"object": "list", "data": [model_entry(r) for r in routes]}

    @router.get("/api/health")
    async def health():
        status, per_model = health_summary(gateway.table.routes)
        return JSONResponse({"status": status, "models": per_model}, status_code=503 if status == "down" else 200)

    @router.get("/api/status")
    async def status(request: Request):
        table = gateway.table
        keyed = [r for r in table.routes if not r.is_open]
        key = presented_key(request)
        if keyed and not any(table.may_use(r, key) for r in keyed):
            raise Unauthorized("a key valid for at least one model is required", code="invalid_api_key")
        try:
            answer = await gateway.daemon.status()
        except httpx.HTTPError:
            raise Unavailable("the daemon's status cannot be read now", code="daemon_unavailable") from None
        return Response(answer.content, status_code=answer.status_code,
                        media_type=answer.headers.get("content-type", "application/json"))

    return router
