"""The Responses API's routes: ``POST /v1/responses`` (streamed or not), and the stored ones'
``GET``, ``DELETE`` and ``GET .../input_items``.

Auth and rate limits are the router's dependencies (worker/app.py). A request is translated
into a neutral turn (``translate.to_turn``) and served by ``api.chat.serve_chat``: batching, the
prefix cache, tools, structured output, reasoning and the MCP tool loop work here as on chat
completions, with no second code path. ``previous_response_id`` puts the stored conversation
before the input; a response is stored (``store``, default true) for the key that made it.
Errors are OpenAI's shape (``api.errors``).
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import Response

from ...errors import InvalidRequest, NotFound
from ..body import read_json, validate
from ..chat import serve_chat
from ..context import LiveContext, owner_of
from ..sampling import applied
from . import translate as tr
from .encode import ResponsesEncoding
from .ids import id_prefix
from .protocol import ResponsesRequest
from .store import ResponseStore, Stored, as_input, with_ids

owner = owner_of  # whose responses a request may see: the key it authenticated with (None on an open entry)


def make_router(live: LiveContext, store: ResponseStore | None = None) -> APIRouter:
    router = APIRouter()
    kept = store if store is not None else ResponseStore()

    def find(request: Request, rid: str, param: str | None = None) -> Stored:
        found = kept.get(owner(request), rid)
        if found is None:
            raise NotFound(f"response with id {rid!r} not found", param=param)
        return found

    # response_model=None: a dict is sent as built, not validated against the return annotation.
    @router.post("/v1/responses", response_model=None)
    async def responses(request: Request) -> Response | dict[str, Any]:
        ctx = live.capture(request)
        req = validate(ResponsesRequest, await read_json(request, ctx.max_body_bytes))
        ctx.check_model(req.model)
        history: list[dict[str, Any]] = []
        if req.previous_response_id is not None:
            earlier = find(request, req.previous_response_id, "previous_response_id")
            history = earlier.input_items + [i for i in map(as_input, earlier.response["output"]) if i is not None]
        turn = await asyncio.to_thread(tr.to_turn, req, history, id_prefix(ctx.name))  # a PDF's text is CPU work
        conversation = history + tr.input_items(req)
        who = owner(request)

        def done(body: dict[str, Any]) -> None:
            if req.store:
                kept.bound(ctx.config.stored_responses, int(ctx.config.stored_responses_mb * 1024 * 1024))
                kept.put(who, body, conversation)

        values = applied(turn.sampling, ctx.config)
        return await serve_chat(ctx, request, turn, ResponsesEncoding(req, ctx.name, done, values))

    @router.get("/v1/responses/{response_id}", response_model=None)
    async def retrieve(response_id: str, request: Request) -> dict[str, Any]:
        return find(request, response_id).response

    @router.delete("/v1/responses/{response_id}", response_model=None)
    async def delete(response_id: str, request: Request) -> dict[str, Any]:
        find(request, response_id)
        kept.delete(owner(request), response_id)
        return {"id": response_id, "object": "response.deleted", "deleted": True}

    @router.get("/v1/responses/{response_id}/input_items", response_model=None)
    async def input_items(response_id: str, request: Request, order: str = "desc") -> dict[str, Any]:
        if order not in ("asc", "desc"):
            raise InvalidRequest("order must be asc or desc", param="order")
        items = with_ids(response_id, find(request, response_id).input_items)
        if order == "desc":  # as OpenAI lists them by default: the newest first
            items.reverse()
        return {
            "object": "list",
            "data": items,
            "first_id": items[0]["id"] if items else None,
            "last_id": items[-1]["id"] if items else None,
            "has_more": False,
        }

    return router
