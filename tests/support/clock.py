"""A fake ``Clock`` for the supervisor's and its slots' tests: virtual time that moves only when told.

- ``monotonic()`` is the virtual now (it starts at 1000.0); ``time()`` is a fixed wall epoch plus
  the same elapsed time, so a stamp taken with one and shown with the other agrees.
- ``sleep(s)`` returns once the virtual now has reached the deadline it set (now + s when called);
  nothing but ``advance`` moves the now, so a sleeper never wakes on its own. ``sleep(0)`` (or less)
  only yields to the loop once, as ``asyncio.sleep(0)`` does. A cancelled sleep is forgotten.
- ``advance(s)`` moves the now forward by ``s`` through every deadline on the way, in order: at
  each, the now is that deadline, its sleepers wake and the loop is settled before the next one,
  so a timer armed by a woken task (a crash's next backoff) fires within the same advance if it is
  due by then. It returns settled, the now exactly ``s`` later.
- ``settle()`` runs the event loop until no callback is ready: whatever can happen without time
  passing (a message handled, a worker that exits at once) has happened. It does not wait for
  sockets, subprocesses or threads: wait for those with a bounded poll (``until``).
- ``run_until(predicate)`` advances in steps until the predicate holds and returns the virtual time
  that took: "not before 30 s, within a second after".

Times are kept in whole nanoseconds, so ``advance(0.49)`` then ``advance(0.01)`` lands exactly on a
timer set for 0.5 s.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable

_NS = 1_000_000_000
_START_NS = 1000 * _NS
_WALL_EPOCH = 1_767_225_600.0  # 2026-01-01T00:00:00Z


def _ns(seconds: float) -> int:
    return round(seconds * _NS)


class FakeClock:
    """Virtual time; see the module's docstring."""

    def __init__(self) -> None:
        self._now_ns = _START_NS
        self._sleepers: list[tuple[int, int, asyncio.Future[None]]] = []  # (deadline, order, future): a heap
        self._order = itertools.count()

    # -- the Clock protocol ------------------------------------------------------------------

    def monotonic(self) -> float:
        return self._now_ns / _NS

    def time(self) -> float:
        return _WALL_EPOCH + (self._now_ns - _START_NS) / _NS

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._now_ns + _ns(seconds), next(self._order), future))
        await future  # a cancelled sleep cancels its future: skipped when its deadline comes

    # -- moving it ---------------------------------------------------------------------------

    @property
    def elapsed(self) -> float:
        """Virtual seconds since the clock was made."""
        return (self._now_ns - _START_NS) / _NS

    def pending(self) -> list[float]:
        """The sleepers' remaining times, soonest first (cancelled ones left out)."""
        return sorted((d - self._now_ns) / _NS for d, _, f in self._sleepers if not f.done())

    async def advance(self, seconds: float) -> None:
        """Move the now ``seconds`` forward, waking each sleeper at its deadline (see the module)."""
        if seconds < 0:
            raise ValueError("time does not go back")
        target = self._now_ns + _ns(seconds)
        await self.settle()
        while self._sleepers and self._sleepers[0][0] <= target:
            deadline = self._sleepers[0][0]
            self._now_ns = max(self._now_ns, deadline)
            while self._sleepers and self._sleepers[0][0] <= self._now_ns:
                future = heapq.heappop(self._sleepers)[2]
                if not future.done():
                    future.set_result(None)
            await self.settle()
        self._now_ns = target
        await self.settle()

    async def settle(self, limit: int = 10_000) -> None:
        """Run the loop until no callback is ready (see the module's docstring)."""
        loop = asyncio.get_running_loop()
        for _ in range(limit):
            await asyncio.sleep(0)
            if not _ready(loop):
                return
        raise AssertionError(f"the event loop did not settle in {limit} rounds: a task keeps itself busy")

    async def run_until(self, predicate: Callable[[], bool], *, step: float = 0.1, within: float = 60.0) -> float:
        """Advance ``step`` at a time until ``predicate()`` holds; the virtual seconds that took.
        Fails once ``within`` virtual seconds have gone by without it."""
        began = self._now_ns
        await self.settle()
        while not predicate():
            assert self._now_ns - began < _ns(within), f"not reached within {within:g} virtual seconds"
            await self.advance(step)
        return (self._now_ns - began) / _NS


def _ready(loop: asyncio.AbstractEventLoop) -> int:
    """How many callbacks the loop has ready to run (CPython's loops keep them in ``_ready``)."""
    ready = getattr(loop, "_ready", None)
    return len(ready) if ready is not None else 0
