"""The model's tokenizer over HTTP, in vLLM's words: ``POST /tokenize`` (a prompt, or chat
messages through the template), ``POST /detokenize`` and ``GET /tokenizer_info``. Evaluation
harnesses count and cut prompts in the served model's own tokens with them
(lm-evaluation-harness finds them by itself and then needs no tokenizer of its own)."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter
from pydantic import Field
from starlette.requests import Request

from ..errors import InvalidRequest
from .body import read_json, validate
from .context import LiveContext
from .openai.protocol import ChatMessage, _Lenient
from .openai.translate import to_template_messages


class TokenizeRequest(_Lenient):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True


class DetokenizeRequest(_Lenient):
    model: str | None = None
    tokens: list[int] = Field(max_length=1_000_000)


def make_router(live: LiveContext) -> APIRouter:
    router = APIRouter()

    @router.post("/tokenize", response_model=None)
    async def tokenize(request: Request) -> dict[str, Any]:
        ctx = live.capture(request)
        req = validate(TokenizeRequest, await read_json(request, ctx.max_body_bytes))
        ctx.check_model(req.model)
        if (req.prompt is None) == (req.messages is None):
            raise InvalidRequest("send a prompt or messages", param="prompt")
        if req.prompt is not None:
            tokens = await asyncio.to_thread(ctx.engine.tokenize, req.prompt, add_special_tokens=req.add_special_tokens)
        else:
            messages = to_template_messages(req.messages or [])
            tokens = await asyncio.to_thread(ctx.engine.apply_chat_template, messages)
        return {"count": len(tokens), "max_model_len": ctx.engine.info.context_length, "tokens": tokens}

    @router.post("/detokenize", response_model=None)
    async def detokenize(request: Request) -> dict[str, Any]:
        ctx = live.capture(request)
        req = validate(DetokenizeRequest, await read_json(request, ctx.max_body_bytes))
        ctx.check_model(req.model)
        if any(not 0 <= t < ctx.engine.info.vocab_size for t in req.tokens):
            raise InvalidRequest("token ids must be inside the vocabulary", param="tokens")
        return {"prompt": await asyncio.to_thread(ctx.engine.detokenize, req.tokens)}

    @router.get("/tokenizer_info", response_model=None)
    async def tokenizer_info(request: Request) -> dict[str, Any]:
        ctx = live.capture(request)
        return {"model_max_length": ctx.engine.info.context_length, **ctx.engine.tokenizer_info()}

    return router
