"""One chat pipeline for every API family: a family translates its request into a
:class:`~vllmmlxd.api.turn.ChatTurn` and hands it here with its :class:`ChatEncoding`.

``serve_chat`` runs, in this order: the request's images (read, checked and decoded once), the
MCP tools the worker may run itself (``offer``), the tool plan (what is parsed, what is forced), rendering (and, for a turn that allows it, dropping
the oldest turns until it fits the context), the engine request, the tool loop,
then a stream through the family's encoder or the fold checked against the output format
and given to the family's body. ``render_prompt`` is the one rendering of a prompt, so
Anthropic's ``count_tokens`` counts exactly what ``/v1/messages`` sends to the engine.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator
from dataclasses import replace
from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from ..engine.types import Finished, RenderedPrompt, TextDelta, ToolCallDelta
from ..errors import InvalidRequest
from ..log import log_event
from .choices import Choices, choice_requests
from .context import ServingContext, owner_of
from .hosted_tools import HEADER, enforce, header_value
from .image_input import resolve_images
from .prompt import make_generation, render_template, thinking_on, tool_plan
from .stream import Folded, Generation, StreamEncoder, fold, open_events, stream
from .structured import ensure_valid
from .tool_loop import McpCall, McpOutcome, Offer, ToolLoop, offer
from .tooling import ToolChoice, cut_call
from .turn import ChatPrompt, ChatTurn, turn_starts, without_oldest

logger = logging.getLogger("vllmmlxd.api")


class ChatEncoding(Protocol):
    """A family's two ways of writing one response."""

    def stream_encoder(self, rid: str, prompt_tokens: int) -> StreamEncoder:
        """A fresh encoder for a streamed response with id ``rid``."""
        ...

    def response(self, rid: str, folded: Folded) -> dict[str, Any]:
        """The whole response's body."""
        ...


def offered_tools(prompt: ChatPrompt, offered: Offer | None) -> list[dict] | None:
    """The tools the prompt shows: the client's, then the worker's own when it offers some."""
    return offered.tools if offered else prompt.tools


async def render_prompt(ctx: ServingContext, prompt: ChatPrompt, offered: Offer | None) -> RenderedPrompt:
    """The prompt's tokens, with the tools ``offered`` (``tool_loop.offer``) beside the client's
    (its images resolved first: ``resolve_images``)."""
    return await render_template(ctx, prompt.messages, offered_tools(prompt, offered), prompt.template_kwargs)


async def fit_context(
    ctx: ServingContext, prompt: ChatPrompt, offered: Offer | None, tokens: RenderedPrompt
) -> tuple[ChatPrompt, RenderedPrompt]:
    """The prompt without its oldest turns, as few dropped as make it fit the context (found by
    halving: renders grow with the conversation); the last turn always stays. When even that is
    too long, the prompt as it was: the context's 400 says so."""
    limit, starts = ctx.engine.info.context_length, turn_starts(prompt.messages)
    best, lo, hi = (prompt, tokens), 1, len(starts) - 1
    if len(tokens) < limit:
        return best
    while lo <= hi:
        k = (lo + hi) // 2
        shorter = replace(prompt, messages=without_oldest(prompt.messages, starts, k))
        rendered = await render_prompt(ctx, shorter, offered)
        if len(rendered) < limit:
            best, hi = (shorter, rendered), k - 1
        else:
            lo = k + 1
    return best


async def serve_chat(
    ctx: ServingContext, request: Request, turn: ChatTurn, encoding: ChatEncoding
) -> Response | dict[str, Any]:
    """Serve one chat turn: a streamed response, or the family's whole body (as a response when
    it carries the ignored hosted tools' header)."""
    enforce(ctx.config.hosted_tools, turn.hosted)
    answer = await _serve(ctx, request, turn, encoding)
    if not turn.hosted:
        return answer
    ignored = header_value(turn.hosted)
    log_event(logger, "request.tools_ignored", request_id=getattr(request.state, "request_id", None), tools=ignored)
    reply = answer if isinstance(answer, StreamingResponse) else JSONResponse(answer)
    reply.headers[HEADER] = ignored
    return reply


async def _serve(
    ctx: ServingContext, request: Request, turn: ChatTurn, encoding: ChatEncoding
) -> StreamingResponse | dict[str, Any]:
    prompt = await resolve_images(ctx, turn.prompt)
    offered = offer(ctx, request, prompt.tools)  # MCP tools the worker runs itself; None: none for this request
    plan = tool_plan(ctx, offered_tools(prompt, offered), turn.tool_choice, prompt.template_kwargs)
    tokens = await render_prompt(ctx, prompt, offered)
    if turn.truncate:
        prompt, tokens = await fit_context(ctx, prompt, offered, tokens)
    rid = ctx.request_id(request, turn.id_prefix)
    turn_request = await make_generation(
        ctx,
        turn.sampling,
        tokens,
        rid,
        reasoning=True,
        tools=plan,
        output=turn.output,
        after_reasoning=thinking_on(ctx, prompt.template_kwargs),
        owner=owner_of(request),
    )
    if turn.prediction:  # its tokens become this request's drafts (engine.speculation)
        turn_request.prediction = tuple(
            await asyncio.to_thread(ctx.engine.tokenize, turn.prediction, add_special_tokens=False)
        )
    gen: Generation = turn_request
    if offered:
        if turn.n > 1:
            raise InvalidRequest("n > 1 cannot be combined with the worker's own (MCP) tools", param="n")
        gen = ToolLoop(ctx, offered, prompt.messages, prompt.template_kwargs, turn.sampling, turn.output, turn_request)

    def forced(one: Generation) -> Generation:  # a forced call that max_tokens cuts short is still a call
        return ForcedCall(ctx, one, offered_tools(prompt, offered) or [], turn.tool_choice) if plan.constraint else one

    gen = Choices(ctx, choice_requests(turn_request, turn.n), forced) if turn.n > 1 else forced(gen)
    if turn.stream:
        return stream(ctx, request, gen, encoding.stream_encoder(rid, len(tokens)))
    folded = await fold(ctx, request, gen)
    assert folded.finish is not None  # fold raises when the generation did not finish
    ensure_valid(turn.output, folded.text, folded.finish.reason)
    return encoding.response(rid, folded)


class ForcedCall:
    """A forced turn read as its engine events, except that a call cut short by ``max_tokens``
    (which the engine gives back as text) is a call: as the official APIs answer it, the
    partial call with the finish reason ``length``. Read by ``stream``/``fold`` like a generation.

    The engine holds a call's text back until the call is complete, so holding the text here
    delays nothing; once the worker ran a call itself (a later turn, no longer forced), events
    pass as they are."""

    def __init__(self, ctx: ServingContext, inner: Generation, tools: list[dict], choice: ToolChoice):
        self.ctx, self.inner, self.tools, self.choice = ctx, inner, tools, choice
        self.request_id = inner.request_id
        self.cancelled = inner.cancelled

    def open(self) -> AsyncGenerator:
        """Admit the turn now (a full queue is a 503 before any byte), then read its events."""
        return self._events(open_events(self.ctx, self.inner))

    async def _events(self, events: AsyncGenerator) -> AsyncGenerator:
        held: list[TextDelta] = []
        calls, forced = 0, True
        try:
            async for event in events:
                if isinstance(event, (McpCall, McpOutcome)):
                    forced = False
                if forced and isinstance(event, TextDelta):
                    held.append(event)
                    continue
                if isinstance(event, ToolCallDelta):
                    calls = max(calls, event.index + 1)
                if isinstance(event, Finished) and event.reason == "length" and held:
                    text = "".join(e.text for e in held)
                    cut = cut_call(text, self.tools, self.choice)
                    if cut is not None:
                        yield ToolCallDelta(calls, cut[0], cut[1], sum(e.token_count for e in held))
                        held = []
                for e in held:
                    yield e
                held = []
                yield event
        finally:
            await events.aclose()
