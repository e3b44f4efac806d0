"""The engine of an entry whose model does not generate text (embeddings, reranking, speech to
text): every generation route answers 400 saying what the entry serves instead; health, status and
metrics read idle counters. The subclass holds the model that does the entry's work."""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from ..errors import InvalidRequest
from .types import Constraint, EngineEvent, EngineStats, GenerationRequest, ModelInfo, RenderedPrompt


def answer(loop: asyncio.AbstractEventLoop, future: asyncio.Future, result: Any) -> None:
    """From a model's own thread, settle a request's ``future`` on its loop with ``result`` (an
    exception fails it); a request already gone, or a loop closed, needs nothing."""
    with contextlib.suppress(RuntimeError):  # that loop is closed: nobody is listening
        loop.call_soon_threadsafe(_settle, future, result)


P = TypeVar("P")


@dataclass
class Job(Generic[P]):
    """One request to a model's own thread: what to run, where to answer, and whether its client left."""

    payload: P
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future
    cancelled: threading.Event = field(default_factory=threading.Event)


class JobThread(Generic[P]):
    """A model's own thread (MLX keeps streams per thread: its graphs never run on another's) fed
    from an inbox in order: ``handle`` runs each job there and returns its result or the exception
    that fails it, which ``answer`` settles on the request's loop."""

    def __init__(self, name: str, handle: Callable[[Job[P]], Any]):
        self._inbox: queue.SimpleQueue[Job[P] | None] = queue.SimpleQueue()
        self._handle = handle
        self._thread: threading.Thread | None = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    async def submit(self, payload: P) -> Any:
        loop = asyncio.get_running_loop()
        job = Job(payload, loop, loop.create_future())
        self._inbox.put(job)
        try:
            return await job.future
        finally:
            job.cancelled.set()  # a client gone before its turn (or between batches) costs no more work

    def close(self) -> None:
        if self._thread is not None:
            self._inbox.put(None)
            self._thread.join(timeout=10)
            self._thread = None

    def _run(self) -> None:
        while (job := self._inbox.get()) is not None:
            answer(job.loop, job.future, self._handle(job))


def _settle(future: asyncio.Future, result: Any) -> None:
    if future.done():
        return
    if isinstance(result, BaseException):
        future.set_exception(result)
    else:
        future.set_result(result)


def task_model_info(name: str, *, context_length: int, vocab_size: int, source: str, **extra: Any) -> ModelInfo:
    # has_chat_template True: chat requests reach apply_chat_template, which says why they cannot run.
    return ModelInfo(
        name=name,
        context_length=context_length,
        vocab_size=vocab_size,
        source=source,
        has_chat_template=True,
        tool_parser=None,
        **extra,
    )


class TaskEngine:
    """What the worker's app needs of an engine, for an entry that serves one task but generation."""

    refusal = "this entry's model cannot generate text"  # each subclass names what it serves

    def __init__(self, info: ModelInfo):
        self.info = info
        self.stats = EngineStats()

    def _refuse(self) -> InvalidRequest:
        return InvalidRequest(self.refusal, param="model")

    def tokenize(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        raise self._refuse()

    def detokenize(self, tokens: list[int]) -> str:
        raise self._refuse()

    def tokenizer_info(self) -> dict[str, Any]:
        raise self._refuse()

    def apply_chat_template(
        self, messages: list[dict], *, tools: list[dict] | None = None, template_kwargs: dict | None = None
    ) -> list[int]:
        raise self._refuse()

    def render(
        self, messages: list[dict], *, tools: list[dict] | None = None, template_kwargs: dict | None = None
    ) -> RenderedPrompt:
        raise self._refuse()

    def generate(self, request: GenerationRequest) -> AsyncGenerator[EngineEvent, None]:
        raise self._refuse()

    def check_constraint(self, constraint: Constraint) -> str | None:
        return self.refusal

    def memory(self) -> dict[str, float]:
        import mlx.core as mx  # here: the API imports this module (``answer``), and it never loads mlx

        gb = 1024**3
        return {
            "active_memory_gb": round(mx.get_active_memory() / gb, 3),
            "peak_memory_gb": round(mx.get_peak_memory() / gb, 3),
            "cache_memory_gb": round(mx.get_cache_memory() / gb, 3),
        }

    def cache_status(self) -> dict:
        return {
            "type": "none",
            "entries": 0,
            "hit_rate": 0.0,
            "memory_mb": 0.0,
            "budget_mb": 0.0,
            "hits": 0,
            "misses": 0,
            "cached_tokens": 0,
            "evictions": 0,
        }

    def close(self) -> None:
        pass
