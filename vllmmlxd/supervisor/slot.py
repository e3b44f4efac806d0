"""One model entry under supervision: its socket, its current worker, its state.

All changes to a slot happen under its lock, so a crash restart, a reload and a
`vllmmlxctl restart` never race. The daemon owns the listening socket: a new worker
inherits it and starts accepting while the old one drains, so a swap drops nothing.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import sys
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import AsyncIterator, Callable

from ..config.schema import ModelConfig
from ..log import event_line, log_event
from ..runtime.cpus import CpuShare
from ..sockets import bind_tcp, http_url
from . import states
from .backoff import BackoffPolicy
from .process import WorkerProcess

logger = logging.getLogger("vllmmlxd.supervisor")

HEALTH_INTERVAL_S = 10.0
HEALTH_FAILURES = 3


@dataclass(frozen=True)
class SlotSettings:
    state_dir: Path
    drain_timeout: float
    log_level: str
    ready_timeout: float = 900.0  # a first use may fetch and convert a model
    policy: BackoffPolicy = BackoffPolicy()


class Slot:
    """Supervises the worker of one model entry."""

    def __init__(
        self, name: str, config: ModelConfig, settings: SlotSettings, on_change: Callable[[], None],
        share: CpuShare | None = None,
    ):
        self.name = name
        self.config = config
        self.share = share  # the cores its worker is pinned to (None: not pinned)
        self.planned_share = share  # where a reload's plan puts it when it next restarts
        self.settings = settings
        self.state: states.State = states.STOPPED
        self.worker: WorkerProcess | None = None
        self.restarts = 0
        self.last_exit_code: int | None = None
        self.last_error: str | None = None
        self.ready_since: float | None = None
        self.lines: deque[str] = deque(maxlen=1000)
        self._followers: set[asyncio.Queue[str]] = set()
        self._sock: socket.socket | None = None
        self._lock = asyncio.Lock()
        self._gen = 0  # bumped by every deliberate change; a stale monitor sees it and steps aside
        self._fast_crashes = 0
        self._tasks: set[asyncio.Task] = set()
        self._on_change = on_change

    # -- log lines ------------------------------------------------------

    def sink(self, line: str) -> None:
        """A worker's stderr line: forwarded to the daemon's stderr and kept for `logs`."""
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
        self._keep(line)

    def _keep(self, line: str) -> None:
        self.lines.append(line)
        for q in self._followers:
            q.put_nowait(line)

    async def follow(self) -> AsyncIterator[str]:
        q: asyncio.Queue[str] = asyncio.Queue()
        self._followers.add(q)
        try:
            while True:
                yield await q.get()
        finally:
            self._followers.discard(q)

    # -- lifecycle ------------------------------------------------------

    def _set(self, state: states.State, **fields) -> None:
        self.state = state
        log_event(logger, f"worker.{state}", model=self.name, **fields)
        # `vllmmlxctl logs MODEL` shows the daemon's view of the model beside the worker's own lines.
        self._keep(event_line(f"worker.{state}", model=self.name, **fields))
        self._on_change()

    def _bind(self, config: ModelConfig) -> socket.socket | None:
        try:
            return bind_tcp(config.host, config.port)
        except OSError as exc:
            self.last_error = f"cannot listen on {config.host}:{config.port}: {exc.strerror}"
            log_event(logger, "worker.bind_failed", logging.ERROR, model=self.name, error=self.last_error)
            return None

    async def start(self) -> bool:
        """Bind the socket if needed and start a worker; True once it is ready."""
        async with self._lock:
            self._gen += 1
            self._fast_crashes = 0
            return await self._start_locked()

    async def _start_locked(self) -> bool:
        if self.worker is not None and self.worker.alive:
            return self.state == states.READY
        if self._sock is None:
            self._sock = self._bind(self.config)
            if self._sock is None:
                self._set(states.FAILED, error=self.last_error)
                return False
        self.share = self.planned_share  # a (re)start is when a reload's new plan takes effect
        worker = await self._spawn(self.config, self._sock, self.share)
        self.worker = worker
        self._set(states.STARTING, pid=worker.pid)
        if await worker.wait_ready(self.settings.ready_timeout):
            self.ready_since = time.time()
            self._set(states.READY, pid=worker.pid, url=self.url)
            self._watch(worker, self._gen)
            return True
        await self._reap_failed_start(worker)
        self._watch(worker, self._gen)
        return False

    async def _spawn(self, config: ModelConfig, sock: socket.socket, share: CpuShare | None) -> WorkerProcess:
        s = self.settings
        return await WorkerProcess.spawn(
            self.name, config, listen_fd=sock.fileno(), state_dir=s.state_dir,
            drain_timeout=s.drain_timeout, log_level=s.log_level, sink=self.sink,
            cpus=share.render() if share else None,
        )

    async def _reap_failed_start(self, worker: WorkerProcess) -> None:
        if worker.alive:  # never became ready in time
            worker.kill()
        code = await worker.wait()
        self.last_exit_code = code
        self.last_error = worker.last_lines() or f"exited with code {code}"

    def _watch(self, worker: WorkerProcess, gen: int) -> None:
        task = asyncio.create_task(self._monitor(worker, gen))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _monitor(self, worker: WorkerProcess, gen: int) -> None:
        """Wait for the worker to die (or stop answering), then restart it with backoff."""
        failures = 0
        while worker.alive:
            try:
                await asyncio.wait_for(asyncio.shield(worker.proc.wait()), HEALTH_INTERVAL_S)
            except asyncio.TimeoutError:
                failures = 0 if await worker.healthy() else failures + 1
                if failures >= HEALTH_FAILURES and gen == self._gen:
                    log_event(logger, "worker.unhealthy", logging.WARNING, model=self.name, pid=worker.pid)
                    worker.kill()
        code = await worker.wait()
        async with self._lock:
            if gen != self._gen or self.worker is not worker:
                return  # replaced or stopped on purpose
            self.last_exit_code = code
            self.last_error = worker.last_lines() or None
            ran = time.time() - worker.started
            self._fast_crashes = self.settings.policy.next_fast_crashes(self._fast_crashes, ran)
            self.ready_since = None
            if self.settings.policy.gives_up(self._fast_crashes):
                self._set(states.FAILED, exit_code=code, crashes=self._fast_crashes)
                return
            delay = self.settings.policy.delay(self._fast_crashes)
            self._set(states.BACKOFF, exit_code=code, retry_in_s=delay)
        await asyncio.sleep(delay)
        async with self._lock:
            if gen != self._gen:
                return
            self.restarts += 1
            self.worker = None
            await self._start_locked()

    async def replace(
        self, config: ModelConfig, share: CpuShare | None = None, *, hold_both: bool = True,
    ) -> tuple[bool, str | None]:
        """Swap in a worker for ``config`` (on the cores of ``share``) with no downtime; the old one keeps serving if it fails.

        ``hold_both=False`` (the two do not fit in memory together): stop the old worker, then start the new.
        """
        if not hold_both:
            return await self._replace_cold(config, share)
        async with self._lock:
            old_worker, old_sock = self.worker, self._sock
            same_address = (config.host, config.port) == (self.config.host, self.config.port)
            sock = old_sock if same_address and old_sock is not None else self._bind(config)
            if sock is None:
                return False, self.last_error
            new = await self._spawn(config, sock, share)
            log_event(logger, "worker.replacing", model=self.name, old_pid=old_worker and old_worker.pid, pid=new.pid)
            if not await new.wait_ready(self.settings.ready_timeout):
                if new.alive:
                    new.kill()
                code = await new.wait()
                if sock is not old_sock:
                    sock.close()
                error = new.last_lines() or f"the new worker exited with code {code}"
                log_event(logger, "worker.replace_failed", logging.ERROR, model=self.name, exit_code=code)
                return False, error
            self._gen += 1
            self._fast_crashes = 0
            self.config, self.worker, self._sock = config, new, sock
            self.share = self.planned_share = share
            self.ready_since = time.time()
            self._set(states.READY, pid=new.pid, url=self.url)
            self._watch(new, self._gen)
        if old_worker is not None and old_worker.alive:
            await self._drain(old_worker)
        if old_sock is not None and old_sock is not sock:
            old_sock.close()
        return True, None

    async def _replace_cold(self, config: ModelConfig, share: CpuShare | None) -> tuple[bool, str | None]:
        # The socket stays bound when the address does: clients wait in its queue instead of being refused.
        async with self._lock:
            self._gen += 1
            self._fast_crashes = 0
            old = self.worker
            if old is not None and old.alive:
                self._set(states.DRAINING, pid=old.pid, reason="not enough memory for both")
                await self._drain(old, announce=False)
            self.worker, self.ready_since = None, None
            if (config.host, config.port) != (self.config.host, self.config.port) and self._sock is not None:
                self._sock.close()
                self._sock = None
            self.config, self.planned_share = config, share
            ok = await self._start_locked()
            return ok, None if ok else self.last_error

    async def _drain(self, worker: WorkerProcess, *, announce: bool = True) -> None:
        if announce:  # stop() announces it through the slot's state instead
            log_event(logger, "worker.draining", model=self.name, pid=worker.pid)
        code = await worker.stop(self.settings.drain_timeout)
        log_event(logger, "worker.exited", model=self.name, pid=worker.pid, exit_code=code)

    async def stop(self, *, close_socket: bool = True) -> None:
        """Drain and stop the worker; the slot stays (state ``stopped``) unless removed."""
        async with self._lock:
            self._gen += 1
            worker = self.worker
            if worker is not None and worker.alive:
                self._set(states.DRAINING, pid=worker.pid)
                await self._drain(worker, announce=False)
            self.worker = None
            self.ready_since = None
            if close_socket and self._sock is not None:
                self._sock.close()
                self._sock = None
            self._set(states.STOPPED)

    async def restart(self, *, hold_both: bool = True) -> bool:
        """Replace the worker by a fresh one of the same config (zero downtime when it runs and ``hold_both``)."""
        if self.worker is not None and self.worker.alive and self.state == states.READY:
            ok, _ = await self.replace(self.config, self.planned_share, hold_both=hold_both)
            if ok:
                self.restarts += 1
            return ok
        await self.stop(close_socket=False)
        return await self.start()

    @property
    def url(self) -> str:
        return http_url(self.config.host, self.config.port)

    @property
    def pid(self) -> int | None:
        return self.worker.pid if self.worker is not None and self.worker.alive else None
