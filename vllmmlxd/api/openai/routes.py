"""OpenAI-compatible routes: chat and text completions (streamed or not), models.

Both response kinds read the same engine event stream: streaming sends each event
as an SSE chunk, non-streaming folds the stream, so the two cannot disagree.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from functools import partial
from typing import AsyncIterator, Callable

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import StreamingResponse

from ...engine.types import Finished, GenerationRequest, TextDelta, Usage
from ...errors import EngineFailure, InvalidRequest, RequestTimeout
from ...log import log_event
from ..body import ClientDisconnected, read_json, unless_disconnected, validate
from ..context import ServingContext
from ..sse import DONE, sse_data
from . import translate as tr
from .protocol import ChatCompletionRequest, CompletionRequest, error_body

logger = logging.getLogger("vllmmlxd.api")


def make_router(ctx: ServingContext) -> APIRouter:
    router = APIRouter()

    @router.get("/v1/models")
    async def list_models(request: Request):
        ctx.check_api_key(request)
        return {"object": "list", "data": [_model_card(ctx)]}

    @router.get("/v1/models/{model_id:path}")
    async def get_model(model_id: str, request: Request):
        ctx.check_api_key(request)
        ctx.check_model(model_id)
        return _model_card(ctx)

    @router.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        ctx.check_api_key(request)
        req = validate(ChatCompletionRequest, await read_json(request, ctx.max_body_bytes))
        ctx.check_model(req.model)
        tr.check_chat_supported(req)
        prompt = _render_chat(ctx, req)
        gen = _generation(ctx, req, prompt)
        rid, created = "chatcmpl-" + uuid.uuid4().hex, int(time.time())
        if req.stream:
            chunk = partial(tr.chat_chunk, rid, created, ctx.name)
            return _stream(
                ctx, gen, req, first=chunk({"role": "assistant", "content": ""}),
                delta=lambda text: chunk({"content": text}), end=lambda reason: chunk({}, reason),
                usage=partial(tr.usage_chunk, rid, created, ctx.name, "chat.completion.chunk"),
            )
        folded = await _fold(ctx, request, gen)
        return tr.chat_response(rid, created, ctx.name, folded)

    @router.post("/v1/completions")
    async def completions(request: Request):
        ctx.check_api_key(request)
        req = validate(CompletionRequest, await read_json(request, ctx.max_body_bytes))
        ctx.check_model(req.model)
        prompt = tr.completion_prompt(req)
        tokens = ctx.engine.tokenize(prompt) if isinstance(prompt, str) else prompt
        if any(not 0 <= t < ctx.engine.info.vocab_size for t in tokens):
            raise InvalidRequest("prompt token ids must be inside the vocabulary", param="prompt")
        gen = _generation(ctx, req, tokens)
        rid, created = "cmpl-" + uuid.uuid4().hex, int(time.time())
        if req.stream:
            chunk = partial(tr.completion_chunk, rid, created, ctx.name)
            return _stream(
                ctx, gen, req, first=None, delta=chunk, end=lambda reason: chunk("", reason),
                usage=partial(tr.usage_chunk, rid, created, ctx.name, "text_completion"),
            )
        folded = await _fold(ctx, request, gen)
        return tr.completion_response(rid, created, ctx.name, folded)

    return router


def _model_card(ctx: ServingContext) -> dict:
    return {
        "id": ctx.name,
        "object": "model",
        "created": int(ctx.started),
        "owned_by": ctx.config.owned_by,
        "max_model_len": ctx.engine.info.context_length,
    }


def _render_chat(ctx: ServingContext, req: ChatCompletionRequest) -> list[int]:
    if not ctx.engine.info.has_chat_template:
        raise InvalidRequest("this model has no chat template; use /v1/completions", param="messages")
    try:
        return ctx.engine.apply_chat_template(
            tr.to_template_messages(req.messages), tools=req.tools, template_kwargs=req.chat_template_kwargs
        )
    except InvalidRequest:
        raise
    except Exception as exc:  # jinja raises on conversations the template refuses
        raise InvalidRequest(f"the chat template rejected these messages: {exc}", param="messages") from None


def _generation(ctx: ServingContext, req, prompt: list[int]) -> GenerationRequest:
    sampling = tr.resolve_sampling(
        req, ctx.config, prompt_len=len(prompt),
        context_length=ctx.engine.info.context_length, vocab_size=ctx.engine.info.vocab_size,
    )
    return GenerationRequest(prompt_tokens=prompt, sampling=sampling, stream_interval=ctx.config.stream_interval)


async def _fold(ctx: ServingContext, request: Request, gen: GenerationRequest) -> tr.Folded:
    events = ctx.engine.generate(gen)

    async def fold() -> tr.Folded:
        folded = tr.Folded()
        try:
            async with asyncio.timeout(ctx.config.timeout):
                async for event in events:
                    folded.add(event)
        finally:
            gen.cancelled.set()  # also when cancelled before the first event
        return folded

    try:
        folded = await unless_disconnected(request, fold())
    except TimeoutError:
        raise RequestTimeout(f"the request took longer than {ctx.config.timeout:g} s", code="timeout") from None
    except ClientDisconnected:
        log_event(logger, "request.disconnected", request_id=gen.request_id)
        raise
    if folded.finish is None or folded.finish.reason == "error":
        raise EngineFailure(folded.finish.error if folded.finish else "generation ended without a result")
    return folded


def _stream(
    ctx: ServingContext,
    gen: GenerationRequest,
    req,
    *,
    first: dict | None,
    delta: Callable[[str], dict],
    end: Callable[[str], dict],
    usage: Callable[[Usage], dict],
) -> StreamingResponse:
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    events = ctx.engine.generate(gen)  # admission (503) happens before the 200 goes out

    async def body() -> AsyncIterator[str]:
        try:
            if first is not None:
                yield sse_data(first)
            async with asyncio.timeout(ctx.config.timeout):
                async for event in events:
                    if isinstance(event, TextDelta):
                        yield sse_data(delta(event.text))
                    elif isinstance(event, Finished):
                        if event.reason == "error":
                            yield sse_data(error_body(event.error or "generation failed", "server_error"))
                            break
                        yield sse_data(end(tr.finish_reason(event.reason)))
                        if include_usage:
                            yield sse_data(usage(event.usage))
        except TimeoutError:
            msg = f"the request took longer than {ctx.config.timeout:g} s"
            yield sse_data(error_body(msg, "timeout_error", code="timeout"))
        finally:
            gen.cancelled.set()  # a disconnect may come before the stream was ever read
            await events.aclose()
        yield DONE

    return StreamingResponse(body(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
