"""OpenAI-compatible routes: chat and text completions (streamed or not), models.

Auth and rate limits are the router's dependencies (worker/app.py), so no handler can forget
them. A chat request is translated into a neutral turn (``translate.to_turn``) and served by
``api.chat.serve_chat``; both response kinds read the same engine events: a stream encodes
them (``encode.py``), a whole response is their fold (``api.stream``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import Response

from ...engine.types import GenerationRequest
from ...errors import InvalidRequest, ModelNotFound
from ..body import read_json, validate
from ..chat import serve_chat
from ..choices import Choices, choice_requests
from ..context import LiveContext, ServingContext, owner_of
from ..prompt import make_generation
from ..stream import Generation, fold, stream
from . import encode
from . import translate as tr
from .echo import Echoed
from .protocol import ChatCompletionRequest, CompletionRequest


def make_router(live: LiveContext) -> APIRouter:
    """The routes, each reading the settings its request started under (``live.capture``)."""
    router = APIRouter()

    # response_model=None: a dict is sent as built, not validated against the return annotation.
    @router.get("/v1/models", response_model=None)
    async def list_models(request: Request) -> dict[str, Any]:
        return {"object": "list", "data": _model_cards(live.capture(request))}

    @router.get("/v1/models/{model_id:path}", response_model=None)
    async def get_model(model_id: str, request: Request) -> dict[str, Any]:
        ctx = live.capture(request)
        cards = _model_cards(ctx)
        if model_id in ctx.names():
            return cards[0]
        for card in cards[1:]:  # the entry's embedding model, by its own name
            if card["id"] == model_id:
                return card
        raise ModelNotFound(f"model {model_id!r} is not served here; this server serves {ctx.name!r}")

    @router.post("/v1/chat/completions", response_model=None)
    async def chat_completions(request: Request) -> Response | dict[str, Any]:
        ctx = live.capture(request)
        req = validate(ChatCompletionRequest, await read_json(request, ctx.max_body_bytes))
        ctx.check_model(req.model)
        turn = await asyncio.to_thread(tr.to_turn, req)  # a file part's text (a PDF's) is CPU work
        return await serve_chat(
            ctx,
            request,
            turn,
            encode.ChatEncoding(
                int(time.time()),
                ctx.name,
                tr.include_usage(req),
                encode.LogprobsAsked(bool(req.logprobs), req.return_tokens_as_token_ids),
                req.n,
            ),
        )

    @router.post("/v1/completions", response_model=None)
    async def completions(request: Request) -> Response | dict[str, Any]:
        ctx = live.capture(request)
        req = validate(CompletionRequest, await read_json(request, ctx.max_body_bytes))
        ctx.check_model(req.model)
        return await serve_completion(ctx, request, req)

    return router


def _model_cards(ctx: ServingContext) -> list[dict]:
    """The entry's model, then its embedding model when it has one beside a generation model
    (an embeddings-only entry is one model, under the entry's name)."""
    cards = [
        {
            "id": ctx.name,
            "object": "model",
            "created": int(ctx.started),
            "owned_by": ctx.config.owned_by,
            "max_model_len": ctx.engine.info.context_length,
            "vision": ctx.engine.info.vision,  # an extension: the model takes images
        }
    ]
    embedder = ctx.embedder
    if embedder is not None and not getattr(ctx.engine, "embeddings_only", False):
        card = {**cards[0], "id": embedder.info.name, "max_model_len": embedder.info.max_tokens, "vision": False}
        cards.append(card)
    return cards


async def serve_completion(ctx: ServingContext, request: Request, req: CompletionRequest) -> Response | dict[str, Any]:
    """A text completion: the prompt (a suffix's fill-in-the-middle form around it), echoed first
    when asked, in n choices, streamed or whole."""
    tr.refuse_unhonoured(req)
    sent = tr.completion_prompt(req)
    prompt = tr.completion_text(req, sent, ctx.config.fim, ctx.engine.info.fim)
    tokens = await asyncio.to_thread(ctx.engine.tokenize, prompt) if isinstance(prompt, str) else prompt
    if any(not 0 <= t < ctx.engine.info.vocab_size for t in tokens):
        raise InvalidRequest("prompt token ids must be inside the vocabulary", param="prompt")
    rid = ctx.request_id(request, "cmpl-")
    gen = await make_generation(ctx, tr.sampling_request(req), tokens, rid, reasoning=False, owner=owner_of(request))
    created = int(time.time())
    asked = encode.LogprobsAsked(req.logprobs is not None, req.return_tokens_as_token_ids)
    wrap: Callable[[Generation], Generation] = lambda one: one  # noqa: E731 - the identity, replaced for echo
    if req.echo:  # the prompt first, with its log-probabilities when asked (from a pass of its own)
        gen.prompt_logprobs = req.logprobs
        text = sent if isinstance(sent, str) else await asyncio.to_thread(ctx.engine.detokenize, tokens)

        def wrap(one: Generation) -> Generation:
            assert isinstance(one, GenerationRequest)
            return Echoed(ctx, one, text, written=req.max_tokens != 0)

    served = Choices(ctx, choice_requests(gen, req.n), wrap) if req.n > 1 else wrap(gen)
    if not req.stream:
        return encode.completion_response(rid, created, ctx.name, await fold(ctx, request, served), asked)
    encoder = encode.CompletionStreamEncoder(rid, created, ctx.name, tr.include_usage(req), asked.as_ids)
    if req.n > 1:
        each = [encode.CompletionStreamEncoder(rid, created, ctx.name, False, asked.as_ids, i) for i in range(req.n)]
        return stream(ctx, request, served, encode.ChoicesStreamEncoder(each, encoder))
    return stream(ctx, request, served, encoder)
