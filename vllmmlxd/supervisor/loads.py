"""Lazy models' loads and idle unloads, as the supervisor's task decides and runs them.

A load is admitted by ``plan``: with fresh idle times, footprints and memory, room is made
by unloading idle lazy models least recently used first, or the load is refused with the
numbers. Callers asking for a model whose load is in flight join it. Every second the
ticker reads lazy models' idle times and posts a tick; ``plan`` names who is due.

``Loads`` is part of the supervisor's task: its methods run only there, it reads the units
and carries its decisions out as the supervisor's operations.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from ..log import log_event
from . import states
from .clock import REAL_CLOCK, Clock
from .memory import Capacity
from .messages import IdleTick, Msg
from .operations import Operations, resolve
from .plan import Answer, Join, Load, LoadWanted, Tick, UnitFacts, Unload, plan
from .units import ModelUnit, UpstreamUnit
from .views import ActionReply

logger = logging.getLogger("vllmmlxd.supervisor")

IDLE_CHECK_S = 1.0  # how often lazy models' idle time is read from their workers and compared with their limit

Entries = Callable[[], "dict[str, ModelUnit | UpstreamUnit]"]
Measure = Callable[[], "tuple[Capacity, dict[str, int]]"]  # usable memory and footprints (reads files)


class Loads:
    def __init__(self, entries: Entries, ops: Operations, measure: Measure, clock: Clock = REAL_CLOCK):
        self._entries = entries
        self._clock = clock  # the ticker's
        self._ops = ops
        self._measure = measure
        self._waiting: dict[str, list[asyncio.Future]] = {}  # callers waiting for a load in flight

    def facts(self, footprints: dict[str, int] | None = None) -> dict[str, UnitFacts]:
        out: dict[str, UnitFacts] = {}
        for name, unit in self._entries().items():
            if isinstance(unit, ModelUnit):
                out[name] = unit.facts((footprints or {}).get(name, 0), self._ops.on(name))
            else:
                out[name] = unit.facts()
        return out

    async def admit(self, name: str, future: asyncio.Future | None, *, start: bool) -> None:
        """Decide a load (``start``: a `vllmmlxctl start`, which also loads a model stopped on purpose)."""
        event = LoadWanted(name, start=start)
        actions = plan(self.facts(), None, event)
        if any(isinstance(a, Load) for a in actions):  # admission: now with fresh idle times, footprints, memory
            lazy = [u for u in self._entries().values() if isinstance(u, ModelUnit) and u.lazy]
            await asyncio.gather(*(u.refresh() for u in lazy if u.slot.serving is not None), return_exceptions=True)
            capacity, footprints = await asyncio.to_thread(self._measure)
            actions = plan(self.facts(footprints), capacity.usable_mb, event)
        for action in actions:
            if isinstance(action, Answer):
                if not action.ok:
                    log_event(
                        logger,
                        "memory.load_refused" if "memory" in action.message else "model.load_refused",
                        logging.WARNING,
                        model=name,
                        error=action.message,
                    )
                resolve(future, ActionReply(action.ok, name, action.message))
            elif isinstance(action, Join):
                self._join(name, future)
        load = next((a for a in actions if isinstance(a, Load)), None)
        if load is not None:
            self._load(name, future, [a.name for a in actions if isinstance(a, Unload)], start)

    def _load(self, name: str, future: asyncio.Future | None, unloads: list[str], start: bool) -> None:
        entries = self._entries()
        unit = entries[name]
        assert isinstance(unit, ModelUnit)
        for victim in unloads:
            log_event(logger, "model.unloading", model=victim, reason="memory", for_model=name)
        log_event(logger, "model.loading", model=name, reason="start" if start else "on demand")
        self._waiting[name] = [future] if future is not None else []
        victims = [v for v in (entries[n] for n in unloads) if isinstance(v, ModelUnit)]
        before = self._ops.pending([name, *unloads])

        async def work() -> tuple[bool, str | None]:
            if before:
                await asyncio.wait(before)
            await asyncio.gather(*(v.slot.unload() for v in victims))
            if start:  # from stopped too
                return await unit.slot.start(), unit.slot.last_error
            return await unit.slot.load()

        def done(result: Any, error: BaseException | None) -> None:
            ok, why = result if error is None else (False, str(error))
            for waiting in self._waiting.pop(name, []):
                resolve(waiting, _ready_reply(name, ok, why))

        self._ops.start({name: "loading", **{v: "unloading" for v in unloads}}, work(), done)

    def _join(self, name: str, future: asyncio.Future | None) -> None:
        """Wait for ``name`` to be ready: with the load in flight if there is one, else on its slot."""
        if name in self._waiting:
            if future is not None:
                self._waiting[name].append(future)
            return
        unit = self._entries()[name]
        if not isinstance(unit, ModelUnit):
            return

        async def wait() -> None:
            ok, why = await unit.slot.load()
            resolve(future, _ready_reply(name, ok, why))

        self._ops.track(wait())

    async def ticker(self, post: Callable[[Msg], None]) -> None:
        """Every second: fresh load figures from lazy models' ready workers, then a tick to decide on.
        Every lazy model is read, an entry without ``idle_unload_s`` too: a request may set its limit
        (``keep_alive``), and only a fresh read shows it."""
        while True:
            await self._clock.sleep(IDLE_CHECK_S)
            watched = [
                u
                for u in self._entries().values()
                if isinstance(u, ModelUnit) and u.lazy and u.slot.state == states.READY
            ]
            await asyncio.gather(*(u.refresh() for u in watched), return_exceptions=True)
            post(IdleTick())

    def tick(self) -> None:
        for action in plan(self.facts(), None, Tick()):
            if isinstance(action, Unload):
                self._unload_idle(action.name)

    def _unload_idle(self, name: str) -> None:
        unit = self._entries()[name]
        assert isinstance(unit, ModelUnit)
        idle, limit = unit.idle_s(), unit.idle_unload_s()
        said = limit != unit.config.idle_unload_s  # a request's keep_alive set it
        log_event(
            logger,
            "model.unloading",
            model=name,
            reason="keep_alive" if said else "idle",
            idle_s=round(idle or 0, 1),
            idle_unload_s=limit,
        )
        self._ops.start({name: "unloading"}, unit.slot.unload())


def _ready_reply(name: str, ok: bool, why: str | None) -> ActionReply:
    return ActionReply(ok, name, "ready" if ok else f"did not become ready: {why}")
