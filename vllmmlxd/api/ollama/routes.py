"""Ollama's API on a worker, under ``/ollama/api/...``: chat, generate, embed and embeddings, show,
and this model's line of ps.

The prefix keeps Ollama's paths apart from everything else a worker or the gateway answers (the
gateway's main port has its own ``/api/*``, the web page's); the gateway's Ollama listener takes
Ollama's own paths and forwards them here. Auth and rate limits are the router's dependencies
(worker/app.py); errors are Ollama's ``{"error": "..."}`` (``http.error_shapes``, by the prefix).
Chat and generate are translated into a neutral turn (``translate.py``) and served by
``api.chat.serve_chat``, so tools, structured output, reasoning, stop strings, the MCP loop and
keys behave as in the other families; a raw generate is a completion of its prompt as written.

``keep_alive`` is handed to the worker's ``Activity``: the daemon reads it with the idle time and
unloads a lazy model after that long (``0``: once the request is done).
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import Response

from ...engine.embeddings.embedding_types import Embedder
from ...errors import InvalidRequest
from ...http.activity import Activity, idle_limit
from ...store.weights import folder_weights
from ..body import read_json, unless_disconnected, validate
from ..chat import serve_chat
from ..context import LiveContext, ServingContext, owner_of, shown_source
from ..openai.embeddings import embedder_for, fit_lengths, parse_input
from ..prompt import make_generation
from ..stream import fold, stream
from ..structured import ensure_valid
from . import describe
from . import translate as tr
from .encode import NS, ChatEncoding, Clock, GenerateEncoding, created_at, load_answer
from .protocol import ChatRequest, EmbeddingsRequest, EmbedRequest, GenerateRequest, ShowRequest

PREFIX = "/ollama"


def model_of(ctx: ServingContext) -> tr.Model:
    return tr.Model(ctx.name, ctx.engine.info.reasoning)


def facts_of(ctx: ServingContext) -> describe.Facts:
    """What ``show`` and ``ps`` describe, read from the entry, the engine and the model's folder
    (small files: its config.json, the sizes of its weights)."""
    info, config = ctx.engine.info, ctx.config
    folder = Path(info.source)
    try:
        model_config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        model_config = {}
    model_config = model_config if isinstance(model_config, dict) else {}
    quant = model_config.get("quantization")
    weights = folder_weights(folder, cpu=False) if folder.is_dir() else None
    embeds_only = bool(getattr(ctx.engine, "embeddings_only", False))
    template = getattr(getattr(ctx.engine, "tokenizer", None), "chat_template", None)
    parameters = [("temperature", config.default_temperature), ("top_p", config.default_top_p)]
    parameters += [("num_predict", config.max_tokens), ("num_ctx", info.context_length)]
    return describe.Facts(
        name=ctx.name,
        source=shown_source(info.source),
        context_length=info.context_length,
        template=template if isinstance(template, str) else None,
        family=str(model_config.get("model_type") or ""),
        quantization_bits=quant.get("bits") if isinstance(quant, dict) else None,
        size_bytes=(weights.nbytes or 0) if weights is not None else 0,
        capabilities=describe.capabilities(
            generates=not embeds_only,
            tools=info.tool_parser is not None,
            thinking=info.reasoning,
            vision=info.vision,
            embeds=ctx.embedder is not None,
        ),
        parameters=tuple((k, v) for k, v in parameters if v is not None),
        started=ctx.started,
    )


def make_router(live: LiveContext, activity: Activity | None = None) -> APIRouter:  # noqa: C901 - a factory: its count is the routes it defines, each simple
    """The routes, each reading the settings its request started under (``live.capture``);
    ``activity``: where a request's ``keep_alive`` goes (the worker's idle figures)."""
    router = APIRouter()

    def keep_alive(value: float | str | None) -> float | None:
        """The request's ``keep_alive`` (None: not said, the entry's idle_unload_s applies again)."""
        seconds = tr.keep_alive_s(value)
        if activity is not None:
            activity.keep_alive(seconds)
        return seconds

    def clock(request: Request) -> Clock:
        return Clock(time.monotonic(), lambda: getattr(request.state, "progress", None))

    # response_model=None: a dict is sent as built, not validated against the return annotation.
    @router.post(PREFIX + "/api/chat", response_model=None)
    async def chat(request: Request) -> Response | dict[str, Any]:
        started = clock(request)
        ctx = live.capture(request)
        req = validate(ChatRequest, await read_json(request, ctx.max_body_bytes))
        ctx.check_model(req.model)
        turn = tr.chat_turn(req, model_of(ctx))
        seconds = keep_alive(req.keep_alive)
        name = req.model or ctx.name
        if not req.messages:  # Ollama's way to load a model, or with keep_alive 0 to unload it
            return load_answer(name, chat=True, unload=seconds == 0)
        return await serve_chat(ctx, request, turn, ChatEncoding(name, started))

    @router.post(PREFIX + "/api/generate", response_model=None)
    async def generate(request: Request) -> Response | dict[str, Any]:
        started = clock(request)
        ctx = live.capture(request)
        req = validate(GenerateRequest, await read_json(request, ctx.max_body_bytes))
        ctx.check_model(req.model)
        model = model_of(ctx)
        if req.raw:
            tr.refuse_generate_fields(req)
            sampling, output = tr.request_sampling(req), tr.output_format(req.format)
        else:
            turn = tr.generate_turn(req, model)
        seconds = keep_alive(req.keep_alive)
        name = req.model or ctx.name
        if not req.prompt:
            return load_answer(name, chat=False, unload=seconds == 0)
        encoding = GenerateEncoding(name, started)
        if not req.raw:
            return await serve_chat(ctx, request, turn, encoding)
        # The prompt as written: no template, no reasoning parser (nothing opened a <think>).
        tokens = await asyncio.to_thread(ctx.engine.tokenize, req.prompt)
        rid = ctx.request_id(request, tr.ID_PREFIX)
        gen = await make_generation(ctx, sampling, tokens, rid, reasoning=False, output=output, owner=owner_of(request))
        if req.streamed:
            return stream(ctx, request, gen, encoding.stream_encoder(rid, len(tokens)))
        folded = await fold(ctx, request, gen)
        assert folded.finish is not None  # fold raises when the generation did not finish
        ensure_valid(output, folded.text, folded.finish.reason)
        return encoding.response(rid, folded)

    async def vectors(
        request: Request, ctx: ServingContext, model: str | None, texts: list[str], truncate: bool
    ) -> tuple[Embedder, np.ndarray, int]:
        """The embedding model's vectors for ``texts`` and the tokens they took."""
        embedder = embedder_for(ctx, None if model in ctx.names() else model)
        token_lists = await asyncio.to_thread(embedder.tokenize, texts)
        token_lists = fit_lengths(token_lists, embedder.info.max_tokens, truncate=truncate, special_end=True)
        ctx.request_id(request, "embd-")
        out = await unless_disconnected(request, embedder.embed(token_lists))
        return embedder, out, sum(len(ids) for ids in token_lists)

    @router.post(PREFIX + "/api/embed", response_model=None)
    async def embed(request: Request) -> dict[str, Any]:
        started = time.monotonic()
        ctx = live.capture(request)
        req = validate(EmbedRequest, await read_json(request, ctx.max_body_bytes))
        texts, _ = parse_input(req.input)
        assert texts is not None  # the protocol takes strings only
        keep_alive(req.keep_alive)
        embedder, out, used = await vectors(request, ctx, req.model, texts, req.truncate)
        if req.dimensions is not None and req.dimensions != embedder.info.dimensions:
            raise InvalidRequest(
                f"dimensions: {embedder.info.name} makes {embedder.info.dimensions}-dimension vectors and cannot "
                "shorten them (it was not trained for it)",
                param="dimensions",
            )
        rows = [np.asarray(v, dtype=np.float32) for v in out]
        if not embedder.info.normalized:  # Ollama's /api/embed answers unit vectors
            rows = [v / max(float(np.linalg.norm(v)), 1e-12) for v in rows]
        return {
            "model": req.model or ctx.name,
            "embeddings": [v.tolist() for v in rows],
            "total_duration": int((time.monotonic() - started) * NS),
            "load_duration": 0,
            "prompt_eval_count": used,
        }

    @router.post(PREFIX + "/api/embeddings", response_model=None)
    async def embeddings(request: Request) -> dict[str, Any]:
        ctx = live.capture(request)
        req = validate(EmbeddingsRequest, await read_json(request, ctx.max_body_bytes))
        keep_alive(req.keep_alive)
        if not req.prompt:  # as Ollama answers an empty prompt
            embedder_for(ctx, None if req.model in ctx.names() else req.model)
            return {"embedding": []}
        _, out, _ = await vectors(request, ctx, req.model, [req.prompt], True)
        return {"embedding": np.asarray(out[0], dtype=np.float32).tolist()}

    @router.post(PREFIX + "/api/show", response_model=None)
    async def show(request: Request) -> dict[str, Any]:
        ctx = live.capture(request)
        req = validate(ShowRequest, await read_json(request, ctx.max_body_bytes))
        ctx.check_model(req.model or req.name)
        return describe.show_body(await asyncio.to_thread(facts_of, ctx))

    @router.get(PREFIX + "/api/tags", response_model=None)
    async def tags(request: Request) -> dict[str, Any]:
        """This worker's models: a worker alone is an Ollama endpoint for its model (``/ollama`` as the host)."""
        ctx = live.capture(request)
        facts = await asyncio.to_thread(facts_of, ctx)
        when = created_at(ctx.started)
        models = [describe.tag_entry(ctx.name, when, size=facts.size_bytes, family=facts.family, source=facts.source)]
        embedder = ctx.embedder
        if embedder is not None and embedder.info.name != ctx.name:
            models.append(
                describe.tag_entry(embedder.info.name, when, family="bert", source=shown_source(embedder.info.source))
            )
        return {"models": models}

    @router.get(PREFIX + "/api/version", response_model=None)
    async def version() -> dict[str, Any]:
        return {"version": describe.OLLAMA_VERSION}

    @router.get(PREFIX + "/api/ps", response_model=None)
    async def ps(request: Request) -> dict[str, Any]:
        ctx = live.capture(request)
        facts = await asyncio.to_thread(facts_of, ctx)
        limit, idle = None, 0.0
        if ctx.config.load == "lazy" and activity is not None:  # an eager model stays loaded
            limit, idle = idle_limit(ctx.config.idle_unload_s, activity.keep_alive_s), activity.idle_s()
        return {"models": [describe.ps_line(facts, describe.expires_at(limit, idle))]}

    return router
