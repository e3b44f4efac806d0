"""A fake ControlTarget and a real control server on a Unix socket, run by a background event loop.

The fake stands in for the supervisor: these are the control layer's own tests; the
daemon with real workers is tested elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

from vllmmlxd.control.protocol import (
    ActionResponse,
    DaemonStatus,
    ModelStatus,
    ReloadResponse,
    ReloadResult,
    StatusResponse,
)
from vllmmlxd.control.server import ControlServer, make_control_app, serve_control


def model_status(name: str, state: str = "ready", port: int = 8001, **kw) -> ModelStatus:
    fields = dict(pid=4200, host="127.0.0.1", restarts=0, uptime_s=192.0, served_model_name=name)
    fields.update(kw)
    return ModelStatus(name=name, state=state, port=port, **fields)


class FakeTarget:
    """Answers from fields a test sets; records the calls it gets."""

    def __init__(self) -> None:
        self.models = [model_status("a", port=8001), model_status("b", port=8002)]
        self.last_reload: ReloadResult | None = ReloadResult(ok=True, at=1_700_000_000.0)
        self.reload_response = ReloadResponse(ok=True, dry_run=False, plan="changed: a (port)\nunchanged: b")
        self.action_ok = True
        self.lines = {"a": [f"line {i}" for i in range(10)], "b": []}
        self.new_lines: list[str] = ["new 1", "new 2"]
        self.follow_forever = False
        self.follow_closed = threading.Event()
        self.calls: list[tuple] = []

    def status(self) -> StatusResponse:
        daemon = DaemonStatus(
            pid=4121,
            uptime_s=3700.0,
            config_path="/etc/v.yaml",
            config_hash="abcdef012345",
            last_reload=self.last_reload,
            version="0.1.0",
        )
        return StatusResponse(daemon=daemon, models=self.models)

    async def refresh(self) -> None:
        self.calls.append(("refresh",))

    async def reload(self, dry_run: bool = False, file: str | None = None) -> ReloadResponse:
        # ``file`` is ignored: it answers for its own config, as a daemon that cannot preview does.
        self.calls.append(("reload", dry_run))
        return self.reload_response.model_copy(update={"dry_run": dry_run})

    def _known(self, name: str) -> None:
        if name not in self.lines:
            raise KeyError(name)

    async def _act(self, verb: str, name: str) -> ActionResponse:
        self._known(name)
        self.calls.append((verb, name))
        message = f"{verb} done" if self.action_ok else "did not become ready"
        return ActionResponse(ok=self.action_ok, name=name, message=message)

    async def restart(self, name: str) -> ActionResponse:
        return await self._act("restart", name)

    async def stop(self, name: str) -> ActionResponse:
        return await self._act("stop", name)

    async def start(self, name: str) -> ActionResponse:
        return await self._act("start", name)

    def logs(self, name: str, lines: int) -> list[str]:
        self._known(name)
        return self.lines[name][-lines:] if lines > 0 else []

    def follow(self, name: str) -> AsyncIterator[str]:
        self._known(name)
        return self._follow()

    async def _follow(self) -> AsyncIterator[str]:
        try:
            for line in self.new_lines:
                yield line
            while self.follow_forever:
                await asyncio.sleep(0.05)
        finally:
            self.follow_closed.set()


@contextlib.contextmanager
def short_tmp_dir() -> Iterator[Path]:
    """A directory with a short path: a Unix socket path must fit in about 100 bytes."""
    path = Path(tempfile.mkdtemp(prefix="vmx-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


class ControlThread:
    """An event loop in a daemon thread serving the control API for ``target`` on ``path``."""

    def __init__(self, target: FakeTarget, path: Path):
        self.target = target
        self.path = path
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="control-loop", daemon=True)
        self.server: ControlServer | None = None

    def run(self, coro, timeout: float = 10):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def __enter__(self) -> ControlThread:
        self.thread.start()
        self.server = self.run(serve_control(make_control_app(self.target), self.path))
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if self.server is not None:
                self.run(self.server.stop())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(5)
            self.loop.close()
