"""Ollama's wire format for engine events: NDJSON lines while streaming (one JSON object a line,
one stateful encoder per response), and the whole answer as one object built from the fold of the
same events. Pure, but for the clock the durations are read from.

Each line names the model and the time (``created_at``, RFC 3339 in UTC); the last one says
``done: true`` with ``done_reason`` and the counts Ollama's clients show: ``prompt_eval_count`` and
``eval_count`` (the engine's usage), ``total_duration``, ``load_duration``, ``prompt_eval_duration``
and ``eval_duration`` in nanoseconds (from the engine's progress of the request). Calls the worker
ran itself (``api.tool_loop``) are not shown: Ollama has no place for them, and its clients would
run any call they see.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from ...engine.types import EngineEvent, Finished, Logprobs, ReasoningDelta, TextDelta, ToolCallDelta
from ...http.error_shapes import ollama_error
from ..logprob_format import token_entries
from ..tooling import call_id
from .translate import CALL_ID_PREFIX

if TYPE_CHECKING:  # only its attributes are read; api.stream itself imports starlette
    from ..stream import Folded

MEDIA_TYPE = "application/x-ndjson"
NS = 1_000_000_000


def created_at(now: float | None = None) -> str:
    """A time as Ollama writes it: RFC 3339 in UTC, to the microsecond."""
    moment = datetime.fromtimestamp(time.time() if now is None else now, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def line(body: dict) -> str:
    """One NDJSON line."""
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")) + "\n"


def done_reason(finished: Finished) -> str:
    """Ollama's ``done_reason``: ``length`` when cut by ``num_predict`` or the context, else ``stop``
    (a turn that calls tools ends with ``stop`` there too)."""
    return "length" if finished.reason == "length" else "stop"


def arguments(text: str) -> dict[str, Any]:
    """A call's arguments as the object Ollama sends (JSON text from the engine; {} if not an object)."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


def tool_call(rid: str, call: ToolCallDelta) -> dict:
    return {
        "id": call_id(CALL_ID_PREFIX, rid, call.index),
        "function": {"index": call.index, "name": call.name, "arguments": arguments(call.arguments)},
    }


@dataclass
class Clock:
    """Where a request's durations come from: when its route began (monotonic), and the engine's
    progress of it (``RequestProgress``: queued, first and last token), read once it finished."""

    started: float
    progress: Callable[[], Any] = lambda: None

    def durations(self, now: float | None = None) -> dict[str, int]:
        now = time.monotonic() if now is None else now
        p = self.progress()
        began = getattr(p, "started_at", None) or getattr(p, "queued_at", None) or self.started
        first = getattr(p, "first_token_at", None)
        last = getattr(p, "last_token_at", None) or now
        return {
            "total_duration": int(max(now - self.started, 0) * NS),
            # The model was loaded before the worker saw the request (a lazy one by the gateway).
            "load_duration": 0,
            "prompt_eval_duration": int(max((first or now) - began, 0) * NS),
            "eval_duration": int(max(last - first, 0) * NS) if first is not None else 0,
        }


def done_fields(finished: Finished, clock: Clock) -> dict:
    """The last line's (or the whole answer's) closing fields."""
    return {
        "done": True,
        "done_reason": done_reason(finished),
        **clock.durations(),
        "prompt_eval_count": finished.usage.prompt_tokens,
        "eval_count": finished.usage.completion_tokens,
    }


class _Lines:
    """What chat and generate streams share: the envelope, the error line, no start and no end."""

    media_type = MEDIA_TYPE

    def __init__(self, rid: str, model: str, clock: Clock):
        self.rid, self.model, self.clock = rid, model, clock
        self.pending: list[Any] = []  # log-probabilities for the next line (the tokens it carries)

    def _line(self, fields: dict) -> str:
        held, self.pending = self.pending, []
        extra = {"logprobs": token_entries(held)} if held else {}
        return line({"model": self.model, "created_at": created_at(), **fields, **extra})

    def start(self) -> list[str]:
        return []

    def error(self, message: str, kind: str) -> list[str]:
        """A failure after the head: one line with the error, which Ollama's clients raise."""
        return [line(ollama_error(message))]

    def end(self) -> list[str]:
        return []


class ChatStreamEncoder(_Lines):
    """``/api/chat``'s lines: each delta as a message piece (``content`` or ``thinking``), each
    call whole as it comes, then the closing line with an empty message."""

    def _message(self, **fields: Any) -> str:
        return self._line({"message": {"role": "assistant", "content": "", **fields}, "done": False})

    def event(self, event: EngineEvent) -> list[str]:
        if isinstance(event, Logprobs):
            self.pending += event.entries
            return []
        if isinstance(event, TextDelta) and event.text:
            return [self._message(content=event.text)]
        if isinstance(event, ReasoningDelta) and event.text:
            return [self._message(thinking=event.text)]
        if isinstance(event, ToolCallDelta):
            return [self._message(tool_calls=[tool_call(self.rid, event)])]
        if isinstance(event, Finished):
            return [self._line({"message": {"role": "assistant", "content": ""}, **done_fields(event, self.clock)})]
        return []


class GenerateStreamEncoder(_Lines):
    """``/api/generate``'s lines: ``response`` pieces (``thinking`` ones first), then the closing line."""

    def event(self, event: EngineEvent) -> list[str]:
        if isinstance(event, Logprobs):
            self.pending += event.entries
            return []
        if isinstance(event, TextDelta) and event.text:
            return [self._line({"response": event.text, "done": False})]
        if isinstance(event, ReasoningDelta) and event.text:
            return [self._line({"response": "", "thinking": event.text, "done": False})]
        if isinstance(event, Finished):
            return [self._line({"response": "", **done_fields(event, self.clock)})]
        return []


def chat_response(rid: str, model: str, folded: Folded, clock: Clock) -> dict:
    """``/api/chat``'s whole answer (``stream: false``)."""
    assert folded.finish is not None
    message: dict[str, Any] = {"role": "assistant", "content": folded.text}
    if folded.reasoning:
        message["thinking"] = folded.reasoning
    if folded.tool_calls:
        message["tool_calls"] = [tool_call(rid, c) for c in folded.tool_calls]
    body = {"model": model, "created_at": created_at(), "message": message, **done_fields(folded.finish, clock)}
    return {**body, "logprobs": token_entries(folded.logprobs)} if folded.logprobs else body


def generate_response(rid: str, model: str, folded: Folded, clock: Clock) -> dict:
    """``/api/generate``'s whole answer (``stream: false``)."""
    assert folded.finish is not None
    body: dict[str, Any] = {"model": model, "created_at": created_at(), "response": folded.text}
    if folded.reasoning:
        body["thinking"] = folded.reasoning
    if folded.logprobs:
        body["logprobs"] = token_entries(folded.logprobs)
    return {**body, **done_fields(folded.finish, clock)}


def load_answer(model: str, *, chat: bool, unload: bool) -> dict:
    """The answer to a request with nothing to generate: Ollama's way to load a model (or, with
    ``keep_alive: 0``, to unload it)."""
    piece = {"message": {"role": "assistant", "content": ""}} if chat else {"response": ""}
    return {
        "model": model,
        "created_at": created_at(),
        **piece,
        "done": True,
        "done_reason": "unload" if unload else "load",
    }


class ChatEncoding:
    """``/api/chat``'s two ways of writing a response (``api.chat.ChatEncoding``)."""

    def __init__(self, model: str, clock: Clock):
        self.model, self.clock = model, clock

    def stream_encoder(self, rid: str, prompt_tokens: int) -> ChatStreamEncoder:
        return ChatStreamEncoder(rid, self.model, self.clock)

    def response(self, rid: str, folded: Folded) -> dict:
        return chat_response(rid, self.model, folded, self.clock)


class GenerateEncoding:
    """``/api/generate``'s two ways of writing a response."""

    def __init__(self, model: str, clock: Clock):
        self.model, self.clock = model, clock

    def stream_encoder(self, rid: str, prompt_tokens: int) -> GenerateStreamEncoder:
        return GenerateStreamEncoder(rid, self.model, self.clock)

    def response(self, rid: str, folded: Folded) -> dict:
        return generate_response(rid, self.model, folded, self.clock)
