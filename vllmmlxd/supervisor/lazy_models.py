"""Lazy models, as the supervisor runs them: unloaded until a request needs one, loaded under
memory admission (idle lazy models unloaded first, least recently used first), and unloaded
after ``idle_unload_s`` without a request. The decisions are ``lazy.py``'s (pure); this is the
shell that reads the workers and drives the slots. Mixed into ``Supervisor``.
"""

from __future__ import annotations

import asyncio
import logging
import time

from ..config.schema import ModelConfig
from ..log import log_event
from ..sockets import bind_tcp
from . import lazy, states
from .memory import entry_footprints, read_capacity
from .slot import Slot
from .views import ActionReply

logger = logging.getLogger("vllmmlxd.supervisor")

IDLE_CHECK_S = 1.0  # how often lazy models' idle time is compared with their idle_unload_s


class LazyModels:
    """The supervisor's lazy-model half: needs ``slots``, ``upstreams``, ``_load_lock``, ``_loading``,
    ``_slot``, ``_on_change``, ``daemon_config`` and ``settings``."""

    def _wait_unloaded(self, slot: Slot) -> None:
        slot.unloaded = True
        # A request on its own port is answered 503 (Retry-After) and loads it: the client's retry finds it.
        slot.on_demand = lambda: self._load_in_background(slot.name)
        if slot.sock is None:
            try:  # bound now: clients get a 503 saying why, not a refused connection
                slot.sock = bind_tcp(slot.config.host, slot.config.port)
            except OSError as exc:
                log_event(logger, "slot.bind_failed", logging.WARNING, model=slot.name, error=exc.strerror or str(exc))
        slot.answer_on_socket()
        self._on_change()

    def _load_in_background(self, name: str) -> None:
        if name in self._loading or name in self._demanded:
            return
        self._demanded.add(name)
        log_event(logger, "model.demanded", model=name, reason="a request on its port")

        async def load() -> None:
            try:
                await self.load(name)
            finally:
                self._demanded.discard(name)

        task = asyncio.get_running_loop().create_task(load())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def shown(self, name: str) -> tuple[states.Shown, str | None]:
        """A model's state as status and the gateway show it, and why it is not serving."""
        if name in self.upstreams:
            upstream = self.upstreams[name]
            return upstream.state, upstream.last_error  # type: ignore[return-value]
        slot = self.slots[name]
        state: states.Shown = slot.state
        if slot.config.load == "lazy":
            if state == states.STOPPED and slot.unloaded:
                state = states.UNLOADED
            elif state == states.STARTING:
                state = states.LOADING
            elif state == states.READY and self._idle_s(slot) is not None:
                state = states.IDLE
        return state, shown_error(slot)

    @staticmethod
    def _idle_s(slot: Slot) -> float | None:
        worker = slot.serving
        if worker is None or slot.state != states.READY:
            return None
        return lazy.idle_for(worker.load.get("idle_s"), worker.load_at, time.monotonic())

    async def load(self, name: str) -> ActionReply:
        """Make ``name`` serve (the gateway asks, for a request that needs it): start a lazy model that is not
        loaded, unloading idle lazy ones first if memory needs it; answers once it is ready, or why not."""
        if name in self.upstreams:
            state, error = self.shown(name)
            return ActionReply(ok=state == states.READY, name=name, message=error or state)
        slot = self._slot(name)
        if slot.state in (states.READY, states.STARTING):
            waiting = asyncio.ensure_future(slot.start())
        else:
            async with self._load_lock:  # after an unload in progress, which holds it
                if slot.state == states.STOPPED and not slot.unloaded:
                    return ActionReply(ok=False, name=name, message=f"model {name} is stopped (vllmmlxctl start {name})")
                if slot.state == states.FAILED:
                    return ActionReply(ok=False, name=name, message=f"model {name} failed: {shown_error(slot)}")
                if slot.state in (states.STOPPED, states.BACKOFF):
                    refused = await self._make_room(name)
                    if refused is not None:
                        return refused
                    self._loading.add(name)
                    log_event(logger, "model.loading", model=name, reason="on demand")
                waiting = asyncio.ensure_future(slot.start())
                await asyncio.sleep(0)  # the slot's actor takes the start before the lock is let go
        try:
            ok = await waiting
        finally:
            self._loading.discard(name)
        if ok:
            slot.unloaded = False
        elif slot.config.load == "lazy" and slot.state == states.STOPPED:
            slot.unloaded = True
        return ActionReply(ok=ok, name=name, message="ready" if ok else f"did not become ready: {shown_error(slot) or slot.last_error}")

    async def _make_room(self, name: str) -> ActionReply | None:
        """Under the load lock: unload idle lazy models until ``name`` fits; an answer saying why when it cannot."""
        running = {n: s.config for n, s in self.slots.items()
                   if n == name or n in self._loading or s.state not in (states.STOPPED, states.FAILED)}
        await asyncio.gather(*(s.serving.refresh() for n, s in self.slots.items() if n in running and s.serving),
                             return_exceptions=True)
        capacity, footprints = await asyncio.to_thread(self._footprints, running)
        resident = [
            lazy.Resident(n, footprints[n].total_mb,
                          self._idle_s(self.slots[n]) if self.slots[n].config.load == "lazy" and n not in self._loading else None)
            for n in running if n != name
        ]
        room = lazy.make_room(name, footprints[name].total_mb, capacity.usable_mb, resident)
        if not room.fits:
            log_event(logger, "memory.load_refused", logging.WARNING, model=name, needed_mb=footprints[name].total_mb,
                      usable_mb=capacity.usable_mb, error=room.message)
            return ActionReply(ok=False, name=name, message=room.message)
        for victim in room.evict:
            log_event(logger, "model.unloading", model=victim, reason="memory", for_model=name,
                      idle_s=self._idle_s(self.slots[victim]))
            await self._unload(victim)
        return None

    def _footprints(self, entries: dict[str, ModelConfig]):
        capacity = read_capacity(self.daemon_config.memory_reserve_mb)
        return capacity, entry_footprints(entries, self.settings.state_dir, capacity.physical_mb)

    async def _unload(self, name: str) -> None:
        slot = self.slots[name]
        slot.unloaded = True
        await slot.stop()
        self._wait_unloaded(slot)

    async def _unload_idle(self) -> None:
        """Unload each lazy model idle for its ``idle_unload_s`` (checked every second, confirmed by asking it)."""
        while True:
            await asyncio.sleep(IDLE_CHECK_S)
            for name, slot in list(self.slots.items()):
                limit = slot.config.idle_unload_s
                if limit is None or not lazy.should_unload(self._idle_s(slot), limit) or name in self._loading:
                    continue
                if slot.serving is not None:
                    await slot.serving.refresh()
                async with self._load_lock:
                    idle = self._idle_s(slot)
                    if self.slots.get(name) is slot and lazy.should_unload(idle, limit):
                        log_event(logger, "model.unloading", model=name, reason="idle", idle_s=round(idle or 0, 1),
                                  idle_unload_s=limit)
                        await self._unload(name)



def shown_error(slot: Slot) -> str | None:
    if slot.state in (states.FAILED, states.BACKOFF):
        return f"{slot.fail_reason}: {slot.last_error}" if slot.state == states.FAILED and slot.fail_reason else slot.last_error
    return None
