"""The MLX engine: the asyncio face of one loaded model; a scheduler thread owns mlx.

``generate`` admits a request (or refuses it at once with 503 when ``max_queue`` requests
already wait) and returns its event stream. The scheduler thread batches running
requests (``continuous_batching``, up to ``max_num_seqs``; one at a time otherwise) and
posts each step's events back to the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from typing import TYPE_CHECKING, AsyncIterator

import mlx.core as mx

from ..errors import Overloaded
from ..log import log_event
from ..parsers.reasoning import make_reasoning_parser
from .detokenize import IncrementalDetokenizer
from .options import EngineOptions
from .scheduler import Scheduler
from .sequence import Sequence
from .types import EngineEvent, EngineStats, Finished, GenerationRequest, ModelInfo

if TYPE_CHECKING:
    from .loader import LoadedModel

logger = logging.getLogger("vllmmlxd.engine")

PROMPT_TAIL_TOKENS = 16  # the prompt's end, as text, tells a reasoning parser where generation starts
PROMPT_TAIL_CHARS = 64


class MLXEngine:
    """Serves generation requests for one loaded model on a dedicated thread."""

    def __init__(self, loaded: "LoadedModel", *, name: str | None = None, options: EngineOptions | None = None):
        self.model = loaded.model
        self.tokenizer = loaded.tokenizer
        self.options = options or EngineOptions()
        self.info = ModelInfo(
            name=name or loaded.name,
            context_length=loaded.context_length,
            vocab_size=len(self.tokenizer),
            source=str(loaded.path),
            has_chat_template=bool(getattr(self.tokenizer, "has_chat_template", False)),
        )
        self.stats = EngineStats()
        self.max_queue = self.options.max_queue
        self._eos = set(self.tokenizer.eos_token_ids)
        self._special = set(getattr(self.tokenizer, "all_special_ids", ()) or ())
        # Special tokens' texts, for the parsers that need to see some (<think> as an added token).
        self._special_text = {t: self.tokenizer.convert_ids_to_tokens(t) for t in self._special}
        self._waiting = 0
        self._lock = threading.Lock()
        self._scheduler = Scheduler(self.model, self._eos, self.options, self.stats)
        self._scheduler.on_admit = self._admitted
        log_event(logger, "engine.warm", seconds=round(self._scheduler.warm_up(), 2))
        self._thread = threading.Thread(target=self._scheduler.run, name="mlx-engine", daemon=True)
        self._thread.start()

    # -- the asyncio side ---------------------------------------------------

    def tokenize(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))

    def apply_chat_template(
        self, messages: list[dict], *, tools: list[dict] | None = None, template_kwargs: dict | None = None
    ) -> list[int]:
        # mlx-lm would default enable_thinking to "the vocabulary has a <think> token"; a template
        # that reads the flag should see thinking allowed unless the request turns it off.
        kwargs = {"enable_thinking": True, **(template_kwargs or {})}
        if tools:
            kwargs["tools"] = tools
        return list(self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, **kwargs))

    def generate(self, request: GenerationRequest) -> AsyncIterator[EngineEvent]:
        """Queue ``request`` (or raise :class:`Overloaded` at once) and return its event stream.

        Closing the stream early, or cancelling the task reading it, cancels the request.
        """
        with self._lock:
            if self._waiting >= self.max_queue:
                raise Overloaded(
                    f"the engine is busy: {self.stats.num_running} requests running and {self._waiting} waiting "
                    f"(max_queue {self.max_queue}); retry later",
                    retry_after=self._retry_after(),
                )
            detok = IncrementalDetokenizer(self._decode, request.prompt_tokens)
            seq = Sequence(
                request, asyncio.get_running_loop(), detok, self._eos, self._special,
                parser=self._parser_for(request), token_text=self._special_text.get,
            )
            self._waiting += 1
            self.stats.num_waiting = self._waiting
            self.stats.requests[request.request_id] = seq.progress
        self._scheduler.inbox.put(seq)
        return self._events(seq)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def _parser_for(self, request: GenerationRequest):
        """The request's reasoning parser, told how the prompt ends (a template may open <think>)."""
        if not (request.reasoning and self.options.reasoning_parser):
            return None
        tail = self._decode(request.prompt_tokens[-PROMPT_TAIL_TOKENS:])[-PROMPT_TAIL_CHARS:]
        return make_reasoning_parser(self.options.reasoning_parser, tail)

    def _admitted(self, seq: Sequence) -> None:
        """Called by the scheduler thread when a sequence leaves the queue (to run, or cancelled)."""
        with self._lock:
            self._waiting -= 1
            self.stats.num_waiting = self._waiting

    def _retry_after(self) -> int:
        """Seconds until a slot is likely free: the soonest running request to end at its current pace."""
        now = time.monotonic()
        remaining = [
            (p.max_tokens - p.generated_tokens) * (now - p.first_token_at) / p.generated_tokens
            for p in list(self.stats.requests.values())
            if p.first_token_at is not None and p.generated_tokens > 0
        ]
        return int(min(max(math.ceil(min(remaining, default=1.0)), 1), 60))

    async def _events(self, seq: Sequence) -> AsyncIterator[EngineEvent]:
        try:
            while True:
                event = await seq.events.get()
                yield event
                if isinstance(event, Finished):
                    return
        finally:
            seq.request.cancelled.set()

    def memory(self) -> dict[str, float]:
        gb = 1024**3
        return {
            "active_memory_gb": round(mx.get_active_memory() / gb, 3),
            "peak_memory_gb": round(mx.get_peak_memory() / gb, 3),
            "cache_memory_gb": round(mx.get_cache_memory() / gb, 3),
        }

    def cache_status(self) -> dict:
        """The prefix cache's ``cache`` block of /v1/status."""
        return self._scheduler.cache.describe()

    def close(self) -> None:
        self._scheduler.inbox.put(None)
        self._thread.join(timeout=10)
