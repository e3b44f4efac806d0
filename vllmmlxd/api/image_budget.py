"""Decoded image pixels a worker holds at once, across every request: the decode budget.

A request's images are measured from their headers first (``images.canvas``); before any is
decoded the request takes their pixels from the worker's budget, waiting its turn (first come,
first served) while other requests hold it, and a 503 after ``WAIT_S``. Each decoded image gives
its pixels back when it is freed (a finalizer: the request is done with it, answered, failed or
cancelled), so the budget bounds what decoded pictures hold in memory, not only how many are
being decoded. Everything runs on the event loop: a finalizer that runs elsewhere (a thread
dropping the last reference) only schedules the give-back there.
"""

from __future__ import annotations

import asyncio
import gc
import time
import weakref
from collections import deque
from dataclasses import dataclass, field

from ..errors import InvalidRequest, Overloaded

WAIT_S = 30.0  # a request waits this long for other requests' images to be freed, then 503


def fits(held: int, capacity: int, wanted: int) -> bool:
    return held + wanted <= capacity


@dataclass
class PixelBudget:
    capacity: int
    held: int = 0
    _waiting: deque[tuple[int, asyncio.Future]] = field(default_factory=deque)
    _loop: asyncio.AbstractEventLoop | None = None
    _collected: float = 0.0

    async def take(self, pixels: int, wait_s: float = WAIT_S) -> None:
        """``pixels`` from the budget, once they fit behind every request that waits already."""
        if pixels > self.capacity:
            raise InvalidRequest(
                f"the request's images have {pixels:,} pixels together; this worker decodes at most "
                f"{self.capacity:,} at once (image_pixel_budget)",
                param="messages",
            )
        self._loop = asyncio.get_running_loop()
        if self._take_now(pixels):
            return
        if time.monotonic() - self._collected > 1.0:
            # Images a failed request left in a reference cycle are freed by a collection, not at once.
            self._collected = time.monotonic()
            gc.collect()
            if self._take_now(pixels):
                return
        entry = (pixels, self._loop.create_future())
        self._waiting.append(entry)
        try:
            await asyncio.wait_for(asyncio.shield(entry[1]), wait_s)
        except TimeoutError:
            if entry in self._waiting:
                self._waiting.remove(entry)
                self._grant()  # those behind it may fit now
                raise Overloaded(
                    "the worker is decoding other requests' images; retry shortly", retry_after=5
                ) from None
        except asyncio.CancelledError:  # the client left while waiting
            if entry in self._waiting:
                self._waiting.remove(entry)
                self._grant()
            else:
                self.give(pixels)  # granted as it was cancelled
            raise

    def _take_now(self, pixels: int) -> bool:
        """Take ``pixels`` at once if nobody waits ahead and they fit."""
        if self._waiting or not fits(self.held, self.capacity, pixels):
            return False
        self.held += pixels
        return True

    def give(self, pixels: int) -> None:
        """Pixels back (on the event loop); whoever waits first and now fits goes on."""
        self.held = max(0, self.held - pixels)
        self._grant()

    def hold(self, image: object, pixels: int) -> None:
        """Give ``pixels`` back when ``image`` is freed, wherever that happens."""
        weakref.finalize(image, _give_later, self, pixels)

    def _grant(self) -> None:
        while self._waiting and fits(self.held, self.capacity, self._waiting[0][0]):
            pixels, future = self._waiting.popleft()
            self.held += pixels
            if not future.done():
                future.set_result(None)

    def describe(self) -> dict:
        return {"capacity": self.capacity, "held": self.held, "waiting": len(self._waiting)}


def _give_later(budget: PixelBudget, pixels: int) -> None:
    loop = budget._loop
    try:
        if loop is None or loop.is_closed():
            budget.held = max(0, budget.held - pixels)  # no loop to wake: nobody waits
        else:
            loop.call_soon_threadsafe(budget.give, pixels)
    except RuntimeError:  # the loop closed meanwhile (shutdown)
        pass
