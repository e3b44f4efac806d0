"""OpenAI's ``POST /v1/audio/transcriptions`` and ``/v1/audio/translations`` over the worker's speech model.

A multipart form, as OpenAI's API reference defines it: ``file`` (wav, mp3, m4a, flac, ogg,
webm), ``model``, ``language`` (transcriptions), ``prompt``, ``temperature`` (0..1; given, it is
the only one tried, 0 being greedy; absent, Whisper's fallback ladder from 0.0 to 1.0),
``response_format`` (json, text, srt, vtt, verbose_json), ``timestamp_granularities[]``
(segment, word: with verbose_json) and ``stream`` (transcriptions; json or text: SSE events
``transcript.text.delta`` then ``transcript.text.done``). The body is read up to the entry's
``max_audio_mb`` (413 past it), the audio decoded off the event loop (400 when it is not audio,
or is longer than ``max_audio_s``), then queued for the speech thread.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass

from fastapi import APIRouter
from starlette.datastructures import FormData, UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from ...engine.speech.decode import AudioLimits, decode_audio
from ...engine.speech.formats import RESPONSE_FORMATS, TEXT_FORMATS, Transcript, language_code, render, stream_events
from ...engine.speech.transcriber import SpeechRequest, Transcriber
from ...errors import InvalidRequest, ModelNotFound, RequestError
from ..body import read_body, unless_disconnected
from ..context import LiveContext, ServingContext
from ..sse import sse_data

FORM_SLACK_BYTES = 1 << 20  # the form's other fields and boundaries, beside the file
GRANULARITIES = ("segment", "word")


@dataclass(frozen=True)
class AudioForm:
    """The form's fields but the file, checked."""

    model: str | None
    language: str | None
    prompt: str | None
    temperature: float | None
    response_format: str
    granularities: tuple[str, ...]
    stream: bool


def parse_form(form: FormData, *, translate: bool) -> AudioForm:
    """The fields of an upload form but the file's bytes (400 naming the field that is wrong)."""
    upload = form.get("file")
    if not isinstance(upload, UploadFile):
        raise InvalidRequest("file is required: the audio, as a multipart file field", param="file")
    fmt = _text(form, "response_format") or "json"
    if fmt not in RESPONSE_FORMATS:
        raise InvalidRequest(
            f"response_format {fmt!r} is not one of {', '.join(RESPONSE_FORMATS)}", param="response_format"
        )
    granularities = tuple(
        dict.fromkeys(
            str(v) for v in form.getlist("timestamp_granularities[]") + form.getlist("timestamp_granularities")
        )
    )
    for g in granularities:
        if g not in GRANULARITIES:
            raise InvalidRequest(
                f"timestamp_granularities[] {g!r} is not one of {', '.join(GRANULARITIES)}",
                param="timestamp_granularities[]",
            )
    if granularities and fmt != "verbose_json":
        raise InvalidRequest(
            "timestamp_granularities[] needs response_format verbose_json", param="timestamp_granularities[]"
        )
    stream = _flag(form, "stream")
    if stream and translate:
        raise InvalidRequest("stream is not a field of translations", param="stream")
    if stream and fmt not in ("json", "text"):
        raise InvalidRequest("stream needs response_format json or text", param="stream")
    try:
        language = None if translate else language_code(_text(form, "language"))
    except ValueError as exc:
        raise InvalidRequest(str(exc), param="language") from None
    return AudioForm(
        model=_text(form, "model"),
        language=language,
        prompt=_text(form, "prompt"),
        temperature=_temperature(_text(form, "temperature")),
        response_format=fmt,
        granularities=granularities,
        stream=stream,
    )


def _text(form: FormData, name: str) -> str | None:
    value = form.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidRequest(f"{name} must be a text field, not a file", param=name)
    return value.strip() or None


def _flag(form: FormData, name: str) -> bool:
    value = (_text(form, name) or "false").lower()
    if value not in ("true", "false", "1", "0"):
        raise InvalidRequest(f"{name} must be true or false", param=name)
    return value in ("true", "1")


def _temperature(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        t = float(value)
    except ValueError:
        raise InvalidRequest(f"temperature {value!r} is not a number", param="temperature") from None
    if not math.isfinite(t) or not 0 <= t <= 1:
        raise InvalidRequest("temperature must be between 0 and 1", param="temperature")
    return t


async def read_form(request: Request, max_bytes: int) -> FormData:
    """The multipart form of the request, its body read up to ``max_bytes`` (413 past it)."""
    content_type = request.headers.get("content-type", "")
    if not content_type.lower().startswith("multipart/form-data"):
        raise InvalidRequest("send the audio as multipart/form-data (fields file, model, ...)", param="file")
    body = await read_body(request, max_bytes)

    async def chunks() -> AsyncGenerator[bytes, None]:
        yield body

    try:
        return await MultiPartParser(request.headers, chunks(), max_files=1, max_fields=32).parse()
    except MultiPartException as exc:
        raise InvalidRequest(f"the multipart form could not be read: {exc.message}", param="file") from None


def transcriber_for(ctx: ServingContext, requested: str | None) -> Transcriber:
    """The entry's speech model; under ``strict_model_name`` the request must name the entry."""
    transcriber = getattr(ctx.engine, "transcriber", None)
    if transcriber is None:
        raise ModelNotFound(f"{ctx.name!r} is not a speech model; it cannot transcribe audio")
    ctx.check_model(requested)
    return transcriber


def make_router(live: LiveContext) -> APIRouter:
    router = APIRouter()

    async def serve(request: Request, *, translate: bool) -> Response:
        ctx = live.capture(request)
        transcriber = transcriber_for(ctx, None)  # before the body: an entry that is no speech model says so at once
        limits = AudioLimits(int(ctx.config.max_audio_mb * 1024 * 1024), float(ctx.config.max_audio_s))
        form = await read_form(request, limits.max_bytes + FORM_SLACK_BYTES)
        try:
            fields = parse_form(form, translate=translate)
            upload = form.get("file")
            assert isinstance(upload, UploadFile)  # parse_form checked it
            data = await upload.read()
        finally:
            await form.close()
        transcriber_for(ctx, fields.model)
        if translate and not transcriber.translates:
            raise InvalidRequest(f"{ctx.name} is an English-only model; it cannot translate", param="model")
        samples = await asyncio.to_thread(decode_audio, data, limits)
        speech = SpeechRequest(
            samples=samples,
            task="translate" if translate else "transcribe",
            language=fields.language,
            temperature=fields.temperature,
            prompt=fields.prompt,
            word_timestamps="word" in fields.granularities,
        )
        ctx.request_id(request, "trsc-")
        if fields.stream:
            return StreamingResponse(
                _events(transcriber, speech), media_type="text/event-stream", headers={"cache-control": "no-cache"}
            )
        transcript = await unless_disconnected(request, transcriber.transcribe(speech))
        return respond(transcript, fields)

    # response_model=None: a Response is sent as built.
    @router.post("/v1/audio/transcriptions", response_model=None)
    async def transcriptions(request: Request) -> Response:
        return await serve(request, translate=False)

    @router.post("/v1/audio/translations", response_model=None)
    async def translations(request: Request) -> Response:
        return await serve(request, translate=True)

    return router


def respond(transcript: Transcript, fields: AudioForm) -> Response:
    """The response of ``fields.response_format``: JSON, or text with its media type."""
    body = render(transcript, fields.response_format, fields.granularities)
    if isinstance(body, dict):
        return JSONResponse(body)
    return PlainTextResponse(body, media_type=TEXT_FORMATS[fields.response_format])


async def _events(transcriber: Transcriber, speech: SpeechRequest) -> AsyncIterator[str]:
    """The SSE body: the transcript's deltas and its done event, or one error event (the head is out)."""
    try:
        transcript = await transcriber.transcribe(speech)
    except RequestError as exc:
        yield sse_data({"error": {"message": exc.message, "type": exc.error_type, "param": None, "code": exc.code}})
        return
    except Exception as exc:  # the speech thread failed this request: said to the client, logged there
        yield sse_data({"error": {"message": f"transcription failed: {type(exc).__name__}", "type": "server_error"}})
        return
    for event in stream_events(transcript):
        yield sse_data(event)
