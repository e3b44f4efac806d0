"""One worker process: spawn it, feed it its config, forward its logs, check its health.

Workers are started with ``python -m vllmmlxd.worker`` (never forked: MLX does not
survive a fork on macOS). The daemon keeps the write end of the worker's stdin open
for the worker's whole life; when the daemon dies, the worker sees EOF and exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import signal
import sys
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, Self

import httpx

from ...log import event_line, log_event
from ..notify import strip_notify_env

if TYPE_CHECKING:
    from ...runtime.cpus import CpuShare

logger = logging.getLogger("vllmmlxd.supervisor")

_seq = itertools.count(1)
LogSink = Callable[[str], None]

MAX_LINE = 64 * 1024  # a longer stderr line is cut here (and marked): one log line stays readable
_CHUNK = 64 * 1024


class UnitConfig(Protocol):
    """What a supervised process runs: a model entry, or the gateway's spec (sent on its stdin)."""

    @property
    def host(self) -> str: ...

    @property
    def port(self) -> int: ...

    def to_worker_json(self) -> str: ...

    def config_hash(self) -> str: ...


class SpawnError(OSError):
    """The worker could not be started: exec failed, or it died before taking its config."""


class WorkerProcess:
    """A running (or exited) worker for one model entry."""

    def __init__(
        self, name: str, config: UnitConfig, proc: asyncio.subprocess.Process, health_socket: Path, sink: LogSink
    ):
        self.name = name
        self.config = config
        self.proc = proc
        self.pid = proc.pid
        self.health_socket = health_socket
        self.started = time.time()
        self.exit_code: int | None = None
        self.runtime: dict = {}  # BLAS, threads and cores, as the worker reports them once ready
        self.load: dict = {}  # requests, recent tokens/s and prefix cache use, as of the last refresh
        self.load_at: float | None = None  # monotonic time of that refresh
        self._sink = sink
        self.recent: deque[str] = deque(maxlen=40)
        self.share: CpuShare | None = None  # the cores it was started on (set by its slot)
        self.ready_at: float | None = None  # monotonic time it became ready (set by its slot)
        self.listening = False  # its health socket exists: it is about to accept, or accepts
        self.failure: str | None = None  # why its supervisor gave up on it (a start timeout), for status
        self._stderr_task = asyncio.create_task(self._forward_stderr())

    @classmethod
    async def spawn(
        cls,
        name: str,
        config: UnitConfig,
        *,
        listen_fd: int,
        state_dir: Path,
        drain_timeout: float,
        log_level: str,
        sink: LogSink,
        cpus: str | None = None,
        module: str = "vllmmlxd.worker",
        env: dict[str, str] | None = None,
        extra_fds: dict[str, int] | None = None,
    ) -> Self:
        """Start a worker serving ``config`` on the inherited socket ``listen_fd``, pinned to ``cpus``.
        ``module``: the program (the gateway is supervised the same way, ``vllmmlxd.gateway``);
        ``env``: added to its environment (a rank's MLX variables); ``extra_fds``: more inherited
        listening sockets, each passed as ``FLAG FD`` (the gateway's Ollama listener)."""
        health = state_dir / "run" / f"w{os.getpid()}-{next(_seq)}.sock"
        health.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        share = ("--cpus", cpus) if cpus else ()
        argv = [
            sys.executable,
            "-m",
            module,
            "--name",
            name,
            "--fd",
            str(listen_fd),
            "--health-socket",
            str(health),
            "--state-dir",
            str(state_dir),
            "--drain-timeout",
            str(drain_timeout),
            "--log-level",
            log_level,
            *share,
        ]
        for flag, fd in (extra_fds or {}).items():
            argv += [flag, str(fd)]
        fds = (listen_fd, *(extra_fds or {}).values())
        # A worker never downloads: a model not here is refused before it starts (or pulled, download: true).
        offline = {"HF_HUB_OFFLINE": "1"}
        return await cls.start(name, config, argv, health, sink, pass_fds=fds, env={**offline, **(env or {})})

    @classmethod
    async def start(
        cls,
        name: str,
        config: UnitConfig,
        argv: list[str],
        health: Path,
        sink: LogSink,
        *,
        pass_fds: tuple[int, ...] = (),
        env: dict[str, str] | None = None,
    ) -> Self:
        """Run ``argv`` in a session of its own and hand it ``config`` on stdin (a worker, a rank,
        or ssh starting a rank on another host)."""
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
                pass_fds=pass_fds,
                env={**strip_notify_env(dict(os.environ)), **(env or {})},
                start_new_session=True,
            )
        except (OSError, ValueError) as exc:  # no interpreter, no fds left, a closed socket...
            raise SpawnError(f"cannot start a worker: {exc}") from exc
        worker = cls(name, config, proc, health, sink)
        assert proc.stdin is not None
        try:
            # The config travels on stdin so that secrets never show in the process list.
            proc.stdin.write(config.to_worker_json().encode() + b"\n")
            await proc.stdin.drain()
        except (OSError, RuntimeError) as exc:  # it died at once: a broken pipe
            worker.kill()
            await worker.wait()
            raise SpawnError(f"the worker died before reading its config: {exc}; {worker.last_lines(3)}") from exc
        log_event(logger, "worker.spawned", model=name, pid=proc.pid)
        return worker

    async def _forward_stderr(self) -> None:
        # Chunks split by hand: StreamReader.readline raises on a line over its limit (a huge traceback).
        assert self.proc.stderr is not None
        pending, skipping = b"", False  # skipping: the rest of a line already emitted cut
        while chunk := await self.proc.stderr.read(_CHUNK):
            if skipping:
                if b"\n" not in chunk:
                    continue
                chunk, skipping = chunk.split(b"\n", 1)[1], False
            *lines, pending = (pending + chunk).split(b"\n")
            for raw in lines:
                self._emit(raw)
            if len(pending) > MAX_LINE:
                self._emit(pending)
                pending, skipping = b"", True
        if pending:
            self._emit(pending)

    def _emit(self, raw: bytes) -> None:
        cut = len(raw) > MAX_LINE
        line = raw[:MAX_LINE].decode(errors="replace").rstrip("\r")
        if cut:
            line += " [cut]"
        if line:
            if not _is_logfmt(line):  # tracebacks and stray prints get wrapped as events
                line = _wrap_raw(self.name, self.pid, line)
            self.recent.append(line)
            self._sink(line)

    def last_lines(self, n: int = 10) -> str:
        """Its last ``n`` stderr lines: what status shows when it dies."""
        return "\n".join(list(self.recent)[-n:])

    async def wait_ready(self, timeout: float, on_listening: Callable[[], None] = lambda: None) -> bool:
        """True once /health answers on the private socket; False if the worker exits or time runs out.

        ``on_listening`` is called as soon as the health socket appears: the worker has loaded
        and is about to accept on its TCP socket, so whoever answered there in its stead stops.
        """
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.returncode is None:
            if not self.listening and self.health_socket.exists():
                self.listening = True
                on_listening()
            body = await self.health(timeout=2) if self.listening else None
            if body is not None and body.get("status") != "degraded":
                self.note(body)
                return True
            await asyncio.sleep(0.1 if self.listening else 0.02)
        return False

    def note(self, body: dict) -> None:
        """Keep what a health answer says of the worker's process and load."""
        self.runtime = body.get("runtime") or self.runtime
        self.load = body.get("load") or {}
        self.load_at = time.monotonic()

    async def refresh(self, timeout: float = 1.0) -> None:
        """Ask the worker for its current load (for `vllmmlxctl status`); keep the last on no answer."""
        body = await self.health(timeout)
        if body is not None:
            self.note(body)

    async def health(self, timeout: float = 5) -> dict | None:
        """One health check: the body of a 200, else None. A worker busy generating still answers;
        one whose engine is stuck answers 503 ``degraded`` (None here)."""
        # A Unix socket carries no TLS: verify=False skips loading the CA store (40 ms of CPU a check).
        transport = httpx.AsyncHTTPTransport(uds=str(self.health_socket), verify=False)
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://worker", timeout=timeout) as client:
                response = await client.get("/health")
                return response.json() if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None

    async def healthy(self, timeout: float = 5) -> bool:
        """Answers, and not ``"status": "degraded"`` (waiting requests, no engine step for a while).
        The answer's load figures are kept: idle times stay fresh between status calls."""
        body = await self.health(timeout)
        if body is not None:
            self.note(body)
        return body is not None and body.get("status") != "degraded"

    async def exited(self) -> int:
        """Returns once the process has exited (its exit code), without reaping its other resources."""
        return await self.proc.wait()

    @property
    def pids(self) -> list[int]:
        """Every process this worker is (one; a distributed entry's ranks are several)."""
        return [self.pid]

    async def wait(self) -> int:
        """Wait for the exit; returns the exit code (negative: killed by that signal)."""
        code = await self.proc.wait()
        await asyncio.gather(self._stderr_task, return_exceptions=True)
        self.exit_code = code
        self.health_socket.unlink(missing_ok=True)
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        return code

    def terminate(self) -> None:
        """Ask the worker to drain and stop (SIGTERM)."""
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def _signal(self, sig: int) -> None:
        # os.kill, not proc.send_signal: this Python's asyncio signals through Popen.send_signal, which
        # polls first, and a poll that reaps a child which has just exited steals its status from
        # asyncio's watcher, which then reports 255 (CPython gh-87744). A rank group signals ranks that
        # may have just died; the returncode check stands for the poll's guard against a reused pid.
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    async def stop(self, drain_timeout: float) -> int:
        """SIGTERM, wait up to ``drain_timeout`` (+ a margin) for in-flight requests, then SIGKILL."""
        self.terminate()
        try:
            return await asyncio.wait_for(asyncio.shield(self.wait()), drain_timeout + 5)
        except TimeoutError:
            log_event(logger, "worker.killed", logging.WARNING, model=self.name, pid=self.pid, reason="drain timeout")
            self.kill()
            return await self.wait()

    @property
    def alive(self) -> bool:
        return self.proc.returncode is None


def _is_logfmt(line: str) -> bool:
    body = line[3:] if line.startswith("<") and line[2:3] == ">" else line
    return body.startswith(("ts=", "level="))


def _wrap_raw(name: str, pid: int, line: str) -> str:
    return event_line("worker.stderr", "error", model=name, pid=pid, line=line)
