"""The supervisor's and its slots' time: a ``Clock`` they are given, the real one by default.

Every timer of the daemon's decisions reads it: a crash's backoff, a start's ready timeout, the
health-check interval, the idle ticker, a worker's time since READY (fast crashes), the stand-in's
retry window, a rank group's grace after rank 0's clean stop, an upstream's check interval, and
the wall times status shows. Tests give a fake one (``tests/support/clock.py``) and move its time
themselves, so a timing is asserted in virtual seconds, never by sleeping.

What waits on a real process or socket keeps real time (``process.py``): a worker's readiness
polls (its own ready deadline only backs the slot's up), one health check's timeout, a drain's
SIGKILL timeout; the stand-in's reads; HTTP timeouts. A worker's own stamps (``load_at``) read
``time.monotonic``, as the real clock does.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Protocol


class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds on a clock that never goes back: intervals and deadlines."""
        ...

    def time(self) -> float:
        """Wall time, seconds since the epoch: only for times shown (ready since, last reload)."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Return once ``seconds`` have passed on this clock."""
        ...


class RealClock:
    """``time.monotonic``, ``time.time`` and ``asyncio.sleep``."""

    def monotonic(self) -> float:
        return time.monotonic()

    def time(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


REAL_CLOCK = RealClock()


async def done_within(clock: Clock, future: asyncio.Future[Any], seconds: float) -> bool:
    """Wait until ``future`` is done or ``seconds`` have passed on ``clock``; True if it is done.
    The future itself is never cancelled (a worker's exit, still awaited after)."""
    if not future.done():
        timer = asyncio.ensure_future(clock.sleep(seconds))
        try:
            await asyncio.wait({future, timer}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            timer.cancel()
    return future.done()
