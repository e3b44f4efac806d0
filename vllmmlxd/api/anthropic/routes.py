"""Anthropic Messages routes: ``POST /v1/messages`` (streamed or not) and ``/v1/messages/count_tokens``.

Auth (``x-api-key`` or ``Authorization: Bearer``) and rate limits are the router's
dependencies; errors are shaped as Anthropic's by ``api.errors``. A request is translated into
a neutral turn (``translate.to_turn``) and served by ``api.chat.serve_chat``; the stream and
the whole response read the same engine events (``encode.py``, ``api.stream``).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import Response

from ..body import read_json, validate
from ..chat import render_prompt, serve_chat
from ..context import LiveContext
from ..image_input import resolve_images
from ..tool_loop import offer
from . import translate as tr
from .encode import MessagesEncoding
from .protocol import CountTokensRequest, MessagesRequest


def make_router(live: LiveContext) -> APIRouter:
    """The routes, each reading the settings its request started under (``live.capture``)."""
    router = APIRouter()

    # response_model=None: a dict is sent as built, not validated against the return annotation.
    @router.post("/v1/messages", response_model=None)
    async def messages(request: Request) -> Response | dict[str, Any]:
        ctx = live.capture(request)
        req = validate(MessagesRequest, await read_json(request, ctx.max_body_bytes))
        ctx.check_model(req.model)
        return await serve_chat(ctx, request, tr.to_turn(req), MessagesEncoding(ctx.name))

    @router.post("/v1/messages/count_tokens", response_model=None)
    async def count_tokens(request: Request) -> dict[str, Any]:
        ctx = live.capture(request)
        req = validate(CountTokensRequest, await read_json(request, ctx.max_body_bytes))
        ctx.check_model(req.model)
        prompt = await resolve_images(ctx, tr.to_prompt(req))
        # Rendered as /v1/messages renders it (api.chat.render_prompt), so the count equals usage.input_tokens.
        return {"input_tokens": len(await render_prompt(ctx, prompt, offer(ctx, request, prompt.tools)))}

    return router
