"""Anthropic Messages routes: ``POST /v1/messages`` (streamed or not) and ``/v1/messages/count_tokens``.

Auth (``x-api-key`` or ``Authorization: Bearer``) and rate limits are the router's
dependencies; errors are shaped as Anthropic's by ``api.errors``. The stream and the whole
response read the same engine events (``encode.py``, ``api.stream``).
"""

from __future__ import annotations

from fastapi import APIRouter
from starlette.requests import Request

from ..body import read_json, validate
from ..context import LiveContext, ServingContext
from ..prompt import make_generation, render_template, thinking_on, tool_plan
from ..structured import anthropic_output_format, ensure_valid
from ..stream import fold, stream
from ..tool_loop import ToolLoop, offer
from ..tooling import anthropic_tool_choice
from . import translate as tr
from .encode import MessagesStreamEncoder, message_response
from .protocol import CountTokensRequest, MessagesRequest


def make_router(live: LiveContext) -> APIRouter:
    """The routes, each reading the settings its request started under (``live.capture``)."""
    router = APIRouter()

    @router.post("/v1/messages")
    async def messages(request: Request):
        ctx = live.capture(request)
        req = validate(MessagesRequest, await read_json(request, ctx.max_body_bytes))
        ctx.check_model(req.model)
        choice = req.tool_choice
        offered = offer(ctx, request, tr.to_template_tools(req.tools))  # MCP tools the worker runs itself, or None
        tools = tool_plan(ctx, offered.tools if offered else tr.to_template_tools(req.tools), anthropic_tool_choice(
            choice and choice.type, choice and choice.name, choice and choice.disable_parallel_tool_use),
            tr.thinking_switch(req))
        prompt = await _render(ctx, req, offered)
        rid = ctx.request_id(request, "msg_")
        output = anthropic_output_format(req.output_format)
        gen = await make_generation(ctx, tr.sampling_request(req), prompt, rid, reasoning=True, tools=tools,
                              output=output,
                              after_reasoning=thinking_on(ctx, tr.thinking_switch(req)))
        if offered:
            gen = ToolLoop(ctx, offered, tr.to_template_messages(req)[0], tr.thinking_switch(req),
                           tr.sampling_request(req), output, gen)
        if req.stream:
            return stream(ctx, request, gen, MessagesStreamEncoder(rid, ctx.name, len(prompt)))
        folded = await fold(ctx, request, gen)
        ensure_valid(output, folded.text, folded.finish.reason)
        return message_response(rid, ctx.name, folded)

    @router.post("/v1/messages/count_tokens")
    async def count_tokens(request: Request):
        ctx = live.capture(request)
        req = validate(CountTokensRequest, await read_json(request, ctx.max_body_bytes))
        ctx.check_model(req.model)
        # Rendered exactly as /v1/messages renders it, so the count equals usage.input_tokens.
        return {"input_tokens": len(await _render(ctx, req, offer(ctx, request, tr.to_template_tools(req.tools))))}

    return router


async def _render(ctx: ServingContext, req, offered=None) -> list[int]:
    messages, tools = tr.to_template_messages(req)
    return await render_template(ctx, messages, offered.tools if offered else tools, tr.thinking_switch(req))
