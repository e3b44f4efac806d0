"""OpenAI's upload routes through the gateway: ``/v1/audio/transcriptions`` and ``/v1/audio/translations``.

Their body is a multipart form, routed by its ``model`` field as a JSON body is by its key. The
body is read up to the largest ``max_audio_mb`` of the routes (plus the form's other fields), the
``model`` field found in it, and the body sent on as the client sent it; only when the route
knows the model by another name (an upstream, a member of a replica set named by its group) is
the field's value replaced, in place, as ``body_for`` does for JSON.
"""

from __future__ import annotations

import re

from starlette.requests import Request

from ..api.body import read_body
from ..config.gateway import Route
from ..errors import InvalidRequest
from ..http.access import presented_key
from .dispatch import Body, Gateway, body_for
from .proxy import RawResponse

UPLOAD_PATHS = ("/v1/audio/transcriptions", "/v1/audio/translations")
FORM_SLACK_BYTES = 1 << 20  # the form's other fields and boundaries, beside the file
DEFAULT_AUDIO_MB = 25.0
_BOUNDARY = re.compile(r'boundary="?([^";]+)"?', re.IGNORECASE)
_NAME = re.compile(rb'\bname="([^"]*)"', re.IGNORECASE)


def boundary_of(content_type: str) -> bytes:
    """The multipart boundary of ``content_type``; 400 when the body is no multipart form."""
    if not content_type.lower().startswith("multipart/form-data"):
        raise InvalidRequest("send the audio as multipart/form-data (fields file, model, ...)", param="file")
    match = _BOUNDARY.search(content_type)
    if not match:
        raise InvalidRequest("the multipart Content-Type names no boundary", param="file")
    return match.group(1).encode("latin-1")


def field_span(body: bytes, boundary: bytes, name: str) -> tuple[int, int] | None:
    """Where the value of the text field ``name`` lies in ``body`` (start, end), or None (pure).

    Each part is ``--boundary CRLF headers CRLF CRLF value CRLF``; a part with a ``filename``
    is a file, never the field."""
    delimiter = b"--" + boundary
    pos = body.find(delimiter)
    while pos != -1:
        head_start = pos + len(delimiter)
        if body[head_start : head_start + 2] == b"--":  # the closing delimiter
            return None
        head_end = body.find(b"\r\n\r\n", head_start)
        if head_end == -1:
            return None
        headers = body[head_start:head_end]
        value_start = head_end + 4
        next_pos = body.find(b"\r\n" + delimiter, value_start)
        if next_pos == -1:
            return None
        named = _NAME.search(headers)
        if named and named.group(1).decode("utf-8", "replace") == name and b"filename=" not in headers.lower():
            return value_start, next_pos
        pos = next_pos + 2
    return None


def form_field(body: bytes, boundary: bytes, name: str) -> str | None:
    """The text field ``name`` of a multipart body, stripped; None when absent or empty (pure)."""
    span = field_span(body, boundary, name)
    if span is None:
        return None
    return body[span[0] : span[1]].decode("utf-8", "replace").strip() or None


def with_field(body: bytes, boundary: bytes, name: str, value: str) -> bytes:
    """``body`` with the text field ``name`` set to ``value``, every other byte as it was (pure)."""
    span = field_span(body, boundary, name)
    if span is None:
        return body
    return body[: span[0]] + value.encode() + body[span[1] :]


def upload_limit(routes: tuple[Route, ...], max_body_mb: float) -> int:
    """The most bytes an upload may have: the largest route's audio limit (or the gateway's body limit) plus the form."""
    largest = max((r.max_audio_mb for r in routes), default=DEFAULT_AUDIO_MB)
    return int(max(largest, max_body_mb) * 1024 * 1024) + FORM_SLACK_BYTES


def upload_body_for(boundary: bytes) -> Body:
    """What a route is sent of an upload: the client's bytes, the model field renamed where ``body_for`` would."""

    def body(route: Route, data: dict, raw: bytes) -> bytes:
        if body_for(route, data, b"") == b"":  # body_for's decision: the client's body as it is
            return raw
        return with_field(raw, boundary, "model", route.served_model_name)

    return body


async def routed_upload(gateway: Gateway, request: Request, path: str) -> RawResponse:
    """An upload: resolve the route by the form's ``model``, check the key, forward the form."""
    table = gateway.table
    boundary = boundary_of(request.headers.get("content-type", ""))
    raw = await read_body(request, upload_limit(table.routes, table.spec.gateway.max_body_mb))
    model = form_field(raw, boundary, "model")
    target = table.resolve(model, False, presented_key(request))
    gateway.admit(request, target)
    stream = form_field(raw, boundary, "stream") in ("true", "1")
    data = {"model": model, "stream": stream}
    # A streamed transcription is SSE: a lazy model's load is waited for with comment lines, as for chat.
    body = upload_body_for(boundary)
    if isinstance(target, Route):
        return await gateway.forward(request, target, path, body(target, data, raw), stream)
    return await gateway.forward_set(request, target, path, data, raw, stream, body)
