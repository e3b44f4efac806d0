"""The disk tier of the block cache: block files in a directory of their own model and KV layout.

Files live under ``ROOT/FINGERPRINT/xx/NAME.safetensors``: the fingerprint names the model's
weights and the KV layout (``fingerprint.py``), so another model, dtype or quantization never
even lists these files; NAME is a block's chain digest (its parent's and its tokens'), so a
lookup that runs out of blocks in memory goes on by opening the next block's name.

Two threads, one writer. The engine thread reads (a lookup) and hands over new blocks as host
bytes it already copied (MLX arrays are evaluated on the engine thread only); it never waits on
the disk: a write that would overfill the hand-over (``QUEUE_BYTES``) is dropped and counted.
The writer thread alone writes and deletes files and keeps the budget: each file is written
under a temporary name and renamed (a crash leaves no half file under a real name), the budget
is least recently used first by mtime (a read touches its file), and the sizes are scanned at
start and every ``RESCAN_S`` (another worker of the same model, during a swap, writes here too).
A file that fails a check when read (truncated, damaged, foreign) is a miss, and goes to the
writer to be removed. No mlx here: tensors are bytes (``block_file``).

The directory is trusted only as far as it is private: files are opened without following a
symbolic link (a planted link never redirects a read or a write), created 0600 in 0700
directories of this user's (a group- or world-writable one is tightened when it is ours and
refused when it is not: the tier is then off, with the reason), and every block is sealed with
a keyed hash under the install's secret (``ROOT/.block-key``, made once, 0600), so a block this
install did not write is refused. A block's metadata holds its tokens only as that keyed hash.
"""

from __future__ import annotations

import contextlib
import hashlib
import heapq
import logging
import os
import queue
import secrets
import stat
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from ...log import log_event
from .block_file import BlockFileError, Tensor, decode, encode

logger = logging.getLogger("vllmmlxd.engine")

SUFFIX = ".safetensors"
QUEUE_BYTES = 256 * 1024**2  # host copies waiting for the writer at most; past that, new blocks are not written
RESCAN_S = 60.0
STALE_TMP_S = 600.0  # a temporary file this old was left by a writer that died
KEY_NAME = ".block-key"
KEY_BYTES = 32
NOFOLLOW = os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


def dir_verdict(mode: int, owner: int, me: int) -> str:
    """What to do with an existing directory of the tier: "ok", "tighten" (ours, but others may
    write in it) or "refuse" (someone else's that others may write in)."""
    if not mode & (stat.S_IWGRP | stat.S_IWOTH):
        return "ok"
    return "tighten" if owner == me else "refuse"


def _private_dir(path: Path, *, ours: bool) -> None:
    """Make ``path`` a directory others cannot write in (created 0700 when absent); OSError with
    the reason when it cannot be. ``ours``: the tier's own subdirectory, which must not be a link
    and must be this user's (the root may be a link the operator made, to another disk)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = os.lstat(path) if ours else os.stat(path)
    me = os.geteuid()
    if not stat.S_ISDIR(info.st_mode):
        raise OSError(f"{path} is not a directory")
    if ours and info.st_uid != me:
        raise OSError(f"{path} belongs to uid {info.st_uid}, not to this service's user")
    verdict = dir_verdict(info.st_mode, info.st_uid, me)
    if verdict == "refuse":
        raise OSError(f"{path} is writable by other users and not this service's: give the tier a private directory")
    if verdict == "tighten":
        os.chmod(path, 0o700)
        log_event(logger, "cache.disk_dir_tightened", logging.WARNING, dir=str(path), was=oct(info.st_mode & 0o777))


def install_secret(root: Path) -> bytes:
    """The key every block of this install is sealed with, made on first use. Made under a
    temporary name and linked into place, so two workers starting at once agree on one key."""
    path = root / KEY_NAME
    try:
        fd = os.open(path, os.O_RDONLY | NOFOLLOW)
    except FileNotFoundError:
        tmp = root / f"{KEY_NAME}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW, 0o600)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(secrets.token_bytes(KEY_BYTES))
            with contextlib.suppress(FileExistsError):  # another worker made it first: theirs is the key
                os.link(tmp, path)
        finally:
            _unlink(tmp)
        fd = os.open(path, os.O_RDONLY | NOFOLLOW)
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        key = f.read(KEY_BYTES + 1)
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o077:
        raise OSError(f"{path} must be a regular file of this service's user, mode 0600")
    if len(key) != KEY_BYTES:
        raise OSError(f"{path} is not a block key (remove it: a new one is made, and old blocks are dropped)")
    return key


@dataclass
class DiskStats:
    reads: int = 0  # blocks read back (engine thread)
    read_bytes: int = 0
    rejected: int = 0  # files that failed a check when read (engine thread)
    written: int = 0  # blocks written (writer thread, as the rest)
    write_bytes: int = 0
    dropped: int = 0  # blocks not handed over: the writer was behind (engine thread)
    evicted: int = 0
    removed: int = 0  # rejected files deleted
    errors: int = 0  # writes that failed (a full disk...)


class DiskStore:
    def __init__(
        self,
        root: Path,
        fingerprint: str,
        budget_bytes: int,
        *,
        queue_bytes: int = QUEUE_BYTES,
        rescan_s: float = RESCAN_S,
    ):
        self.root = Path(root)
        self.fingerprint = fingerprint
        self.dir = self.root / fingerprint
        self.budget_bytes = budget_bytes
        self.queue_bytes = queue_bytes
        self.rescan_s = rescan_s
        self.stats = DiskStats()
        _private_dir(self.root, ours=False)
        self._key = install_secret(self.root)
        _private_dir(self.dir, ours=True)
        # The writer's state: the files it knows and their sizes, an LRU heap by mtime, the total.
        self._index: dict[str, int] = {}
        self._heap: list[tuple[float, str]] = []
        self.nbytes = 0
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._rejected: deque[str] = deque(maxlen=4096)  # names the engine thread found bad
        self._handed = 0  # bytes handed over (engine thread) ...
        self._done = 0  # ... and taken care of (writer thread)
        self._scanned_at = 0.0
        self._thread = threading.Thread(target=self._run, name="kv-disk-writer", daemon=True)
        self._thread.start()

    def path(self, name: str) -> Path:
        return self.dir / name[:2] / (name + SUFFIX)

    def seal(self, data: bytes) -> str:
        """``data`` (a block's tokens) as the metadata holds it: a keyed hash, never the ids."""
        return hashlib.blake2b(data, digest_size=16, key=self._key).hexdigest()

    def known(self, name: str) -> bool:
        """Whether the block is on disk as far as the writer knows (a read of its index: may lag)."""
        return name in self._index

    # -- the engine thread ------------------------------------------------

    def get(self, name: str, expect: dict[str, str]) -> dict[str, Tensor] | None:
        """The block ``name``'s tensors, if its file is here and passes every check (its metadata
        must hold ``expect``); a bad file is a miss and is removed."""
        try:
            fd = self._open(name, name + SUFFIX, os.O_RDONLY)
        except FileNotFoundError:
            return None  # not there (or gone meanwhile: another worker's writer evicted it)
        except OSError as exc:  # a link where a block should be (ELOOP), or a shard that is one
            self.reject(name, exc.strerror or "cannot be opened")
            return None
        with os.fdopen(fd, "rb") as f:
            info = os.fstat(fd)
            try:
                if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
                    raise BlockFileError("not a regular file of this service's user")
                raw = f.read()
                tensors, meta = decode(raw, self._key)
                wrong = [k for k, v in {"fingerprint": self.fingerprint, **expect}.items() if meta.get(k) != v]
                if wrong:
                    raise BlockFileError(f"not this block: {', '.join(wrong)} differ")
            except (BlockFileError, OSError) as exc:
                self.reject(name, str(exc))
                return None
            with contextlib.suppress(OSError):
                os.utime(fd)  # recently used: the writer's budget keeps it longer
        self.stats.reads += 1
        self.stats.read_bytes += len(raw)
        return tensors

    def _open(self, name: str, file: str, flags: int, mode: int = 0o600) -> int:
        """``file`` in block ``name``'s shard directory, opened with no link followed on the way."""
        shard = os.open(self.dir / name[:2], os.O_RDONLY | os.O_DIRECTORY | NOFOLLOW)
        try:
            return os.open(file, flags | NOFOLLOW, mode, dir_fd=shard)
        finally:
            os.close(shard)

    def reject(self, name: str, why: str) -> None:
        """A file found bad: counted, logged, and removed by the writer."""
        self.stats.rejected += 1
        log_event(logger, "cache.disk_rejected", logging.WARNING, block=name, reason=why)
        self._rejected.append(name)
        self._jobs.put(("wake",))

    def room(self, nbytes: int) -> bool:
        """Whether the writer can take ``nbytes`` more now; counts a drop when it cannot (asked before
        the host copy is made, so a writer that fell behind costs the engine thread nothing)."""
        if self._handed - self._done + nbytes > self.queue_bytes:
            self.stats.dropped += 1
            return False
        return True

    def put(self, name: str, tensors: dict[str, Tensor], metadata: dict[str, str]) -> bool:
        """Hand a block's bytes to the writer; False (dropped) when it is too far behind."""
        size = sum(t.nbytes for t in tensors.values())
        if not self.room(size):
            return False
        self._handed += size
        self._jobs.put(("write", name, tensors, metadata, size))
        return True

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until the writer has done everything handed over so far (tests, shutdown)."""
        done = threading.Event()
        self._jobs.put(("flush", done))
        return done.wait(timeout)

    def close(self, timeout: float = 10.0) -> None:
        """Write what was handed over (within ``timeout``), then stop the writer."""
        if self._thread.is_alive():
            self._jobs.put(None)
            self._thread.join(timeout)

    def describe(self) -> dict:
        s = self.stats
        return {
            "dir": str(self.dir),
            "budget_mb": round(self.budget_bytes / 1024**2, 1),
            "used_mb": round(self.nbytes / 1024**2, 3),
            "files": len(self._index),
            "blocks_read": s.reads,
            "blocks_written": s.written,
            "rejected": s.rejected,
            "dropped": s.dropped,
            "evicted": s.evicted,
            "write_errors": s.errors,
        }

    # -- the writer thread ------------------------------------------------

    def _run(self) -> None:
        self._scan()
        while True:
            try:
                job = self._jobs.get(timeout=self.rescan_s)
            except queue.Empty:
                job = ("wake",)
            while self._rejected:
                self._remove(self._rejected.popleft(), counted=True)
            if job is None:
                return
            try:
                self._do(job)
            except Exception as exc:  # the tier is an optimisation: a surprise costs a block, not the writer
                self.stats.errors += 1
                log_event(logger, "cache.disk_error", logging.WARNING, error=repr(exc))

    def _do(self, job: tuple) -> None:
        kind = job[0]
        if kind == "write":
            _, name, tensors, metadata, size = job
            try:
                self._write(name, tensors, metadata)
            finally:
                self._done += size
        elif kind == "flush":
            job[1].set()
        if time.monotonic() - self._scanned_at > self.rescan_s:
            self._scan()

    def _scan(self) -> None:
        """Every block file's size and mtime, from the directory itself; stale temporary files removed."""
        index: dict[str, int] = {}
        heap: list[tuple[float, str]] = []
        now = time.time()
        try:
            shards = list(os.scandir(self.dir))
        except OSError:
            shards = []
        for shard in shards:
            if not shard.is_dir(follow_symlinks=False):
                continue
            try:
                entries = list(os.scandir(shard.path))
            except OSError:
                continue
            for entry in entries:
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if entry.name.endswith(SUFFIX):
                    name = entry.name[: -len(SUFFIX)]
                    index[name] = info.st_size
                    heap.append((info.st_mtime, name))
                elif entry.name.endswith(".tmp") and now - info.st_mtime > STALE_TMP_S:
                    _unlink(Path(entry.path))
        heapq.heapify(heap)
        self._index, self._heap, self.nbytes = index, heap, sum(index.values())
        self._scanned_at = time.monotonic()
        self._keep_budget()

    def _write(self, name: str, tensors: dict[str, Tensor], metadata: dict[str, str]) -> None:
        path = self.path(name)
        if name in self._index or os.path.lexists(path):
            return  # written before (by this worker, or another of the same model)
        tmp = f"{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        try:
            shard = path.parent
            if not os.path.lexists(shard):
                shard.mkdir(mode=0o700, exist_ok=True)
            fd = self._open(name, tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)  # never through a planted link
            with os.fdopen(fd, "wb") as f:
                for part in encode(tensors, metadata, self._key):
                    f.write(part)
            os.replace(shard / tmp, path)  # a link planted under the real name is replaced, not followed
            info = path.lstat()
        except (OSError, BlockFileError) as exc:
            _unlink(path.parent / tmp)
            self.stats.errors += 1
            log_event(logger, "cache.disk_write_failed", logging.WARNING, block=name, error=repr(exc))
            return
        self._index[name] = info.st_size
        self.nbytes += info.st_size
        heapq.heappush(self._heap, (info.st_mtime, name))
        self.stats.written += 1
        self.stats.write_bytes += info.st_size
        self._keep_budget()

    def _keep_budget(self) -> None:
        """Delete least recently used files until the rest fit; a file read since it was queued goes back."""
        while self.nbytes > self.budget_bytes and self._heap:
            mtime, name = heapq.heappop(self._heap)
            if name not in self._index:
                continue
            try:
                now = self.path(name).lstat().st_mtime
            except OSError:
                self.nbytes -= self._index.pop(name)  # removed by someone else
                continue
            if now > mtime:
                heapq.heappush(self._heap, (now, name))  # touched by a read since
                continue
            self._remove(name, counted=False)
            self.stats.evicted += 1

    def _remove(self, name: str, *, counted: bool) -> None:
        _unlink(self.path(name))
        self.nbytes -= self._index.pop(name, 0)
        if counted:
            self.stats.removed += 1


def _unlink(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink()
