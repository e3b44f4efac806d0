"""``/api/*``: the web page's endpoints (the cluster's "passerelle web").

``/api/chat`` and ``/api/complete`` take a short body (the entry key, served name or alias as
``model``; ``system`` beside the messages) and forward it as the OpenAI request it stands for,
streamed, so the page reads one OpenAI SSE stream whatever the model. ``/api/models`` and
``/api/health`` describe the routes; ``/api/status`` shows the daemon's status as far as the
caller's key reaches: the models it may use, without pids, paths, key names other than its own,
or any process's error output (that is for operators: ``vllmmlxctl status``, the logs).
The body translations, the listings and that view are pure functions, tested without a server.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import httpx
from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..config.gateway import Route
from ..errors import InvalidRequest, Unauthorized
from ..http.access import presented_key
from ..http.error_shapes import FAMILY_KEY
from .dispatch import Gateway, Unavailable, parse_object
from .routing import ReplicaSet, Table, health_summary, set_health, set_state

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


def looks_like_ollama(data: dict) -> bool:
    """Is a body sent to ``/api/chat`` shaped like Ollama's chat (whose clients cannot read this
    route's SSE)? Fields only Ollama has, or a whole answer asked for with no ``max_tokens`` (the
    page always streams)."""
    if any(k in data for k in ("options", "keep_alive", "format", "think")):
        return True
    return data.get("stream") is False and "max_tokens" not in data


def ollama_elsewhere(ollama_port: int | None) -> str:
    """What an Ollama client that called the main port is told."""
    where = (
        f"Ollama's API is served on port {ollama_port}"
        if ollama_port is not None
        else "Ollama's API is off: set gateway.ollama_port (11434 is Ollama's) and point the client there"
    )
    return (
        "this /api/chat is vllmmlxd's web page endpoint (it streams OpenAI server-sent events), "
        f"and this request looks like an Ollama client's: {where}"
    )


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
    return {
        "id": route.name,
        "name": route.served_model_name,
        "aliases": list(route.aliases),
        "state": route.state,
        "kind": route.kind,
        "load": route.load,
        "owned_by": route.owned_by,
        "embedding_model": route.embedding_model,
    }


def set_entry(rset: ReplicaSet) -> dict:
    """The line of ``/api/models`` for a replica set: its name, once, and its members."""
    return {
        "id": rset.name,
        "name": rset.name,
        "aliases": [],
        "state": set_state(rset.members),
        "kind": "group",
        "load": "eager" if any(m.load == "eager" for m in rset.members) else "lazy",
        "owned_by": rset.first.owned_by,
        "embedding_model": None,
        "members": [m.name for m in rset.members],
    }


def require_some_route(table: Table, key: str | None) -> list[Route]:
    """The routes ``key`` may use; 401 when it may use none and some need a key, so the page asks for
    a key instead of showing an empty list."""
    visible = table.visible(key)
    if not visible and any(not r.is_open for r in table.routes):
        raise Unauthorized("a key valid for at least one model is required", code="invalid_api_key")
    return visible


# What an API client may see of the daemon's status (an allowlist: a field the daemon adds later stays
# hidden until it is judged fit). Never pids, paths, the config, or anyone's error output.
_DAEMON_SHOWN = ("uptime_s", "version")
_GATEWAY_SHOWN = ("state", "host", "port", "restarts", "uptime_s", "ui", "version")
_MODEL_SHOWN = (
    "name",
    "state",
    "host",
    "port",
    "restarts",
    "uptime_s",
    "served_model_name",
    "blas",
    "threads",
    "cpus",
    "running",
    "waiting",
    "tokens_per_s",
    "cache_mb",
    "cache_budget_mb",
    "embedding_model",
    "embedding_requests",
    "embedding_inputs",
    "load",
    "idle_unload_s",
    "idle_s",
    "upstream",
    "group",
)
_GROUP_MEMBER_SHOWN = ("name", "state", "running", "waiting")
# A pull's progress, as a downloading entry's and as the store's pulls under way (no path, no error text).
_PULL_SHOWN = ("repo", "revision", "state", "percent", "done_bytes", "total_bytes", "bytes_per_s", "eta_s")
_PULLS_RUNNING = ("queued", "resolving", "downloading", "verifying", "installing")
_MCP_SHOWN = ("name", "transport", "state", "tools", "connects")


def _picked(data: object, fields: tuple[str, ...]) -> dict | None:
    return {k: data[k] for k in fields if k in data} if isinstance(data, dict) else None


async def _usage(gateway: Gateway) -> dict | None:
    """The daemon's usage report for the last day; None when it cannot be read now (the status stands)."""
    try:
        answer = await gateway.daemon.usage()
        return answer.json() if answer.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None


def usage_for(report: dict, table: Table, key: str | None) -> dict:
    """The usage a caller presenting ``key`` may see: its own key's rows and budget (and an open
    entry's, where it may use one), never another key's."""
    names = {grant.name for r in table.routes if key and not r.is_open and (grant := table.access[r.name].match(key))}
    if any(r.is_open for r in table.routes):
        names.add("")
    rows = [r for r in report.get("rows") or () if isinstance(r, dict) and r.get("key") in names]
    budgets = [b for b in report.get("budgets") or () if isinstance(b, dict) and b.get("key") in names]
    return {"since_s": report.get("since_s"), "rows": rows, "budgets": budgets}


def status_for(status: object, table: Table, key: str | None) -> dict:
    """The daemon's ``/status`` as a caller presenting ``key`` may see it: the models it may use (each
    with its own key's name only, and the MCP servers that key may use), no pid, path or error text."""
    status = status if isinstance(status, dict) else {}
    models = []
    for row in status.get("models") or ():
        name = row.get("name") if isinstance(row, dict) else None
        route = table.by_name.get(name) if isinstance(name, str) else None
        if route is None or route.name != row.get("name") or not table.may_use(route, key):
            continue
        grant = table.access[route.name].match(key) if key and not route.is_open else None
        shown = _picked(row, _MODEL_SHOWN) or {}
        if isinstance(row.get("download"), dict):
            shown["download"] = _picked(row["download"], _PULL_SHOWN)
        keys = row.get("keys")
        shown["keys"] = None if keys is None else [k for k in keys if grant is not None and k == grant.name]
        if isinstance(row.get("mcp"), list):
            scope = grant.mcp if grant is not None else None
            shown["mcp"] = [
                _picked(m, _MCP_SHOWN)
                for m in row["mcp"]
                if isinstance(m, dict) and (scope is None or m.get("name") in scope)
            ]
        models.append(shown)
    out: dict[str, Any] = {"daemon": _picked(status.get("daemon"), _DAEMON_SHOWN) or {}, "models": models}
    if status.get("gateway") is not None:
        out["gateway"] = _picked(status.get("gateway"), _GATEWAY_SHOWN)
    # The store's pulls are the daemon's, not a model's: shown to a caller who may use every model.
    pulls = [p for p in status.get("pulls") or () if isinstance(p, dict) and p.get("state") in _PULLS_RUNNING]
    if pulls and table.may_use_every(key):
        out["pulls"] = [_picked(p, _PULL_SHOWN) for p in pulls]
    sets = {s.name for s in table.visible_sets(key)}
    groups = [g for g in status.get("groups") or () if isinstance(g, dict) and g.get("name") in sets]
    if groups:
        out["groups"] = [
            {
                "name": g["name"],
                "state": g.get("state"),
                "members": [_picked(m, _GROUP_MEMBER_SHOWN) for m in g.get("members") or () if isinstance(m, dict)],
            }
            for g in groups
        ]
    return out


def make_router(gateway: Gateway) -> APIRouter:
    router = APIRouter()

    async def translated(request: Request, path: str, translate: Callable[[dict], dict]) -> Response:
        data = parse_object(await gateway.read_body(request))
        table = gateway.table
        if path == "/v1/chat/completions" and looks_like_ollama(data):
            request.scope[FAMILY_KEY] = "ollama"  # answered in the shape its client reads
            raise InvalidRequest(ollama_elsewhere(table.spec.gateway.ollama_port), code="ollama_port")
        target = table.resolve(data.get("model"), key=presented_key(request))
        gateway.admit(request, target)
        body = translate(data)
        return await gateway.dispatch(request, target, path, body, json.dumps(body).encode())

    @router.post("/api/chat")
    async def chat(request: Request) -> Response:
        return await translated(request, "/v1/chat/completions", chat_body)

    @router.post("/api/complete")
    async def complete(request: Request) -> Response:
        return await translated(request, "/v1/completions", complete_body)

    # response_model=None: a dict is sent as built, not validated against the return annotation.
    @router.get("/api/models", response_model=None)
    async def models(request: Request) -> dict[str, Any]:
        table, key = gateway.table, presented_key(request)
        routes = require_some_route(table, key)
        sets = [set_entry(s) for s in table.visible_sets(key)]
        return {"object": "list", "data": [model_entry(r) for r in routes] + sets}

    @router.get("/api/health")
    async def health(request: Request) -> JSONResponse:
        table, key = gateway.table, presented_key(request)
        status, per_model = health_summary(table.routes, table.visible(key))
        body: dict[str, Any] = {"status": status, "models": per_model}
        sets = table.visible_sets(key)
        if sets:
            ejected = gateway.replicas.ejected(time.monotonic())
            body["groups"] = {s.name: set_health(s, gateway.replicas.outstanding, ejected) for s in sets}
        return JSONResponse(body, status_code=503 if status == "down" else 200)

    @router.get("/api/status")
    async def status(request: Request) -> JSONResponse:
        table = gateway.table
        keyed = [r for r in table.routes if not r.is_open]
        key = presented_key(request)
        if keyed and not any(table.may_use(r, key) for r in keyed):
            raise Unauthorized("a key valid for at least one model is required", code="invalid_api_key")
        try:
            answer = await gateway.daemon.status()
            body = answer.json()
        except (httpx.HTTPError, ValueError):
            raise Unavailable("the daemon's status cannot be read now", code="daemon_unavailable") from None
        if answer.status_code != 200:
            raise Unavailable(
                f"the daemon's status cannot be read now (HTTP {answer.status_code})", code="daemon_unavailable"
            )
        shown = status_for(body, table, key)
        usage = await _usage(gateway)
        if usage is not None:
            shown["usage"] = usage_for(usage, table, key)
        return JSONResponse(shown)

    return router
