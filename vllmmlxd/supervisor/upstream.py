"""A model served by another host's daemon (``upstream:``): no process here, only health checks.

The daemon checks ``GET {upstream}/health`` every few seconds and keeps the answer as the
entry's state, ``ready`` or ``unreachable`` (with why), which ``vllmmlxctl status`` shows and
the gateway routes by: an unreachable host's models get a 503 at once, the others carry on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import httpx

from ..config.schema import ResolvedUpstream
from ..log import log_event
from . import states
from .clock import REAL_CLOCK, Clock, done_within

logger = logging.getLogger("vllmmlxd.supervisor")

CHECKING: states.Shown = states.STARTING  # before the first answer
READY: states.Shown = states.READY
UNREACHABLE: states.Shown = states.UNREACHABLE
CHECK_TIMEOUT_S = 3.0
SLOW_CHECKS = 2  # a host that answers slowly this many times in a row is unreachable; a refusal counts at once


class UpstreamChecks:
    """Health checks of one upstream entry; ``state`` and ``last_error`` as of the last check, written
    by its own task only (a reload's new entry reaches it through ``update``)."""

    def __init__(
        self,
        name: str,
        config: ResolvedUpstream,
        interval_s: float,
        on_change: Callable[[], None],
        clock: Clock = REAL_CLOCK,
    ):
        self.name = name
        self._clock = clock  # the interval between checks, and ready_since
        self.config = config
        self.interval_s = interval_s
        self.state: states.Shown = CHECKING
        self.last_error: str | None = None
        self.ready_since: float | None = None
        self.checks = 0
        self._slow = 0  # timeouts in a row
        self._on_change = on_change
        self._wake = asyncio.Event()
        self._tls = httpx.create_ssl_context()  # loaded once: the CA store costs 40 ms of CPU each time
        self._task = asyncio.create_task(self._run(), name=f"upstream-{name}")

    def update(self, config: ResolvedUpstream, interval_s: float | None = None) -> None:
        """A reload's new entry: checked again at once."""
        self.config = config
        self.interval_s = interval_s or self.interval_s
        self._wake.set()

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    async def check(self) -> tuple[states.Shown, str | None]:
        """One health check: ``(ready, None)`` or ``(unreachable, why)``."""
        headers = {}
        if self.config.upstream_api_key is not None:
            headers["authorization"] = f"Bearer {self.config.upstream_api_key.get_secret_value()}"
        try:
            async with httpx.AsyncClient(timeout=CHECK_TIMEOUT_S, verify=self._tls) as client:
                response = await client.get(f"{self.config.upstream}/health", headers=headers)
        except httpx.TimeoutException:
            self._slow += 1
            if self._slow < SLOW_CHECKS and self.state == READY:  # one slow answer on a busy host is not a fault
                return READY, None
            return UNREACHABLE, f"{self.config.upstream}/health did not answer within {CHECK_TIMEOUT_S:g}s"
        except httpx.HTTPError as exc:
            self._slow = 0
            return UNREACHABLE, f"cannot reach {self.config.upstream}: {type(exc).__name__}: {exc}"
        self._slow = 0
        if response.status_code == 200:
            return READY, None
        return UNREACHABLE, f"{self.config.upstream}/health answered {response.status_code}"

    async def _run(self) -> None:
        while True:
            state, why = await self.check()
            self.checks += 1
            if (state, why) != (self.state, self.last_error):
                if state != self.state:
                    log_event(
                        logger,
                        f"upstream.{state}",
                        logging.INFO if state == READY else logging.WARNING,
                        model=self.name,
                        url=self.config.upstream,
                        error=why,
                    )
                    self.ready_since = self._clock.time() if state == READY else None
                self.state, self.last_error = state, why
                self._on_change()
            self._wake.clear()
            woken = asyncio.ensure_future(self._wake.wait())
            try:
                await done_within(self._clock, woken, self.interval_s)  # a reload's update wakes it early
            finally:
                woken.cancel()
