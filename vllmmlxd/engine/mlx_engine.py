"""The MLX engine: one thread owns the model; requests queue in, typed events flow out.

In this simple mode requests are served one at a time, first come first served. A
request waits in the queue (never a 503 while the queue has room); cancelling it,
from a client disconnect or a timeout, frees the engine at the next token.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from typing import TYPE_CHECKING, AsyncIterator

import mlx.core as mx
from mlx_lm.generate import generate_step

from ..errors import Overloaded
from ..log import log_event
from .sampling import make_processors, make_sampler
from .stops import StopMatcher
from .types import (
    EngineEvent,
    EngineStats,
    Finished,
    GenerationRequest,
    ModelInfo,
    RequestProgress,
    TextDelta,
    Usage,
)

if TYPE_CHECKING:
    from .loader import LoadedModel

logger = logging.getLogger("vllmmlxd.engine")

PREFILL_STEP = 512  # small enough that a cancelled long prompt stops within a chunk


class _Cancelled(Exception):
    pass


class _Job:
    """A request plus the way back to the asyncio loop that waits for its events."""

    def __init__(self, request: GenerationRequest, loop: asyncio.AbstractEventLoop):
        self.request = request
        self.loop = loop
        self.progress = RequestProgress(request.request_id, len(request.prompt_tokens), request.sampling.max_tokens)
        self.events: asyncio.Queue[EngineEvent] = asyncio.Queue()

    def post(self, event: EngineEvent) -> None:
        self.loop.call_soon_threadsafe(self.events.put_nowait, event)


class MLXEngine:
    """Serves generation requests for one loaded model on a dedicated thread."""

    def __init__(self, loaded: "LoadedModel", *, name: str | None = None, max_queue: int = 64):
        self.model = loaded.model
        self.tokenizer = loaded.tokenizer
        self.info = ModelInfo(
            name=name or loaded.name,
            context_length=loaded.context_length,
            vocab_size=len(self.tokenizer),
            source=str(loaded.path),
            has_chat_template=bool(getattr(self.tokenizer, "has_chat_template", False)),
        )
        self.stats = EngineStats()
        self.max_queue = max_queue
        self._eos = set(self.tokenizer.eos_token_ids)
        self._special = set(getattr(self.tokenizer, "all_special_ids", ()) or ())
        self._queue: queue.Queue[_Job | None] = queue.Queue()
        self._waiting = 0
        self._lock = threading.Lock()
        self._warm_up()
        self._thread = threading.Thread(target=self._run, name="mlx-engine", daemon=True)
        self._thread.start()

    def _warm_up(self) -> None:
        """Run two tokens once, so the first client does not pay for kernel compilation."""
        started = time.perf_counter()
        for _ in generate_step(mx.array([0]), self.model, max_tokens=2):
            pass
        log_event(logger, "engine.warm", seconds=round(time.perf_counter() - started, 2))

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
                raise Overloaded(f"the engine queue is full ({self.max_queue} requests waiting); retry later")
            job = _Job(request, asyncio.get_running_loop())
            self._waiting += 1
            self.stats.num_waiting = self._waiting
            self.stats.requests[request.request_id] = job.progress
        self._queue.put(job)
        return self._events(job)

    async def _events(self, job: _Job) -> AsyncIterator[EngineEvent]:
        try:
            while True:
                event = await job.events.get()
                yield event
                if isinstance(event, Finished):
                    return
        finally:
            job.request.cancelled.set()

    def memory(self) -> dict[str, float]:
        gb = 1024**3
        return {
            "active_memory_gb": round(mx.get_active_memory() / gb, 3),
            "peak_memory_gb": round(mx.get_peak_memory() / gb, 3),
            "cache_memory_gb": round(mx.get_cache_memory() / gb, 3),
        }

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=10)

    # -- the engine thread -----------------------------------------------

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            with self._lock:
                self._waiting -= 1
                self.stats.num_waiting = self._waiting
            request, progress = job.request, job.progress
            if request.cancelled.is_set():
                self.stats.requests.pop(request.request_id, None)
                job.post(Finished("cancelled", Usage(len(request.prompt_tokens), 0)))
                continue
            self.stats.num_running = 1
            progress.started_at = time.monotonic()
            try:
                self._serve(job)
            except Exception as exc:  # one bad request must not kill the engine
                log_event(logger, "engine.error", logging.ERROR, request_id=request.request_id, error=repr(exc))
                job.post(Finished("error", Usage(len(request.prompt_tokens), 0), error=str(exc)))
            finally:
                self.stats.num_running = 0
                self.stats.total_requests_processed += 1
                self.stats.requests.pop(request.request_id, None)

    def _serve(self, job: _Job) -> None:
        request, progress = job.request, job.progress
        params = request.sampling
        prompt_len = len(request.prompt_tokens)
        detok = self.tokenizer.detokenizer
        stops = StopMatcher(params.stop)
        pending, pending_tokens, produced = "", 0, 0
        reason = "length"
        started = time.perf_counter()

        def on_prefill(done: int, total: int) -> None:
            if request.cancelled.is_set():
                raise _Cancelled

        steps = generate_step(
            mx.array(request.prompt_tokens),
            self.model,
            max_tokens=params.max_tokens,
            sampler=make_sampler(params),
            logits_processors=make_processors(params, prompt_len),
            prefill_step_size=PREFILL_STEP,
            prompt_progress_callback=on_prefill,
        )
        try:
            for token, _ in steps:
                if request.cancelled.is_set():
                    reason = "cancelled"
                    break
                produced += 1
                progress.generated_tokens = produced
                if produced == 1:
                    progress.first_token_at = time.monotonic()
                self.stats.steps_executed += 1
                if token in self._eos and not params.ignore_eos:
                    reason = "stop"
                    break
                if token not in self._special:
                    detok.add_token(token)
                    pending += stops.feed(detok.last_segment)
                pending_tokens += 1
                if stops.stopped:
                    reason = "stop"
                    break
                if pending_tokens >= request.stream_interval and pending:
                    job.post(TextDelta(pending, pending_tokens))
                    pending, pending_tokens = "", 0
        except _Cancelled:
            reason = "cancelled"
        finally:
            steps.close()
        if reason != "cancelled" and not stops.stopped:
            detok.finalize()
            pending += stops.feed(detok.last_segment)
            pending += stops.flush()
        if pending and reason != "cancelled":
            job.post(TextDelta(pending, pending_tokens))
        self.stats.total_prompt_tokens += prompt_len
        self.stats.total_completion_tokens += produced
        log_event(
            logger,
            "request.done",
            logging.DEBUG,
            request_id=request.request_id,
            reason=reason,
            prompt_tokens=prompt_len,
            completion_tokens=produced,
            seconds=round(time.perf_counter() - started, 3),
        )
        job.post(Finished(reason, Usage(prompt_len, produced)))
