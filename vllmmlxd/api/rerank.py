"""``POST /v1/rerank`` (also ``/rerank`` and ``/v2/rerank``) and ``POST /v1/score`` over the
worker's reranking model, in the shapes vLLM serves them.

Rerank is the Cohere/Jina request Open WebUI, LangChain and Dify send: ``query``,
``documents`` (strings, or objects with ``text``), ``top_n`` (absent or 0: every document)
and ``return_documents``, which defaults to true as in vLLM (which always returns the text)
and Jina (Cohere's default is false; Open WebUI reads only ``index`` and ``relevance_score``).
Results come sorted by score, highest first, ties in input order. Score is vLLM's:
``text_1`` and ``text_2``, each a string or a list; one ``text_1`` is paired with every
``text_2``, else the two lists pair up item by item.

Everything is checked before anything runs. Documents past the model's limit beside the
query are cut at their end unless the request sends ``truncate: false`` (then a 400 names
the document); a query that leaves no room is a 400 either way.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np
from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request

from ..engine.rerank.rerank_types import Pair, Reranker
from ..errors import InvalidRequest, ModelNotFound
from .body import read_json, unless_disconnected, validate
from .context import LiveContext, ServingContext

MAX_DOCUMENTS = 1000  # per request (Cohere's bound); pairs of one /v1/score request likewise
_DOCUMENT = "documents must be a list of strings or of objects with a text string"


class RerankRequest(BaseModel):
    model_config = ConfigDict(extra="allow")  # lenient, as the other requests

    model: str | None = None
    query: str
    documents: list[Any]
    top_n: int | None = Field(None, ge=0, description="the best N results only; absent or 0: all")
    return_documents: bool = True
    truncate: bool | None = Field(None, description="cut documents past the model's limit (the default)")
    truncation: bool | None = Field(None, description="the same as truncate, as Voyage and Jina name it")

    def cuts(self) -> bool:
        return next((v for v in (self.truncate, self.truncation) if v is not None), True)


class ScoreRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    text_1: str | list[str]
    text_2: str | list[str]
    truncate: bool = True


def parse_documents(value: list[Any]) -> list[str]:
    """The documents' texts; InvalidRequest naming the first that is neither a string nor ``{"text": str}``."""
    if not value:
        raise InvalidRequest("documents must not be empty", param="documents")
    if len(value) > MAX_DOCUMENTS:
        raise InvalidRequest(
            f"documents has {len(value)} items; at most {MAX_DOCUMENTS} per request", param="documents"
        )
    texts = []
    for i, doc in enumerate(value):
        if isinstance(doc, dict) and isinstance(doc.get("text"), str):
            doc = doc["text"]
        if not isinstance(doc, str):
            raise InvalidRequest(f"documents[{i}]: {_DOCUMENT}", param=f"documents.{i}")
        texts.append(doc)
    return texts


def ranking(scores: np.ndarray | list[float], top_n: int | None) -> list[int]:
    """Document indices by score, highest first (ties in input order), the first ``top_n`` (0 or None: all)."""
    order = sorted(range(len(scores)), key=lambda i: (-float(scores[i]), i))
    return order[:top_n] if top_n else order


def rerank_body(
    rid: str, model: str, texts: list[str], scores: np.ndarray, top_n: int | None, with_text: bool, tokens: int
) -> dict[str, Any]:
    """vLLM's (and Cohere's) rerank response."""
    results = []
    for i in ranking(scores, top_n):
        result: dict[str, Any] = {"index": i, "relevance_score": float(scores[i])}
        if with_text:
            result["document"] = {"text": texts[i]}
        results.append(result)
    return {"id": rid, "model": model, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}, "results": results}


def score_groups(text_1: str | list[str], text_2: str | list[str]) -> list[tuple[str, list[int]]]:
    """vLLM's pairing of ``text_1`` with ``text_2``, as (query, the ``text_2`` indices it is paired
    with) per distinct query, so each query is tokenized once."""
    firsts = [text_1] if isinstance(text_1, str) else list(text_1)
    seconds = [text_2] if isinstance(text_2, str) else list(text_2)
    if not firsts or not seconds:
        raise InvalidRequest("text_1 and text_2 must not be empty", param="text_1" if not firsts else "text_2")
    if len(firsts) > 1 and len(firsts) != len(seconds):
        raise InvalidRequest(
            f"text_1 has {len(firsts)} items and text_2 {len(seconds)}: give one text_1, or as many as text_2",
            param="text_1",
        )
    if len(seconds) > MAX_DOCUMENTS:
        raise InvalidRequest(f"text_2 has {len(seconds)} items; at most {MAX_DOCUMENTS} per request", param="text_2")
    groups: dict[str, list[int]] = {}
    for j in range(len(seconds)):
        groups.setdefault(firsts[0] if len(firsts) == 1 else firsts[j], []).append(j)
    return list(groups.items())


def score_body(rid: str, model: str, scores: np.ndarray, tokens: int, created: int) -> dict[str, Any]:
    """vLLM's score response: one ``score`` per pair, in ``text_2``'s order."""
    return {
        "id": rid,
        "object": "list",
        "created": created,
        "model": model,
        "data": [{"index": i, "object": "score", "score": float(s)} for i, s in enumerate(scores)],
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0},
    }


def reranker_for(ctx: ServingContext, requested: str | None) -> Reranker:
    """The entry's reranking model; under ``strict_model_name`` the request must name it or the entry."""
    reranker = getattr(ctx.engine, "reranker", None)
    if reranker is None:
        raise ModelNotFound(f"{ctx.name!r} serves no reranking model; a reranker is an entry of its own")
    names = ctx.names() | {reranker.info.name, reranker.info.source}
    if requested and ctx.config.strict_model_name and requested not in names:
        raise ModelNotFound(f"model {requested!r} is not served here; this server reranks with {ctx.name!r}")
    return reranker


def make_router(live: LiveContext) -> APIRouter:
    router = APIRouter()

    async def rerank(request: Request) -> dict[str, Any]:
        ctx = live.capture(request)
        req = validate(RerankRequest, await read_json(request, ctx.max_body_bytes))
        reranker = reranker_for(ctx, req.model)
        texts = parse_documents(req.documents)
        pairs = await asyncio.to_thread(reranker.make_pairs, req.query, texts, truncate=req.cuts())
        rid = ctx.request_id(request, "rerank-")
        scores = await unless_disconnected(request, reranker.score(pairs))
        tokens = sum(len(p) for p in pairs)
        return rerank_body(rid, ctx.name, texts, scores, req.top_n, req.return_documents, tokens)

    async def score(request: Request) -> dict[str, Any]:
        ctx = live.capture(request)
        req = validate(ScoreRequest, await read_json(request, ctx.max_body_bytes))
        reranker = reranker_for(ctx, req.model)
        seconds = [req.text_2] if isinstance(req.text_2, str) else req.text_2
        pairs: list[Pair | None] = [None] * len(seconds)
        for query, indices in score_groups(req.text_1, req.text_2):
            made = await asyncio.to_thread(
                reranker.make_pairs, query, [seconds[j] for j in indices], truncate=req.truncate
            )
            for j, pair in zip(indices, made):
                pairs[j] = pair
        ready = [p for p in pairs if p is not None]
        rid = ctx.request_id(request, "score-")
        scores = await unless_disconnected(request, reranker.score(ready))
        return score_body(rid, ctx.name, scores, sum(len(p) for p in ready), int(time.time()))

    # response_model=None: a dict is sent as built, not validated against the return annotation.
    for path in ("/v1/rerank", "/rerank", "/v2/rerank"):
        router.add_api_route(path, rerank, methods=["POST"], response_model=None)
    for path in ("/v1/score", "/score"):
        router.add_api_route(path, score, methods=["POST"], response_model=None)
    return router
