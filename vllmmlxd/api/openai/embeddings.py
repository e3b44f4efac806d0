"""OpenAI's ``POST /v1/embeddings`` over the worker's embedding model.

The input is checked here, whole, before any of it runs: a string, a list of strings, a list
of token ids or a list of lists of token ids; no empty input anywhere (OpenAI refuses an
empty string too: it has no meaning as a sentence, and a vector for it would be the
padding's); token ids inside the model's vocabulary, used as given (no [CLS]/[SEP] added:
send them if you want what the text would get). An input longer than the model's limit is
a 400 unless the request sets ``truncate: true``, which keeps its start (as
sentence-transformers does). ``dimensions`` is refused unless it is the model's own size:
these models were not trained to be cut. ``encoding_format: base64`` is the vector's
little-endian float32 bytes, as the official SDK expects (it asks for base64 by default).
"""

from __future__ import annotations

import asyncio
import base64
from typing import Any, Literal

import numpy as np
from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request

from ...engine.embeddings.embedding_types import Embedder
from ...errors import ContextLengthExceeded, InvalidRequest, ModelNotFound
from ..body import read_json, unless_disconnected, validate
from ..context import LiveContext, ServingContext

MAX_INPUTS = 2048  # OpenAI's bound on inputs per request
_SHAPE = "input must be a string, a list of strings, a list of token ids or a list of lists of token ids"


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="allow")  # lenient, as the other OpenAI requests

    input: Any = Field(..., description="a string, a list of strings, token ids or lists of token ids")
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1)
    user: str | None = None
    truncate: bool = Field(False, description="cut inputs longer than the model's limit instead of refusing them")


def make_router(live: LiveContext) -> APIRouter:
    router = APIRouter()

    # response_model=None: a dict is sent as built, not validated against the return annotation.
    @router.post("/v1/embeddings", response_model=None)
    async def embeddings(request: Request) -> dict[str, Any]:
        ctx = live.capture(request)
        req = validate(EmbeddingRequest, await read_json(request, ctx.max_body_bytes))
        embedder = embedder_for(ctx, req.model)
        info = embedder.info
        if req.dimensions is not None and req.dimensions != info.dimensions:
            raise InvalidRequest(
                f"dimensions: {info.name} makes {info.dimensions}-dimension vectors and cannot "
                f"shorten them (it was not trained for it); omit dimensions or send {info.dimensions}",
                param="dimensions",
            )
        texts, token_lists = parse_input(req.input)
        if texts is not None:
            token_lists = await asyncio.to_thread(embedder.tokenize, texts)
        else:
            assert token_lists is not None  # the input is texts or token ids
            for i, ids in enumerate(token_lists):
                if any(not 0 <= t < info.vocab_size for t in ids):
                    raise InvalidRequest(
                        f"input[{i}]: token ids must be inside the vocabulary (0..{info.vocab_size - 1})", param="input"
                    )
        token_lists = fit_lengths(token_lists, info.max_tokens, truncate=req.truncate, special_end=texts is not None)
        ctx.request_id(request, "embd-")
        vectors = await unless_disconnected(request, embedder.embed(token_lists))
        used = sum(len(ids) for ids in token_lists)
        return {
            "object": "list",
            "data": [
                {"object": "embedding", "index": i, "embedding": encode_vector(v, req.encoding_format)}
                for i, v in enumerate(vectors)
            ],
            "model": _model_name(ctx, embedder),
            "usage": {"prompt_tokens": used, "total_tokens": used},
        }

    return router


def _embeddings_only(ctx: ServingContext) -> bool:
    """An entry whose model is the embedding model (its engine generates nothing)."""
    return bool(getattr(ctx.engine, "embeddings_only", False))


def embedder_for(ctx: ServingContext, requested: str | None) -> Embedder:
    """The entry's embedding model; under ``strict_model_name`` the request must name it
    (or, for an embeddings-only entry, the entry)."""
    embedder = ctx.embedder
    if embedder is None:
        raise ModelNotFound(f"{ctx.name!r} serves no embedding model; its entry can set embedding_model")
    if requested and ctx.config.strict_model_name:
        names = {embedder.info.name, embedder.info.source}
        if _embeddings_only(ctx):
            names |= ctx.names()
        if requested not in names:
            raise ModelNotFound(
                f"model {requested!r} is not served here; this server embeds with {embedder.info.name!r}"
            )
    return embedder


def _model_name(ctx: ServingContext, embedder: Embedder) -> str:
    return ctx.name if _embeddings_only(ctx) else embedder.info.name


def parse_input(value: Any) -> tuple[list[str] | None, list[list[int]] | None]:
    """(texts, None) or (None, token lists); InvalidRequest naming what is wrong."""
    if isinstance(value, str):
        value = [value]
    elif not isinstance(value, list):
        raise InvalidRequest(_SHAPE, param="input")
    if not value:
        raise InvalidRequest("input must not be empty", param="input")
    if all(_is_id(t) for t in value):  # one input given as token ids
        value = [value]
    if len(value) > MAX_INPUTS:
        raise InvalidRequest(f"input has {len(value)} items; at most {MAX_INPUTS} per request", param="input")
    if all(isinstance(v, str) for v in value):
        for i, text in enumerate(value):
            if not text:
                raise InvalidRequest(f"input[{i}] is an empty string; every input must have text", param="input")
        return list(value), None
    if all(isinstance(v, list) and all(_is_id(t) for t in v) for v in value):
        for i, ids in enumerate(value):
            if not ids:
                raise InvalidRequest(f"input[{i}] is an empty list of token ids", param="input")
        return None, [list(v) for v in value]
    raise InvalidRequest(_SHAPE + " (items of one kind)", param="input")


def _is_id(t: Any) -> bool:
    return isinstance(t, int) and not isinstance(t, bool)


def fit_lengths(token_lists: list[list[int]], limit: int, *, truncate: bool, special_end: bool) -> list[list[int]]:
    """Inputs within ``limit`` tokens: refused (400) past it, or cut when ``truncate``.

    A tokenized text ends with its separator token: a cut text keeps it, as the tokenizer's
    own truncation would. Token-id inputs are cut as they are.
    """
    out = []
    for i, ids in enumerate(token_lists):
        if len(ids) > limit:
            if not truncate:
                raise ContextLengthExceeded(
                    f"input[{i}] is {len(ids)} tokens; this model takes at most {limit} "
                    "(send truncate: true to cut longer inputs to that)",
                    param="input",
                )
            ids = ids[: limit - 1] + ids[-1:] if special_end else ids[:limit]
        out.append(ids)
    return out


def encode_vector(vector: np.ndarray, encoding_format: str) -> list[float] | str:
    if encoding_format == "base64":
        return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")
    return np.asarray(vector, dtype=np.float32).tolist()
