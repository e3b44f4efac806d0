"""One request inside the scheduler: its tokens become text events, and it knows when it is done.

Everything that belongs to a single request lives here (detokenizer, stop strings, stream
grouping, progress, finish reason); the scheduler only feeds tokens and collects events.
No mlx: the engine thread drives it, and it can be tested with any tokenizer.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from .stops import StopMatcher
from .types import EngineEvent, Finished, FinishReason, GenerationRequest, RequestProgress, TextDelta, Usage


class Sequence:
    """A request being served: feed it tokens, take its events."""

    def __init__(
        self,
        request: GenerationRequest,
        loop: asyncio.AbstractEventLoop,
        detokenizer: Any,
        eos_ids: set[int],
        special_ids: set[int],
    ):
        self.request = request
        self.loop = loop
        self.events: asyncio.Queue[EngineEvent] = asyncio.Queue()
        self.progress = RequestProgress(request.request_id, len(request.prompt_tokens), request.sampling.max_tokens)
        self.uid: int | None = None  # its id in the batch, once it runs
        self.finished: FinishReason | None = None
        self.prompt_wanted = False  # a waiting request shares its start: cache the prompt once prefilled
        self._detok = detokenizer
        self._eos = eos_ids
        self._special = special_ids
        self._stops = StopMatcher(request.sampling.stop)
        self._pending = ""
        self._pending_tokens = 0
        self._outbox: list[EngineEvent] = []

    @property
    def prompt(self) -> list[int]:
        return self.request.prompt_tokens

    @property
    def produced(self) -> int:
        return self.progress.generated_tokens

    def start(self, uid: int, cached_tokens: int, hit_type: str) -> None:
        """It joined the batch as ``uid``, with ``cached_tokens`` of its prompt taken from the prefix cache."""
        self.uid = uid
        self.progress.started_at = time.monotonic()
        self.progress.cached_tokens = cached_tokens
        self.progress.cache_hit_type = hit_type

    def feed(self, token: int) -> FinishReason | None:
        """One generated token; returns why the sequence must end now, if it must."""
        params = self.request.sampling
        progress = self.progress
        progress.generated_tokens += 1
        progress.last_token_at = time.monotonic()
        if progress.generated_tokens == 1:
            progress.first_token_at = progress.last_token_at
        if token in self._eos and not params.ignore_eos:
            return "stop"
        if token not in self._special:
            self._detok.add_token(token)
            self._pending += self._stops.feed(self._detok.last_segment)
        self._pending_tokens += 1
        if self._stops.stopped:
            return "stop"
        if self._pending_tokens >= self.request.stream_interval and self._pending:
            self._emit()
        return "length" if progress.generated_tokens >= params.max_tokens else None

    def finish(self, reason: FinishReason, error: str | None = None) -> None:
        """The last events: the text still held back (unless cancelled or failed), then Finished."""
        if self.finished is not None:
            return
        if reason not in ("cancelled", "error"):
            if not self._stops.stopped:
                self._detok.finalize()
                self._pending += self._stops.feed(self._detok.last_segment)
                self._pending += self._stops.flush()
                if self._stops.stopped:  # a stop string completed in the text held back at the end
                    reason = "stop"
            self._emit()
        self.finished = reason
        usage = Usage(len(self.request.prompt_tokens), self.progress.generated_tokens)
        self._outbox.append(Finished(reason, usage, error=error))

    def take_events(self) -> list[EngineEvent]:
        """The events produced since the last call (the scheduler posts a step's events at once)."""
        out, self._outbox = self._outbox, []
        return out

    def _emit(self) -> None:
        if self._pending:
            self._outbox.append(TextDelta(self._pending, self._pending_tokens))
        self._pending, self._pending_tokens = "", 0
