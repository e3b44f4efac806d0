"""Where vllmmlxd keeps its state: converted models, downloads, sockets, logs. Stdlib only."""

from __future__ import annotations

import fcntl
import os
import sys
from pathlib import Path
from typing import IO

from .errors import VllmmlxdError

ENV_STATE_DIR = "VLLMMLXD_STATE_DIR"


def default_state_dir() -> Path:
    """The platform's default: ~/Library/Application Support/vllmmlxd or $XDG_STATE_HOME/vllmmlxd."""
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Application Support" / "vllmmlxd"
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "vllmmlxd"


def resolve_state_dir(explicit: str | os.PathLike | None = None) -> Path:
    """``--state-dir`` (or the config's ``daemon.state_dir``), else $VLLMMLXD_STATE_DIR, else the default."""
    if explicit:
        return Path(explicit).expanduser()
    env = os.environ.get(ENV_STATE_DIR)
    if env:
        return Path(env).expanduser()
    return default_state_dir()


def default_cache_dir() -> Path:
    """What can be rebuilt at any time (never state): ~/Library/Caches/vllmmlxd or $XDG_CACHE_HOME/vllmmlxd."""
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "vllmmlxd"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "vllmmlxd"


def models_dir(state_dir: Path) -> Path:
    return state_dir / "models"


def downloads_dir(state_dir: Path) -> Path:
    return state_dir / "downloads"


def kv_cache_dir(state_dir: Path) -> Path:
    """The prefix cache's disk tier when an entry names no ``cache_disk.dir``: one per fingerprint inside."""
    return state_dir / "kv-cache"


def ensure_private_dir(path: Path) -> Path:
    """Create ``path`` (and its parents) as 0700; tighten it to 0700 when it exists and is ours.

    The state dir holds sockets, converted models and logs of one user: nobody else should list
    or enter it. A folder owned by someone else (a shared path given by hand) is left alone.
    """
    path = Path(path).expanduser()
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = path.stat()
    if info.st_uid == os.getuid() and info.st_mode & 0o077:
        os.chmod(path, 0o700)
    return path


class AlreadyRunning(VllmmlxdError):
    """Another process holds the lock (another daemon on the same state dir)."""

    def __init__(self, path: Path, pid: int | None):
        holder = f"process {pid}" if pid else "another process"
        super().__init__(f"{holder} already holds {path}: is another vllmmlxd running on this state dir?")
        self.path = path
        self.pid = pid


def acquire_lock(path: Path) -> IO[str]:
    """Take an exclusive lock on ``path`` (created 0600), write our pid in it, and return the open file.

    Keep the file object for the process's life: closing it (or exiting, even by ``kill -9``)
    releases the lock, so a stale file never blocks a restart. Raises ``AlreadyRunning`` naming
    the holder's pid when another process has it.
    """
    path = Path(path)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    f = os.fdopen(fd, "r+", encoding="ascii")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        text = f.read().strip()
        f.close()
        raise AlreadyRunning(path, int(text) if text.isdigit() else None) from None
    except BaseException:
        f.close()
        raise
    f.seek(0)
    f.truncate()
    f.write(f"{os.getpid()}\n")
    f.flush()
    return f
