"""Every API family's two ways of answering, run the same way: a stream of SSE frames from an
encoder, or the fold of the same events into one response.

A family supplies a :class:`StreamEncoder` (its wire format) and builds its response body
from a :class:`Folded`; timeouts, client disconnects, engine errors and cancellation are
handled here, once, and so are the numbers the access log writes (``http.access_log``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from starlette.requests import Request
from starlette.responses import StreamingResponse

from ..engine.types import (
    EngineEvent,
    Finished,
    GenerationRequest,
    Logprobs,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
)
from ..errors import EngineFailure, KvBudgetExceeded, RequestTimeout
from ..http.access_log import SERVED
from ..http.tracing import OUTPUT as TRACED_OUTPUT
from ..http.tracing import TRACING
from ..log import log_event
from .body import ClientDisconnected, unless_disconnected
from .context import ServingContext
from .structured import ConstraintFailed
from .tool_loop import McpCall, McpOutcome, ToolLoop

logger = logging.getLogger("vllmmlxd.api")


@dataclass(frozen=True)
class ChoiceEvent:
    """One of n choices' events (``api.choices``): ``index`` is the choice's place in the answer."""

    index: int
    event: Any


# One block of a folded answer, in the order the model wrote them (see Folded).
Part = (
    tuple[Literal["text", "reasoning"], str]
    | tuple[Literal["tool_call", "mcp_call"], ToolCallDelta]
    | tuple[Literal["mcp_result"], McpOutcome]
)


class StreamEncoder(Protocol):
    """One response's SSE frames, in a family's wire format. Stateful: one per response. An
    encoder whose frames are no SSE says so with a ``media_type`` attribute (Ollama's NDJSON)."""

    def start(self) -> list[str]:
        """Frames before the first event (OpenAI's role chunk; Anthropic's message_start)."""
        ...

    def event(self, event: EngineEvent) -> list[str]:
        """Frames for one engine event; ``Finished`` (never with reason ``error``) closes the message."""
        ...

    def error(self, message: str, kind: str) -> list[str]:
        """Frames for a failure mid-stream; ``kind`` is ``timeout``, ``constraint`` (the request's
        grammar could not be held: the client's error) or ``server``."""
        ...

    def end(self) -> list[str]:
        """Frames after everything else (OpenAI's ``[DONE]``)."""
        ...


@dataclass
class Folded:
    """A whole response: the fold of its event stream. ``parts`` keeps the order the model wrote
    things in (``("reasoning" | "text", str)`` runs and ``("tool_call", ToolCallDelta)``), for
    families whose messages are ordered blocks; calls the worker ran itself (``api.tool_loop``)
    are ``("mcp_call", ToolCallDelta)`` and ``("mcp_result", McpOutcome)`` there, and in ``executed``."""

    text: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCallDelta] = field(default_factory=list)
    parts: list[Part] = field(default_factory=list)
    finish: Finished | None = None
    executed: list[McpOutcome] = field(default_factory=list)
    logprobs: list[Any] = field(default_factory=list)  # the written tokens' (when the request asked)
    # Those that came before each text part's pieces, by the part's index (the Responses API's per message).
    part_logprobs: dict[int, list[Any]] = field(default_factory=dict)
    _unplaced: list[Any] = field(default_factory=list)
    choices: dict[int, Folded] = field(default_factory=dict)  # n > 1: each choice's fold, by index

    def add(self, event: EngineEvent) -> None:
        if isinstance(event, ChoiceEvent):  # one of n choices' (api.choices)
            self.choices.setdefault(event.index, Folded()).add(event.event)
        elif isinstance(event, Logprobs):
            self.logprobs += event.entries
            self._unplaced += event.entries
        elif isinstance(event, TextDelta):
            self._part("text", event.text)
            if self._unplaced and self.parts:
                self.part_logprobs.setdefault(len(self.parts) - 1, []).extend(self._unplaced)
            self._unplaced = []
        elif isinstance(event, ReasoningDelta):
            self._part("reasoning", event.text)
            self._unplaced = []
        elif isinstance(event, ToolCallDelta):
            self.tool_calls.append(event)
            self.parts.append(("tool_call", event))
        elif isinstance(event, McpCall):
            self.parts.append(("mcp_call", event.call))
        elif isinstance(event, McpOutcome):
            self.executed.append(event)
            self.parts.append(("mcp_result", event))
        elif isinstance(event, Finished):
            self.finish = event
            if self.tool_calls or self.executed:  # the blank lines around calls are no answer of their own
                kept = [
                    i for i, p in enumerate(self.parts) if p[0] != "text" or (isinstance(p[1], str) and p[1].strip())
                ]
                self.part_logprobs = {n: self.part_logprobs[i] for n, i in enumerate(kept) if i in self.part_logprobs}
                self.parts = [self.parts[i] for i in kept]
            self.text = "".join(v for k, v in self.parts if k == "text" and isinstance(v, str))
            self.reasoning = "".join(v for k, v in self.parts if k == "reasoning" and isinstance(v, str))

    def _part(self, kind: Literal["text", "reasoning"], text: str) -> None:
        if not text:
            return
        last = self.parts[-1] if self.parts else None
        if last is not None and last[0] == kind and isinstance(last[1], str):
            self.parts[-1] = (kind, last[1] + text)
        else:
            self.parts.append((kind, text))


class Opens(Protocol):
    """Events read as one generation's: a tool loop's turns (api.tool_loop), a forced call (api.chat)."""

    request_id: str
    cancelled: Any  # set() when the response ends or its client goes

    def open(self) -> AsyncGenerator: ...


# One generation, or what reads as one.
Generation = GenerationRequest | ToolLoop | Opens


def open_events(ctx: ServingContext, gen: Generation) -> AsyncGenerator:
    """Admit ``gen`` (an engine request, or anything that opens its own events) and return its events."""
    return ctx.engine.generate(gen) if isinstance(gen, GenerationRequest) else gen.open()


def _events(ctx: ServingContext, request: Request, gen: Generation) -> AsyncGenerator:
    """Admit ``gen`` and return its events; what the access log reports is taken from the
    engine's progress of the (first) turn, which the engine keeps from admission on."""
    events = open_events(ctx, gen)
    request.state.progress = ctx.engine.stats.requests.get(gen.request_id)
    return _kept_for_trace(events, request) if TRACING.captures else events


async def _kept_for_trace(events: AsyncGenerator, request: Request) -> AsyncGenerator:
    """``events`` as they come, their text kept for the request's span (``capture_content``)."""
    text: list[str] = []
    try:
        async for event in events:
            if isinstance(event, TextDelta):
                text.append(event.text)
            elif isinstance(event, Finished):
                setattr(request.state, TRACED_OUTPUT, ("".join(text), event.reason))
            yield event
    finally:
        await events.aclose()  # the engine's request ends with its reader, as it would unwrapped


def _finished(ctx: ServingContext, request: Request, event: Finished) -> None:
    """The response's last event: charge its tokens, and leave its numbers for the access log."""
    ctx.charge(request, event.usage)
    progress = getattr(request.state, "progress", None)
    first, queued = getattr(progress, "first_token_at", None), getattr(progress, "queued_at", None)
    setattr(
        request.state,
        SERVED,
        {
            "prompt_tokens": event.usage.prompt_tokens,
            "completion_tokens": event.usage.completion_tokens,
            "cached_tokens": getattr(progress, "cached_tokens", None),
            "finish_reason": event.reason,  # for the request's span (the access log shows the counts)
            "ttft_s": round(first - queued, 3) if first is not None and queued is not None else None,
        },
    )


async def fold(ctx: ServingContext, request: Request, gen: Generation) -> Folded:
    """Run ``gen`` to its end; 504 past the timeout, nothing left running if the client goes."""
    events = _events(ctx, request, gen)

    async def run() -> Folded:
        folded = Folded()
        try:
            async with asyncio.timeout(ctx.config.timeout):
                async for event in events:
                    folded.add(event)
                    if isinstance(event, Finished):
                        _finished(ctx, request, event)
        finally:
            gen.cancelled.set()  # also when cancelled before the first event
        return folded

    try:
        folded = await unless_disconnected(request, run())
    except TimeoutError:
        raise RequestTimeout(f"the request took longer than {ctx.config.timeout:g} s", code="timeout") from None
    except ClientDisconnected:
        log_event(logger, "request.disconnected", request_id=gen.request_id)
        raise
    if folded.finish is None or folded.finish.reason == "error":
        raise failure(folded.finish)
    return folded


def failure(finish: Finished | None) -> Exception:
    """The error a failed generation is answered with: the client's (its grammar could not be
    held, named) or the server's."""
    if finish is not None and finish.error_kind == "constraint":
        return ConstraintFailed(finish.error or "the output could not be held to its grammar")
    if finish is not None and finish.error_kind == "kv_budget":  # the budget was lowered while it waited
        return KvBudgetExceeded(finish.error or "the request's KV cannot fit the model's KV budget")
    return EngineFailure(finish.error if finish else "generation ended without a result")


def stream(ctx: ServingContext, request: Request, gen: Generation, encoder: StreamEncoder) -> StreamingResponse:
    """Admit ``gen`` now (a full queue is a 503 before any byte is sent), then stream its frames."""
    events = _events(ctx, request, gen)

    async def body() -> AsyncGenerator[str, None]:
        try:
            for frame in encoder.start():
                yield frame
            async with asyncio.timeout(ctx.config.timeout):
                async for event in events:
                    if isinstance(event, Finished):
                        _finished(ctx, request, event)
                    if isinstance(event, Finished) and event.reason == "error":
                        kind = "constraint" if event.error_kind == "constraint" else "server"
                        for frame in encoder.error(event.error or "generation failed", kind):
                            yield frame
                        break
                    for frame in encoder.event(event):
                        yield frame
        except TimeoutError:
            for frame in encoder.error(f"the request took longer than {ctx.config.timeout:g} s", "timeout"):
                yield frame
        finally:
            gen.cancelled.set()  # a disconnect may come before the stream was ever read
            await events.aclose()
        for frame in encoder.end():
            yield frame

    # A family whose stream is no SSE names its media type on its encoder (Ollama's NDJSON).
    media_type = getattr(encoder, "media_type", "text/event-stream")
    return StreamingResponse(body(), media_type=media_type, headers={"Cache-Control": "no-cache"})
