"""A slot's worker processes, beside its actor: spawning, watching, draining, pushing settings.

Nothing here decides. The actor says what to do; each worker's watch posts what happens to
it (listening, ready, start timeout, health failed, exited) back to the actor's queue, so
the actor never waits on a worker and a stop interrupts a start or a backoff at once.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

from ...log import log_event
from ..clock import REAL_CLOCK, Clock, done_within
from .process import UnitConfig, WorkerProcess
from .ranks import RankGroup
from .slot_messages import BackoffElapsed, Listening, SlotMsg, WorkerExited, WorkerNews
from .slot_news import Result
from .tuning import Tuning

logger = logging.getLogger("vllmmlxd.supervisor")

# supervisor/live.py's push_settings: (True, config hash) once the worker runs the config, else (False, why).
PushSettings = Callable[[Path, UnitConfig], Awaitable["tuple[bool, str | None]"]]
Post = Callable[[SlotMsg], None]  # the actor's queue


class SlotWorkers:
    """Every worker of one slot not yet reaped, and the tasks that watch and stop them."""

    def __init__(self, name: str, post: Post, push_settings: PushSettings | None, clock: Clock = REAL_CLOCK):
        self.name = name
        self._clock = clock  # the backoff timer's and the health checks' interval
        self._post = post
        self._push_settings = push_settings
        self._alive: set[WorkerProcess] = set()
        self._tasks: set[asyncio.Task] = set()  # watches, drains, pushes, the backoff timer
        self._retiring: set[asyncio.Task] = set()  # workers draining after a swap

    async def spawn(self, config: UnitConfig, sock: socket.socket, tuning: Tuning, **how: Any) -> WorkerProcess:
        """Start a worker on ``sock`` and watch it; ``how``: WorkerProcess.spawn's settings. Raises OSError."""
        if getattr(config, "distributed", None) is not None:
            worker: WorkerProcess = await RankGroup.spawn_group(
                self.name, config, listen_fd=sock.fileno(), clock=self._clock, **how
            )
        else:
            worker = await WorkerProcess.spawn(self.name, config, listen_fd=sock.fileno(), **how)
        self._alive.add(worker)
        self.track(self._watch(worker, tuning))
        return worker

    async def _watch(self, worker: WorkerProcess, t: Tuning) -> None:
        """Readiness, then periodic health, then the exit of one worker, posted as events."""
        exited = asyncio.ensure_future(worker.exited())
        # The ready timeout is the clock's (the worker's own, the same, only backs it up).
        readying = asyncio.ensure_future(
            worker.wait_ready(t.ready_timeout_s, on_listening=lambda: self._post(Listening(worker)))
        )
        try:
            ready = await done_within(self._clock, readying, t.ready_timeout_s) and readying.result()
            if ready:
                self._post(WorkerNews("worker_ready", worker))
            elif worker.alive:
                self._post(WorkerNews("start_timeout", worker))
            failures = 0
            while ready and worker.alive:
                if await done_within(self._clock, exited, t.health_interval_s):
                    break
                failures = 0 if await worker.healthy(t.health_timeout_s) else failures + 1
                if failures >= t.health_failures and worker.alive:
                    log_event(
                        logger,
                        "worker.unhealthy",
                        logging.WARNING,
                        model=self.name,
                        pid=worker.pid,
                        failed_checks=failures,
                    )
                    self._post(WorkerNews("health_failed", worker))
                    failures = 0
        finally:
            readying.cancel()  # timed out: it polls no more
            await worker.wait()  # (``exited`` ends with it)
            self._alive.discard(worker)
            self._post(WorkerExited(worker))

    def drain(self, worker: WorkerProcess, timeout: float) -> None:
        """SIGTERM now; SIGKILL if it is still there after ``timeout`` (its exit is watched)."""
        self.track(worker.stop(timeout))

    def retire(self, worker: WorkerProcess, timeout: float) -> None:
        """Drain a worker a swap replaced; ``wait_retired`` waits for every such drain."""

        async def drain() -> None:
            log_event(logger, "worker.draining", model=self.name, pid=worker.pid)
            code = await worker.stop(timeout)
            log_event(logger, "worker.exited", model=self.name, pid=worker.pid, exit_code=code)

        task = self.track(drain())
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def wait_retired(self) -> None:
        # asyncio.wait, not gather: a caller cancelled here must not cancel the drains.
        if self._retiring:
            await asyncio.wait(set(self._retiring))

    def push(self, worker: WorkerProcess, config: UnitConfig, done: Callable[[Result], None]) -> None:
        """Send ``config``'s live settings to a running worker; ``done`` gets the outcome."""

        async def push() -> None:
            why: str | None
            ok, why = False, "no way to push settings"
            if self._push_settings is not None:
                try:
                    ok, why = await self._push_settings(worker.health_socket, config)
                except Exception as exc:  # a push must never take the slot down
                    why = f"{type(exc).__name__}: {exc}"
            if ok:
                worker.config = config  # what it runs now: a failed swap later restores this, not its start config
            else:
                log_event(logger, "worker.settings_failed", logging.WARNING, model=self.name, pid=worker.pid, error=why)
            done((ok, None if ok else why))

        self.track(push())

    def backoff(self, delay: float, token: int) -> asyncio.Task:
        """Post ``BackoffElapsed(token)`` once ``delay`` seconds have passed on the clock."""

        async def timer() -> None:
            await self._clock.sleep(delay)
            self._post(BackoffElapsed(token))

        return self.track(timer())

    def track(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def kill_all(self) -> list[int]:
        """SIGKILL every worker still alive (the daemon's last resort at exit); their pids."""
        pids = []
        for worker in list(self._alive):
            if worker.alive:
                worker.kill()
                pids.extend(worker.pids)
        return pids
