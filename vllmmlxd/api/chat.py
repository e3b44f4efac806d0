"""One chat pipeline for every API family: a family translates its request into a
:class:`~vllmmlxd.api.turn.ChatTurn` and hands it here with its :class:`ChatEncoding`.

``serve_chat`` runs, in this order: the MCP tools the worker may run itself (``offer``), the
tool plan (what is parsed, what is forced), rendering, the engine request, the tool loop,
then a stream through the family's encoder or the fold checked against the output format
and given to the family's body. ``render_prompt`` is the one rendering of a prompt, so
Anthropic's ``count_tokens`` counts exactly what ``/v1/messages`` sends to the engine.
"""

from __future__ import annotations

from typing import Any, Protocol

from starlette.requests import Request

from .context import ServingContext
from .prompt import make_generation, render_template, thinking_on, tool_plan
from .stream import Folded, StreamEncoder, fold, stream
from .structured import ensure_valid
from .tool_loop import Offer, ToolLoop, offer
from .turn import ChatPrompt, ChatTurn


class ChatEncoding(Protocol):
    """A family's two ways of writing one response."""

    def stream_encoder(self, rid: str, prompt_tokens: int) -> StreamEncoder:
        """A fresh encoder for a streamed response with id ``rid``."""
        ...

    def response(self, rid: str, folded: Folded) -> Any:
        """The whole response's body."""
        ...


def offered_tools(prompt: ChatPrompt, offered: Offer | None) -> list[dict] | None:
    """The tools the prompt shows: the client's, then the worker's own when it offers some."""
    return offered.tools if offered else prompt.tools


async def render_prompt(ctx: ServingContext, prompt: ChatPrompt, offered: Offer | None) -> list[int]:
    """The prompt's tokens, with the tools ``offered`` (``tool_loop.offer``) beside the client's."""
    return await render_template(ctx, prompt.messages, offered_tools(prompt, offered), prompt.template_kwargs)


async def serve_chat(ctx: ServingContext, request: Request, turn: ChatTurn, encoding: ChatEncoding) -> Any:
    """Serve one chat turn: a streamed response, or the family's whole body."""
    prompt = turn.prompt
    offered = offer(ctx, request, prompt.tools)  # MCP tools the worker runs itself; None: none for this request
    plan = tool_plan(ctx, offered_tools(prompt, offered), turn.tool_choice, prompt.template_kwargs)
    tokens = await render_prompt(ctx, prompt, offered)
    rid = ctx.request_id(request, turn.id_prefix)
    gen = await make_generation(ctx, turn.sampling, tokens, rid, reasoning=True, tools=plan, output=turn.output,
                                after_reasoning=thinking_on(ctx, prompt.template_kwargs))
    if offered:
        gen = ToolLoop(ctx, offered, prompt.messages, prompt.template_kwargs, turn.sampling, turn.output, gen)
    if turn.stream:
        return stream(ctx, request, gen, encoding.stream_encoder(rid, len(tokens)))
    folded = await fold(ctx, request, gen)
    ensure_valid(turn.output, folded.text, folded.finish.reason)
    return encoding.response(rid, folded)
