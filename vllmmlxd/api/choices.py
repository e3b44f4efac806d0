"""Several choices of one request (OpenAI's ``n``): n engine requests of the same prompt, each
its own row of the batch (so ``n`` counts against ``max_num_seqs`` and the KV budget as n rows),
submitted together so that the prefix cache prefills the prompt once and the others start from
its blocks (admission holds requests that share a start behind the first). With a ``seed``,
choice i samples with a seed drawn from it and i, so the set repeats; without, each its own.

Read as one generation: ``Choices.open`` merges the choices' events as :class:`ChoiceEvent`, in
the order they come, then one :class:`Finished` with the usage of all (the prompt counted once,
the written tokens of every choice), as OpenAI counts it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
from collections.abc import AsyncGenerator, Callable
from typing import Any

from ..engine.types import Finished, GenerationRequest, Usage
from .context import ServingContext
from .stream import ChoiceEvent, open_events

SEED_STRIDE = 0x9E3779B97F4A7C15  # choice i's seed: the request's plus i times this odd constant (mod 2^64)


def choice_requests(first: GenerationRequest, n: int) -> list[GenerationRequest]:
    """``first`` and its n - 1 siblings: their own ids, cancel flags and (seeded) seeds."""
    seed = first.sampling.seed
    out = []
    for i in range(n):
        sampling = first.sampling
        if seed is not None:
            sampling = dataclasses.replace(sampling, seed=(seed + i * SEED_STRIDE) % 2**64)
        out.append(
            first
            if i == 0 and seed is None
            else dataclasses.replace(
                first,
                request_id=first.request_id if i == 0 else f"{first.request_id}-{i}",
                sampling=sampling,
                cancelled=first.cancelled if i == 0 else threading.Event(),
                # Each its own grammar state: the engine writes a failure to the constraint it holds.
                constraint=first.constraint
                if i == 0 or first.constraint is None
                else dataclasses.replace(first.constraint, failures=[]),
            )
        )
    return out


class _Cancels:
    """Every choice's cancel flag, set as one (a response ends, or its client goes)."""

    def __init__(self, flags: list[Any]):
        self.flags = flags

    def set(self) -> None:
        for flag in self.flags:
            flag.set()

    def is_set(self) -> bool:
        return all(flag.is_set() for flag in self.flags)


class Choices:
    """n generations read as one (``stream``/``fold`` take it like any generation)."""

    def __init__(self, ctx: ServingContext, gens: list[Any], wrap: Callable[[Any], Any] = lambda g: g):
        self.ctx, self.gens = ctx, [wrap(g) for g in gens]
        self.request_id = gens[0].request_id
        self.cancelled = _Cancels([g.cancelled for g in self.gens])

    def open(self) -> AsyncGenerator:
        """Admit every choice now (a full queue is a 503 before any byte: choices opened so far are
        cancelled), then read their events together."""
        opened: list[AsyncGenerator] = []
        try:
            for gen in self.gens:
                opened.append(open_events(self.ctx, gen))
        except BaseException:
            self.cancelled.set()
            raise
        return self._merged(opened)

    async def _merged(self, opened: list[AsyncGenerator]) -> AsyncGenerator[Any, None]:
        queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
        done = object()

        async def pump(i: int, events: AsyncGenerator) -> None:
            try:
                async for event in events:
                    await queue.put((i, event))
            finally:
                await queue.put((i, done))

        tasks = [asyncio.create_task(pump(i, events)) for i, events in enumerate(opened)]
        finishes: dict[int, Finished] = {}
        left = len(tasks)
        try:
            while left:
                i, event = await queue.get()
                if event is done:
                    left -= 1
                    continue
                if isinstance(event, Finished):
                    finishes[i] = event
                    if event.reason == "error":  # one choice failed: the answer did
                        yield event
                        return
                yield ChoiceEvent(i, event)
            if len(finishes) == len(tasks):
                yield combined(list(finishes.values()))
        finally:
            self.cancelled.set()
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            for events in opened:
                await events.aclose()


def combined(finishes: list[Finished]) -> Finished:
    """The answer's end: the prompt once (and its cached tokens, the most any choice had), every choice's tokens."""
    first = finishes[0]
    usage = Usage(
        first.usage.prompt_tokens,
        sum(f.usage.completion_tokens for f in finishes),
        max(f.usage.cached_tokens for f in finishes),
        sum(f.usage.predicted_tokens for f in finishes),
        sum(f.usage.accepted_predicted for f in finishes),
    )
    return dataclasses.replace(first, usage=usage)
