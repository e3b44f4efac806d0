"""One daemon per state directory and per control socket: advisory locks held for the daemon's life.

``paths.acquire_lock`` takes one (``flock``: the kernel drops it when the process ends, even by
``kill -9``); the daemon takes two, ``<state dir>/daemon.lock`` and ``<control socket>.lock``,
since two daemons on different state directories must still not share a control socket.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import IO

from vllmmlxd.paths import AlreadyRunning, acquire_lock


class DaemonRunning(Exception):
    """Another daemon holds one of the locks; the message says which and its pid."""


class DaemonLock:
    """Both locks, held until ``release()``."""

    def __init__(self, files: list[IO[str]]):
        self._files = files

    @classmethod
    def acquire(cls, state_dir: Path, control_socket: Path) -> DaemonLock:
        files: list[IO[str]] = []
        try:
            for path, what in (
                (state_dir / "daemon.lock", f"state directory {state_dir}"),
                (Path(f"{control_socket}.lock"), f"control socket {control_socket}"),
            ):
                path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # the socket's folder may not exist yet
                try:
                    files.append(acquire_lock(path))
                except AlreadyRunning as exc:
                    holder = f"pid {exc.pid}" if exc.pid else "pid unknown"
                    raise DaemonRunning(f"another vllmmlxd ({holder}) is running on the {what}") from None
        except BaseException:
            for f in files:
                f.close()
            raise
        return cls(files)

    def release(self) -> None:
        for f in self._files:
            with contextlib.suppress(OSError):
                f.close()
        self._files = []
