"""From a request to what the engine runs, the same for every API family: the rendered
conversation and the engine request with its sampling resolved."""

from __future__ import annotations

import asyncio

from ..engine.types import Constraint, DecodedImage, GenerationRequest, RenderedPrompt, ToolUse
from ..errors import InvalidRequest
from .context import ServingContext
from .sampling import SamplingRequest, resolve_sampling
from .structured import OutputFormat
from .template_kwargs import checked_template_kwargs
from .tooling import ToolChoice, ToolPlan, plan_tools


async def render_template(
    ctx: ServingContext,
    messages: list[dict],
    tools: list[dict] | None,
    kwargs: dict | None,
) -> RenderedPrompt:
    """The conversation as prompt tokens (with its images placed, for a vision model: parts
    resolved by ``api.image_input``); a template's refusal is the client's 400. Rendered off the
    event loop: a long conversation must not stall /health or other requests' streams."""
    if not ctx.engine.info.has_chat_template:
        raise InvalidRequest("this model has no chat template; use /v1/completions", param="messages")
    kwargs = checked_template_kwargs(kwargs, ctx.engine.info.template_switches)
    engine = ctx.engine
    try:
        if has_images(messages):
            return await asyncio.to_thread(engine.render, messages, tools=tools, template_kwargs=kwargs)
        return RenderedPrompt(
            await asyncio.to_thread(engine.apply_chat_template, messages, tools=tools, template_kwargs=kwargs)
        )
    except InvalidRequest:
        raise
    except Exception as exc:  # jinja raises on conversations the template refuses
        raise InvalidRequest(f"the chat template rejected these messages: {exc}", param="messages") from None


def has_images(messages: list[dict]) -> bool:
    """Whether a conversation holds decoded images (``api.image_input.resolve_images``)."""
    return any(
        isinstance(part, dict) and isinstance(part.get("image"), DecodedImage)
        for message in messages
        if isinstance(message.get("content"), list)
        for part in message["content"]
    )


def thinking_on(ctx: ServingContext, template_kwargs: dict | None) -> bool:
    """Will the model reason first? (A reasoning parser, and thinking not switched off by the request.)"""
    return ctx.engine.info.reasoning and (template_kwargs or {}).get("enable_thinking", True) is not False


def tool_plan(
    ctx: ServingContext, tools: list[dict] | None, choice: ToolChoice, template_kwargs: dict | None
) -> ToolPlan:
    """How this model serves the request's tools (see ``api.tooling``)."""
    return plan_tools(
        tools,
        choice,
        parser=ctx.engine.info.tool_parser,
        auto_enabled=ctx.config.enable_auto_tool_choice,
        after_reasoning=thinking_on(ctx, template_kwargs),
    )


def kv_room(engine: object) -> int | None:
    """The most tokens one request may hold under the engine's KV budget (``MLXEngine.kv_room``); None: no limit."""
    room = getattr(engine, "kv_room", None)
    return room() if room is not None else None


def cache_salt(scope: str, owner: str | None, requested: str | None) -> str | None:
    """What a request's prefix-cache entries are salted with: its key's name where the entry keeps
    each key's cache apart (``cache_scope: key``, the default), and the request's own
    ``cache_salt``; None (shared with every unsalted request of the entry) when neither applies."""
    parts = [f"key:{owner}" if scope == "key" and owner is not None else "", f"salt:{requested}" if requested else ""]
    return "\0".join(p for p in parts if p) or None


async def make_generation(
    ctx: ServingContext,
    sampling: SamplingRequest,
    prompt: RenderedPrompt | list[int],
    rid: str,
    *,
    reasoning: bool,
    tools: ToolPlan | None = None,
    output: OutputFormat | None = None,
    after_reasoning: bool = False,
    owner: str | None = None,
) -> GenerationRequest:
    """The engine request for ``prompt``: sampling merged with the model's defaults, the request's id,
    its tools, and the grammar it is held to (a forced tool call wins over an output format)."""
    rendered = prompt if isinstance(prompt, RenderedPrompt) else RenderedPrompt(prompt)
    params = resolve_sampling(
        sampling,
        ctx.config,
        prompt_len=len(prompt),
        context_length=ctx.engine.info.context_length,
        vocab_size=ctx.engine.info.vocab_size,
        kv_tokens=kv_room(ctx.engine),
    )
    tools = tools or ToolPlan()
    constraint, param, use = tools.constraint, "tool_choice", tools.use
    if constraint is None and output is not None:
        constraint, param = output.constraint(after_reasoning=after_reasoning), output.param
        if use is not None:  # the answer is held to JSON: nothing in it is a call (a bare-JSON family would misread it)
            use = ToolUse(use.tools, parse_calls=False)
    if constraint is not None:
        if params.ignore_eos:
            raise InvalidRequest("ignore_eos cannot be combined with a constrained output", param="ignore_eos")
        await _check(ctx, constraint, param)
    return GenerationRequest(
        prompt_tokens=rendered.tokens,
        images=rendered.images,
        sampling=params,
        request_id=rid,
        stream_interval=ctx.config.stream_interval,
        reasoning=reasoning,
        tool_use=use,
        constraint=constraint,
        owner=owner,
        cache_salt=cache_salt(ctx.config.cache_scope, owner, sampling.cache_salt),
    )


async def _check(ctx: ServingContext, constraint: Constraint, param: str) -> None:
    """A grammar the engine cannot compile (an unsupported schema feature) is the client's 400.
    Compiling may take a moment: off the event loop, so other streams keep flowing."""
    problem = await asyncio.to_thread(ctx.engine.check_constraint, constraint)
    if problem:
        raise InvalidRequest(f"this schema cannot be enforced: {problem}", param=param)
