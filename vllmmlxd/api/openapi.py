"""An honest OpenAPI description of a worker's public app, built though its docs routes are off.

The routes read their bodies themselves (``api.body``), so FastAPI's own description has no
request bodies and only the statuses it can see. This one takes the bodies from the protocol
models and lists what each route really answers, errors in its family's shape, and the keys it
asks for. It is never served (``openapi_url`` stays None): tests and fuzzers read ``app.openapi()``.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from ..http.error_shapes import OLLAMA_PREFIX
from .anthropic.protocol import CountTokensRequest, MessagesRequest
from .ollama.protocol import ChatRequest, EmbeddingsRequest, EmbedRequest, GenerateRequest, ShowRequest
from .openai.embeddings import EmbeddingRequest
from .openai.protocol import ChatCompletionRequest, CompletionRequest
from .rerank import RerankRequest, ScoreRequest

BODIES: dict[str, type[BaseModel]] = {
    "/v1/chat/completions": ChatCompletionRequest,
    "/v1/completions": CompletionRequest,
    "/v1/messages": MessagesRequest,
    "/v1/messages/count_tokens": CountTokensRequest,
    "/v1/embeddings": EmbeddingRequest,
    "/v1/rerank": RerankRequest,
    "/rerank": RerankRequest,
    "/v2/rerank": RerankRequest,
    "/v1/score": ScoreRequest,
    "/score": ScoreRequest,
    "/ollama/api/chat": ChatRequest,
    "/ollama/api/generate": GenerateRequest,
    "/ollama/api/embed": EmbedRequest,
    "/ollama/api/embeddings": EmbeddingsRequest,
    "/ollama/api/show": ShowRequest,
}
STREAMED = {"/v1/chat/completions", "/v1/completions", "/v1/messages"}  # "stream": true answers SSE
NDJSON = {"/ollama/api/chat", "/ollama/api/generate"}  # streamed (Ollama's default): one JSON object a line
ANTHROPIC_PREFIX = "/v1/messages"  # the family rule of api.errors.is_anthropic

# Reading and validating a body: a bad value, no such model (strict names), too large, not JSON,
# and not said to be JSON (http.browser: a page could send it without a preflight).
BODY = (400, 404, 413, 415, 422)
# Running a generation: the engine queue is full, the request ran past the timeout.
GENERATE = (503, 504)
EXTRA: dict[tuple[str, str], tuple[int, ...]] = {
    ("POST", "/v1/chat/completions"): BODY + GENERATE,
    ("POST", "/v1/completions"): BODY + GENERATE,
    ("POST", "/v1/messages"): BODY + GENERATE,
    ("POST", "/v1/messages/count_tokens"): BODY,
    ("POST", "/ollama/api/chat"): BODY + GENERATE,
    ("POST", "/ollama/api/generate"): BODY + GENERATE,
    ("GET", "/v1/models/{model_id}"): (404,),
    # A stored response that is not there (or not the caller's); input_items' order may be wrong.
    ("GET", "/v1/responses/{response_id}"): (404,),
    ("DELETE", "/v1/responses/{response_id}"): (404,),
    ("GET", "/v1/responses/{response_id}/input_items"): (400, 404),
    ("GET", "/health"): (503,),  # degraded: work waits on a silent engine thread
    ("GET", "/metrics"): (404,),  # metrics switched off: as if the route did not exist
}
# The speech upload routes (api/openai/audio.py): a multipart form, not JSON; a full queue is a 503.
UPLOADS = {"/v1/audio/transcriptions", "/v1/audio/translations"}
EXTRA.update({("POST", path): (*BODY, 503) for path in UPLOADS})
UPLOAD_FORM = {
    "type": "object",
    "required": ["file"],
    "properties": {
        "file": {"type": "string", "format": "binary"},
        **{name: {"type": "string"} for name in ("model", "language", "prompt", "response_format")},
        "temperature": {"type": "number", "minimum": 0, "maximum": 1},
        "timestamp_granularities[]": {"type": "array", "items": {"type": "string", "enum": ["segment", "word"]}},
        "stream": {"type": "boolean"},
    },
}
# Anthropic has no 422 (a 400 there) and says "overloaded" with 529 (api.errors.render_error); nor has Ollama.
ANTHROPIC_STATUS = {422: 400, 503: 529}
OLLAMA_STATUS = {422: 400}

SECURITY_SCHEMES = {
    "bearer": {"type": "http", "scheme": "bearer"},
    "apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key"},
}
_NULLABLE_STR = {"anyOf": [{"type": "string"}, {"type": "null"}]}
SSE_EVENT = {
    "type": "object",
    "required": ["data"],
    "properties": {"event": {"type": "string"}, "data": {"type": "string"}},
}
ERROR_SCHEMAS = {
    "OpenAIError": {
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["message", "type", "param", "code"],
                "properties": {
                    "message": {"type": "string"},
                    "type": {"type": "string"},
                    "param": _NULLABLE_STR,
                    "code": _NULLABLE_STR,
                },
            }
        },
    },
    "AnthropicError": {
        "type": "object",
        "required": ["type", "error"],
        "properties": {
            "type": {"const": "error"},
            "error": {
                "type": "object",
                "required": ["type", "message"],
                "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
            },
        },
    },
    "OllamaError": {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}},
}
OPEN = {"/health", "/metrics"}  # for probes and scrapers: the key only where the entry asks for it


def describe(app: FastAPI) -> dict[str, Any]:
    """The OpenAPI 3.1 description of ``app``'s routes (see the module's docstring)."""
    # FastAPI's own generator finds every route, included routers' too, and their path parameters;
    # what it cannot see (bodies, statuses, keys) is replaced.
    base = get_openapi(title=app.title, version=app.version, routes=app.routes)
    bodies, defs = _body_schemas()
    paths: dict[str, dict] = {}
    for path, ops in base.get("paths", {}).items():
        for method, op in ops.items():
            paths.setdefault(path, {})[method] = _operation(method.upper(), path, op, bodies)
    return {
        "openapi": "3.1.0",
        "info": {"title": app.title, "version": app.version},
        "paths": paths,
        "components": {"schemas": {**defs, **ERROR_SCHEMAS}, "securitySchemes": SECURITY_SCHEMES},
    }


def install(app: FastAPI) -> None:
    """Make ``app.openapi()`` return this description (built once, on first use, as FastAPI's is)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = describe(app)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented override; it types openapi as a method


def statuses(method: str, path: str) -> list[int]:
    """The statuses ``method path`` can answer, 200 first, in its family's numbering."""
    # Every route: no or a wrong key (401; health and metrics when the entry asks for one), a key not
    # allowed on this model or a foreign Host or web page (403, http.browser); past the guard, 429.
    # A POST not listed reads a JSON body all the same (api.body), with the same refusals.
    extra = EXTRA.get((method, path), BODY if method == "POST" else ())
    codes = {401, 403, *extra} | (set() if path in OPEN else {429})
    if path.startswith(ANTHROPIC_PREFIX):
        codes = {ANTHROPIC_STATUS.get(c, c) for c in codes}
    if path.startswith(OLLAMA_PREFIX):
        codes = {OLLAMA_STATUS.get(c, c) for c in codes}
    return [200, *sorted(codes)]


def _error_schema(path: str) -> str:
    if path.startswith(ANTHROPIC_PREFIX):
        return "AnthropicError"
    return "OllamaError" if path.startswith(OLLAMA_PREFIX) else "OpenAIError"


def _operation(method: str, path: str, base: dict, bodies: dict[str, dict]) -> dict[str, Any]:
    error = {"$ref": "#/components/schemas/" + _error_schema(path)}
    responses: dict[str, Any] = {}
    for code in statuses(method, path):
        if code == 200:
            responses["200"] = {"description": "OK", "content": _success_content(path)}
        elif (path, code) in (("/health", 503), ("/metrics", 404)):  # a degraded health report; no route
            responses[str(code)] = {
                "description": "unavailable",
                "content": {"application/json": {"schema": {"type": "object"}}},
            }
        else:
            responses[str(code)] = {"description": "error", "content": {"application/json": {"schema": error}}}
    keys: list[dict[str, list[str]]] = [{"bearer": []}, {"apiKey": []}]
    op: dict[str, Any] = {
        "operationId": base["operationId"],
        "summary": base.get("summary", ""),
        "responses": responses,
        # {}: anonymous allowed (health and metrics, unless the entry puts them behind the key).
        "security": [{}, *keys] if path in OPEN else keys,
    }
    if base.get("parameters"):
        op["parameters"] = [{**p, "schema": {"type": "string"}} for p in base["parameters"]]
    if path in UPLOADS:
        op["requestBody"] = {"required": True, "content": {"multipart/form-data": {"schema": UPLOAD_FORM}}}
    elif method == "POST":  # a route without a model in BODIES is described as taking any object
        schema = bodies.get(path, {"type": "object"})
        op["requestBody"] = {"required": True, "content": {"application/json": {"schema": schema}}}
    return op


def _success_content(path: str) -> dict[str, Any]:
    if path == "/metrics":
        return {"text/plain": {"schema": {"type": "string"}}}
    content: dict[str, Any] = {"application/json": {"schema": {"type": "object"}}}
    if path in STREAMED:
        # Before OpenAPI 3.2 (``itemSchema``), an event stream's schema is read as each event's.
        content["text/event-stream"] = {"schema": SSE_EVENT}
    if path in NDJSON:
        content["application/x-ndjson"] = {"schema": {"type": "object"}}
    return content


def _body_schemas() -> tuple[dict[str, dict], dict[str, dict]]:
    """Each body route's ``$ref`` and the shared definitions, as the models validate them."""
    refs, top = models_json_schema(
        [(m, "validation") for m in BODIES.values()], ref_template="#/components/schemas/{model}"
    )
    return {path: refs[(model, "validation")] for path, model in BODIES.items()}, top.get("$defs", {})
