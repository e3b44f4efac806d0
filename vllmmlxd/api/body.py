"""Reading and validating request bodies, with errors each API family can shape."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import Awaitable
from typing import TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect, Request

from ..errors import InvalidRequest, PayloadTooLarge, UnprocessableBody

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")


async def read_body(request: Request, max_bytes: int) -> bytes:
    """The body's bytes: 413 past ``max_bytes`` (declared or sent)."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > max_bytes:
        raise PayloadTooLarge(f"request body is {declared} bytes; the limit is {max_bytes} bytes")
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_bytes:
                raise PayloadTooLarge(f"request body is over the limit of {max_bytes} bytes")
            chunks.append(chunk)
    except ClientDisconnect:  # gone mid-body (or cut off as too slow): nobody to answer
        raise ClientDisconnected from None
    return b"".join(chunks)


async def read_json(request: Request, max_bytes: int) -> dict:
    """The body as a JSON object: 413 past ``max_bytes``, 422 when not a JSON object."""
    raw = await read_body(request, max_bytes) or b"null"
    try:
        data = json.loads(raw)
    # ValueError: bad JSON, bad UTF-8, an integer past Python's 4300 digits; RecursionError: nesting
    # deeper than the parser's stack.
    except (ValueError, RecursionError) as exc:
        raise UnprocessableBody(f"request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise UnprocessableBody("request body must be a JSON object")
    if _SURROGATE_ESCAPE.search(raw) and _has_lone_surrogate(data):
        raise UnprocessableBody("request body is not valid JSON: a string holds a lone surrogate (\\ud800-\\udfff)")
    return data


# JSON may escape half of a UTF-16 pair alone ("\ud800"); such a string is no Unicode text, and
# tokenizers, grammars and encoders refuse it deep inside. Only bodies with such an escape are walked.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _has_lone_surrogate(data: object) -> bool:
    stack = [data]  # a loop, not recursion: nesting is as deep as the parser allowed
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if not item.isascii():
                try:
                    item.encode("utf-8")
                except UnicodeEncodeError:
                    return True
        elif isinstance(item, dict):
            stack.extend(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def validate(model: type[M], data: dict) -> M:
    """Validate ``data``: a missing field is 422, a wrong type or value is 400, naming the field."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        err = exc.errors(include_url=False, include_input=False)[0]
        param = ".".join(str(p) for p in err["loc"]) or None
        message = f"{param}: {err['msg']}" if param else err["msg"]
        if err["type"] == "missing":
            raise UnprocessableBody(message, param=param) from None
        raise InvalidRequest(message, param=param) from None


class ClientDisconnected(Exception):
    """The client went away before the response was ready."""


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await ``work``, cancelling it at once if the client disconnects first."""
    task = asyncio.ensure_future(work)

    async def wait_disconnect() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(wait_disconnect())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        watcher.cancel()
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    raise ClientDisconnected
