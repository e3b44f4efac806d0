"""One request inside the scheduler: its tokens become typed events, and it knows when it is done.

Everything that belongs to a single request lives here; the scheduler only feeds tokens and
collects events. A token goes through:

    detokenizer → output parser (reasoning apart from the answer, then tool calls out of the
                answer) → stop strings (answer only) → stream grouping
                → TextDelta / ReasoningDelta / ToolCallDelta, then Finished

Special tokens are dropped unless the request's parser asks for their text (``<think>``
where it is an added token). No mlx: the engine thread drives it, and it can be tested with
any tokenizer.
"""

from __future__ import annotations

import asyncio
import collections.abc
import hashlib
import time
from collections.abc import Callable
from typing import Any, Protocol

from ..text.stops import StopMatcher
from ..types import (
    EngineEvent,
    Finished,
    FinishReason,
    GenerationRequest,
    Logprobs,
    ReasoningDelta,
    RequestProgress,
    TextDelta,
    ToolCallDelta,
    Usage,
)

# (kind, value) pairs; each parser family narrows the kinds to its own literals.
Pieces = collections.abc.Sequence[tuple[str, Any]]


class OutputParser(Protocol):
    """Splits generated text into typed pieces; the reasoning parsers are the first kind."""

    markers: frozenset[str]

    def feed(self, text: str) -> Pieces: ...

    def finish(self) -> Pieces: ...


class AnswerOnly:
    """No parser: everything generated is the answer."""

    markers: frozenset[str] = frozenset()

    def feed(self, text: str) -> list[tuple[str, str]]:
        return [("content", text)] if text else []

    def finish(self) -> list[tuple[str, str]]:
        return []


class Chain:
    """The reasoning parser, then the tool-call parser over what it calls the answer.

    By construction every path (streamed or not) sees tool calls after a reasoning section.
    """

    def __init__(self, reasoning: OutputParser | None, tools: OutputParser | None):
        self._reasoning = reasoning
        self._tools = tools
        self.markers = (reasoning.markers if reasoning else frozenset()) | (tools.markers if tools else frozenset())

    def feed(self, text: str) -> list[tuple[str, Any]]:
        return self._answer(self._reasoning.feed(text) if self._reasoning else [("content", text)])

    def finish(self) -> list[tuple[str, Any]]:
        out = self._answer(self._reasoning.finish()) if self._reasoning else []
        return out + list(self._tools.finish() if self._tools else [])

    def _answer(self, pieces: Pieces) -> list[tuple[str, Any]]:
        if self._tools is None:
            return list(pieces)
        out: list[tuple[str, Any]] = []
        for kind, value in pieces:
            out += self._tools.feed(value) if kind == "content" else [(kind, value)]
        return out


class Sequence:
    """A request being served: feed it tokens, take its events."""

    def __init__(
        self,
        request: GenerationRequest,
        loop: asyncio.AbstractEventLoop,
        detokenizer: Any,
        eos_ids: set[int],
        special_ids: set[int],
        *,
        parser: OutputParser | None = None,
        token_text: Callable[[int], str | None] = lambda token: "",
    ):
        self.request = request
        self.loop = loop
        self.events: asyncio.Queue[EngineEvent] = asyncio.Queue()
        self.progress = RequestProgress(
            request.request_id, len(request.prompt_tokens), request.sampling.max_tokens, owner=request.owner
        )
        self.uid: int | None = None  # its id in the batch, once it runs
        self.base = 0  # prompt tokens it joined the batch with as cache (the batch's progress counts from here)
        self.prompt_key = prompt_key(request)  # the prompt as the prefix cache knows it
        self.finished: FinishReason | None = None
        self.prompt_wanted = False  # a waiting request shares its start: cache the prompt once prefilled
        self.shared = 0  # prompt tokens the prefix cache shares with it (more than it continued from, maybe)
        self.captures: Any = None  # a layered model's windowed KV and checkpoints (checkpoints.Captures)
        self.tap: Any = None  # its row's log-probability tap (logprobs.LogprobTap) when it asks for them
        self._logprobs: list[Any] = []  # the written tokens' log-probabilities not sent yet
        self._detok = detokenizer
        self._eos = eos_ids
        self._special = special_ids
        self._parser = parser or AnswerOnly()
        self._token_text = token_text
        self._stops = StopMatcher(request.sampling.stop)
        self._pending: list[tuple[str, Any]] = []  # (kind, text or call) not yet sent, same kinds merged
        self._calls = 0  # tool calls found in the answer
        self._pending_tokens = 0
        self._outbox: list[EngineEvent] = []

    @property
    def prompt(self) -> list[int]:
        return self.request.prompt_tokens

    @property
    def produced(self) -> int:
        return self.progress.generated_tokens

    def start(self, cached_tokens: int, hit_type: str) -> None:
        """It left the queue, with ``cached_tokens`` of its prompt taken from the prefix cache (then
        it joins the batch, or a vision prompt is prefilled from embeddings first)."""
        self.base = cached_tokens
        self.progress.started_at = time.monotonic()
        self.progress.cached_tokens = self.progress.prefilled_tokens = cached_tokens
        self.progress.cache_hit_type = hit_type
        self.progress.waited_for = self.progress.waiting_for  # what held it last, for its trace
        self.progress.queue_position = self.progress.waiting_for = None

    def cache_key(self, tokens: list[int]) -> list[int]:
        """``tokens`` (its prompt, then what it generated) as the prefix cache keys them."""
        if not self.request.images and self.request.cache_salt is None:
            return list(tokens)
        n = min(len(tokens), len(self.prompt))
        return self.prompt_key[:n] + list(tokens[n:])

    def prompt_logprobs(self, entries: list[Any]) -> None:
        """The prompt's own log-probabilities (``logprobs.prompt_logprobs``): sent before anything written."""
        self._outbox.append(Logprobs(tuple(entries), prompt=True))

    def feed(self, token: int, logprob: Any = None) -> FinishReason | None:
        """One generated token (and its log-probability, when the request asks); returns why the
        sequence must end now, if it must. An end-of-sequence token is not written: nor is its log-probability."""
        params = self.request.sampling
        progress = self.progress
        progress.generated_tokens += 1
        progress.last_token_at = time.monotonic()
        if progress.generated_tokens == 1:
            progress.first_token_at = progress.last_token_at
        if token in self._eos and not params.ignore_eos:
            return "stop"
        if logprob is not None and not self._stops.stopped:
            self._logprobs.append(logprob)
        if token not in self._special or self._token_text(token) in self._parser.markers:
            self._detok.add_token(token)
            self._take(self._parser.feed(self._detok.last_segment))
        self._pending_tokens += 1
        if self._stops.stopped:
            return "stop"
        if self._pending_tokens >= self.request.stream_interval and self._pending:
            self._emit()
        return "length" if progress.generated_tokens >= params.max_tokens else None

    def finish(self, reason: FinishReason, error: str | None = None, *, kind: str | None = None) -> None:
        """The last events: the text still held back (unless cancelled or failed), then Finished;
        ``kind`` says whose fault a failure is (``Finished.error_kind``)."""
        if self.finished is not None:
            return
        constraint = self.request.constraint
        if constraint is not None and constraint.failures and reason not in ("cancelled", "error"):
            # The grammar failed and let only EOS through: what was written is no answer.
            reason, error, kind = (
                "error",
                f"the output could not be held to its grammar: {constraint.failures[0]}",
                "constraint",
            )
        if reason not in ("cancelled", "error"):
            if not self._stops.stopped:
                self._detok.finalize()
                self._take(self._parser.feed(self._detok.last_segment))
                self._take(self._parser.finish())
                self._add("content", self._stops.flush())
                if self._stops.stopped:  # a stop string completed in the text held back at the end
                    reason = "stop"
            self._emit()
        if reason == "stop" and self._calls:
            reason = "tool_calls"  # the model ended its turn to have its calls run
        self.finished = reason
        progress, predicted = self.progress, self.request.prediction is not None
        usage = Usage(
            len(self.request.prompt_tokens),
            progress.generated_tokens,
            progress.cached_tokens,
            progress.drafted_tokens if predicted else 0,
            progress.accepted_tokens if predicted else 0,
        )
        self._outbox.append(Finished(reason, usage, error=error, stop_sequence=self._stops.matched, error_kind=kind))

    def take_events(self) -> list[EngineEvent]:
        """The events produced since the last call (the scheduler posts a step's events at once)."""
        out, self._outbox = self._outbox, []
        return out

    def _take(self, pieces: Pieces) -> None:
        """The parser's pieces: reasoning as it is, the answer through the stop strings, calls whole."""
        for kind, value in pieces:
            if self._stops.stopped:
                return  # nothing after a stop string, not even reasoning
            if kind == "tool_call":
                self._add("content", self._stops.flush())  # the answer held back comes before the call
                self._pending.append((kind, ToolCallDelta(self._calls, value.name, value.arguments)))
                self._calls += 1
            else:
                self._add(kind, self._stops.feed(value) if kind == "content" else value)

    def _add(self, kind: str, text: str) -> None:
        if not text:
            return
        if self._pending and self._pending[-1][0] == kind and kind != "tool_call":
            self._pending[-1] = (kind, self._pending[-1][1] + text)
        else:
            self._pending.append((kind, text))

    def _emit(self) -> None:
        if self._logprobs:
            self._outbox.append(Logprobs(tuple(self._logprobs)))
            self._logprobs = []
        # The step's token count goes with the last piece: what matters is the sum.
        for i, (kind, value) in enumerate(self._pending):
            count = self._pending_tokens if i == len(self._pending) - 1 else 0
            if kind == "tool_call":
                self._outbox.append(ToolCallDelta(value.index, value.name, value.arguments, count))
            else:
                self._outbox.append(ReasoningDelta(value, count) if kind == "reasoning" else TextDelta(value, count))
        self._pending, self._pending_tokens = [], 0


def prompt_key(request: GenerationRequest) -> list[int]:
    """The prompt's ids, each image's span replaced by a negative id drawn from its pixels' hash
    (never a real token): the prefix cache then tells two images apart even where their tokens,
    all placeholders, are the same, and knows the same image sent again. A salted request's first
    id is replaced by one drawn from the salt and that id: every block the cache holds of it
    chains from that first one (its name on disk too), so no request of another salt ever shares
    one, and the KV of each position stays where it was."""
    key = list(request.prompt_tokens)
    for span in request.images:
        key[span.start : span.end] = [-(1 + int(span.key[:15], 16))] * span.length
    if request.cache_salt is not None and key:
        digest = hashlib.blake2b(f"{request.cache_salt}\0{key[0]}".encode(), digest_size=8).digest()
        key[0] = -(1 + (int.from_bytes(digest, "big") >> 2))
    return key
