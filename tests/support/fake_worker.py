"""A stand-in for a worker process, for supervisor tests: it behaves as it is told (ready, hangs,
or exits with a code during its load), reports the idle time it is given, and never starts a process.

Its time is the test's clock (``FakeWorker.clock``, the one the slot or supervisor under test is
given): a load takes ``load_s`` and a drain ``drain_s`` of it, and its idle time is measured on it."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from tests.support.clock import FakeClock
from vllmmlxd.config.schema import ModelConfig
from vllmmlxd.runtime.cpus import CpuShare
from vllmmlxd.supervisor.clock import REAL_CLOCK, Clock
from vllmmlxd.supervisor.slot.process import SpawnError

T = TypeVar("T")

_pids = itertools.count(1000)


class FakeWorker:
    """Behaves as told: ``ready`` (loads and serves), ``hang`` (never ready), or an exit code during its load."""

    script: ClassVar[list] = []  # what the next spawns do; "ready" once it is empty
    spawned: ClassVar[list[FakeWorker]] = []
    spawn_error: str | None = None
    clock: ClassVar[Clock] = REAL_CLOCK  # the test's (a FakeClock): set with the slot's or supervisor's
    load_s = 0.0  # how long a load takes, on the clock (0: at the loop's next turn)
    drain_s = 0.0  # how long a drain takes (its in-flight requests finishing), on the clock

    def __init__(self, config: ModelConfig, behaviour):
        self.config = config
        self.behaviour = behaviour
        self.pid = next(_pids)
        self.spawned_at = self.clock.monotonic()
        self.health_socket = Path("/nonexistent")
        self.listening = False
        self.ready_at: float | None = None
        self.share: CpuShare | None = None
        self.failure: str | None = None
        self.exit_code: int | None = None
        self.runtime: dict = {}
        self.load: dict = {}
        self.load_at: float | None = None
        self.idle_since: float | None = None  # set by a test: the worker has had no request since then
        self.keep_alive_s: float | None = None  # set by a test: what its last request said (Ollama's keep_alive)
        self.answers = True
        self._exit = asyncio.get_running_loop().create_future()

    @classmethod
    async def spawn(cls, name, config, **kw):
        if cls.spawn_error:
            raise SpawnError(cls.spawn_error)
        worker = cls(config, cls.script.pop(0) if cls.script else "ready")
        cls.spawned.append(worker)
        return worker

    @classmethod
    def kill_spawned(cls) -> None:
        """Kill every worker still alive: a test that fails leaves none behind (its slot's watches would
        wait for their exits while the loop shuts down)."""
        for worker in cls.spawned:
            worker.kill()

    def _finish(self, code: int) -> None:
        if not self._exit.done():
            self.exit_code = code
            self._exit.set_result(code)

    def exit(self, code: int) -> None:
        """The process ends on its own with ``code`` (a crash, for a test)."""
        self._finish(code)

    async def wait_ready(self, timeout, on_listening=lambda: None):
        await self.clock.sleep(self.load_s)
        if not self.alive:  # killed while it loaded
            return False
        if self.behaviour == "ready":
            self.listening = True
            on_listening()
            return True
        if isinstance(self.behaviour, int):
            self._finish(self.behaviour)
            return False
        await asyncio.shield(self._exit)  # hangs until killed (its slot's clock times the start out)
        return False

    async def healthy(self, timeout=5):
        return self.answers

    async def refresh(self, timeout=1.0):
        """What a real worker's /health load says of its idle time: since ``idle_since``, or busy (None)."""
        now = self.clock.monotonic()
        self.load = {"idle_s": None if self.idle_since is None else now - self.idle_since}
        if self.keep_alive_s is not None:
            self.load["keep_alive_s"] = self.keep_alive_s
        self.load_at = now

    async def wait(self):
        return await asyncio.shield(self._exit)  # a waiter cancelled leaves the exit alone, as a process's

    async def exited(self):
        return await asyncio.shield(self._exit)

    @property
    def pids(self):
        return [self.pid]

    def kill(self):
        self._finish(-9)

    def terminate(self):
        self._finish(0)

    async def stop(self, drain_timeout):
        await self.clock.sleep(self.drain_s)
        self.terminate()
        return await self.wait()

    def last_lines(self, n=10):
        return f"fake worker {self.pid} said goodbye"

    @property
    def alive(self):
        return not self._exit.done()


# -- the slot and supervisor tests' shared harness -------------------------------------------------


def use_fake_workers(monkeypatch: Any) -> FakeClock:
    """Slots spawn FakeWorkers, on a fresh fake clock (their class settings restored after the test)."""
    from vllmmlxd.supervisor.slot import slot_workers

    FakeWorker.script, FakeWorker.spawned, FakeWorker.spawn_error = [], [], None
    clock = FakeClock()
    monkeypatch.setattr(FakeWorker, "clock", clock)
    monkeypatch.setattr(FakeWorker, "load_s", 0.0)
    monkeypatch.setattr(FakeWorker, "drain_s", 0.0)
    monkeypatch.setattr(slot_workers, "WorkerProcess", FakeWorker)
    return clock


def run_with_fakes(coro: Coroutine[Any, Any, T], limit_s: float) -> T:
    """``asyncio.run`` with a deadline; a failed test's workers end with it, so the loop shuts down."""

    async def main() -> T:
        try:
            return await asyncio.wait_for(coro, limit_s)
        finally:
            FakeWorker.kill_spawned()

    return asyncio.run(main())


async def until(predicate: Callable[[], object], timeout: float = 5.0) -> None:
    """Poll for what takes real time (a socket's answer, a file read in a thread), with a deadline."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.005)
