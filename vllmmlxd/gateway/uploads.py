"""OpenAI's upload routes through the gateway: ``/v1/audio/transcriptions`` and ``/v1/audio/translations``.

Their body is a multipart form, routed by its ``model`` field as a JSON body is by its key. The
body is read up to the largest ``max_audio_mb`` of the routes (plus the form's other fields), the
``model`` field found in it, and the body sent on as the client sent it; only when the route
knows the model by another name (an upstream, a member of a replica set named by its group) is
the field's value replaced, in place, as ``body_for`` does for JSON.
"""

from __future__ import annotations

import re
from typing import Any, cast

from python_multipart.exceptions import FormParserError, MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header
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

    python-multipart's parser reads the form (the whole body in one write, so the offsets its
    callbacks give are the body's); a part with a ``filename`` is a file, never the field."""
    part: dict[str, Any] = {}
    found: list[tuple[int, int] | None] = []

    def on_part_begin() -> None:
        part.clear()
        part.update(header=b"", disposition=b"", start=None, end=None, value=b"")

    def on_header_field(data: bytes, start: int, end: int) -> None:
        part["header"] += data[start:end]

    def on_header_value(data: bytes, start: int, end: int) -> None:
        if part["header"].lower() == b"content-disposition":
            part["disposition"] += data[start:end]

    def on_header_end() -> None:
        part["header"] = b""

    def on_part_data(data: bytes, start: int, end: int) -> None:
        part["value"] += data[start:end]
        if data is body:  # else the parser hands back bytes it held aside: no offsets of the body
            part["start"] = start if part["start"] is None else part["start"]
            part["end"] = end

    def on_part_end() -> None:
        _, options = parse_options_header(part["disposition"])
        if options.get(b"name") != name.encode() or b"filename" in options or found:
            return
        span = None if part["start"] is None else (part["start"], part["end"])
        # The span must hold exactly the value read, or the field cannot be replaced in place.
        found.append(span if span and body[span[0] : span[1]] == part["value"] else None)

    callbacks = {
        "on_part_begin": on_part_begin,
        "on_header_field": on_header_field,
        "on_header_value": on_header_value,
        "on_header_end": on_header_end,
        "on_part_data": on_part_data,
        "on_part_end": on_part_end,
    }
    try:
        parser = MultipartParser(boundary, cast(Any, callbacks))
        parser.write(body)
        parser.finalize()
    except (MultipartParseError, FormParserError):
        return None
    return found[0] if found else None


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
