"""Text completions' ``echo``: the prompt comes back before what was written, with its own
log-probabilities when the request asks for them (lm-evaluation-harness scores a continuation
this way); ``max_tokens: 0`` echoes the prompt alone. Read by ``stream``/``fold`` like a generation.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncGenerator
from typing import Any

from ...engine.types import Finished, GenerationRequest, Logprobs, ReasoningDelta, TextDelta, Usage
from ..context import ServingContext
from ..stream import open_events


class Echoed:
    """``inner``'s events after the prompt's text (``prompt``); ``written: False``: nothing the
    engine writes is kept (the engine writes one token all the same: a request always does)."""

    def __init__(self, ctx: ServingContext, inner: GenerationRequest, prompt: str, written: bool):
        self.ctx, self.inner, self.prompt, self.written = ctx, inner, prompt, written
        self.request_id = inner.request_id
        self.cancelled = inner.cancelled

    def open(self) -> AsyncGenerator:
        """Admit the request now (a full queue is a 503 before any byte), then read its events."""
        return self._events(open_events(self.ctx, self.inner))

    async def _events(self, events: AsyncGenerator) -> AsyncGenerator[Any, None]:
        echoed = False
        try:
            async for event in events:
                if isinstance(event, Logprobs) and event.prompt:
                    yield event  # the prompt's, then its text: they go out together
                    yield TextDelta(self.prompt, 0)
                    echoed = True
                    continue
                if not echoed and self.inner.prompt_logprobs is None:
                    yield TextDelta(self.prompt, 0)
                    echoed = True
                if isinstance(event, Finished) and not self.written:
                    usage = Usage(event.usage.prompt_tokens, 0, event.usage.cached_tokens)
                    reason = event.reason if event.reason in ("error", "cancelled") else "length"
                    yield dataclasses.replace(event, reason=reason, usage=usage)
                elif self.written or not isinstance(event, (TextDelta, ReasoningDelta, Logprobs)):
                    yield event
        finally:
            await events.aclose()
