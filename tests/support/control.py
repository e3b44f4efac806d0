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
    BudgetStatus,
    DaemonStatus,
    ModelStatus,
    PullStatus,
    ReloadResponse,
    ReloadResult,
    StatusResponse,
    StoredModelStatus,
    StoreResponse,
    UsageResponse,
    UsageRow,
)
from vllmmlxd.control.server import ControlServer, make_control_app, serve_control
from vllmmlxd.errors import StoreBusy, StoreError
from vllmmlxd.store.catalog import NotInStore


def pull_status(state: str = "downloading", done: int = 0, **kw) -> PullStatus:
    fields = dict(id="p1", repo="org/m", total_bytes=4_000_000_000, files=3, started_at=1_700_000_000.0)
    fields.update(kw)
    percent = round(done * 100 / fields["total_bytes"], 1) if fields["total_bytes"] else None  # type: ignore[operator]
    return PullStatus(state=state, done_bytes=done, percent=percent, **fields)


def model_status(name: str, state: str = "ready", port: int = 8001, **kw) -> ModelStatus:
    fields = dict(pid=4200, host="127.0.0.1", restarts=0, uptime_s=192.0, served_model_name=name)
    fields.update(kw)
    return ModelStatus(name=name, state=state, port=port, **fields)


class FakeTarget:
    """Answers from fields a test sets; records the calls it gets."""

    def __init__(self) -> None:
        self.models = [model_status("a", port=8001), model_status("b", port=8002)]
        self.usage_rows: list[UsageRow] = []
        self.budgets: list[BudgetStatus] = []
        self.last_reload: ReloadResult | None = ReloadResult(ok=True, at=1_700_000_000.0)
        self.reload_response = ReloadResponse(ok=True, dry_run=False, plan="changed: a (port)\nunchanged: b")
        self.action_ok = True
        self.lines = {"a": [f"line {i}" for i in range(10)], "b": []}
        self.new_lines: list[str] = ["new 1", "new 2"]
        self.follow_forever = False
        self.follow_closed = threading.Event()
        self.calls: list[tuple] = []
        # The store: the statuses a pull goes through, and what it holds (used_by refuses a removal).
        self.pull_script = [
            pull_status("resolving", total_bytes=None),
            pull_status("downloading", 1_000_000_000, commit="c" * 40, bytes_per_s=50e6, eta_s=60.0),
            pull_status("downloading", 4_000_000_000, commit="c" * 40),
            pull_status("done", 4_000_000_000, commit="c" * 40, path="/s/models/hub-org--m"),
        ]
        self.pull_conflict: str | None = None
        self.pulls_busy: str | None = None
        self.stored = [
            StoredModelStatus(name="org/m", kind="pulled", source="org/m @ cccc", path="/s/m", size_bytes=4 * 10**9),
            StoredModelStatus(
                name="builtin:tiny",
                kind="builtin",
                source="built here",
                path="/s/t",
                size_bytes=12_900_000,
                used_by=["a"],
            ),
        ]

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

    async def load(self, name: str) -> ActionResponse:
        return await self._act("load", name)

    def logs(self, name: str, lines: int) -> list[str]:
        self._known(name)
        return self.lines[name][-lines:] if lines > 0 else []

    def follow(self, name: str) -> AsyncIterator[str]:
        self._known(name)
        return self._follow()

    async def pull(self, source) -> PullStatus:
        self.calls.append(("pull", source.repo, source.revision))
        if self.pull_conflict:
            raise StoreError(self.pull_conflict)
        if self.pulls_busy:
            raise StoreBusy(self.pulls_busy)
        return self.pull_script[0]

    def pulls(self) -> list[PullStatus]:
        return [self.pull_script[-1]]

    def pull_status(self, pull_id: str) -> PullStatus:
        if pull_id != "p1":
            raise KeyError(pull_id)
        return self.pull_script[-1]

    async def follow_pull(self, pull_id: str) -> AsyncIterator[PullStatus]:
        if pull_id != "p1":
            raise KeyError(pull_id)
        for status in self.pull_script:
            yield status
            await asyncio.sleep(0)

    async def cancel_pull(self, pull_id: str) -> PullStatus:
        self.calls.append(("cancel_pull", pull_id))
        if pull_id != "p1":
            raise KeyError(pull_id)
        return pull_status("cancelled", 1_000_000_000, error="cancelled")

    async def store(self) -> StoreResponse:
        return StoreResponse(path="/s/models", free_bytes=50 * 10**9, models=self.stored, pulls=[])

    async def usage(self, since_s: float) -> UsageResponse:
        self.calls.append(("usage", since_s))
        return UsageResponse(since_s=since_s, rows=self.usage_rows, budgets=self.budgets)

    async def remove(self, name: str) -> ActionResponse:
        self.calls.append(("remove", name))
        found = [m for m in self.stored if m.name == name]
        if not found:
            raise NotInStore(f"no model {name!r} in the store")
        if found[0].used_by:
            raise StoreError(f"{name} is in use by {', '.join(found[0].used_by)}")
        self.stored.remove(found[0])
        return ActionResponse(ok=True, name=name, message=f"removed {name} (4.00 GB)")

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
